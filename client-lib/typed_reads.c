/*
 * typed_reads.c — the permit and quota reads as C structs: permit.get as
 * struct pgcoord_permit_info, permit.list as rows of it, permit.history as
 * struct pgcoord_permit_history, quota.get and quota.list as struct
 * pgcoord_quota_info. Each
 * struct is allocated by the library inside a box that also owns its
 * strings, so one free function releases everything.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

/* --- helpers ------------------------------------------------------------- */

static int64_t int_or(const msgpack_object *map, const char *key, int64_t dflt)
{
	int64_t v;
	return pgc_obj_int64(pgc_map_get(map, key), &v) ? v : dflt;
}

static bool bool_or_false(const msgpack_object *map, const char *key)
{
	bool v = false;
	pgc_obj_bool(pgc_map_get(map, key), &v);
	return v;
}

/* A string field, copied; NULL when absent or nil. *ok false when memory ran out. */
static char *str_copy(const msgpack_object *map, const char *key, bool *ok)
{
	const msgpack_object *o = pgc_map_get(map, key);
	if (!o || o->type != MSGPACK_OBJECT_STR)
		return NULL;
	char *s = pgc_obj_strdup(o);
	if (!s)
		*ok = false;
	return s;
}

/* Decodes a raw result (as pgcoord_call returns it) that must be a map. */
static bool unpack_map(const void *raw, size_t len, msgpack_unpacked *u)
{
	msgpack_unpacked_init(u);
	if (msgpack_unpack_next(u, raw, len, NULL) == MSGPACK_UNPACK_SUCCESS &&
	    u->data.type == MSGPACK_OBJECT_MAP)
		return true;
	msgpack_unpacked_destroy(u);
	return false;
}

/* --- permit.get ----------------------------------------------------------- */

#define PERMIT_STRS 6

struct permit_box {
	struct pgcoord_permit_info pub; /* first: the caller's pointer */
	char *strs[PERMIT_STRS];
	char **keys;
	int32_t *weights;
	void *intent;
};

void pgcoord_permit_info_free(struct pgcoord_permit_info *p)
{
	struct permit_box *b = (struct permit_box *)p;
	if (!b)
		return;
	for (size_t i = 0; i < PERMIT_STRS; i++)
		free(b->strs[i]);
	for (size_t i = 0; b->keys && i < b->pub.nquotas; i++)
		free(b->keys[i]);
	free(b->keys);
	free(b->weights);
	free(b->intent);
	free(b);
}

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

static struct permit_box *permit_from(const msgpack_object *pm, int64_t now_at)
{
	struct permit_box *b = calloc(1, sizeof(*b));
	bool ok = true;
	if (!b)
		return NULL;
	struct pgcoord_permit_info *p = &b->pub;
	p->id = b->strs[0] = str_copy(pm, "id", &ok);
	p->state = b->strs[1] = str_copy(pm, "state", &ok);
	p->phase = b->strs[2] = str_copy(pm, "phase", &ok);
	p->owner_replica = b->strs[3] = str_copy(pm, "owner_replica", &ok);
	p->on_owner_loss = b->strs[4] = str_copy(pm, "on_owner_loss", &ok);
	p->uncertain_reason = b->strs[5] = str_copy(pm, "uncertain_reason", &ok);
	p->token = int_or(pm, "token", 0);
	p->owner_session = int_or(pm, "owner_session", 0);
	p->owner_live = bool_or_false(pm, "owner_live");
	p->redacted = bool_or_false(pm, "redacted");
	p->created_at = int_or(pm, "created_at", -1);
	p->phase_at = int_or(pm, "phase_at", -1);
	p->state_at = int_or(pm, "state_at", -1);
	p->released_at = int_or(pm, "released_at", -1);
	p->now_at = now_at;

	const msgpack_object *intent = pgc_map_get(pm, "intent");
	if (intent && (intent->type == MSGPACK_OBJECT_BIN || intent->type == MSGPACK_OBJECT_STR)) {
		size_t n = intent->via.bin.size; /* bin and str share the layout */
		b->intent = malloc(n ? n : 1);
		if (b->intent) {
			memcpy(b->intent, intent->via.bin.ptr, n);
			p->intent = b->intent;
			p->intent_len = n;
		} else {
			ok = false;
		}
	}
	if (!ok || !p->id || !p->state || !permit_quotas(b, pgc_map_get(pm, "quotas"))) {
		pgcoord_permit_info_free(&b->pub);
		return NULL;
	}
	return b;
}

pgcoord_err pgcoord_permit_info_get(pgcoord *c, const char *id, int timeout_ms,
				    struct pgcoord_permit_info **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

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
	pgcoord_err err =
	    pgcoord__call_decoded(c, "permit.get", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	const msgpack_object *pm = pgc_map_get(&u.data, "permit");
	struct permit_box *b = NULL;
	if (pm && pm->type == MSGPACK_OBJECT_MAP)
		b = permit_from(pm, int_or(&u.data, "now_at", -1));
	if (b) {
		*out = &b->pub;
	} else {
		pgcoord__set_message(c, "the permit.get result lacks a permit with id, state and "
					"quotas (or memory ran out)");
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

/* --- quota.get and quota.list --------------------------------------------- */

/* Reads one QUOTA map into r; false without a key or on out of memory. */
static bool quota_read(const msgpack_object *q, struct pgcoord_quota_info *r)
{
	r->key = pgc_obj_strdup(pgc_map_get(q, "key"));
	r->limit = int_or(q, "limit", -1);
	r->in_flight = int_or(q, "in_flight", -1);
	r->held = int_or(q, "held", -1);
	r->uncertain = int_or(q, "uncertain", -1);
	r->available = int_or(q, "available", -1);
	r->permits = int_or(q, "permits", -1);
	r->lapse_after_s = int_or(q, "lapse_after_s", -1);
	r->created_at = int_or(q, "created_at", -1);
	r->updated_at = int_or(q, "updated_at", -1);
	return r->key != NULL;
}

void pgcoord_quota_info_free(struct pgcoord_quota_info *q)
{
	if (!q)
		return;
	free((char *)q->key); /* the library's own copy */
	free(q);
}

pgcoord_err pgcoord_quota_info_get(pgcoord *c, const char *key, int timeout_ms,
				   struct pgcoord_quota_info **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

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
	pgcoord_err err = pgcoord__call_decoded(c, "quota.get", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	const msgpack_object *qm = pgc_map_get(&u.data, "quota");
	struct pgcoord_quota_info *q = calloc(1, sizeof(*q));
	if (q && qm && qm->type == MSGPACK_OBJECT_MAP && quota_read(qm, q)) {
		*out = q;
	} else {
		pgcoord_quota_info_free(q);
		pgcoord__set_message(c, "the quota.get result lacks a quota with its key (or "
					"memory ran out)");
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

struct quota_list_box {
	struct pgcoord_quota_list pub; /* first: the caller's pointer */
	struct pgcoord_quota_info *rows;
};

void pgcoord_quota_list_free(struct pgcoord_quota_list *l)
{
	struct quota_list_box *b = (struct quota_list_box *)l;
	if (!b)
		return;
	for (size_t i = 0; b->rows && i < b->pub.count; i++)
		free((char *)b->rows[i].key); /* the library's own copy */
	free(b->rows);
	free(b);
}

pgcoord_err pgcoord_quota_list_get(pgcoord *c, int timeout_ms, struct pgcoord_quota_list **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 0);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "quota.list", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;

	const msgpack_object *qs = pgc_map_get(&u.data, "quotas");
	struct quota_list_box *b = calloc(1, sizeof(*b));
	bool ok = b && qs && qs->type == MSGPACK_OBJECT_ARRAY;
	if (ok) {
		size_t n = qs->via.array.size;
		b->rows = calloc(n ? n : 1, sizeof(*b->rows));
		ok = b->rows != NULL;
		b->pub.rows = b->rows;
		b->pub.now_at = int_or(&u.data, "now_at", -1);
		for (size_t i = 0; ok && i < n; i++) {
			b->pub.count = i + 1;
			ok = quota_read(&qs->via.array.ptr[i], &b->rows[i]);
		}
	}
	if (ok) {
		*out = &b->pub;
	} else {
		pgcoord_quota_list_free(b ? &b->pub : NULL);
		pgcoord__set_message(c,
				     "the quota.list result lacks its quotas with their keys (or "
				     "memory ran out)");
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

/* --- permit.list ----------------------------------------------------------- */

struct permit_list_box {
	struct pgcoord_permit_list pub; /* first: the caller's pointer */
	struct permit_box **rows;
};

void pgcoord_permit_list_free(struct pgcoord_permit_list *l)
{
	struct permit_list_box *b = (struct permit_list_box *)l;
	if (!b)
		return;
	for (size_t i = 0; b->rows && i < b->pub.count; i++)
		pgcoord_permit_info_free(&b->rows[i]->pub);
	free(b->rows);
	free(b);
}

pgcoord_err pgcoord_permit_list_get(pgcoord *c, const char *quota, const char *state,
				    int timeout_ms, struct pgcoord_permit_list **out)
{
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_permit_list(c, quota, state, timeout_ms, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	struct permit_list_box *b = NULL;
	bool ok = unpack_map(raw, raw_len, &u);
	if (ok) {
		const msgpack_object *ps = pgc_map_get(&u.data, "permits");
		int64_t now_at = int_or(&u.data, "now_at", -1);
		b = calloc(1, sizeof(*b));
		ok = b && ps && ps->type == MSGPACK_OBJECT_ARRAY;
		if (ok) {
			size_t n = ps->via.array.size;
			b->rows = calloc(n ? n : 1, sizeof(*b->rows));
			ok = b->rows != NULL;
			b->pub.permits = (const struct pgcoord_permit_info *const *)b->rows;
			b->pub.truncated = bool_or_false(&u.data, "truncated");
			b->pub.now_at = now_at;
			for (size_t i = 0; ok && i < n; i++) {
				b->rows[i] = permit_from(&ps->via.array.ptr[i], now_at);
				ok = b->rows[i] != NULL;
				b->pub.count = ok ? i + 1 : i;
			}
		}
		msgpack_unpacked_destroy(&u);
	}
	pgcoord_free(raw);
	if (!ok) {
		pgcoord_permit_list_free(b ? &b->pub : NULL);
		pgcoord__set_message(c, "the permit.list result lacks its permits with id, state "
					"and quotas (or memory ran out)");
		return PGCOORD_E_PROTOCOL;
	}
	*out = &b->pub;
	return PGCOORD_OK;
}

/* --- permit.history -------------------------------------------------------- */

struct permit_history_box {
	struct pgcoord_permit_history pub; /* first: the caller's pointer */
	char *id;
	struct pgcoord_permit_history_event *events;
};

void pgcoord_permit_history_free(struct pgcoord_permit_history *h)
{
	struct permit_history_box *b = (struct permit_history_box *)h;
	if (!b)
		return;
	for (size_t i = 0; b->events && i < b->pub.count; i++) {
		struct pgcoord_permit_history_event *e = &b->events[i];
		/* the library's own copies */
		free((char *)e->event);
		free((char *)e->quota);
		free((char *)e->actor);
		free((char *)e->reason);
		free((char *)e->state);
		free((char *)e->phase);
	}
	free(b->events);
	free(b->id);
	free(b);
}

static bool history_event(const msgpack_object *m, struct pgcoord_permit_history_event *e)
{
	bool ok = true;
	e->seq = int_or(m, "seq", -1);
	e->event = str_copy(m, "event", &ok);
	e->quota = str_copy(m, "quota", &ok);
	e->delta = int_or(m, "delta", 0);
	e->actor = str_copy(m, "actor", &ok);
	e->reason = str_copy(m, "reason", &ok);
	e->state = str_copy(m, "state", &ok);
	e->phase = str_copy(m, "phase", &ok);
	e->at = int_or(m, "at", -1);
	return ok && e->event;
}

pgcoord_err pgcoord_permit_history_get(pgcoord *c, const char *id, int timeout_ms,
				       struct pgcoord_permit_history **out)
{
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_permit_history(c, id, timeout_ms, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	struct permit_history_box *b = NULL;
	bool ok = unpack_map(raw, raw_len, &u);
	if (ok) {
		const msgpack_object *es = pgc_map_get(&u.data, "events");
		b = calloc(1, sizeof(*b));
		ok = b && es && es->type == MSGPACK_OBJECT_ARRAY;
		if (ok) {
			size_t n = es->via.array.size;
			b->pub.id = b->id = str_copy(&u.data, "id", &ok);
			b->events = calloc(n ? n : 1, sizeof(*b->events));
			ok = ok && b->id && b->events;
			b->pub.events = b->events;
			b->pub.now_at = int_or(&u.data, "now_at", -1);
			for (size_t i = 0; ok && i < n; i++) {
				b->pub.count = i + 1; /* freed on failure too */
				ok = history_event(&es->via.array.ptr[i], &b->events[i]);
			}
		}
		msgpack_unpacked_destroy(&u);
	}
	pgcoord_free(raw);
	if (!ok) {
		pgcoord_permit_history_free(b ? &b->pub : NULL);
		pgcoord__set_message(c, "the permit.history result lacks its id or events (or "
					"memory ran out)");
		return PGCOORD_E_PROTOCOL;
	}
	*out = &b->pub;
	return PGCOORD_OK;
}
