/*
 * request.c — a request's life once dispatched (dispatch.h): its context,
 * its one answer (req_done, req_fail), its statement on the requests lane,
 * the reply budget and the checks of who the peer is. Apart from
 * dispatch.c, which decides which handler runs, because every handler
 * calls these and none calls the table.
 */
#include <stdarg.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/dispatch_internal.h"
#include "agent/metrics.h"
#include "agent/reply.h"
#include "agent/session_registry.h"

void req_log_kv(const struct request *req, char *buf, size_t len)
{
	int n =
	    snprintf(buf, len, "conn=%llu msgid=%u method=%s", (unsigned long long)req->conn->id,
		     (unsigned)req->msgid, req->method ? req->method->name : "unknown");
	if (req->conn->session && n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, " session=%lld",
			 (long long)req->conn->session->id);
}

/* Counts the answer in the metrics (labels: the method table's name, or
 * "unknown", and the outcome) and logs it at debug level. */
void dispatch_req_count(struct request *req, int outcome)
{
	struct agent *ag = req->ag;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double s = (double)(now.tv_sec - req->started_ts.tv_sec) +
		   (double)(now.tv_nsec - req->started_ts.tv_nsec) / 1e9;
	metrics_rpc(ag->metrics, req->method_index, outcome, s);
	if (ag->log.level >= LOG_LEVEL_DEBUG) {
		char kv[256];
		req_log_kv(req, kv, sizeof(kv));
		log_write(&ag->log, LOG_LEVEL_DEBUG, "dispatch", kv, "answered %s in %.3f ms",
			  outcome ? pgc_error_name((enum pgc_error_code)outcome) : "ok", s * 1e3);
	}
}

void dispatch_req_free(struct request *req)
{
	struct conn *c = req->conn;
	if (req->ctx && req->ctx_free)
		req->ctx_free(req->ctx);
	free(req->ctx);
	msgpack_unpacked_destroy(&req->unpacked);
	msgpack_sbuffer_destroy(&req->out);
	free(req->frame);
	free(req);
	c->inflight--;
	conn_unref(c);
}

void dispatch_send_error(struct conn *c, uint32_t msgid, enum pgc_error_code code, const char *msg)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_response_error(&pk, msgid, pgc_error_name(code), msg, pgc_error_retryable(code));
	conn_send(c, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
}

msgpack_packer *req_result(struct request *req)
{
	req->result_started = true;
	pgc_pack_response_ok_begin(&req->pk, req->msgid);
	return &req->pk;
}

void req_done(struct request *req)
{
	dispatch_req_count(req, 0);
	conn_send(req->conn, req->out.data, req->out.size);
	dispatch_req_free(req);
}

void req_fail(struct request *req, enum pgc_error_code code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (code == PGC_E_INTERNAL) {
		char kv[256];
		req_log_kv(req, kv, sizeof(kv));
		log_write(&req->ag->log, LOG_LEVEL_ERROR, "dispatch", kv, "%s failed: %s",
			  req->method->name, msg);
	} else if (code == PGC_E_FORBIDDEN) {
		/* every refusal of the authorisation rules, once, with who asked */
		char kv[256];
		req_log_kv(req, kv, sizeof(kv));
		log_write(&req->ag->log, LOG_LEVEL_WARN, "authz", kv, "uid %u refused %s: %s",
			  (unsigned)req->conn->uid, req->method->name, msg);
	}
	dispatch_req_count(req, code);
	dispatch_send_error(req->conn, req->msgid, code, msg);
	dispatch_req_free(req);
}

void req_fail_db(struct request *req, const struct db_result *res)
{
	if (res->error == PGC_E_INTERNAL)
		req_fail(req, PGC_E_INTERNAL, "database error: %s", res->message);
	else
		req_fail(req, res->error, "%s", res->message);
}

bool req_query(struct request *req, const char *sql, int nparams, const char *const *params,
	       db_done_fn done)
{
	/* the connection outlives its requests (refcount), so &closed stays valid */
	if (!db_query_unless(req->ag->db, DB_LANE_REQUESTS, sql, nparams, params, done, req,
			     &req->conn->closed)) {
		req_fail(req, PGC_E_UNAVAILABLE,
			 "the database is unreachable (or its queue is full); retry");
		return false;
	}
	return true;
}

bool req_is_admin(const struct request *req)
{
	return conn_peer_is_admin(req->ag, req->conn->uid, req->conn->gid);
}

bool req_may_open_sessions(const struct request *req)
{
	const struct admin_set *c = &req->ag->cfg.clients;
	if (!c->has_group && c->nuids == 0)
		return true; /* not narrowed: whoever reaches the socket */
	return req_is_admin(req) || uid_set_has(c, req->conn->uid, req->conn->gid);
}

size_t req_reply_budget(const struct request *req)
{
	size_t out = (size_t)req->ag->cfg.max_output_bytes;
	/* headroom for the envelope and notifications queued beside it */
	return out > 2 * 65536 ? out - 65536 : out / 2;
}

/* Per field: its key (the longest is ~20 bytes) and MessagePack framing. */
#define REPLY_FIELD_ALLOWANCE 32

bool req_rows_fit(struct request *req, const PGresult *res, const char *how_to_page)
{
	size_t budget = req_reply_budget(req), total = 0;
	int rows = PQntuples(res), cols = PQnfields(res);

	for (int i = 0; i < rows && total <= budget; i++)
		for (int j = 0; j < cols; j++)
			total += (size_t)PQgetlength(res, i, j) + REPLY_FIELD_ALLOWANCE;
	if (total <= budget)
		return true;
	req_fail(req, PGC_E_TOO_LARGE,
		 "%s would answer more than %zu bytes, over the reply budget (max_output_bytes "
		 "less headroom); %s",
		 req->method->name, budget, how_to_page);
	return false;
}

bool req_rows_are(struct request *req, const struct reply_kind *kind, const PGresult *res,
		  int offset)
{
	if (reply_kind_fits(kind, res, offset))
		return true;
	req_fail(req, PGC_E_INTERNAL, "%s: a statement answered %d columns where %d were expected",
		 req->method->name, res ? PQnfields(res) : -1, offset + reply_kind_width(kind));
	return false;
}

void *req_ctx_alloc(struct request *req, size_t size, void (*free_fn)(void *ctx))
{
	/* one context per request: a second would leak the first */
	if (req->ctx) {
		req_fail(req, PGC_E_INTERNAL, "%s: a second request context", req->method->name);
		return NULL;
	}
	req->ctx = calloc(1, size);
	if (!req->ctx) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return NULL;
	}
	req->ctx_free = free_fn;
	return req->ctx;
}

bool req_need_session(struct request *req)
{
	struct conn *c = req->conn;
	if (c->session)
		return true;
	if (c->lost_session)
		req_fail(req, PGC_E_SESSION_EXPIRED,
			 "session %lld is no longer live; open a new one",
			 (long long)c->lost_session);
	else
		req_fail(req, PGC_E_NO_SESSION, "%s needs a session: call session.open first",
			 req->method->name);
	return false;
}
