/*
 * permit_lifecycle.c — permit.update (phase), permit.mark_uncertain and
 * permit.resolve: the calls that move a held permit through its life, each
 * answered from one pgcoord.permit_change row (0004_permits.sql). Its end,
 * permit.release, is permit_release.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/permits_internal.h"
#include "agent/reply.h"
#include "agent/sessions.h"

static const char *const outcome_names[] = {"running", "gone", NULL};

/* --- permit.update ----------------------------------------------------- */

/* Answers {id, the row's cells} for a call on one permit. */
static void reply_permit_row(struct request *req, const struct permit_call *call,
			     const struct reply_kind *kind, const PGresult *res)
{
	struct reply_src src = {.res = res, .row = 0, .nrows = 1, .c = call};

	reply_pack(req_result(req), kind, &src);
	req_done(req);
}

/* The columns of pgcoord.permit_change (0004_permits.sql), which the
 * lifecycle functions answer; each reply sends its own of them. A refusal
 * arrives as the statement's error (a class-PC SQLSTATE), never as a row. */
enum { CH_CHANGED, CH_STATE, CH_PHASE, CH_PHASE_AT, CH_STATE_AT, CH_OWNER, CH_DETAIL, CH_NOW };

/* A lifecycle function answers exactly one permit_change row. */
static bool one_change(struct request *req, const struct reply_kind *kind, const PGresult *res)
{
	if (PQntuples(res) != 1) {
		req_fail(req, PGC_E_INTERNAL, "%s returned %d rows", req->method->name,
			 PQntuples(res));
		return false;
	}
	return req_rows_are(req, kind, res, 0);
}

/* Each reply starts with the call's id. */
#define CALL_ID REPLY_FIELD("id", REPLY_FIELD_STR, struct permit_call, id)

static const struct reply_col update_cols[] = {
    CALL_ID,
    {"phase", REPLY_STR, CH_PHASE, 0},
    {"state", REPLY_STR, CH_STATE, 0},
    {"changed", REPLY_BOOL, CH_CHANGED, 0},
    {"phase_at", REPLY_INT, CH_PHASE_AT, 0},
    {"now_at", REPLY_INT, CH_NOW, 0},
    {"state_at", REPLY_HIDDEN, CH_STATE_AT, 0},
    {"owner_session", REPLY_HIDDEN, CH_OWNER, 0},
    {"detail", REPLY_HIDDEN, CH_DETAIL, 0},
};
const struct reply_kind permit_update_reply = REPLY_KIND(update_cols);

static void updated(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok)
		req_fail_db(req, r);
	else if (one_change(req, &permit_update_reply, res))
		reply_permit_row(req, call, &permit_update_reply, res);
}

void rpc_permit_update(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	int phase = 0;
	char session[24], actor[256];

	if (!call)
		return;
	if (!permit_param_id(req, &call->id) ||
	    !req_param_enum(req, "phase", true, permit_phase_names, &phase, NULL))
		return;
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	permit_session_actor(req, actor, sizeof(actor));
	const char *params[4] = {call->id, session, permit_phase_names[phase], actor};
	/* guarantee 6: phase moves forward only, audited in the same transaction */
	req_query(req, "SELECT * FROM pgcoord.permit_update($1, $2, $3, $4)", 4, params, updated);
}

/* --- permit.mark_uncertain ----------------------------------------------- */

static const struct reply_col marked_cols[] = {
    CALL_ID,
    {"state", REPLY_STR, CH_STATE, 0},
    {"changed", REPLY_BOOL, CH_CHANGED, 0},
    {"state_at", REPLY_INT, CH_STATE_AT, 0},
    {"now_at", REPLY_INT, CH_NOW, 0},
    {"phase", REPLY_HIDDEN, CH_PHASE, 0},
    {"phase_at", REPLY_HIDDEN, CH_PHASE_AT, 0},
    {"owner_session", REPLY_HIDDEN, CH_OWNER, 0},
    {"detail", REPLY_HIDDEN, CH_DETAIL, 0},
};
const struct reply_kind permit_marked_reply = REPLY_KIND(marked_cols);

static void marked(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok)
		req_fail_db(req, r);
	else if (one_change(req, &permit_marked_reply, res))
		reply_permit_row(req, call, &permit_marked_reply, res);
}

void rpc_permit_mark_uncertain(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	char *reason = NULL;
	char session[24], actor[256];

	if (!call)
		return;
	if (!permit_param_id(req, &call->id) || !permit_param_text(req, "reason", true, &reason))
		return;
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	permit_session_actor(req, actor, sizeof(actor));
	const char *params[4] = {call->id, session, reason, actor};
	/* guarantee 5: the permit keeps counting, now visibly uncertain */
	req_query(req, "SELECT * FROM pgcoord.permit_mark_uncertain($1, $2, $3, $4)", 4, params,
		  marked);
	free(reason);
}

/* --- permit.resolve ------------------------------------------------------ */

static const struct reply_col resolved_cols[] = {
    CALL_ID,
    {"state", REPLY_STR, CH_STATE, 0},
    {"owner_session", REPLY_INT, CH_OWNER, 0},
    {"changed", REPLY_BOOL, CH_CHANGED, 0},
    {"detail", REPLY_STR, CH_DETAIL, 0},
    {"now_at", REPLY_INT, CH_NOW, 0},
    {"phase", REPLY_HIDDEN, CH_PHASE, 0},
    {"phase_at", REPLY_HIDDEN, CH_PHASE_AT, 0},
    {"state_at", REPLY_HIDDEN, CH_STATE_AT, 0},
};
const struct reply_kind permit_resolved_reply = REPLY_KIND(resolved_cols);

static void resolved(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok) {
		req_fail_db(req, r);
	} else if (one_change(req, &permit_resolved_reply, res)) {
		if (call->override)
			permit_log_override(req, call->id, "resolved by operator override",
					    PQgetvalue(res, 0, CH_STATE));
		reply_permit_row(req, call, &permit_resolved_reply, res);
	}
}

void rpc_permit_resolve(struct request *req)
{
	struct agent *ag = req->ag;
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	char *evidence = NULL;
	int outcome = 0;
	char session[24], actor[256], uid[24];
	bool has_session;

	if (!call)
		return;
	if (!permit_param_id(req, &call->id) ||
	    !req_param_enum(req, "outcome", true, outcome_names, &outcome, NULL) ||
	    !permit_param_override(req, &call->override) ||
	    /* guarantee 5: a slot is freed on observed evidence, never on silence */
	    !permit_param_text(req, "evidence", true, &evidence))
		goto fail;
	if (!call->override && !req_need_session(req))
		goto fail;
	has_session = req->conn->session != NULL;
	if (has_session)
		snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	if (call->override)
		permit_operator_actor(req, actor, sizeof(actor));
	else
		permit_session_actor(req, actor, sizeof(actor));
	/* an operator without a session who says "running" holds it as nobody's:
	 * it counts until an operator releases it */
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	/* another uid's permit (uncertain or not) is admin work */
	const char *params[9] = {uid,
				 req_is_admin(req) ? "true" : "false",
				 call->id,
				 has_session ? session : NULL,
				 has_session ? ag->cfg.replica_id : NULL,
				 outcome_names[outcome],
				 evidence,
				 call->override ? "true" : "false",
				 actor};
	req_query(req,
		  "SELECT * FROM pgcoord.permit_resolve_as($1, $2, $3, $4, $5, $6, $7, $8, $9)", 9,
		  params, resolved);
fail:
	free(evidence);
}
