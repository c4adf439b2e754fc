/*
 * typed_reads.c — the permit and quota reads as C structs: permit.get as
 * struct pgcoord_permit_info, permit.list as rows of it, permit.history as
 * struct pgcoord_permit_history, quota.get and quota.list as struct
 * pgcoord_quota_info. Each struct is allocated by the library inside a box
 * that also owns its strings, so one free function releases everything.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "typed_read.h"

/* --- permit.get ----------------------------------------------------------- */

#define PF(...) PGCOORD__FIELD(struct pgcoord_permit_info, __VA_ARGS__)

static const struct pgcoord__field permit_fields[] = {
    PF("id", STR, id, 0, true),
    PF("state", STR, state, 0, true),
    PF("phase", STR, phase, 0, false),
    PF("owner_replica", STR, owner_replica, 0, false),
    PF("on_owner_loss", STR, on_owner_loss, 0, false),
    PF("uncertain_reason", STR, uncertain_reason, 0, false),
    PF("token", INT, token, 0, false),
    PF("owner_session", INT, owner_session, 0, false),
    PF("owner_live", BOOL, owner_live, 0, false),
    PF("redacted", BOOL, redacted, 0, false),
    PF("created_at", INT, created_at, -1, false),
    PF("phase_at", INT, phase_at, -1, false),
    PF("state_at", INT, state_at, -1, false),
    PF("released_at", INT, released_at, -1, false),
};

struct permit_box {
	struct pgcoord_permit_info pub; /* first: the caller's pointer */
	char **keys;
	int32_t *weights;
	void *intent;
};

void pgcoord_permit_info_free(struct pgcoord_permit_info *p)
{
	struct permit_box *b = (struct permit_box *)p;
	if (!b)
		return;
	pgcoord__fields_free(permit_fields, PGCOORD__NFIELDS(permit_fields), &b->pub);
	for (size_t i = 0; b->keys && i < b->pub.nquotas; i++)
		free(b->keys[i]);
	free(b->keys);
	free(b->weights);
	free(b->intent);
	free(b);
}

/* quotas: [{key, weight}], kept as two parallel arrays. */
static bool permit_quotas(struct permit_box *b, const msgpack_object *quotas)
{
	if (!quotas || quotas->type != MSGPACK_OBJECT_ARRAY)
		return false;
	size_t n = quotas->via.array.size;
	b->keys = calloc(n ? n : 1, sizeof(char *));
	b->weights = calloc(n ? n : 1, sizeof(int32_t));
	if (!b->keys || !b->weights)
		return false;
	b->pub.nquotas = n;
	for (size_t i = 0; i < n; i++) {
		const msgpack_object *q = &quotas->via.array.ptr[i];
		int64_t w;
		b->keys[i] = pgc_obj_strdup(pgc_map_get(q, "key"));
		if (!b->keys[i] || !pgc_obj_int64(pgc_map_get(q, "weight"), &w))
			return false;
		b->weights[i] = (int32_t)w;
	}
	b->pub.quota_keys = (const char *const *)b->keys;
	b->pub.quota_weights = b->weights;
	return true;
}

/* bin, or str from an agent that sent the bytes as text: the same layout. */
static bool permit_intent(struct permit_box *b, const msgpack_object *intent)
{
	if (!intent || (intent->type != MSGPACK_OBJECT_BIN && intent->type != MSGPACK_OBJECT_STR))
		return true;
	size_t n = intent->via.bin.size;
	if (!(b->intent = malloc(n ? n : 1)))
		return false;
	memcpy(b->intent, intent->via.bin.ptr, n);
	b->pub.intent = b->intent;
	b->pub.intent_len = n;
	return true;
}

/* One permit map into a box already allocated (zeroed). */
static bool permit_read(const msgpack_object *pm, struct permit_box *b)
{
	return pgcoord__fields_read(pm, permit_fields, PGCOORD__NFIELDS(permit_fields), &b->pub) &&
	       permit_intent(b, pgc_map_get(pm, "intent")) &&
	       permit_quotas(b, pgc_map_get(pm, "quotas"));
}

static bool permit_get_read(const msgpack_object *m, void *box)
{
	struct permit_box *b = box;
	b->pub.now_at = pgcoord__int_or(m, "now_at", -1);
	return permit_read(pgc_map_get(m, "permit"), b);
}

static void permit_free_box(void *box)
{
	pgcoord_permit_info_free(box);
}

static const struct pgcoord__reply_kind permit_kind = {
    sizeof(struct permit_box), permit_get_read, permit_free_box,
    "the permit.get result lacks a permit with id, state and quotas"};

pgcoord_err pgcoord_permit_info_get(pgcoord *c, const char *id, int timeout_ms,
				    struct pgcoord_permit_info **out)
{
	struct pgcoord_writer w;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if (!id || !*id) {
		pgcoord__set_message(c, "the permit id is empty");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "id", id);
	return pgcoord__typed_call(c, "permit.get", &w, timeout_ms, &permit_kind, (void **)out);
}

/* --- permit.list ----------------------------------------------------------- */

/* A row is a pointer to a permit box of its own, as permit.get's. */
static bool permit_row_read(const msgpack_object *m, void *row, const void *arg)
{
	(void)arg;
	struct permit_box **b = row;
	return (*b = calloc(1, sizeof(**b))) && permit_read(m, *b);
}

static void permit_row_clear(void *row)
{
	pgcoord_permit_info_free(*(struct pgcoord_permit_info **)row);
}

void pgcoord_permit_list_free(struct pgcoord_permit_list *l)
{
	if (!l)
		return;
	pgcoord__rows_free((void *)l->permits, l->count, sizeof(*l->permits), permit_row_clear);
	free(l);
}

static bool permit_list_read(const msgpack_object *m, void *box)
{
	struct pgcoord_permit_list *l = box;
	void *rows;
	bool ok = pgcoord__rows_read(m, "permits", sizeof(*l->permits), permit_row_read, NULL,
				     &rows, &l->count);
	l->permits = rows;
	l->now_at = pgcoord__int_or(m, "now_at", -1);
	pgc_obj_bool(pgc_map_get(m, "truncated"), &l->truncated);
	for (size_t i = 0; ok && i < l->count; i++)
		((struct pgcoord_permit_info **)rows)[i]->now_at = l->now_at;
	return ok;
}

static void permit_list_free_box(void *box)
{
	pgcoord_permit_list_free(box);
}

static const struct pgcoord__reply_kind permit_list_kind = {
    sizeof(struct pgcoord_permit_list), permit_list_read, permit_list_free_box,
    "the permit.list result lacks its permits with id, state and quotas"};

pgcoord_err pgcoord_permit_list_get(pgcoord *c, const char *quota, const char *state,
				    int timeout_ms, struct pgcoord_permit_list **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_permit_list(c, quota, state, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, &permit_list_kind, (void **)out);
}

/* --- quota.get and quota.list --------------------------------------------- */

#define QF(...) PGCOORD__FIELD(struct pgcoord_quota_info, __VA_ARGS__)

static const struct pgcoord__field quota_fields[] = {
    QF("key", STR, key, 0, true),
    QF("limit", INT, limit, -1, false),
    QF("in_flight", INT, in_flight, -1, false),
    QF("held", INT, held, -1, false),
    QF("uncertain", INT, uncertain, -1, false),
    QF("available", INT, available, -1, false),
    QF("permits", INT, permits, -1, false),
    QF("lapse_after_s", INT, lapse_after_s, -1, false),
    QF("created_at", INT, created_at, -1, false),
    QF("updated_at", INT, updated_at, -1, false),
};

static const struct pgcoord__row_kind quota_row =
    PGCOORD__ROW_KIND(struct pgcoord_quota_info, quota_fields);

static bool quota_read(const msgpack_object *m, void *row)
{
	return pgcoord__fields_read(m, quota_fields, PGCOORD__NFIELDS(quota_fields), row);
}

static void quota_clear(void *row)
{
	pgcoord__fields_free(quota_fields, PGCOORD__NFIELDS(quota_fields), row);
}

void pgcoord_quota_info_free(struct pgcoord_quota_info *q)
{
	quota_clear(q);
	free(q);
}

static bool quota_get_read(const msgpack_object *m, void *box)
{
	return quota_read(pgc_map_get(m, "quota"), box);
}

static void quota_free_box(void *box)
{
	pgcoord_quota_info_free(box);
}

static const struct pgcoord__reply_kind quota_kind = {
    sizeof(struct pgcoord_quota_info), quota_get_read, quota_free_box,
    "the quota.get result lacks a quota with its key"};

pgcoord_err pgcoord_quota_info_get(pgcoord *c, const char *key, int timeout_ms,
				   struct pgcoord_quota_info **out)
{
	struct pgcoord_writer w;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if (!key || !*key) {
		pgcoord__set_message(c, "the quota key is empty");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "key", key);
	return pgcoord__typed_call(c, "quota.get", &w, timeout_ms, &quota_kind, (void **)out);
}

void pgcoord_quota_list_free(struct pgcoord_quota_list *l)
{
	if (!l)
		return;
	pgcoord__table_free((void *)l->rows, l->count, &quota_row);
	free(l);
}

static bool quota_list_read(const msgpack_object *m, void *box)
{
	struct pgcoord_quota_list *l = box;
	void *rows;
	bool ok = pgcoord__table_read(m, "quotas", &quota_row, &rows, &l->count);
	l->rows = rows;
	l->now_at = pgcoord__int_or(m, "now_at", -1);
	return ok;
}

static void quota_list_free_box(void *box)
{
	pgcoord_quota_list_free(box);
}

static const struct pgcoord__reply_kind quota_list_kind = {
    sizeof(struct pgcoord_quota_list), quota_list_read, quota_list_free_box,
    "the quota.list result lacks its quotas with their keys"};

pgcoord_err pgcoord_quota_list_get(pgcoord *c, int timeout_ms, struct pgcoord_quota_list **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_quota_list(c, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, &quota_list_kind, (void **)out);
}

/* --- permit.history -------------------------------------------------------- */

#define HF(...) PGCOORD__FIELD(struct pgcoord_permit_history_event, __VA_ARGS__)

static const struct pgcoord__field event_fields[] = {
    HF("seq", INT, seq, -1, false),    HF("event", STR, event, 0, true),
    HF("quota", STR, quota, 0, false), HF("delta", INT, delta, 0, false),
    HF("actor", STR, actor, 0, false), HF("reason", STR, reason, 0, false),
    HF("state", STR, state, 0, false), HF("phase", STR, phase, 0, false),
    HF("at", INT, at, -1, false),
};

static const struct pgcoord__row_kind event_row =
    PGCOORD__ROW_KIND(struct pgcoord_permit_history_event, event_fields);

void pgcoord_permit_history_free(struct pgcoord_permit_history *h)
{
	if (!h)
		return;
	pgcoord__table_free((void *)h->events, h->count, &event_row);
	free((char *)h->id); /* the library's own copy */
	free(h);
}

static bool history_read(const msgpack_object *m, void *box)
{
	struct pgcoord_permit_history *h = box;
	const msgpack_object *id = pgc_map_get(m, "id");
	void *rows;
	bool ok = pgcoord__table_read(m, "events", &event_row, &rows, &h->count);
	h->events = rows;
	h->now_at = pgcoord__int_or(m, "now_at", -1);
	return ok && id && id->type == MSGPACK_OBJECT_STR && (h->id = pgc_obj_strdup(id));
}

static void history_free_box(void *box)
{
	pgcoord_permit_history_free(box);
}

static const struct pgcoord__reply_kind history_kind = {
    sizeof(struct pgcoord_permit_history), history_read, history_free_box,
    "the permit.history result lacks its id or events"};

pgcoord_err pgcoord_permit_history_get(pgcoord *c, const char *id, int timeout_ms,
				       struct pgcoord_permit_history **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_permit_history(c, id, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, &history_kind, (void **)out);
}

/* --- permit.check ---------------------------------------------------------- */

#define VF(...) PGCOORD__FIELD(struct pgcoord_check_violation, __VA_ARGS__)

static const struct pgcoord__field violation_fields[] = {
    VF("key", STR, key, 0, true),
    VF("limit", INT, limit, -1, false),
    VF("in_flight", INT, in_flight, -1, false),
    VF("permit_weights", INT, permit_weights, -1, false),
    VF("audit_sum", INT, audit_sum, -1, false),
    VF("problem", STR, problem, 0, false),
};

#define SQF(...) PGCOORD__FIELD(struct pgcoord_check_stall, __VA_ARGS__)

static const struct pgcoord__field stall_fields[] = {
    SQF("key", STR, key, 0, true),
    SQF("head_id", STR, head_id, 0, false),
    SQF("head_age_ms", INT, head_age_ms, -1, false),
};

static const struct pgcoord__row_kind violation_row =
    PGCOORD__ROW_KIND(struct pgcoord_check_violation, violation_fields);

static const struct pgcoord__row_kind stall_row =
    PGCOORD__ROW_KIND(struct pgcoord_check_stall, stall_fields);

void pgcoord_check_report_free(struct pgcoord_check_report *r)
{
	if (!r)
		return;
	pgcoord__table_free((void *)r->violations, r->nviolations, &violation_row);
	pgcoord__table_free((void *)r->stalled_queues, r->nstalled, &stall_row);
	free(r);
}

static bool check_read(const msgpack_object *m, void *box)
{
	struct pgcoord_check_report *r = box;
	void *violations = NULL, *stalled = NULL;
	bool ok =
	    pgc_obj_bool(pgc_map_get(m, "ok"), &r->ok) &&
	    pgcoord__table_read(m, "violations", &violation_row, &violations, &r->nviolations);
	r->violations = violations;
	/* an agent from before stalled queues were reported sends none */
	if (ok && pgc_map_get(m, "stalled_queues")) {
		ok = pgcoord__table_read(m, "stalled_queues", &stall_row, &stalled, &r->nstalled);
		r->stalled_queues = stalled;
	}
	r->quotas = pgcoord__int_or(m, "quotas", -1);
	r->now_at = pgcoord__int_or(m, "now_at", -1);
	return ok;
}

static void check_free_box(void *box)
{
	pgcoord_check_report_free(box);
}

static const struct pgcoord__reply_kind check_kind = {
    sizeof(struct pgcoord_check_report), check_read, check_free_box,
    "the permit.check result lacks ok or its violations"};

pgcoord_err pgcoord_permit_check_get(pgcoord *c, int timeout_ms, struct pgcoord_check_report **out)
{
	return pgcoord__typed_get(c, "permit.check", timeout_ms, &check_kind, (void **)out);
}
