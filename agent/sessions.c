/*
 * sessions.c — session registry and the session.* methods.
 */
#include "agent/sessions.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/keepalive.h"
#include "agent/leases.h"
#include "agent/pgrow.h"
#include "agent/reply.h"
#include "agent/session_order.h"
#include "agent/methods.h"

#define SESSION_NAME_MAX 200

static struct session *session_new(struct agent *ag, int64_t id, const char *name,
				   int64_t owner_uid)
{
	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->id = id;
	s->owner_uid = owner_uid;
	s->name = strdup(name ? name : "");
	if (!s->name) {
		free(s);
		return NULL;
	}
	s->next = ag->sessions;
	if (ag->sessions)
		ag->sessions->prev = s;
	ag->sessions = s;
	ag->nsessions++;
	return s;
}

static void session_remove(struct agent *ag, struct session *s)
{
	leases_session_ending(ag, s->id, "the session ended", LOG_LEVEL_WARN);
	keepalive_stop(s);
	if (s->conn) {
		s->conn->session = NULL;
		s->conn = NULL;
	}
	if (s->prev)
		s->prev->next = s->next;
	else
		ag->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	ag->nsessions--;
	free(s->name);
	free(s);
}

static void attach(struct session *s, struct conn *c)
{
	s->conn = c;
	c->session = s;
	c->lost_session = 0;
}

void sessions_detach(struct agent *ag, struct conn *c)
{
	struct session *s = c->session;
	(void)ag;
	if (!s)
		return;
	s->conn = NULL;
	s->detached_ms = mono_ms();
	c->session = NULL;
}

void sessions_add_internal(struct agent *ag, int64_t id)
{
	struct session *s = session_new(ag, id, "pgcoord-agent", (int64_t)geteuid());
	if (s)
		s->internal = true;
}

void sessions_adopt_detached(struct agent *ag, int64_t id)
{
	struct session *s;
	if (sessions_find(ag, id))
		return;
	s = session_new(ag, id, "", -1);
	if (s)
		s->detached_ms = mono_ms();
}

char *sessions_renew_list(struct agent *ag)
{
	size_t cap = 3 + (size_t)ag->nsessions * 21;
	char *out = malloc(cap);
	size_t n = 0;
	if (!out)
		return NULL;
	out[n++] = '{';
	uint64_t now = mono_ms();
	for (struct session *s = ag->sessions; s; s = s->next) {
		/* a keepalive overdue is never renewed, even before its timer ran
		 * (the loop may have been stalled): the row must lapse from the
		 * deadline on */
		if (s->closing || (s->keepalive_ms > 0 && now >= s->keepalive_due))
			continue;
		n += (size_t)snprintf(out + n, cap - n, "%s%" PRId64, n > 1 ? "," : "", s->id);
	}
	out[n++] = '}';
	out[n] = '\0';
	return out;
}

struct lost_note {
	int64_t id;
	const char *reason;
};

/* session.lost's params */
static const struct reply_col lost_cols[] = {
    REPLY_FIELD("session", REPLY_FIELD_INT, struct lost_note, id),
    REPLY_FIELD("reason", REPLY_FIELD_STR, struct lost_note, reason),
};
const struct reply_kind session_lost_params = REPLY_KIND(lost_cols);

static void lose(struct agent *ag, struct session *s, const char *reason, enum log_level level)
{
	struct lost_note note = {s->id, reason};
	char kv[48];
	snprintf(kv, sizeof(kv), "session=%" PRId64, s->id);
	log_write(&ag->log, level, "sessions", kv, "session lost: %s", reason);
	/* beliefs end before the client hears its session is gone */
	leases_session_ending(ag, s->id, reason, level);
	if (s->conn) {
		s->conn->lost_session = s->id;
		conn_notify_struct(s->conn, NOTICE_SESSION_LOST, &note);
	}
	session_remove(ag, s);
}

void sessions_lost(struct agent *ag, int64_t id, const char *reason)
{
	struct session *s = sessions_find(ag, id);
	if (s)
		lose(ag, s, reason, LOG_LEVEL_WARN);
}

void sessions_lose_all(struct agent *ag, const char *reason, enum log_level level)
{
	while (ag->sessions)
		lose(ag, ag->sessions, reason, level);
}

/* --- grace expiry ---------------------------------------------------- */

static void grace_closed(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;
	if (!r->ok)
		log_warn(&ag->log, "sessions",
			 "could not record the close of expired sessions (%s); they lapse by "
			 "session_ttl_ms instead",
			 r->message);
	/* either way they are no longer renewed, so they are gone */
	for (struct session *s = ag->sessions, *next; s; s = next) {
		next = s->next;
		if (s->closing && !s->busy)
			session_remove(ag, s);
	}
}

void sessions_expire_grace(struct agent *ag)
{
	uint64_t now = mono_ms();
	size_t cap = 3 + (size_t)ag->nsessions * 21, n = 0;
	char *ids;
	char inc[24];
	int count = 0;

	ids = malloc(cap);
	if (!ids)
		return;
	ids[n++] = '{';
	for (struct session *s = ag->sessions; s; s = s->next) {
		if (s->conn || s->busy || s->closing || s->internal ||
		    now - s->detached_ms < (uint64_t)ag->cfg.session_grace_ms)
			continue;
		leases_session_ending(ag, s->id, "the session's resume grace expired",
				      LOG_LEVEL_WARN);
		/* closed at a later tick, once its last lease statement returned */
		if (leases_busy(ag, s->id, NULL))
			continue;
		s->closing = true;
		n += (size_t)snprintf(ids + n, cap - n, "%s%" PRId64, count ? "," : "", s->id);
		count++;
	}
	ids[n++] = '}';
	ids[n] = '\0';
	if (count > 0) {
		const char *params[3] = {ids, inc, "resume grace expired"};
		snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
		log_info(&ag->log, "sessions", "closing %d session(s) whose resume grace expired",
			 count);
		if (!db_query(ag->db, DB_LANE_REQUESTS,
			      "SELECT pgcoord.session_close($1::bigint[], $2, $3)", 3, params,
			      grace_closed, ag)) {
			struct db_result r = {.ok = false, .message = "database unreachable"};
			grace_closed(&r, ag);
		}
	}
	free(ids);
}

/* --- session.open ---------------------------------------------------- */

/* keepalive_ms as session.open gave it: 0 (not enforced) or within
 * KEEPALIVE_MS_MIN..MAX. False once the request was answered invalid_params. */
static bool read_keepalive_ms(struct request *req, int64_t *out)
{
	*out = 0;
	if (!req_param_int(req, "keepalive_ms", false, 0, KEEPALIVE_MS_MAX, out, NULL))
		return false;
	if (*out > 0 && *out < KEEPALIVE_MS_MIN) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "keepalive_ms must be 0 (no keepalive) or %d..%d, got %" PRId64,
			 KEEPALIVE_MS_MIN, KEEPALIVE_MS_MAX, *out);
		return false;
	}
	return true;
}

/* A new or resumed session's answer. */
struct open_view {
	int64_t session, ttl_ms, grace_ms, keepalive_ms;
	bool resumed;
};

static const struct reply_col open_cols[] = {
    REPLY_FIELD("session", REPLY_FIELD_INT, struct open_view, session),
    REPLY_FIELD("resumed", REPLY_FIELD_BOOL, struct open_view, resumed),
    REPLY_FIELD("ttl_ms", REPLY_FIELD_INT, struct open_view, ttl_ms),
    REPLY_FIELD("grace_ms", REPLY_FIELD_INT, struct open_view, grace_ms),
    REPLY_FIELD("keepalive_ms", REPLY_FIELD_INT, struct open_view, keepalive_ms),
};
const struct reply_kind session_open_reply = REPLY_KIND(open_cols);

static void answer_open(struct request *req, const struct session *s, bool resumed)
{
	struct open_view v = {
	    .session = s->id,
	    .resumed = resumed,
	    .ttl_ms = req->ag->cfg.session_ttl_ms,
	    .grace_ms = req->ag->cfg.session_grace_ms,
	    .keepalive_ms = s->keepalive_ms,
	};
	reply_pack_struct(req_result(req), &session_open_reply, &v);
}

static void opened(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct agent *ag = req->ag;
	struct conn *c = req->conn;
	struct session *s;
	int64_t id, keepalive_ms;

	/* a superseded incarnation is refused by the database (PCSUP) */
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (PQntuples(r->res) != 1 || pgrow_null(r->res, 0, 0)) {
		req_fail(req, PGC_E_INTERNAL, "session_open returned no session");
		return;
	}
	id = pgrow_int(r->res, 0, 0);
	/* validated before the statement was sent */
	(void)read_keepalive_ms(req, &keepalive_ms);
	s = session_new(ag, id, "", (int64_t)c->uid);
	if (!s) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return;
	}
	/* the clock starts when the session exists, attached or not */
	if (keepalive_ms > 0 && !keepalive_start(ag, s, (int)keepalive_ms, sessions_lost)) {
		session_remove(ag, s);
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return;
	}
	if (c->closed || c->session) {
		/* the client left (or raced a second open): keep it resumable */
		s->detached_ms = mono_ms();
	} else {
		attach(s, c);
	}
	answer_open(req, s, false);
	char kv[96] = "";
	log_kv_int(kv, sizeof(kv), "session", id);
	log_kv_int(kv, sizeof(kv), "pid", c->pid);
	log_kv_int(kv, sizeof(kv), "uid", c->uid);
	log_write(&ag->log, LOG_LEVEL_INFO, "sessions", kv, "opened");
	req_done(req);
}

/* Sessions answer to the uid that opened them: another uid (not an admin)
 * may not resume one. A session of unknown owner (opened before owners were
 * recorded) is for admins only. */
static void fail_not_owner(struct request *req, const struct session *s)
{
	char owner[24] = "no recorded uid";
	if (s->owner_uid >= 0)
		snprintf(owner, sizeof(owner), "uid %" PRId64, s->owner_uid);
	req_fail(req, PGC_E_FORBIDDEN,
		 "session %" PRId64 " belongs to %s; resuming another uid's session needs admin",
		 s->id, owner);
}

/* What session.open (resuming) and session.close keep for their callback:
 * the session, found again by id since the registry may change meanwhile. */
struct session_call {
	int64_t id;
};

static void resumed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct agent *ag = req->ag;
	int64_t id = 0, keepalive_ms;
	struct session *s;

	/* validated before the statement was sent */
	(void)read_keepalive_ms(req, &keepalive_ms);
	/* find the target again by id: the registry may have changed while
	 * the statement ran */
	id = ((const struct session_call *)req->ctx)->id;
	s = sessions_find(ag, id);
	if (s)
		s->busy = false;
	/* the database refuses another uid (PCFBD) and a session that is not
	 * resumable here (PCSEX), which is then lost here too */
	if (!r->ok) {
		if (s && r->sqlstate && strcmp(r->sqlstate, "PCSEX") == 0)
			lose(ag, s, "no longer live in the database", LOG_LEVEL_WARN);
		req_fail_db(req, r);
		return;
	}
	if (PQntuples(r->res) != 1 || !s) {
		req_fail(req, PGC_E_SESSION_EXPIRED,
			 "session %lld is no longer live; open a new one", (long long)id);
		return;
	}
	/* the database knows the owner of a predecessor's session: keep it */
	s->owner_uid = pgrow_null(r->res, 0, 2) ? -1 : pgrow_int(r->res, 0, 2);
	if (req->conn->closed || req->conn->session) {
		s->detached_ms = mono_ms();
		req_fail(req, PGC_E_CONFLICT, "the connection closed or opened another session");
		return;
	}
	/* a predecessor's session came without its keepalive_ms: the resume
	 * names it again; a session opened here keeps its own, and its clock */
	if (s->keepalive_ms == 0 && keepalive_ms > 0 &&
	    !keepalive_start(ag, s, (int)keepalive_ms, sessions_lost)) {
		s->detached_ms = mono_ms();
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return;
	}
	attach(s, req->conn);
	answer_open(req, s, true);
	char kv[96] = "";
	log_kv_int(kv, sizeof(kv), "session", id);
	log_kv_int(kv, sizeof(kv), "pid", req->conn->pid);
	log_kv_int(kv, sizeof(kv), "uid", req->conn->uid);
	log_write(&ag->log, LOG_LEVEL_INFO, "sessions", kv, "resumed");
	req_done(req);
}

void rpc_session_open(struct request *req)
{
	struct agent *ag = req->ag;
	char *name = NULL;
	int64_t resume = 0, keepalive_ms;
	bool has_resume = false;
	char inc[24], ttl[24], idbuf[24], uid[24];

	if (!req_param_str(req, "name", false, SESSION_NAME_MAX, &name) ||
	    !req_param_int(req, "resume", false, 1, INT64_MAX, &resume, &has_resume) ||
	    !read_keepalive_ms(req, &keepalive_ms)) {
		free(name);
		return;
	}
	if (!req_may_open_sessions(req)) {
		free(name);
		req_fail(req, PGC_E_FORBIDDEN,
			 "uid %u may not open sessions: it is not in client_uids or client_group "
			 "(admins always may)",
			 (unsigned)req->conn->uid);
		return;
	}
	if (req->conn->session) {
		free(name);
		req_fail(req, PGC_E_CONFLICT, "this connection already has session %lld",
			 (long long)req->conn->session->id);
		return;
	}
	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	snprintf(ttl, sizeof(ttl), "%d", ag->cfg.session_ttl_ms);
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	if (has_resume) {
		struct session *s = sessions_find(ag, resume);
		free(name);
		if (!s || s->closing || s->internal) {
			req_fail(
			    req, PGC_E_SESSION_EXPIRED,
			    "session %lld is not resumable on this agent (closed, expired, past "
			    "its grace, or held by another agent)",
			    (long long)resume);
			return;
		}
		/* before saying whether it is attached: another uid learns
		 * nothing about the session */
		if (s->owner_uid != -1 && s->owner_uid != (int64_t)req->conn->uid &&
		    !req_is_admin(req)) {
			fail_not_owner(req, s);
			return;
		}
		/* A client that reconnects at once can overtake the old
		 * connection's hang-up in this loop: that connection can carry
		 * no more replies, so it ends now and the resume goes ahead. */
		if (s->conn && !s->busy && s->conn != req->conn && conn_peer_gone(s->conn))
			conn_close(s->conn, "its client hung up (seen by the session's resume)");
		if (s->conn || s->busy) {
			req_fail(req, PGC_E_CONFLICT,
				 "session %lld is attached to another connection",
				 (long long)resume);
			return;
		}
		snprintf(idbuf, sizeof(idbuf), "%" PRId64, resume);
		const char *params[6] = {
		    idbuf, ag->cfg.replica_id, inc, ttl, uid, req_is_admin(req) ? "true" : "false"};
		struct session_call *call = req_ctx_alloc(req, sizeof(*call), NULL);
		if (!call)
			return;
		call->id = resume;
		/* the database checks the owner too: it alone knows the owner
		 * of a predecessor's session */
		if (req_query(req,
			      "SELECT session_id, name, owner_uid "
			      "FROM pgcoord.session_resume($1, $2, $3, $4, $5, $6)",
			      6, params, resumed))
			s->busy = true;
		return;
	}
	const char *params[5] = {ag->cfg.replica_id, inc, name ? name : "", ttl, uid};
	req_query(req, "SELECT pgcoord.session_open($1, $2, $3, $4, false, $5)", 5, params, opened);
	free(name);
}

/* --- session.keepalive ----------------------------------------------- */

struct keepalive_view {
	int64_t session, last_heartbeat_ms_ago, keepalive_ms, next_due_ms;
	bool live;
};

static const struct reply_col keepalive_cols[] = {
    REPLY_FIELD("session", REPLY_FIELD_INT, struct keepalive_view, session),
    REPLY_FIELD("live", REPLY_FIELD_BOOL, struct keepalive_view, live),
    REPLY_FIELD("last_heartbeat_ms_ago", REPLY_FIELD_INT, struct keepalive_view,
		last_heartbeat_ms_ago),
    REPLY_FIELD("keepalive_ms", REPLY_FIELD_INT, struct keepalive_view, keepalive_ms),
    REPLY_FIELD("next_due_ms", REPLY_FIELD_INT, struct keepalive_view, next_due_ms),
};
const struct reply_kind session_keepalive_reply = REPLY_KIND(keepalive_cols);

void rpc_session_keepalive(struct request *req)
{
	struct agent *ag = req->ag;
	struct session *s = req->conn->session;
	int64_t id = s->id;
	uint64_t now = mono_ms();

	if (!keepalive_touch(ag, s)) {
		req_fail(req, PGC_E_SESSION_EXPIRED,
			 "session %" PRId64 " is lost: its keepalive came after keepalive_ms; "
			 "open a new one",
			 id);
		return;
	}
	struct keepalive_view v = {
	    .session = id,
	    .live = true,
	    .last_heartbeat_ms_ago =
		ag->id.hb_last_ok_ms ? (int64_t)(now - ag->id.hb_last_ok_ms) : -1,
	    .keepalive_ms = s->keepalive_ms,
	    .next_due_ms = keepalive_due_in_ms(s),
	};
	reply_pack_struct(req_result(req), &session_keepalive_reply, &v);
	req_done(req);
}

/* --- session.close --------------------------------------------------- */

struct close_view {
	bool closed;
};

static const struct reply_col close_cols[] = {
    REPLY_FIELD("closed", REPLY_FIELD_BOOL, struct close_view, closed),
};
const struct reply_kind session_close_reply = REPLY_KIND(close_cols);

static void closed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct agent *ag = req->ag;
	int64_t id = 0;
	struct session *s;

	id = ((const struct session_call *)req->ctx)->id;
	s = sessions_find(ag, id);
	if (s)
		session_remove(ag, s);
	if (!r->ok) {
		/* it is no longer renewed, so it lapses within session_ttl_ms */
		req_fail_db(req, r);
		return;
	}
	char kv[48];
	snprintf(kv, sizeof(kv), "session=%" PRId64, id);
	log_write(&ag->log, LOG_LEVEL_INFO, "sessions", kv, "closed by its client");
	struct close_view v = {.closed = true};
	reply_pack_struct(req_result(req), &session_close_reply, &v);
	req_done(req);
}

void rpc_session_close(struct request *req)
{
	struct agent *ag = req->ag;
	struct session *s = req->conn->session;
	char ids[32], inc[24];

	if (s->busy) {
		req_fail(req, PGC_E_CONFLICT, "a close of this session is already under way");
		return;
	}
	/* beliefs end before the hand-back is sent */
	leases_session_ending(ag, s->id, "the session was closed", LOG_LEVEL_INFO);
	/* ...which goes after any statement of its leases still running */
	if (leases_park_if_busy(ag, s->id, NULL, req))
		return;
	snprintf(ids, sizeof(ids), "{%" PRId64 "}", s->id);
	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	const char *params[3] = {ids, inc, "closed by client"};
	struct session_call *call = req_ctx_alloc(req, sizeof(*call), NULL);
	if (!call)
		return;
	call->id = s->id;
	if (req_query(req, "SELECT pgcoord.session_close($1::bigint[], $2, $3)", 3, params,
		      closed)) {
		s->busy = true;
		s->closing = true;
	}
}
