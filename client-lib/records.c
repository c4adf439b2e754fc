/*
 * records.c — typed helpers over pgcoord_call for the record.* methods
 * (PROTOCOL.md, "Records and recovery"): put, update, settle, get and list
 * (raw and typed), and recovery with its opaque outcome.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "typed_read.h"

struct pgcoord_record {
	char *kind;
	char *key;
	char *state;
	bool terminal;
	void *data; /* NULL when the record has none */
	size_t data_len;
	char *permit;
	int64_t owner_session;
	bool owner_live;
	int64_t token;
	int64_t adopted_from;
};

struct pgcoord_recovery {
	bool liveness_read;
	char *reason;
	int64_t left_alone, remaining;
	struct pgcoord_record *records;
	size_t count;
	void *raw;
	size_t raw_len;
};

static bool check_name(pgcoord *c, const char *what, const char *s)
{
	if (!s || !*s) {
		pgcoord__set_message(c, "%s is empty", what);
		return false;
	}
	return true;
}

#define F(...) PGCOORD__FIELD(struct pgcoord_record, __VA_ARGS__)

static const struct pgcoord__field record_fields[] = {
    F("kind", STR, kind, 0, true),
    F("key", STR, key, 0, true),
    F("state", STR, state, 0, true),
    F("terminal", BOOL, terminal, 0, true),
    F("owner_live", BOOL, owner_live, 0, true),
    F("owner_session", INT, owner_session, 0, true),
    F("token", INT, token, 0, true),
    F("adopted_from", INT, adopted_from, 0, false),
    F("permit", STR, permit, 0, false),
};

static void record_clear(struct pgcoord_record *r)
{
	pgcoord__fields_free(record_fields, PGCOORD__NFIELDS(record_fields), r);
	free(r->data);
	memset(r, 0, sizeof(*r));
}

/* A field that must be nil (or absent) when it is not of type t. */
static bool nil_or(const msgpack_object *m, const char *key, msgpack_object_type t)
{
	const msgpack_object *o = pgc_map_get(m, key);
	return !o || o->type == MSGPACK_OBJECT_NIL || o->type == t;
}

/* Reads a record map the agent sent into r (cleared first). False when a
 * field is missing or of the wrong type, or on out of memory. */
static bool record_read(const msgpack_object *m, struct pgcoord_record *r)
{
	const msgpack_object *data;
	memset(r, 0, sizeof(*r));
	if (!pgcoord__fields_read(m, record_fields, PGCOORD__NFIELDS(record_fields), r) ||
	    !nil_or(m, "adopted_from", MSGPACK_OBJECT_POSITIVE_INTEGER) ||
	    !nil_or(m, "permit", MSGPACK_OBJECT_STR) || !nil_or(m, "data", MSGPACK_OBJECT_BIN))
		goto bad;
	data = pgc_map_get(m, "data");
	if (data && data->type == MSGPACK_OBJECT_BIN) {
		r->data_len = data->via.bin.size;
		r->data = malloc(r->data_len ? r->data_len : 1);
		if (!r->data)
			goto bad;
		memcpy(r->data, data->via.bin.ptr, r->data_len);
	}
	return true;
bad:
	record_clear(r);
	return false;
}

/* --- put, update, settle ------------------------------------------------- */

pgcoord_err pgcoord_record_put(pgcoord *c, const char *kind, const char *key, const char *state,
			       const void *data, size_t data_len, const char *permit,
			       int timeout_ms, bool *created, int64_t *token)
{
	struct pgcoord_writer w;
	struct pgcoord_record r;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	bool was_created = false;

	if (created)
		*created = false;
	if (token)
		*token = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_name(c, "the record kind", kind) || !check_name(c, "the record key", key) ||
	    !check_name(c, "the state", state))
		return PGCOORD_E_ARG;
	if (data_len && !data) {
		pgcoord__set_message(c, "data is NULL but data_len is %zu", data_len);
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 3 + (data != NULL) + (permit != NULL));
	pgc_pack_kv_str(&w.pk, "kind", kind);
	pgc_pack_kv_str(&w.pk, "key", key);
	pgc_pack_kv_str(&w.pk, "state", state);
	if (data) {
		pgc_pack_cstr(&w.pk, "data");
		msgpack_pack_bin(&w.pk, data_len);
		msgpack_pack_bin_body(&w.pk, data, data_len);
	}
	if (permit)
		pgc_pack_kv_str(&w.pk, "permit", permit);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "record.put", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	if (!pgc_obj_bool(pgc_map_get(&u.data, "created"), &was_created) ||
	    !record_read(pgc_map_get(&u.data, "record"), &r)) {
		pgcoord__set_message(c, "the record.put result lacks created or a record");
		err = PGCOORD_E_PROTOCOL;
	} else {
		if (created)
			*created = was_created;
		if (token)
			*token = r.token;
		record_clear(&r);
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

pgcoord_err pgcoord_record_update(pgcoord *c, const char *kind, const char *key, const char *state,
				  const void *data, size_t data_len, int64_t token, int timeout_ms)
{
	struct pgcoord_writer w;

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_name(c, "the record kind", kind) || !check_name(c, "the record key", key))
		return PGCOORD_E_ARG;
	if ((!state && !data) || (data_len && !data) || token < 0) {
		pgcoord__set_message(c, "an update needs a state, data or both (and token >= 0)");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2 + (state != NULL) + (data != NULL) + (token > 0));
	pgc_pack_kv_str(&w.pk, "kind", kind);
	pgc_pack_kv_str(&w.pk, "key", key);
	if (state)
		pgc_pack_kv_str(&w.pk, "state", state);
	if (data) {
		pgc_pack_cstr(&w.pk, "data");
		msgpack_pack_bin(&w.pk, data_len);
		msgpack_pack_bin_body(&w.pk, data, data_len);
	}
	if (token > 0)
		pgc_pack_kv_int(&w.pk, "token", token);
	return pgcoord__call_packed(c, "record.update", &w, timeout_ms, NULL, NULL);
}

pgcoord_err pgcoord_record_settle(pgcoord *c, const char *kind, const char *key, const char *state,
				  int64_t token, int timeout_ms)
{
	struct pgcoord_writer w;

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_name(c, "the record kind", kind) || !check_name(c, "the record key", key) ||
	    !check_name(c, "the state", state))
		return PGCOORD_E_ARG;
	if (token < 0) {
		pgcoord__set_message(c, "token must be >= 0 (0: any)");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 3 + (token > 0));
	pgc_pack_kv_str(&w.pk, "kind", kind);
	pgc_pack_kv_str(&w.pk, "key", key);
	pgc_pack_kv_str(&w.pk, "state", state);
	if (token > 0)
		pgc_pack_kv_int(&w.pk, "token", token);
	return pgcoord__call_packed(c, "record.settle", &w, timeout_ms, NULL, NULL);
}

/* --- the same with an options struct ------------------------------------ */

/* The first version's size: older callers never pass less. */
#define RECORD_OPTS_MIN_SIZE (offsetof(struct pgcoord_record_opts, token) + sizeof(int64_t))

void pgcoord_record_opts_init(struct pgcoord_record_opts *opts)
{
	if (opts)
		*opts = (struct pgcoord_record_opts)PGCOORD_RECORD_OPTS_INIT;
}

static bool opts_ok(pgcoord *c, const struct pgcoord_record_opts *opts)
{
	if (!opts || opts->size < RECORD_OPTS_MIN_SIZE) {
		pgcoord__set_message(c, "opts is NULL or its size is smaller than the first "
					"version's (start from PGCOORD_RECORD_OPTS_INIT)");
		return false;
	}
	return true;
}

pgcoord_err pgcoord_record_put_with(pgcoord *c, const char *kind, const char *key,
				    const struct pgcoord_record_opts *opts, int timeout_ms,
				    bool *created, int64_t *token)
{
	if (created)
		*created = false;
	if (token)
		*token = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (!opts_ok(c, opts))
		return PGCOORD_E_ARG;
	if (opts->token != 0) {
		pgcoord__set_message(c, "a put takes no token: the record gets its first one");
		return PGCOORD_E_ARG;
	}
	return pgcoord_record_put(c, kind, key, opts->state, opts->data, opts->data_len,
				  opts->permit, timeout_ms, created, token);
}

pgcoord_err pgcoord_record_update_with(pgcoord *c, const char *kind, const char *key,
				       const struct pgcoord_record_opts *opts, int timeout_ms)
{
	if (!c)
		return PGCOORD_E_ARG;
	if (!opts_ok(c, opts))
		return PGCOORD_E_ARG;
	if (opts->permit) {
		pgcoord__set_message(c, "an update cannot change the record's permit");
		return PGCOORD_E_ARG;
	}
	return pgcoord_record_update(c, kind, key, opts->state, opts->data, opts->data_len,
				     opts->token, timeout_ms);
}

/* --- get, list, accessors ------------------------------------------------- */

static bool record_get_read(const msgpack_object *m, void *box)
{
	return record_read(pgc_map_get(m, "record"), box);
}

static void record_free_box(void *box)
{
	pgcoord_record_free(box);
}

static const struct pgcoord__reply_kind record_kind = {
    sizeof(struct pgcoord_record), record_get_read, record_free_box,
    "the record.get result has no well-formed record"};

pgcoord_err pgcoord_record_get(pgcoord *c, const char *kind, const char *key, int timeout_ms,
			       pgcoord_record **out)
{
	struct pgcoord_writer w;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if (!check_name(c, "the record kind", kind) || !check_name(c, "the record key", key))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2);
	pgc_pack_kv_str(&w.pk, "kind", kind);
	pgc_pack_kv_str(&w.pk, "key", key);
	return pgcoord__typed_call(c, "record.get", &w, timeout_ms, &record_kind, (void **)out);
}

pgcoord_err pgcoord_record_list(pgcoord *c, const char *kind, int64_t owner, unsigned flags,
				int timeout_ms, void **result, size_t *result_len)
{
	const unsigned known =
	    PGCOORD_RECORDS_OPEN | PGCOORD_RECORDS_DEAD_OWNER | PGCOORD_RECORDS_LIVE_OWNER;
	const unsigned both = PGCOORD_RECORDS_DEAD_OWNER | PGCOORD_RECORDS_LIVE_OWNER;
	bool by_live = (flags & both) != 0;
	struct pgcoord_writer w;
	size_t plen;

	if (result)
		*result = NULL;
	if (!c)
		return PGCOORD_E_ARG;
	if (flags & ~known || (flags & both) == both || owner < 0) {
		pgcoord__set_message(c,
				     "unknown flags, both DEAD_OWNER and LIVE_OWNER, or owner < 0");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, (kind != NULL) + (owner > 0) + by_live +
				    ((flags & PGCOORD_RECORDS_OPEN) != 0));
	if (kind)
		pgc_pack_kv_str(&w.pk, "kind", kind);
	if (owner > 0)
		pgc_pack_kv_int(&w.pk, "owner", owner);
	if (by_live)
		pgc_pack_kv_bool(&w.pk, "live_owner", flags & PGCOORD_RECORDS_LIVE_OWNER);
	if (flags & PGCOORD_RECORDS_OPEN)
		pgc_pack_kv_bool(&w.pk, "terminal", false);
	char *params = pgcoord__writer_release(&w, &plen);
	if (!params) {
		pgcoord__set_message(c, "out of memory encoding record.list");
		return PGCOORD_E_NOMEM;
	}
	pgcoord_err err =
	    pgcoord_call(c, "record.list", params, plen, timeout_ms, result, result_len);
	free(params);
	return err;
}

/* A row is a pointer to a record of its own, as record.get's. */
static bool record_row_read(const msgpack_object *m, void *row, const void *arg)
{
	(void)arg;
	struct pgcoord_record **r = row;
	if (!(*r = malloc(sizeof(**r))))
		return false;
	if (record_read(m, *r))
		return true;
	free(*r);
	*r = NULL;
	return false;
}

static void record_row_clear(void *row)
{
	pgcoord_record_free(*(struct pgcoord_record **)row);
}

void pgcoord_record_list_free(struct pgcoord_record_list *l)
{
	if (!l)
		return;
	pgcoord__rows_free((void *)l->records, l->count, sizeof(*l->records), record_row_clear);
	free(l);
}

static bool record_list_read(const msgpack_object *m, void *box)
{
	struct pgcoord_record_list *l = box;
	void *rows;
	bool ok = pgcoord__rows_read(m, "records", sizeof(*l->records), record_row_read, NULL,
				     &rows, &l->count);
	l->records = rows;
	pgc_obj_bool(pgc_map_get(m, "truncated"), &l->truncated);
	l->now_at = pgcoord__int_or(m, "now_at", -1);
	return ok;
}

static void record_list_free_box(void *box)
{
	pgcoord_record_list_free(box);
}

static const struct pgcoord__reply_kind record_list_kind = {
    sizeof(struct pgcoord_record_list), record_list_read, record_list_free_box,
    "the record.list result is not well-formed"};

pgcoord_err pgcoord_record_list_get(pgcoord *c, const char *kind, int64_t owner, unsigned flags,
				    int timeout_ms, struct pgcoord_record_list **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_record_list(c, kind, owner, flags, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, &record_list_kind, (void **)out);
}

const char *pgcoord_record_get_kind(const pgcoord_record *r)
{
	return r ? r->kind : NULL;
}

const char *pgcoord_record_get_key(const pgcoord_record *r)
{
	return r ? r->key : NULL;
}

const char *pgcoord_record_get_state(const pgcoord_record *r)
{
	return r ? r->state : NULL;
}

bool pgcoord_record_get_terminal(const pgcoord_record *r)
{
	return r && r->terminal;
}

const void *pgcoord_record_get_data(const pgcoord_record *r, size_t *len)
{
	if (len)
		*len = r && r->data ? r->data_len : 0;
	return r ? r->data : NULL;
}

const char *pgcoord_record_get_permit(const pgcoord_record *r)
{
	return r ? r->permit : NULL;
}

int64_t pgcoord_record_get_owner_session(const pgcoord_record *r)
{
	return r ? r->owner_session : 0;
}

bool pgcoord_record_get_owner_live(const pgcoord_record *r)
{
	return r && r->owner_live;
}

int64_t pgcoord_record_get_token(const pgcoord_record *r)
{
	return r ? r->token : 0;
}

int64_t pgcoord_record_get_adopted_from(const pgcoord_record *r)
{
	return r ? r->adopted_from : 0;
}

void pgcoord_record_free(pgcoord_record *r)
{
	if (!r)
		return;
	record_clear(r);
	free(r);
}

/* --- recover --------------------------------------------------------------- */

static bool recovery_row_read(const msgpack_object *m, void *row, const void *arg)
{
	(void)arg;
	return record_read(m, row); /* clears a half-read row itself */
}

/* Reads record.recover's result map into rv. */
static bool recovery_read(const msgpack_object *m, struct pgcoord_recovery *rv)
{
	const msgpack_object *adopted = pgc_map_get(m, "adopted"), *reason;

	if (!pgc_obj_bool(pgc_map_get(m, "liveness_read"), &rv->liveness_read) || !adopted ||
	    adopted->type != MSGPACK_OBJECT_ARRAY)
		return false;
	rv->left_alone = rv->remaining = -1;
	if (!rv->liveness_read) {
		reason = pgc_map_get(m, "reason");
		rv->reason = pgc_obj_strdup(reason);
		return rv->reason && adopted->via.array.size == 0;
	}
	if (!pgc_obj_int64(pgc_map_get(m, "left_alone"), &rv->left_alone) ||
	    !pgc_obj_int64(pgc_map_get(m, "remaining"), &rv->remaining))
		return false;
	void *rows;
	bool ok = pgcoord__rows_read(m, "adopted", sizeof(*rv->records), recovery_row_read, NULL,
				     &rows, &rv->count);
	rv->records = rows;
	return ok;
}

pgcoord_err pgcoord_record_recover(pgcoord *c, const char *const *kinds, size_t nkinds,
				   int32_t limit, unsigned flags, int timeout_ms,
				   pgcoord_recovery **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if ((nkinds && !kinds) || limit < 0 || flags & ~PGCOORD_RECOVER_DRY_RUN) {
		pgcoord__set_message(c,
				     "kinds is NULL with nkinds > 0, limit < 0, or unknown flags");
		return PGCOORD_E_ARG;
	}
	for (size_t i = 0; i < nkinds; i++)
		if (!check_name(c, "a kind", kinds[i]))
			return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1 + (nkinds > 0) + (limit > 0));
	pgc_pack_kv_bool(&w.pk, "dry_run", flags & PGCOORD_RECOVER_DRY_RUN);
	if (nkinds) {
		pgc_pack_cstr(&w.pk, "kinds");
		msgpack_pack_array(&w.pk, nkinds);
		for (size_t i = 0; i < nkinds; i++)
			pgc_pack_cstr(&w.pk, kinds[i]);
	}
	if (limit > 0)
		pgc_pack_kv_int(&w.pk, "limit", limit);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "record.recover", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	struct pgcoord_recovery *rv = calloc(1, sizeof(*rv));
	if (!rv) {
		pgcoord__set_message(c, "out of memory");
		err = PGCOORD_E_NOMEM;
	} else if (!recovery_read(&u.data, rv)) {
		pgcoord__set_message(c, "the record.recover result is not well-formed");
		err = PGCOORD_E_PROTOCOL;
	} else {
		rv->raw = raw;
		rv->raw_len = raw_len;
		raw = NULL;
		*out = rv;
		rv = NULL;
	}
	pgcoord_recovery_free(rv);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

void pgcoord_recover_opts_init(struct pgcoord_recover_opts *opts)
{
	if (opts)
		*opts = (struct pgcoord_recover_opts)PGCOORD_RECOVER_OPTS_INIT;
}

pgcoord_err pgcoord_record_recover_with(pgcoord *c, const struct pgcoord_recover_opts *opts,
					int timeout_ms, pgcoord_recovery **out)
{
	const size_t first_size = offsetof(struct pgcoord_recover_opts, flags) + sizeof(unsigned);

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if (!opts || opts->size < first_size) {
		pgcoord__set_message(c, "opts is NULL or its size is smaller than the first "
					"version's (start from PGCOORD_RECOVER_OPTS_INIT)");
		return PGCOORD_E_ARG;
	}
	return pgcoord_record_recover(c, opts->kinds, opts->nkinds, opts->limit, opts->flags,
				      timeout_ms, out);
}

bool pgcoord_recovery_liveness_read(const pgcoord_recovery *rv)
{
	return rv && rv->liveness_read;
}

const char *pgcoord_recovery_reason(const pgcoord_recovery *rv)
{
	return rv ? rv->reason : NULL;
}

size_t pgcoord_recovery_count(const pgcoord_recovery *rv)
{
	return rv ? rv->count : 0;
}

const pgcoord_record *pgcoord_recovery_record(const pgcoord_recovery *rv, size_t i)
{
	return rv && i < rv->count ? &rv->records[i] : NULL;
}

int64_t pgcoord_recovery_left_alone(const pgcoord_recovery *rv)
{
	return rv ? rv->left_alone : -1;
}

int64_t pgcoord_recovery_remaining(const pgcoord_recovery *rv)
{
	return rv ? rv->remaining : -1;
}

const void *pgcoord_recovery_result(const pgcoord_recovery *rv, size_t *len)
{
	if (len)
		*len = rv ? rv->raw_len : 0;
	return rv ? rv->raw : NULL;
}

void pgcoord_recovery_free(pgcoord_recovery *rv)
{
	if (!rv)
		return;
	for (size_t i = 0; i < rv->count; i++)
		record_clear(&rv->records[i]);
	free(rv->records);
	free(rv->reason);
	pgcoord_free(rv->raw);
	free(rv);
}
