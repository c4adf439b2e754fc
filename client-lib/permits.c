/*
 * permits.c — typed helpers over pgcoord_call for the quota.* and permit.*
 * methods (PROTOCOL.md, "Permits"): the claim with its opaque outcome, the
 * lifecycle calls, and the reads that hand back the result map.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "claim_room.h"
#include "handle.h"
#include "pages.h"

struct pgcoord_claim {
	pgcoord_claim_status status;
	int64_t token;
	int64_t owner_session;
	bool mine;
	char *denied_quota;
	int64_t denied_limit;
	int64_t denied_in_flight;
	int64_t position;	   /* queued: 1 = next in line */
	int64_t deadline_at;	   /* queued: when the wait ends, database clock ms */
	struct pgcoord__room room; /* denied or queued: who holds the room */
};

static bool check_id(pgcoord *c, const char *what, const char *id)
{
	if (!id || !*id) {
		pgcoord__set_message(c, "%s is empty", what);
		return false;
	}
	return true;
}

/* --- claim ------------------------------------------------------------ */

void pgcoord_claim_opts_init(struct pgcoord_claim_opts *opts)
{
	if (opts)
		*opts = (struct pgcoord_claim_opts)PGCOORD_CLAIM_OPTS_INIT;
}

/* The fields every version of the struct has; later ones are read only when
 * the caller's size covers them. */
#define CLAIM_OPTS_V0_SIZE (offsetof(struct pgcoord_claim_opts, flags) + sizeof(unsigned))
#define CLAIM_OPTS_HAS(o, field)                                                                   \
	((o)->size >= offsetof(struct pgcoord_claim_opts, field) + sizeof((o)->field))

/* permit.claim's wait_ms range (PROTOCOL.md, "Waiting claims"). */
#define CLAIM_WAIT_MS_MAX 3600000

pgcoord_err pgcoord_permit_claim(pgcoord *c, const char *id, const struct pgcoord_claim_opts *opts,
				 int timeout_ms, pgcoord_claim **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id))
		return PGCOORD_E_ARG;
	if (!opts || opts->size < CLAIM_OPTS_V0_SIZE) {
		pgcoord__set_message(c, "claim options are missing or not initialised "
					"(start from PGCOORD_CLAIM_OPTS_INIT)");
		return PGCOORD_E_ARG;
	}
	const char *const *keys = opts->keys;
	const int32_t *weights = opts->weights;
	size_t nquotas = opts->nquotas;
	const void *intent = opts->intent;
	size_t intent_len = opts->intent_len;
	int64_t limit = opts->limit;
	unsigned flags = opts->flags;
	int64_t wait_ms = CLAIM_OPTS_HAS(opts, wait_ms) ? opts->wait_ms : 0;
	if (wait_ms < 0 || wait_ms > CLAIM_WAIT_MS_MAX) {
		pgcoord__set_message(c, "wait_ms %lld is outside 0..%d", (long long)wait_ms,
				     CLAIM_WAIT_MS_MAX);
		return PGCOORD_E_ARG;
	}
	if (!keys || nquotas == 0 || (intent_len && !intent) || limit < PGCOORD_NO_LIMIT ||
	    flags & ~PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS) {
		pgcoord__set_message(c, "a claim needs at least one quota key (and intent bytes "
					"when intent_len > 0, known flags, limit >= -1)");
		return PGCOORD_E_ARG;
	}
	for (size_t i = 0; i < nquotas; i++) {
		if (!keys[i] || (weights && weights[i] < 1)) {
			pgcoord__set_message(c, "quota %zu: a key and a weight >= 1 are needed", i);
			return PGCOORD_E_ARG;
		}
	}

	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 3 + (intent != NULL) + (limit >= 0) + (wait_ms > 0));
	pgc_pack_kv_str(&w.pk, "id", id);
	pgc_pack_cstr(&w.pk, "quotas");
	msgpack_pack_array(&w.pk, nquotas);
	for (size_t i = 0; i < nquotas; i++) {
		msgpack_pack_map(&w.pk, 2);
		pgc_pack_kv_str(&w.pk, "key", keys[i]);
		pgc_pack_kv_int(&w.pk, "weight", weights ? weights[i] : 1);
	}
	pgc_pack_kv_str(&w.pk, "on_owner_loss",
			flags & PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS ? "release" : "uncertain");
	if (intent) {
		pgc_pack_cstr(&w.pk, "intent");
		msgpack_pack_bin(&w.pk, intent_len);
		msgpack_pack_bin_body(&w.pk, intent, intent_len);
	}
	if (limit >= 0)
		pgc_pack_kv_int(&w.pk, "limit", limit);
	if (wait_ms > 0)
		pgc_pack_kv_int(&w.pk, "wait_ms", wait_ms);

	pgcoord_err err =
	    pgcoord__call_decoded(c, "permit.claim", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;

	struct pgcoord_claim *cl = calloc(1, sizeof(*cl));
	const msgpack_object *status = pgc_map_get(&u.data, "status");
	if (!cl) {
		pgcoord__set_message(c, "out of memory");
		err = PGCOORD_E_NOMEM;
		goto out;
	}
	cl->denied_limit = cl->denied_in_flight = -1;
	if (pgc_obj_str_eq(status, "admitted") || pgc_obj_str_eq(status, "held")) {
		cl->status = pgc_obj_str_eq(status, "admitted") ? PGCOORD_CLAIM_ADMITTED
								: PGCOORD_CLAIM_HELD;
		if (!pgc_obj_int64(pgc_map_get(&u.data, "token"), &cl->token) ||
		    !pgc_obj_int64(pgc_map_get(&u.data, "owner_session"), &cl->owner_session) ||
		    !pgc_obj_bool(pgc_map_get(&u.data, "mine"), &cl->mine))
			goto bad;
	} else if (pgc_obj_str_eq(status, "queued")) {
		cl->status = PGCOORD_CLAIM_QUEUED;
		if (!pgc_obj_int64(pgc_map_get(&u.data, "position"), &cl->position) ||
		    !pgc_obj_int64(pgc_map_get(&u.data, "deadline_at"), &cl->deadline_at) ||
		    !pgc_obj_bool(pgc_map_get(&u.data, "mine"), &cl->mine))
			goto bad;
	} else if (pgc_obj_str_eq(status, "denied")) {
		cl->status = PGCOORD_CLAIM_DENIED;
		cl->denied_quota = pgc_obj_strdup(pgc_map_get(&u.data, "quota"));
		if (!cl->denied_quota ||
		    !pgc_obj_int64(pgc_map_get(&u.data, "limit"), &cl->denied_limit) ||
		    !pgc_obj_int64(pgc_map_get(&u.data, "in_flight"), &cl->denied_in_flight))
			goto bad;
	} else {
		goto bad;
	}
	if (cl->status == PGCOORD_CLAIM_QUEUED || cl->status == PGCOORD_CLAIM_DENIED) {
		if (!pgcoord__room_read(&cl->room, &u.data)) {
			pgcoord__set_message(c, "the permit.claim result's holders are malformed");
			err = PGCOORD_E_PROTOCOL;
			goto out;
		}
	}
	*out = cl;
	cl = NULL;
	goto out;
bad:
	pgcoord__set_message(c, "the permit.claim result lacks a status, token or quota");
	err = PGCOORD_E_PROTOCOL;
out:
	pgcoord_claim_free(cl);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

pgcoord_claim_status pgcoord_claim_get_status(const pgcoord_claim *cl)
{
	return cl ? cl->status : PGCOORD_CLAIM_DENIED;
}

int64_t pgcoord_claim_get_token(const pgcoord_claim *cl)
{
	return cl ? cl->token : 0;
}

int64_t pgcoord_claim_get_owner_session(const pgcoord_claim *cl)
{
	return cl ? cl->owner_session : 0;
}

bool pgcoord_claim_is_mine(const pgcoord_claim *cl)
{
	return cl && cl->mine;
}

const char *pgcoord_claim_denied_quota(const pgcoord_claim *cl)
{
	return cl ? cl->denied_quota : NULL;
}

int64_t pgcoord_claim_denied_limit(const pgcoord_claim *cl)
{
	return cl ? cl->denied_limit : -1;
}

int64_t pgcoord_claim_denied_in_flight(const pgcoord_claim *cl)
{
	return cl ? cl->denied_in_flight : -1;
}

int64_t pgcoord_claim_queue_position(const pgcoord_claim *cl)
{
	return cl && cl->status == PGCOORD_CLAIM_QUEUED ? cl->position : 0;
}

int64_t pgcoord_claim_queue_deadline_at(const pgcoord_claim *cl)
{
	return cl && cl->status == PGCOORD_CLAIM_QUEUED ? cl->deadline_at : 0;
}

bool pgcoord_claim_room(const pgcoord_claim *cl, const char **quota, int64_t *limit,
			int64_t *in_flight, int64_t *waiting, int64_t *hidden)
{
	if (!cl || !cl->room.known)
		return false;
	if (quota)
		*quota = cl->room.quota;
	if (limit)
		*limit = cl->room.limit;
	if (in_flight)
		*in_flight = cl->room.in_flight;
	if (waiting)
		*waiting = cl->room.waiting;
	if (hidden)
		*hidden = cl->room.hidden;
	return true;
}

size_t pgcoord_claim_holder_count(const pgcoord_claim *cl)
{
	return cl && cl->room.known ? cl->room.nholders : 0;
}

const pgcoord_holder *pgcoord_claim_holder_at(const pgcoord_claim *cl, size_t i)
{
	return i < pgcoord_claim_holder_count(cl) ? &cl->room.holders[i] : NULL;
}

void pgcoord_claim_free(pgcoord_claim *cl)
{
	if (!cl)
		return;
	pgcoord__room_free(&cl->room);
	free(cl->denied_quota);
	free(cl);
}

/* --- lifecycle ----------------------------------------------------------- */

pgcoord_err pgcoord_permit_update(pgcoord *c, const char *id, pgcoord_phase phase, int timeout_ms)
{
	static const char *const names[] = {"reserved", "dispatched", "running"};
	struct pgcoord_writer w;

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id))
		return PGCOORD_E_ARG;
	if ((unsigned)phase > PGCOORD_PHASE_RUNNING) {
		pgcoord__set_message(c, "unknown phase %d", (int)phase);
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2);
	pgc_pack_kv_str(&w.pk, "id", id);
	pgc_pack_kv_str(&w.pk, "phase", names[phase]);
	return pgcoord__call_packed(c, "permit.update", &w, timeout_ms, NULL, NULL);
}

pgcoord_err pgcoord_permit_mark_uncertain(pgcoord *c, const char *id, const char *reason,
					  int timeout_ms)
{
	struct pgcoord_writer w;

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id) || !check_id(c, "the reason", reason))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2);
	pgc_pack_kv_str(&w.pk, "id", id);
	pgc_pack_kv_str(&w.pk, "reason", reason);
	return pgcoord__call_packed(c, "permit.mark_uncertain", &w, timeout_ms, NULL, NULL);
}

pgcoord_err pgcoord_permit_resolve(pgcoord *c, const char *id, pgcoord_outcome outcome,
				   const char *evidence, unsigned flags, int timeout_ms)
{
	struct pgcoord_writer w;

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id))
		return PGCOORD_E_ARG;
	if ((unsigned)outcome > PGCOORD_OUTCOME_GONE || flags & ~PGCOORD_OVERRIDE) {
		pgcoord__set_message(c, "unknown outcome or flags");
		return PGCOORD_E_ARG;
	}
	/* evidence is checked by the agent too; an empty one is sent as it is
	 * so the caller gets the agent's refusal, which names the rule */
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 4);
	pgc_pack_kv_str(&w.pk, "id", id);
	pgc_pack_kv_str(&w.pk, "outcome", outcome == PGCOORD_OUTCOME_GONE ? "gone" : "running");
	pgc_pack_kv_str(&w.pk, "evidence", evidence);
	pgc_pack_kv_bool(&w.pk, "override", flags & PGCOORD_OVERRIDE);
	return pgcoord__call_packed(c, "permit.resolve", &w, timeout_ms, NULL, NULL);
}

pgcoord_err pgcoord_permit_release(pgcoord *c, const char *id, unsigned flags, const char *reason,
				   int timeout_ms, bool *released)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	bool did = false;

	if (released)
		*released = false;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id))
		return PGCOORD_E_ARG;
	if (flags & ~PGCOORD_OVERRIDE) {
		pgcoord__set_message(c, "unknown flags");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2 + (reason != NULL));
	pgc_pack_kv_str(&w.pk, "id", id);
	pgc_pack_kv_bool(&w.pk, "override", flags & PGCOORD_OVERRIDE);
	if (reason)
		pgc_pack_kv_str(&w.pk, "reason", reason);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "permit.release", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	if (!pgc_obj_bool(pgc_map_get(&u.data, "released"), &did)) {
		pgcoord__set_message(c, "the permit.release result has no \"released\"");
		err = PGCOORD_E_PROTOCOL;
	} else if (released) {
		*released = did;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

void pgcoord_resolve_opts_init(struct pgcoord_resolve_opts *opts)
{
	if (opts)
		*opts = (struct pgcoord_resolve_opts)PGCOORD_RESOLVE_OPTS_INIT;
}

pgcoord_err pgcoord_permit_resolve_with(pgcoord *c, const char *id, pgcoord_outcome outcome,
					const struct pgcoord_resolve_opts *opts, int timeout_ms)
{
	if (!c)
		return PGCOORD_E_ARG;
	if (!pgcoord__opts_size_ok(
		c, opts, opts ? opts->size : 0, sizeof(struct pgcoord_resolve_opts),
		sizeof(struct pgcoord_resolve_opts), "PGCOORD_RESOLVE_OPTS_INIT"))
		return PGCOORD_E_ARG;
	if (!opts->evidence) {
		pgcoord__set_message(c, "opts.evidence is NULL: say what was observed");
		return PGCOORD_E_ARG;
	}
	return pgcoord_permit_resolve(c, id, outcome, opts->evidence, opts->flags, timeout_ms);
}

void pgcoord_release_opts_init(struct pgcoord_release_opts *opts)
{
	if (opts)
		*opts = (struct pgcoord_release_opts)PGCOORD_RELEASE_OPTS_INIT;
}

pgcoord_err pgcoord_permit_release_with(pgcoord *c, const char *id,
					const struct pgcoord_release_opts *opts, int timeout_ms,
					bool *released)
{
	if (released)
		*released = false;
	if (!c)
		return PGCOORD_E_ARG;
	if (!pgcoord__opts_size_ok(
		c, opts, opts ? opts->size : 0, sizeof(struct pgcoord_release_opts),
		sizeof(struct pgcoord_release_opts), "PGCOORD_RELEASE_OPTS_INIT"))
		return PGCOORD_E_ARG;
	return pgcoord_permit_release(c, id, opts->flags, opts->reason, timeout_ms, released);
}

pgcoord_err pgcoord_permit_cancel(pgcoord *c, const char *id, int timeout_ms,
				  pgcoord_cancel_status *status)
{
	static const struct {
		const char *name;
		pgcoord_cancel_status status;
	} statuses[] = {
	    {"cancelled", PGCOORD_CANCEL_CANCELLED},
	    {"admitted", PGCOORD_CANCEL_ADMITTED},
	    {"held", PGCOORD_CANCEL_HELD},
	    {"released", PGCOORD_CANCEL_RELEASED},
	};
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (status)
		*status = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "id", id);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "permit.cancel", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	const msgpack_object *st = pgc_map_get(&u.data, "status");
	size_t i = 0;
	while (i < sizeof(statuses) / sizeof(statuses[0]) && !pgc_obj_str_eq(st, statuses[i].name))
		i++;
	if (i == sizeof(statuses) / sizeof(statuses[0])) {
		pgcoord__set_message(c, "the permit.cancel result has no known status");
		err = PGCOORD_E_PROTOCOL;
	} else if (status) {
		*status = statuses[i].status;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

/* --- reads --------------------------------------------------------------- */

static pgcoord_err by_id(pgcoord *c, const char *method, const char *id, int timeout_ms,
			 void **result, size_t *result_len)
{
	struct pgcoord_writer w;

	if (result)
		*result = NULL;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the permit id", id))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "id", id);
	return pgcoord__call_packed(c, method, &w, timeout_ms, result, result_len);
}

pgcoord_err pgcoord_permit_get(pgcoord *c, const char *id, int timeout_ms, void **result,
			       size_t *result_len)
{
	return by_id(c, "permit.get", id, timeout_ms, result, result_len);
}

pgcoord_err pgcoord_permit_history(pgcoord *c, const char *id, int timeout_ms, void **result,
				   size_t *result_len)
{
	return by_id(c, "permit.history", id, timeout_ms, result, result_len);
}

pgcoord_err pgcoord_permit_list(pgcoord *c, const char *quota, const char *state, int timeout_ms,
				void **result, size_t *result_len)
{
	struct pgcoord_writer w;

	if (result)
		*result = NULL;
	if (!c)
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, (quota != NULL) + (state != NULL));
	if (quota)
		pgc_pack_kv_str(&w.pk, "quota", quota);
	if (state)
		pgc_pack_kv_str(&w.pk, "state", state);
	return pgcoord__call_packed(c, "permit.list", &w, timeout_ms, result, result_len);
}

pgcoord_err pgcoord_quota_list(pgcoord *c, int timeout_ms, void **result, size_t *result_len)
{
	if (result)
		*result = NULL;
	if (!c)
		return PGCOORD_E_ARG;
	/* every page: the whole list, as before quota.list paged */
	return pgcoord__list_all(c, "quota.list", NULL, 0, "quotas", timeout_ms, result,
				 result_len);
}

pgcoord_err pgcoord_permit_check(pgcoord *c, int timeout_ms, bool *ok, void **result,
				 size_t *result_len)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	bool good = false;

	if (ok)
		*ok = false;
	if (result)
		*result = NULL;
	if (!c || (result && !result_len))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 0);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "permit.check", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	if (!pgc_obj_bool(pgc_map_get(&u.data, "ok"), &good)) {
		pgcoord__set_message(c, "the permit.check result has no \"ok\"");
		err = PGCOORD_E_PROTOCOL;
	} else if (ok) {
		*ok = good;
	}
	msgpack_unpacked_destroy(&u);
	if (err == PGCOORD_OK && result) {
		*result = raw;
		*result_len = raw_len;
		raw = NULL;
	}
	pgcoord_free(raw);
	return err;
}

/* --- quotas -------------------------------------------------------------- */

pgcoord_err pgcoord_quota_set(pgcoord *c, const char *key, int32_t limit, int32_t lapse_after_s,
			      int timeout_ms)
{
	struct pgcoord_writer w;

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the quota key", key))
		return PGCOORD_E_ARG;
	if (limit < 0 || lapse_after_s < -1) {
		pgcoord__set_message(c, "limit must be >= 0 and lapse_after_s >= -1");
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2 + (lapse_after_s >= 0));
	pgc_pack_kv_str(&w.pk, "key", key);
	pgc_pack_kv_int(&w.pk, "limit", limit);
	if (lapse_after_s >= 0)
		pgc_pack_kv_int(&w.pk, "lapse_after_s", lapse_after_s);
	return pgcoord__call_packed(c, "quota.set", &w, timeout_ms, NULL, NULL);
}

pgcoord_err pgcoord_quota_get(pgcoord *c, const char *key, int timeout_ms, int64_t *limit,
			      int64_t *in_flight, int64_t *held, int64_t *uncertain)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	int64_t v[4];
	static const char *const names[4] = {"limit", "in_flight", "held", "uncertain"};
	int64_t *outs[4] = {limit, in_flight, held, uncertain};

	if (!c)
		return PGCOORD_E_ARG;
	if (!check_id(c, "the quota key", key))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "key", key);
	pgcoord_err err = pgcoord__call_decoded(c, "quota.get", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	const msgpack_object *q = pgc_map_get(&u.data, "quota");
	for (int i = 0; i < 4; i++) {
		if (!q || q->type != MSGPACK_OBJECT_MAP ||
		    !pgc_obj_int64(pgc_map_get(q, names[i]), &v[i])) {
			pgcoord__set_message(c, "the quota.get result has no \"%s\"", names[i]);
			err = PGCOORD_E_PROTOCOL;
			break;
		}
	}
	for (int i = 0; i < 4 && err == PGCOORD_OK; i++)
		if (outs[i])
			*outs[i] = v[i];
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}
