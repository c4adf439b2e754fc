/*
 * lease_reads.c — lease.status and lease.list as C structs (struct
 * pgcoord_lease_info), for operators' snapshots. Decisions use the
 * handle's own belief (pgcoord_lease_is_leader), never these.
 */
#include <stdlib.h>

#include <msgpack.h>

#include "typed_read.h"

#define F(...) PGCOORD__FIELD(struct pgcoord_lease_info, __VA_ARGS__)
#define HOLDER(...) PGCOORD__FIELD_IN(struct pgcoord_lease_info, "holder", __VA_ARGS__)

static const struct pgcoord__field lease_fields[] = {
    F("name", STR, name, 0, true),
    F("epoch", INT, epoch, 0, false),
    HOLDER("session", INT, holder_session, 0),
    HOLDER("replica_id", STR, holder_replica, 0),
    F("expires_in_ms", INT, expires_in_ms, -1, false),
    F("ttl_ms", INT, ttl_ms, -1, false),
    F("acquired_at", INT, acquired_at, -1, false),
    F("renewed_at", INT, renewed_at, -1, false),
    F("leader", BOOL, leader, 0, false),
    F("valid_ms", INT, valid_ms, 0, false),
};

static const struct pgcoord__row_kind lease_row =
    PGCOORD__ROW_KIND(struct pgcoord_lease_info, lease_fields);

static bool lease_read(const msgpack_object *m, void *row)
{
	return pgcoord__fields_read(m, lease_fields, PGCOORD__NFIELDS(lease_fields), row);
}

static void lease_clear(void *row)
{
	pgcoord__fields_free(lease_fields, PGCOORD__NFIELDS(lease_fields), row);
}

void pgcoord_lease_info_free(struct pgcoord_lease_info *l)
{
	lease_clear(l);
	free(l);
}

static void lease_free_box(void *box)
{
	pgcoord_lease_info_free(box);
}

static const struct pgcoord__reply_kind lease_kind = {sizeof(struct pgcoord_lease_info), lease_read,
						      lease_free_box,
						      "the lease.status result lacks a name"};

pgcoord_err pgcoord_lease_info_get(pgcoord *c, const char *name, int timeout_ms,
				   struct pgcoord_lease_info **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_lease_status(c, name, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, &lease_kind, (void **)out);
}

void pgcoord_lease_list_free(struct pgcoord_lease_list *l)
{
	if (!l)
		return;
	pgcoord__table_free((void *)l->leases, l->count, &lease_row);
	free(l);
}

static bool lease_list_read(const msgpack_object *m, void *box)
{
	struct pgcoord_lease_list *l = box;
	void *rows;
	bool ok = pgcoord__table_read(m, "leases", &lease_row, &rows, &l->count);
	l->leases = rows;
	return ok;
}

static void lease_list_free_box(void *box)
{
	pgcoord_lease_list_free(box);
}

static const struct pgcoord__reply_kind lease_list_kind = {
    sizeof(struct pgcoord_lease_list), lease_list_read, lease_list_free_box,
    "the lease.list result lacks its leases with their names"};

pgcoord_err pgcoord_lease_list_get(pgcoord *c, int timeout_ms, struct pgcoord_lease_list **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_lease_list(c, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, &lease_list_kind, (void **)out);
}
