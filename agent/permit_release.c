/*
 * permit_release.c — permit.release: releases grouped like claims
 * (groups.c, behind statements on the permit's own keys), each answered
 * from its release_decision row; an operator override is audited in the
 * log as well.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/groups.h"
#include "agent/methods.h"
#include "agent/permits_internal.h"
#include "agent/reply.h"
#include "agent/sessions.h"

/* The columns of pgcoord.release_decision; a refusal is the statement's
 * (or, in a group, the member's) SQLSTATE instead. */
enum { RD_STATUS, RD_STATE, RD_RELEASED_AT, RD_NOW };

/* What a release answers: the id and whether this call released it, then
 * its row. */
struct release_view {
	const char *id;
	bool released;
};

static const struct reply_col released_cols[] = {
    REPLY_FIELD("id", REPLY_FIELD_STR, struct release_view, id),
    REPLY_FIELD("released", REPLY_FIELD_BOOL, struct release_view, released),
    {"status", REPLY_HIDDEN, RD_STATUS, 0},
    {"state", REPLY_STR, RD_STATE, 0},
    {"released_at", REPLY_INT, RD_RELEASED_AT, 0},
    {"now_at", REPLY_INT, RD_NOW, 0},
};
const struct reply_kind permit_release_reply = REPLY_KIND(released_cols);

/* released: this call released it; already_released: release is
 * idempotent, `released` false says it was before. */
static void release_done(struct request *req, struct permit_call *call, const PGresult *res,
			 int row, int col, bool released)
{
	if (call->override && released)
		permit_log_override(req, call->id, "released by operator override", NULL);
	struct release_view v = {call->id, released};
	struct reply_src src = {.res = res, .row = row, .nrows = 1, .offset = col, .c = &v};
	reply_pack(req_result(req), &permit_release_reply, &src);
	req_done(req);
}

static void release_released(struct request *req, struct permit_call *call, const PGresult *res,
			     int row, int col)
{
	release_done(req, call, res, row, col, true);
}

static void release_already(struct request *req, struct permit_call *call, const PGresult *res,
			    int row, int col)
{
	release_done(req, call, res, row, col, false);
}

/* There was no permit: the release retired the id (it wrote the tombstone,
 * so this is an answer of the function, not a raise). */
static void release_retired(struct request *req, struct permit_call *call, const PGresult *res,
			    int row, int col)
{
	(void)res, (void)row, (void)col;
	req_fail(req, PGC_E_NOT_FOUND,
		 "no permit \"%s\"; the id is now retired: a claim of it still on its way, or "
		 "made later, is refused as released",
		 call->id);
}

/* pgcoord.release_status, one handler each. */
static const struct {
	const char *status;
	void (*answer)(struct request *req, struct permit_call *call, const PGresult *res, int row,
		       int col);
} release_statuses[] = {
    {"released", release_released},
    {"already_released", release_already},
    {"retired", release_retired},
};

/* Answers a release from its row of permit_release_group: its columns from
 * `col` on are release_decision's. */
static void release_answer(struct request *req, void *ctx, const PGresult *res, int row, int col)
{
	struct permit_call *call = ctx;
	const char *status = PQgetvalue(res, row, col + RD_STATUS);

	if (!reply_kind_fits(&permit_release_reply, res, col)) {
		req_rows_are(req, &permit_release_reply, res, col);
		return;
	}
	for (size_t i = 0; i < sizeof(release_statuses) / sizeof(release_statuses[0]); i++) {
		if (strcmp(status, release_statuses[i].status) == 0) {
			release_statuses[i].answer(req, call, res, row, col);
			return;
		}
	}
	req_fail(req, PGC_E_INTERNAL, "permit_release: unexpected status \"%s\"", status);
}

static void release_failed(struct request *req, void *ctx, const struct db_result *r)
{
	req_fail_db(req, r);
}

/* Releases waiting at the same moment go as one statement of a group
 * function, like claims; a group of one, of either kind, is
 * permit_release_one alone (one frame, one value). */
#define RELEASE_KIND(kind_name, function)                                                          \
	{                                                                                          \
		.name = kind_name,                                                                 \
		.sql = "SELECT * FROM pgcoord." function "($1::bigint[], $2::text[], "             \
		       "$3::bigint[], $4::boolean[], $5::text[], $6::text[])",                     \
		.lone_sql = "SELECT 1, NULL::text, NULL::text, r.* FROM "                          \
			    "pgcoord.permit_release_one($1::bigint, $2::text, $3::bigint, "        \
			    "$4::boolean, $5::text, $6::text) r",                                  \
		.nargs = 6, .answer = release_answer, .fail = release_failed,                      \
	}

/* The common releases (the caller's session's own permit, no override,
 * no reason) go as one SQL statement (0022_claim_release_fast.sql); a
 * release of anything but a held one-quota permit goes on to
 * permit_release_group_kind. */
const struct group_kind permit_release_fast_kind = RELEASE_KIND("release", "permit_release_fast");

/* The other releases: permit_release_group. */
const struct group_kind permit_release_group_kind =
    RELEASE_KIND("release_slow", "permit_release_group");

void rpc_permit_release(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	char *reason = NULL;
	char session[24] = "", actor[256], uid[24];

	if (!call)
		return;
	if (!permit_param_id(req, &call->id) || !permit_param_override(req, &call->override) ||
	    !permit_param_text(req, "reason", false, &reason))
		goto fail;
	if (!call->override && !req_need_session(req))
		goto fail;
	if (req->conn->session)
		snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	if (call->override)
		permit_operator_actor(req, actor, sizeof(actor));
	else
		permit_session_actor(req, actor, sizeof(actor));
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	const char *params[6] = {uid,
				 call->id,
				 session[0] ? session : NULL,
				 call->override ? "true" : "false",
				 actor,
				 reason ? reason : (call->override ? "operator override" : NULL)};
	/* guarantees 2 and 3: released exactly once, counters and audit rows in
	 * the same transaction (its group's) */
	struct group_keys keys;
	group_recall_keys(req->ag->release_group, call->id, &keys);
	group_add(call->override || reason ? req->ag->release_slow_group : req->ag->release_group,
		  req, call, params, &keys);
fail:
	free(reason);
}
