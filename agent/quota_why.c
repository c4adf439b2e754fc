/*
 * quota_why.c — quota.why: who holds a quota's room. The quota's numbers,
 * the head of its queue, and its largest, longest-held and uncertain
 * permits, from pgcoord.quota_why (migrations/0012_quota_why.sql), which
 * also decides what a caller may see of other uids' permits. A question an
 * operator asks (`pgcoordctl why`), apart from the claim path.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/quota_why.h"
#include "agent/reply.h"

#define QUOTA_KEY_MAX 200
#define WHY_HOLDERS_DEFAULT 5
#define WHY_HOLDERS_MAX 50

/* a limit lowered below in_flight leaves no room, not negative room */
static void pack_available(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	int64_t limit = pgrow_int(src->res, src->row, QW_LIMIT),
		in_flight = pgrow_int(src->res, src->row, QW_IN_FLIGHT);

	(void)field;
	msgpack_pack_int64(pk, limit > in_flight ? limit - in_flight : 0);
}

/* The quota row's numbers (part = 'quota'). */
static const struct reply_col why_quota_cols[] = {
    {"key", REPLY_STR, QW_KEY, 0},
    {"limit", REPLY_INT, QW_LIMIT, 0},
    {"in_flight", REPLY_INT, QW_IN_FLIGHT, 0},
    {"waiting", REPLY_INT, QW_WAITING, 0},
    {"holders", REPLY_INT, QW_HOLDERS, 0},
    {"hidden", REPLY_INT, QW_HIDDEN, 0},
    {"uncertain_weight", REPLY_INT, QW_UNCERTAIN_WEIGHT, 0},
    REPLY_CALL("available", "int", pack_available),
};
static const struct reply_kind why_quota = REPLY_KIND(why_quota_cols);

/* The queue's head, when there is one: its id only for a caller it
 * belongs to (nil otherwise). */
static const struct reply_col why_head_cols[] = {
    {"id", REPLY_STR, QW_HEAD_ID, 0},
    {"weight", REPLY_INT, QW_HEAD_WEIGHT, 0},
    {"waited_ms", REPLY_INT, QW_HEAD_WAITED, 0},
};
static const struct reply_kind why_head = REPLY_KIND(why_head_cols);

static void pack_head(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	(void)field;
	if (pgrow_null(src->res, src->row, QW_HEAD_WEIGHT))
		msgpack_pack_nil(pk);
	else
		reply_pack_row(pk, &why_head, src->res, src->row, 0);
}

/* A holder: one open permit on the quota. */
static const struct reply_col why_holder_cols[] = {
    {"id", REPLY_STR, QW_ID, 0},
    {"weight", REPLY_INT, QW_WEIGHT, 0},
    {"state", REPLY_STR, QW_STATE, 0},
    {"phase", REPLY_STR, QW_PHASE, 0},
    {"owner_replica", REPLY_STR, QW_OWNER_REPLICA, 0},
    {"owner_session", REPLY_INT, QW_OWNER_SESSION, 0},
    {"held_ms", REPLY_INT, QW_HELD_MS, 0},
    {"state_ms", REPLY_INT, QW_STATE_MS, 0},
    {"reason", REPLY_STR, QW_REASON, 0},
};
static const struct reply_kind why_holder = REPLY_KIND(why_holder_cols);

/* Each list of the reply: the rows of one part. */
static void pack_part(msgpack_packer *pk, const char *part, const PGresult *res)
{
	int n = PQntuples(res), count = 0;

	for (int i = 0; i < n; i++)
		count += strcmp(PQgetvalue(res, i, QW_PART), part) == 0;
	msgpack_pack_array(pk, (size_t)count);
	for (int i = 0; i < n; i++)
		if (strcmp(PQgetvalue(res, i, QW_PART), part) == 0)
			reply_pack_row(pk, &why_holder, res, i, 0);
}

#define WHY_PART(part)                                                                             \
	static void pack_##part(msgpack_packer *pk, const void *field,                             \
				const struct reply_src *src)                                       \
	{                                                                                          \
		(void)field;                                                                       \
		pack_part(pk, #part, src->res);                                                    \
	}
WHY_PART(largest)
WHY_PART(oldest)
WHY_PART(uncertain)

static const struct reply_col why_cols[] = {
    REPLY_ROW_AT("quota", why_quota, 0),
    REPLY_CALL_MAP("queue_head", why_head, pack_head),
    REPLY_CALL_ROWS("largest", why_holder, pack_largest),
    REPLY_CALL_ROWS("oldest", why_holder, pack_oldest),
    REPLY_CALL_ROWS("uncertain", why_holder, pack_uncertain),
    {"now_at", REPLY_INT, QW_NOW, 0},
};
const struct reply_kind quota_why_reply = REPLY_KIND(why_cols);

struct why_call {
	char *key;
};

static void why_call_free(void *ctx)
{
	free(((struct why_call *)ctx)->key);
}

static void why_answered(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const struct why_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (PQnfields(res) != QW__COUNT) {
		req_fail(req, PGC_E_INTERNAL, "quota_why: %d columns where %d were expected",
			 PQnfields(res), QW__COUNT);
		return;
	}
	/* the quota's row comes first; none at all: no such quota */
	if (PQntuples(res) == 0 || strcmp(PQgetvalue(res, 0, QW_PART), "quota") != 0) {
		req_fail(req, PGC_E_NOT_FOUND, "no quota \"%s\" (quota.set creates one)",
			 call->key);
		return;
	}
	reply_pack_row(req_result(req), &quota_why_reply, res, 0, 0);
	req_done(req);
}

void rpc_quota_why(struct request *req)
{
	struct why_call *call = req_ctx_alloc(req, sizeof(*call), why_call_free);
	int64_t holders = WHY_HOLDERS_DEFAULT;
	char uid[24], holders_s[24];

	if (!call || !req_param_str(req, "key", true, QUOTA_KEY_MAX, &call->key) ||
	    !req_param_int(req, "holders", false, 1, WHY_HOLDERS_MAX, &holders, NULL))
		return;
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	snprintf(holders_s, sizeof(holders_s), "%" PRId64, holders);
	const char *params[4] = {call->key, uid, req_is_admin(req) ? "true" : "false", holders_s};
	req_query(req, "SELECT * FROM pgcoord.quota_why($1, $2, $3, $4)", 4, params, why_answered);
}
