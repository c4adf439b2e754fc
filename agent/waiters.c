/*
 * waiters.c — see waiters.h.
 */
#include "agent/waiters.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/reply.h"
#include "agent/sessions.h"

#define WAITER_ID_MAX 200

/* A waiter of one of this agent's sessions, as far as the agent knows. */
struct waiter {
	struct waiter *next;
	char *id;
	int64_t session_id;
};

struct waiter_registry {
	struct waiter *list;
	int count;
	struct event *timer;
	bool poll_in_flight;
	uint64_t admitted, expired; /* notifications pushed */
};

static struct waiter_registry *waiter_reg(const struct agent *ag)
{
	return ag->waiters;
}

int waiters_count(const struct agent *ag)
{
	return waiter_reg(ag) ? waiter_reg(ag)->count : 0;
}

uint64_t waiters_admitted_total(const struct agent *ag)
{
	return waiter_reg(ag) ? waiter_reg(ag)->admitted : 0;
}

uint64_t waiters_expired_total(const struct agent *ag)
{
	return waiter_reg(ag) ? waiter_reg(ag)->expired : 0;
}

/* Forgets id of session_id; false when it was not tracked. */
static bool forget(struct waiter_registry *rg, const char *id, int64_t session_id)
{
	for (struct waiter **pp = &rg->list; *pp; pp = &(*pp)->next) {
		struct waiter *w = *pp;
		if (w->session_id == session_id && strcmp(w->id, id) == 0) {
			*pp = w->next;
			free(w->id);
			free(w);
			rg->count--;
			return true;
		}
	}
	return false;
}

void waiters_track(struct agent *ag, const char *id, int64_t session_id)
{
	struct waiter_registry *rg = waiter_reg(ag);
	if (!rg)
		return;
	for (struct waiter *w = rg->list; w; w = w->next)
		if (w->session_id == session_id && strcmp(w->id, id) == 0)
			return; /* a retry of a queued claim */
	struct waiter *w = calloc(1, sizeof(*w));
	if (!w || !(w->id = strdup(id))) {
		/* out of memory: the session still learns by retrying the claim */
		free(w);
		return;
	}
	w->session_id = session_id;
	w->next = rg->list;
	rg->list = w;
	rg->count++;
}

/* --- permit.cancel ------------------------------------------------------ */

/* The columns of pgcoord.cancel_decision (0006_waiting_claims.sql); a
 * refusal arrives as the statement's SQLSTATE instead. */
enum { CD_STATUS, CD_NOW };
/* What a cancel answers: the id and whether it left the queue, then the
 * row. */
struct cancel_view {
	const char *id;
	bool cancelled;
};

static const struct reply_col cancel_cols[] = {
    REPLY_FIELD("id", REPLY_FIELD_STR, struct cancel_view, id),
    REPLY_FIELD("cancelled", REPLY_FIELD_BOOL, struct cancel_view, cancelled),
    {"status", REPLY_STR, CD_STATUS, 0},
    {"now_at", REPLY_INT, CD_NOW, 0},
};
const struct reply_kind permit_cancel_reply = REPLY_KIND(cancel_cols);

/* pgcoord.cancel_status: whether this call took the claim out of the
 * queue (the others name the permit's state: it was not queued). */
static const struct {
	const char *status;
	bool cancelled;
} cancel_statuses[] = {{"cancelled", true}, {"held", false}, {"released", false}};

struct cancel_call {
	char *id;
	int64_t session_id;
};

static void cancel_call_free(void *ctx)
{
	free(((struct cancel_call *)ctx)->id);
}

static void cancelled(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct cancel_call *call = req->ctx;
	const PGresult *res = r->res;
	size_t i = 0, n = sizeof(cancel_statuses) / sizeof(cancel_statuses[0]);

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &permit_cancel_reply, res, 0))
		return;
	if (PQntuples(res) == 1)
		while (i < n && strcmp(PQgetvalue(res, 0, CD_STATUS), cancel_statuses[i].status))
			i++;
	if (PQntuples(res) != 1 || i == n) {
		req_fail(req, PGC_E_INTERNAL, "permit_cancel: unexpected answer");
		return;
	}
	if (cancel_statuses[i].cancelled && waiter_reg(req->ag))
		forget(waiter_reg(req->ag), call->id, call->session_id);
	struct cancel_view v = {call->id, cancel_statuses[i].cancelled};
	struct reply_src src = {.res = res, .row = 0, .nrows = 1, .c = &v};
	reply_pack(req_result(req), &permit_cancel_reply, &src);
	req_done(req);
}

void rpc_permit_cancel(struct request *req)
{
	struct cancel_call *call = req_ctx_alloc(req, sizeof(*call), cancel_call_free);
	char uid[24], session[24];

	if (!call || !req_param_name(req, "id", true, WAITER_ID_MAX, &call->id))
		return;
	call->session_id = req->conn->session->id;
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	snprintf(session, sizeof(session), "%" PRId64, call->session_id);
	const char *params[4] = {uid, req_is_admin(req) ? "true" : "false", call->id, session};
	req_query(req, "SELECT * FROM pgcoord.permit_cancel($1, $2, $3, $4)", 4, params, cancelled);
}

/* --- the poll ----------------------------------------------------------- */

/* Columns of pgcoord.waiters_poll. */
enum {
	WP_ID,
	WP_SESSION,
	WP_STATE,
	WP_REASON,
	WP_TOKEN,
	WP_PSTATE,
	WP_PHASE,
	WP_REPLICA,
	WP_CREATED,
	WP_QUEUED_MS,
	WP_NOW,
};

/* What a waiter hears when admitted, and when its wait ran out. */
static const struct reply_col admitted_cols[] = {
    {"id", REPLY_STR, WP_ID, 0},
    {"token", REPLY_INT, WP_TOKEN, 0},
    {"state", REPLY_STR, WP_PSTATE, 0},
    {"phase", REPLY_STR, WP_PHASE, 0},
    {"owner_session", REPLY_INT, WP_SESSION, 0},
    {"owner_replica", REPLY_STR, WP_REPLICA, 0},
    {"created_at", REPLY_INT, WP_CREATED, 0},
    {"queued_ms", REPLY_INT, WP_QUEUED_MS, 0},
    {"now_at", REPLY_INT, WP_NOW, 0},
    {"waiter_state", REPLY_HIDDEN, WP_STATE, 0},
    {"reason", REPLY_HIDDEN, WP_REASON, 0},
};
const struct reply_kind permit_admitted_params = REPLY_KIND(admitted_cols);

static const struct reply_col expired_cols[] = {
    {"id", REPLY_STR, WP_ID, 0},
    {"reason", REPLY_STR, WP_REASON, 0},
    {"now_at", REPLY_INT, WP_NOW, 0},
};
const struct reply_kind permit_expired_params = REPLY_KIND(expired_cols);

static void poll_done(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;
	struct waiter_registry *rg = waiter_reg(ag);

	if (!rg)
		return; /* the agent is exiting */
	rg->poll_in_flight = false;
	if (!r->ok) {
		log_debug(&ag->log, "waiters", "the waiter poll failed: %s", r->message);
		return;
	}
	if (!reply_kind_fits(&permit_admitted_params, r->res, 0))
		return;
	for (int i = 0; i < PQntuples(r->res); i++) {
		const char *id = PQgetvalue(r->res, i, WP_ID);
		int64_t session_id = pgrow_int(r->res, i, WP_SESSION);
		bool admitted = strcmp(PQgetvalue(r->res, i, WP_STATE), "admitted") == 0;
		struct session *s = sessions_find(ag, session_id);
		struct reply_src row = {.res = r->res, .row = i, .nrows = 1};

		forget(rg, id, session_id);
		/* a detached session re-asks with permit.get or a retry */
		if (!s || !s->conn)
			continue;
		if (admitted && !pgrow_null(r->res, i, WP_TOKEN)) {
			conn_notify(s->conn, NOTICE_PERMIT_ADMITTED, &row);
			rg->admitted++;
		} else if (!admitted) {
			conn_notify(s->conn, NOTICE_PERMIT_EXPIRED, &row);
			rg->expired++;
		}
	}
}

/* Drops the waiters of sessions that ended: the database removed them in
 * the transaction that ended the session. */
static void prune(struct agent *ag, struct waiter_registry *rg)
{
	for (struct waiter **pp = &rg->list; *pp;) {
		struct waiter *w = *pp;
		struct session *s = sessions_find(ag, w->session_id);
		if (!s || s->closing) {
			*pp = w->next;
			free(w->id);
			free(w);
			rg->count--;
			continue;
		}
		pp = &w->next;
	}
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	struct waiter_registry *rg = waiter_reg(ag);
	(void)fd;
	(void)what;

	prune(ag, rg);
	/* only while there are waiters, and never two statements at once */
	if (!rg->list || rg->poll_in_flight || !ag->id.registered)
		return;
	const char *params[1] = {ag->cfg.replica_id};
	if (db_query(ag->db, DB_LANE_REQUESTS, "SELECT * FROM pgcoord.waiters_poll($1)", 1, params,
		     poll_done, ag))
		rg->poll_in_flight = true;
}

bool waiters_start(struct agent *ag)
{
	struct waiter_registry *rg = calloc(1, sizeof(*rg));
	if (!rg)
		return false;
	rg->timer = event_new(ag->base, -1, EV_PERSIST, poll_cb, ag);
	if (!rg->timer) {
		free(rg);
		return false;
	}
	ag->waiters = rg;
	struct timeval tv = {ag->cfg.wait_poll_ms / 1000, (ag->cfg.wait_poll_ms % 1000) * 1000};
	event_add(rg->timer, &tv);
	return true;
}

void waiters_finish(struct agent *ag)
{
	struct waiter_registry *rg = waiter_reg(ag);
	if (!rg)
		return;
	while (rg->list) {
		struct waiter *w = rg->list;
		rg->list = w->next;
		free(w->id);
		free(w);
	}
	event_free(rg->timer);
	free(rg);
	ag->waiters = NULL;
}
