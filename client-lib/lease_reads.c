/*
 * lease_reads.c — lease.status and lease.list as C structs (struct
 * pgcoord_lease_info), for operators' snapshots. Decisions use the
 * handle's own belief (pgcoord_lease_is_leader), never these.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

static int64_t int_or(const msgpack_object *map, const char *key, int64_t dflt)
{
	int64_t v;
	return pgc_obj_int64(pgc_map_get(map, key), &v) ? v : dflt;
}

/* The library's own copies of a row's strings. */
static void lease_strings_free(struct pgcoord_lease_info *l)
{
	free((char *)l->name);
	free((char *)l->holder_replica);
}

/* Reads one lease map into l; false without a name or on out of memory. */
static bool lease_read(const msgpack_object *m, struct pgcoord_lease_info *l)
{
	const msgpack_object *holder, *replica;

	memset(l, 0, sizeof(*l));
	if (!m || m->type != MSGPACK_OBJECT_MAP ||
	    !(l->name = pgc_obj_strdup(pgc_map_get(m, "name"))))
		return false;
	l->epoch = int_or(m, "epoch", 0);
	holder = pgc_map_get(m, "holder");
	if (holder && holder->type == MSGPACK_OBJECT_MAP) {
		l->holder_session = int_or(holder, "session", 0);
		replica = pgc_map_get(holder, "replica_id");
		if (replica && replica->type == MSGPACK_OBJECT_STR &&
		    !(l->holder_replica = pgc_obj_strdup(replica)))
			return false;
	}
	l->expires_in_ms = int_or(m, "expires_in_ms", -1);
	l->ttl_ms = int_or(m, "ttl_ms", -1);
	l->acquired_at = int_or(m, "acquired_at", -1);
	l->renewed_at = int_or(m, "renewed_at", -1);
	pgc_obj_bool(pgc_map_get(m, "leader"), &l->leader);
	l->valid_ms = int_or(m, "valid_ms", 0);
	return true;
}

static bool unpack_map(const void *raw, size_t len, msgpack_unpacked *u)
{
	msgpack_unpacked_init(u);
	if (msgpack_unpack_next(u, raw, len, NULL) == MSGPACK_UNPACK_SUCCESS &&
	    u->data.type == MSGPACK_OBJECT_MAP)
		return true;
	msgpack_unpacked_destroy(u);
	return false;
}

void pgcoord_lease_info_free(struct pgcoord_lease_info *l)
{
	if (!l)
		return;
	lease_strings_free(l);
	free(l);
}

pgcoord_err pgcoord_lease_info_get(pgcoord *c, const char *name, int timeout_ms,
				   struct pgcoord_lease_info **out)
{
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_lease_status(c, name, timeout_ms, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	struct pgcoord_lease_info *l = calloc(1, sizeof(*l));
	bool ok = l && unpack_map(raw, raw_len, &u);
	if (ok) {
		ok = lease_read(&u.data, l);
		msgpack_unpacked_destroy(&u);
	}
	pgcoord_free(raw);
	if (!ok) {
		pgcoord_lease_info_free(l);
		pgcoord__set_message(c, "the lease.status result lacks a name (or memory ran out)");
		return PGCOORD_E_PROTOCOL;
	}
	*out = l;
	return PGCOORD_OK;
}

struct lease_list_box {
	struct pgcoord_lease_list pub; /* first: the caller's pointer */
	struct pgcoord_lease_info *rows;
};

void pgcoord_lease_list_free(struct pgcoord_lease_list *l)
{
	struct lease_list_box *b = (struct lease_list_box *)l;
	if (!b)
		return;
	for (size_t i = 0; b->rows && i < b->pub.count; i++)
		lease_strings_free(&b->rows[i]);
	free(b->rows);
	free(b);
}

pgcoord_err pgcoord_lease_list_get(pgcoord *c, int timeout_ms, struct pgcoord_lease_list **out)
{
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_lease_list(c, timeout_ms, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	struct lease_list_box *b = NULL;
	bool ok = unpack_map(raw, raw_len, &u);
	if (ok) {
		const msgpack_object *ls = pgc_map_get(&u.data, "leases");
		b = calloc(1, sizeof(*b));
		ok = b && ls && ls->type == MSGPACK_OBJECT_ARRAY;
		if (ok) {
			size_t n = ls->via.array.size;
			b->pub.leases = b->rows = calloc(n ? n : 1, sizeof(*b->rows));
			ok = b->rows != NULL;
			for (size_t i = 0; ok && i < n; i++) {
				b->pub.count = i + 1; /* a half-read row is freed too */
				ok = lease_read(&ls->via.array.ptr[i], &b->rows[i]);
			}
		}
		msgpack_unpacked_destroy(&u);
	}
	pgcoord_free(raw);
	if (!ok) {
		pgcoord_lease_list_free(b ? &b->pub : NULL);
		pgcoord__set_message(c,
				     "the lease.list result lacks its leases with their names (or "
				     "memory ran out)");
		return PGCOORD_E_PROTOCOL;
	}
	*out = &b->pub;
	return PGCOORD_OK;
}
