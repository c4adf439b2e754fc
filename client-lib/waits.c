/*
 * waits.c — the outcomes of queued claims (PROTOCOL.md, "Waiting claims"):
 * permit.admitted and permit.expired decoded into struct
 * pgcoord_permit_event, and pgcoord_permit_await, which blocks until the
 * outcome of one id arrives and cancels the claim when it does not in time.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

/* How long the await's own permit.cancel may take after its timeout. */
#define AWAIT_CANCEL_MS 5000

static const char *const admitted_method = "permit.admitted";
static const char *const expired_method = "permit.expired";

void pgcoord_permit_event_free(struct pgcoord_permit_event *ev)
{
	if (!ev)
		return;
	/* every string of an event is the library's own copy */
	free((char *)ev->id);
	free((char *)ev->state);
	free((char *)ev->phase);
	free((char *)ev->owner_replica);
	free((char *)ev->reason);
	free(ev);
}

static struct pgcoord_permit_event *event_new(pgcoord_permit_event_kind kind)
{
	struct pgcoord_permit_event *ev = calloc(1, sizeof(*ev));
	if (!ev)
		return NULL;
	ev->kind = kind;
	ev->token = ev->owner_session = ev->created_at = ev->queued_ms = ev->now_at = -1;
	return ev;
}

/* An optional int field: -1 when absent or nil. */
static int64_t int_or_minus1(const msgpack_object *map, const char *key)
{
	int64_t v;
	return pgc_obj_int64(pgc_map_get(map, key), &v) ? v : -1;
}

/* An optional string field: NULL when absent or not a string; *ok false
 * when the copy failed for memory. */
static const char *str_or_null(const msgpack_object *map, const char *key, bool *ok)
{
	const msgpack_object *o = pgc_map_get(map, key);
	if (!o || o->type != MSGPACK_OBJECT_STR)
		return NULL;
	char *s = pgc_obj_strdup(o);
	if (!s)
		*ok = false;
	return s;
}

/* From a permit.admitted params map, or from permit.get's PERMIT (then
 * queued_ms stays -1). NULL without an id and a token. */
static struct pgcoord_permit_event *admission_from(const msgpack_object *map)
{
	struct pgcoord_permit_event *ev = event_new(PGCOORD_PERMIT_ADMITTED);
	bool ok = true;
	if (!ev)
		return NULL;
	ev->id = str_or_null(map, "id", &ok);
	ev->state = str_or_null(map, "state", &ok);
	ev->phase = str_or_null(map, "phase", &ok);
	ev->owner_replica = str_or_null(map, "owner_replica", &ok);
	ev->token = int_or_minus1(map, "token");
	ev->owner_session = int_or_minus1(map, "owner_session");
	ev->created_at = int_or_minus1(map, "created_at");
	ev->queued_ms = int_or_minus1(map, "queued_ms");
	ev->now_at = int_or_minus1(map, "now_at");
	if (!ok || !ev->id || ev->token < 0) {
		pgcoord_permit_event_free(ev);
		return NULL;
	}
	return ev;
}

static struct pgcoord_permit_event *expiry(const char *id, const char *reason, int64_t now_at)
{
	struct pgcoord_permit_event *ev = event_new(PGCOORD_PERMIT_EXPIRED);
	if (!ev)
		return NULL;
	ev->id = strdup(id);
	ev->reason = strdup(reason);
	ev->now_at = now_at;
	if (!ev->id || !ev->reason) {
		pgcoord_permit_event_free(ev);
		return NULL;
	}
	return ev;
}

struct pgcoord_permit_event *pgcoord__permit_event_decode(const struct pgcoord_note *n)
{
	bool admitted = strcmp(n->method, admitted_method) == 0;
	if (!admitted && strcmp(n->method, expired_method) != 0)
		return NULL;

	msgpack_unpacked u;
	struct pgcoord_permit_event *ev = NULL;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, n->params, n->params_len, NULL) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_MAP) {
		if (admitted) {
			ev = admission_from(&u.data);
		} else {
			char *id = pgc_obj_strdup(pgc_map_get(&u.data, "id"));
			char *reason = pgc_obj_strdup(pgc_map_get(&u.data, "reason"));
			if (id && reason)
				ev = expiry(id, reason, int_or_minus1(&u.data, "now_at"));
			free(id);
			free(reason);
		}
	}
	msgpack_unpacked_destroy(&u);
	return ev;
}

/* --- await --------------------------------------------------------------- */

/* Matches a queued permit.admitted / permit.expired naming id. */
static bool note_names(const struct pgcoord_note *n, void *arg)
{
	const char *id = arg;
	if (strcmp(n->method, admitted_method) != 0 && strcmp(n->method, expired_method) != 0)
		return false;
	msgpack_unpacked u;
	bool match = false;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, n->params, n->params_len, NULL) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_MAP)
		match = pgc_obj_str_eq(pgc_map_get(&u.data, "id"), id);
	msgpack_unpacked_destroy(&u);
	return match;
}

/* Takes id's outcome from the queue: OK / EXPIRED with *out, or
 * PGCOORD_E_CALL_TIMEOUT when it is not there (yet). */
static pgcoord_err take_outcome(pgcoord *c, const char *id, struct pgcoord_permit_event **out)
{
	struct pgcoord_note *n = pgcoord__note_take(c, note_names, (void *)id);
	if (!n)
		return PGCOORD_E_CALL_TIMEOUT;
	*out = pgcoord__permit_event_decode(n);
	pgcoord__note_free(n);
	if (!*out) {
		pgcoord__set_message(c, "the outcome of queued claim %s does not decode", id);
		return PGCOORD_E_PROTOCOL;
	}
	if ((*out)->kind == PGCOORD_PERMIT_ADMITTED)
		return PGCOORD_OK;
	pgcoord__set_message(c, "queued claim %s left the queue: %s", id, (*out)->reason);
	return PGCOORD_E_EXPIRED;
}

/* The admission of a permit the cancel found held, from permit.get. */
static pgcoord_err admission_by_get(pgcoord *c, const char *id, struct pgcoord_permit_event **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "id", id);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "permit.get", &w, AWAIT_CANCEL_MS, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	const msgpack_object *permit = pgc_map_get(&u.data, "permit");
	if (permit && permit->type == MSGPACK_OBJECT_MAP)
		*out = admission_from(permit);
	if (*out)
		(*out)->now_at = int_or_minus1(&u.data, "now_at");
	else {
		pgcoord__set_message(c, "the permit.get result of %s has no permit", id);
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

/* The await timed out: take the claim out of the queue, or learn that it
 * was admitted after all. */
static pgcoord_err cancel_after_timeout(pgcoord *c, const char *id,
					struct pgcoord_permit_event **out)
{
	pgcoord_cancel_status st = 0;
	pgcoord_err err = pgcoord_permit_cancel(c, id, AWAIT_CANCEL_MS, &st);

	/* The outcome may have come in while the cancel waited for its answer. */
	pgcoord_err found = take_outcome(c, id, out);
	if (found != PGCOORD_E_CALL_TIMEOUT)
		return found;
	if (err == PGCOORD_E_NOT_FOUND)
		st = PGCOORD_CANCEL_CANCELLED; /* left the queue by itself: same for the caller */
	else if (err != PGCOORD_OK)
		return err;

	switch (st) {
	case PGCOORD_CANCEL_ADMITTED:
	case PGCOORD_CANCEL_HELD:
		return admission_by_get(c, id, out);
	case PGCOORD_CANCEL_RELEASED:
		*out = expiry(id, "admitted and released already", -1);
		break;
	default:
		*out = expiry(id, "the await timed out", -1);
		break;
	}
	if (!*out) {
		pgcoord__set_message(c, "out of memory");
		return PGCOORD_E_NOMEM;
	}
	pgcoord__set_message(c, "queued claim %s left the queue: %s", id, (*out)->reason);
	return PGCOORD_E_EXPIRED;
}

pgcoord_err pgcoord_permit_await(pgcoord *c, const char *id, int timeout_ms,
				 struct pgcoord_permit_event **out)
{
	int64_t deadline = pgcoord__deadline(timeout_ms);
	pgcoord_err err;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if (!id || !*id) {
		pgcoord__set_message(c, "the permit id is empty");
		return PGCOORD_E_ARG;
	}
	for (;;) {
		err = pgcoord__drain_frames(c, NULL);
		if (err != PGCOORD_OK)
			return err;
		err = take_outcome(c, id, out);
		if (err != PGCOORD_E_CALL_TIMEOUT)
			return err;
		err = pgcoord__read_more(c, deadline);
		if (err == PGCOORD_E_CALL_TIMEOUT)
			return cancel_after_timeout(c, id, out);
		if (err != PGCOORD_OK)
			return err;
	}
}
