/*
 * claim_holders.c — who holds the room a claim was denied or queued for:
 * its answer waits for one read of pgcoord.quota_why (0012_quota_why.sql,
 * the same rows and the same visibility rule as quota.why) and carries the
 * quota's numbers and its largest holders. Only a claim that did not get
 * in pays for it; a grant is answered straight from its row.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/log.h"
#include "agent/methods.h"
#include "agent/permits_internal.h"
#include "agent/pgrow.h"
#include "agent/quota_why.h"
#include "agent/reply.h"
#include "agent/waiters.h"

/* The holders an answer names at most (PROTOCOL.md: permit.claim). */
#define CLAIM_HOLDERS_MAX 5
/* A denied quota's read serves the denials of the same quota and caller
 * class (uid, admin) for this long: quota_why reads every open permit, so
 * a storm of denials costs at most one read per quota and caller a second. */
#define HOLDERS_CACHE_MS 1000
#define HOLDERS_CACHE_SLOTS 64

/* One read, kept (one agent per process: the cache is the agent's). */
static struct holders_cached {
	char key[PERMIT_KEY_MAX + 1];
	unsigned uid;
	bool admin;
	uint64_t at_ms;
	PGresult *res; /* NULL: a free slot */
} holders_cache[HOLDERS_CACHE_SLOTS];

static struct holders_cached *cache_find(const char *key, unsigned uid, bool admin)
{
	uint64_t now = mono_ms();

	for (size_t i = 0; i < HOLDERS_CACHE_SLOTS; i++) {
		struct holders_cached *c = &holders_cache[i];
		if (c->res && c->uid == uid && c->admin == admin && strcmp(c->key, key) == 0 &&
		    now - c->at_ms < HOLDERS_CACHE_MS)
			return c;
	}
	return NULL;
}

/* Keeps a copy of res for key, in a free or expired slot, else the oldest. */
static void cache_store(const char *key, unsigned uid, bool admin, const PGresult *res)
{
	struct holders_cached *slot = &holders_cache[0];
	uint64_t now = mono_ms();

	if (strlen(key) > PERMIT_KEY_MAX)
		return;
	for (size_t i = 0; i < HOLDERS_CACHE_SLOTS; i++) {
		struct holders_cached *c = &holders_cache[i];
		if (!c->res || now - c->at_ms >= HOLDERS_CACHE_MS) {
			slot = c;
			break;
		}
		if (c->at_ms < slot->at_ms)
			slot = c;
	}
	PGresult *copy = PQcopyResult(res, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES);
	if (!copy)
		return; /* out of memory: the next denial reads again */
	PQclear(slot->res);
	slot->res = copy;
	snprintf(slot->key, sizeof(slot->key), "%s", key);
	slot->uid = uid;
	slot->admin = admin;
	slot->at_ms = now;
}

/* The quota that keeps the claim out: the denied one, or for a queued
 * claim the one claim_blocking_key picks (0014_claim_holders.sql). Then
 * quota_why's own row and its largest holders the caller may see. */
static const char holders_sql[] =
    "SELECT w.* FROM pgcoord.quota_why(coalesce($1::text, "
    "pgcoord.claim_blocking_key($2::text[], $3::integer[])), $4, $5, $6) AS w "
    "WHERE w.part IN ('quota', 'largest')";

/* One holder: an open permit on the quota, largest first. */
static const struct reply_col holder_cols[] = {
    {"id", REPLY_STR, QW_ID, 0},
    {"weight", REPLY_INT, QW_WEIGHT, 0},
    {"state", REPLY_STR, QW_STATE, 0},
    {"owner_replica", REPLY_STR, QW_OWNER_REPLICA, 0},
    {"owner_session", REPLY_INT, QW_OWNER_SESSION, 0},
    {"age_ms", REPLY_INT, QW_HELD_MS, 0},
    {"reason", REPLY_STR, QW_REASON, 0},
};
static const struct reply_kind holder_row = REPLY_KIND(holder_cols);

/* The read's rows after the quota's own (row 0). */
static void pack_holders(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	(void)field;
	int n = PQntuples(src->res);
	msgpack_pack_array(pk, (size_t)(n - 1));
	for (int i = 1; i < n; i++)
		reply_pack_row(pk, &holder_row, src->res, i, 0);
}

/*
 * The answers, one table each, in the order they go on the wire: the
 * claim's own fields (copied from its row into claim_pending), then what
 * the read found, its cells from the quota's row of quota_why. A denied
 * claim's quota and numbers are those it was judged by; a queued claim's
 * come from the read. When the read failed the answer is the claim's own
 * fields alone (the *_unread tables).
 */
#define PENDING(key, type) REPLY_FIELD(#key, type, struct claim_pending, key)
#define DENIED_OWN                                                                                 \
	PENDING(status, REPLY_FIELD_STR), PENDING(id, REPLY_FIELD_STR),                            \
	    PENDING(quota, REPLY_FIELD_STR), PENDING(limit, REPLY_FIELD_INT),                      \
	    PENDING(in_flight, REPLY_FIELD_INT), PENDING(now_at, REPLY_FIELD_INT),                 \
	    PENDING(weight, REPLY_FIELD_INT)
#define QUEUED_OWN                                                                                 \
	PENDING(status, REPLY_FIELD_STR), PENDING(id, REPLY_FIELD_STR),                            \
	    PENDING(position, REPLY_FIELD_INT), PENDING(queued_at, REPLY_FIELD_INT),               \
	    PENDING(deadline_at, REPLY_FIELD_INT), PENDING(now_at, REPLY_FIELD_INT),               \
	    PENDING(mine, REPLY_FIELD_BOOL)

static const struct reply_col denied_cols[] = {
    DENIED_OWN,
    {"waiting", REPLY_INT, QW_WAITING, 0},
    {"hidden", REPLY_INT, QW_HIDDEN, 0},
    REPLY_CALL_ROWS("holders", holder_row, pack_holders),
};
const struct reply_kind permit_denied_reply = REPLY_KIND(denied_cols);

static const struct reply_col denied_unread_cols[] = {DENIED_OWN};
const struct reply_kind permit_denied_unread_reply = REPLY_KIND(denied_unread_cols);

static const struct reply_col queued_cols[] = {
    QUEUED_OWN,
    {"quota", REPLY_STR, QW_KEY, 0},
    {"limit", REPLY_INT, QW_LIMIT, 0},
    {"in_flight", REPLY_INT, QW_IN_FLIGHT, 0},
    {"waiting", REPLY_INT, QW_WAITING, 0},
    {"hidden", REPLY_INT, QW_HIDDEN, 0},
    REPLY_CALL_ROWS("holders", holder_row, pack_holders),
};
const struct reply_kind permit_queued_reply = REPLY_KIND(queued_cols);

static const struct reply_col queued_unread_cols[] = {QUEUED_OWN};
const struct reply_kind permit_queued_unread_reply = REPLY_KIND(queued_unread_cols);

/* Ends the answer: the claim's fields and what the read found (res NULL:
 * nothing more), then the reply. */
static void finish(struct request *req, struct claim_pending *p, const PGresult *res)
{
	const struct reply_kind *kind =
	    p->queued ? (res ? &permit_queued_reply : &permit_queued_unread_reply)
		      : (res ? &permit_denied_reply : &permit_denied_unread_reply);
	struct reply_src src = {.res = res, .row = 0, .nrows = 1, .offset = 0, .c = p};

	/* tracked only now, so that no permit.admitted of it can reach the
	 * client before this answer */
	if (p->track)
		waiters_track(req->ag, p->id, p->owner);
	reply_pack(req_result(req), kind, &src);
	free(p);
	req_done(req);
}

static void holders_read(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	struct claim_pending *p = call->pending;
	const PGresult *res = r->ok ? r->res : NULL;

	call->pending = NULL;
	/* the claim's outcome stands whatever the read says: the answer goes
	 * without the holders rather than not at all */
	if (res && (PQnfields(res) != QW__COUNT || PQntuples(res) == 0 ||
		    strcmp(PQgetvalue(res, 0, QW_PART), "quota") != 0))
		res = NULL;
	if (!res) {
		char kv[256];
		req_log_kv(req, kv, sizeof(kv));
		log_write(&req->ag->log, LOG_LEVEL_WARN, "permit", kv,
			  "permit %s: answered without its quota's holders: %s", call->id,
			  r->ok ? "quota_why returned no quota row" : r->message);
	} else if (!p->queued) {
		cache_store(p->key, (unsigned)req->conn->uid, req_is_admin(req), res);
	}
	finish(req, p, res);
}

void claim_holders_send(struct request *req, struct permit_call *call, struct claim_pending *p)
{
	char uid[24], cap[8];
	bool admin = req_is_admin(req);
	const char *key = p->queued ? NULL : p->key;

	if (key) {
		/* a denial: its quota's read of the last second, if any */
		const struct holders_cached *c = cache_find(key, (unsigned)req->conn->uid, admin);
		if (c) {
			finish(req, p, c->res);
			return;
		}
	}
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	snprintf(cap, sizeof(cap), "%d", CLAIM_HOLDERS_MAX);
	const char *params[6] = {key, call->keys_lit,		call->weights_lit,
				 uid, admin ? "true" : "false", cap};
	call->pending = p;
	if (!db_query_unless(req->ag->db, DB_LANE_REQUESTS, holders_sql, 6, params, holders_read,
			     req, &req->conn->closed)) {
		/* the database went away after the claim was answered in it */
		call->pending = NULL;
		finish(req, p, NULL);
	}
}
