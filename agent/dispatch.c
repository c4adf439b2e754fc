/*
 * dispatch.c — see dispatch.h.
 */
#include "agent/dispatch.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/methods.h"
#include "agent/reply.h"
#include "agent/metrics.h"
#include "agent/session_registry.h"

/*
 * Every method and its authorisation class (PROTOCOL.md, "Who may call
 * what"): M_READ answers anyone (fleet views; another uid's intents and
 * data come back nil with redacted: true), M_OWNER acts only on what the
 * caller's uid owns through its sessions — the handlers' statements check
 * the owner in the same transaction, and admins pass — and M_ADMIN is
 * refused here to anyone but an admin. The last column lists the
 * parameter keys each accepts (PROTOCOL.md's method headings): any other
 * key is refused before the handler runs, so a misspelled option is an
 * error rather than a silent default.
 */
static const struct method methods[] = {
    {"agent.hello", rpc_agent_hello, M_READ, "client"},
    {"agent.ping", rpc_agent_ping, M_READ, ""},
    {"agent.status", rpc_agent_status, M_READ, ""},
    /* a new session needs client_uids/client_group; a resume, the owner */
    {"session.open", rpc_session_open, M_OWNER | M_DB, "name, resume, keepalive_ms"},
    {"session.keepalive", rpc_session_keepalive, M_OWNER | M_SESSION, ""},
    {"session.close", rpc_session_close, M_OWNER | M_DB | M_SESSION, ""},
    {"lease.acquire", rpc_lease_acquire, M_OWNER | M_DB | M_SESSION,
     "name, ttl_ms, renew_ms, wait"},
    {"lease.release", rpc_lease_release, M_OWNER | M_DB | M_SESSION, "name"},
    {"lease.status", rpc_lease_status, M_READ | M_DB, "name, watch"},
    {"lease.list", rpc_lease_list, M_READ | M_DB, "limit, cursor"},
    {"fleet.agents", rpc_fleet_agents, M_READ | M_DB, "limit, cursor"},
    {"fleet.sessions", rpc_fleet_sessions, M_READ | M_DB, "limit, cursor"},
    {"quota.set", rpc_quota_set, M_ADMIN | M_DB, "key, limit, lapse_after_s"},
    {"quota.get", rpc_quota_get, M_READ | M_DB, "key"},
    {"quota.list", rpc_quota_list, M_READ | M_DB, "limit, cursor"},
    {"quota.why", rpc_quota_why, M_READ | M_DB, "key, holders"},
    /* a limit from a non-admin only creates a missing quota */
    {"permit.claim", rpc_permit_claim, M_OWNER | M_DB | M_SESSION,
     "id, quotas, intent, on_owner_loss, limit, wait_ms"},
    {"permit.update", rpc_permit_update, M_OWNER | M_DB | M_SESSION, "id, phase"},
    {"permit.mark_uncertain", rpc_permit_mark_uncertain, M_OWNER | M_DB | M_SESSION, "id, reason"},
    /* resolve and release need the owner's session (or its uid, for an
     * uncertain permit), or an admin; override: true is admin only. The
     * handlers check which */
    {"permit.resolve", rpc_permit_resolve, M_OWNER | M_DB, "id, outcome, evidence, override"},
    {"permit.release", rpc_permit_release, M_OWNER | M_DB, "id, override, reason"},
    {"permit.get", rpc_permit_get, M_READ | M_DB, "id"},
    {"permit.list", rpc_permit_list, M_READ | M_DB, "quota, state, phase, owner, limit, cursor"},
    {"permit.history", rpc_permit_history, M_READ | M_DB, "id"},
    {"permit.check", rpc_permit_check, M_READ | M_DB, ""},
    /* a waiting claim belongs to the session that queued it */
    {"permit.cancel", rpc_permit_cancel, M_OWNER | M_DB | M_SESSION, "id"},
    {"record.put", rpc_record_put, M_OWNER | M_DB | M_SESSION, "kind, key, state, data, permit"},
    /* update and settle also run for a session the agent declared lost, so
     * its former owner hears `fenced` (or `session_expired`): records.c */
    {"record.update", rpc_record_update, M_OWNER | M_DB, "kind, key, state, data, token"},
    {"record.settle", rpc_record_settle, M_OWNER | M_DB, "kind, key, state, token"},
    {"record.get", rpc_record_get, M_READ | M_DB, "kind, key"},
    {"record.list", rpc_record_list, M_READ | M_DB,
     "kind, owner, live_owner, terminal, limit, cursor"},
    /* a session unless dry_run; answers liveness_read: false by itself
     * while the database is down. Only the caller's uid's dead owners'
     * records, unless an admin */
    {"record.recover", rpc_record_recover, M_OWNER | M_DB | M_DB_DOWN_OK, "kinds, limit, dry_run"},
    /* watches belong to the caller's session; what they push carries no
     * permit intent or record data, so there is nothing to redact */
    {"quota.watch", rpc_quota_watch, M_READ | M_SESSION, "key"},
    {"permit.watch", rpc_permit_watch, M_READ | M_SESSION, "id"},
    {"record.watch", rpc_record_watch, M_READ | M_SESSION, "kind"},
    {"watch.cancel", rpc_watch_cancel, M_READ | M_SESSION, "watch"},
};

static const struct method *find_method(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
		if (strlen(methods[i].name) == len && memcmp(methods[i].name, name, len) == 0)
			return &methods[i];
	}
	return NULL;
}

size_t dispatch_method_count(void)
{
	return sizeof(methods) / sizeof(methods[0]);
}

const char *dispatch_method_name(size_t i)
{
	return i < dispatch_method_count() ? methods[i].name : "unknown";
}

const char *dispatch_method_class(size_t i)
{
	if (i >= dispatch_method_count())
		return "unknown";
	switch (methods[i].flags & M_CLASS_MASK) {
	case M_READ:
		return "read";
	case M_OWNER:
		return "owner";
	case M_ADMIN:
		return "admin";
	default:
		return "unknown"; /* a table entry without exactly one class */
	}
}

const char *dispatch_method_params(size_t i)
{
	return i < dispatch_method_count() ? methods[i].params : "";
}

bool dispatch_key_listed(const char *list, const char *key, size_t len)
{
	for (const char *p = list; *p;) {
		size_t n = strcspn(p, ",");
		if (n == len && memcmp(p, key, len) == 0)
			return true;
		p += n;
		p += strspn(p, ", ");
	}
	return false;
}

/* Answers `invalid_params` naming the first key the method does not
 * accept; keys starting with "x-" are left for newer agents and ignored. */
static bool params_known(struct request *req)
{
	const msgpack_object_map *m;
	const char *accepted;

	if (!req->params)
		return true;
	m = &req->params->via.map;
	accepted = req->method->params;
	for (uint32_t i = 0; i < m->size; i++) {
		const msgpack_object *k = &m->ptr[i].key;
		if (k->type != MSGPACK_OBJECT_STR) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "parameter keys must be strings, not %s", pgc_obj_type_name(k));
			return false;
		}
		if (k->via.str.size >= 2 && memcmp(k->via.str.ptr, "x-", 2) == 0)
			continue;
		if (dispatch_key_listed(accepted, k->via.str.ptr, k->via.str.size))
			continue;
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "unknown parameter \"%.*s\" for %s; accepted: %s",
			 (int)(k->via.str.size > 64 ? 64 : k->via.str.size), k->via.str.ptr,
			 req->method->name, *accepted ? accepted : "none");
		return false;
	}
	return true;
}

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
static void req_count(struct request *req, int outcome)
{
	struct agent *ag = req->ag;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double s = (double)(now.tv_sec - req->started_ts.tv_sec) +
		   (double)(now.tv_nsec - req->started_ts.tv_nsec) / 1e9;
	metrics_rpc(ag->metrics, req->method ? (int)(req->method - methods) : -1, outcome, s);
	if (ag->log.level >= LOG_LEVEL_DEBUG) {
		char kv[256];
		req_log_kv(req, kv, sizeof(kv));
		log_write(&ag->log, LOG_LEVEL_DEBUG, "dispatch", kv, "answered %s in %.3f ms",
			  outcome ? pgc_error_name((enum pgc_error_code)outcome) : "ok", s * 1e3);
	}
}

static void req_free(struct request *req)
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

static void send_error(struct conn *c, uint32_t msgid, enum pgc_error_code code, const char *msg)
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
	req_count(req, 0);
	conn_send(req->conn, req->out.data, req->out.size);
	req_free(req);
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
	req_count(req, code);
	send_error(req->conn, req->msgid, code, msg);
	req_free(req);
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

bool utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	while (p < end) {
		unsigned c = *p++;
		int more;
		unsigned cp, min;
		if (c < 0x80)
			continue;
		if ((c & 0xe0) == 0xc0) {
			more = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			more = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			more = 3, cp = c & 0x07, min = 0x10000;
		} else {
			return false;
		}
		if (end - p < more)
			return false;
		while (more--) {
			if ((*p & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (*p++ & 0x3f);
		}
		/* overlong forms, surrogates and values past U+10FFFF are not
		 * UTF-8, and Postgres would refuse them with an error */
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
	}
	return true;
}

static const msgpack_object *param(struct request *req, const char *key)
{
	return req->params ? pgc_map_get(req->params, key) : NULL;
}

/* nil counts as absent, so clients may send explicit nils for defaults */
static bool absent(const msgpack_object *o)
{
	return !o || o->type == MSGPACK_OBJECT_NIL;
}

bool req_param_str(struct request *req, const char *key, bool required, size_t max_len, char **out)
{
	const msgpack_object *o = param(req, key);
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (a string)",
				 key);
			return false;
		}
		*out = NULL;
		return true;
	}
	if (o->type != MSGPACK_OBJECT_STR) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be a string, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (o->via.str.size > max_len) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' is longer than %zu bytes", key,
			 max_len);
		return false;
	}
	/* strings reach Postgres as text: refuse what it would refuse */
	if (!utf8_valid(o->via.str.ptr, o->via.str.size)) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' is not valid UTF-8", key);
		return false;
	}
	*out = pgc_obj_strdup(o);
	if (!*out) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must not contain NUL bytes",
			 key);
		return false;
	}
	return true;
}

bool req_param_name(struct request *req, const char *key, bool required, size_t max_len, char **out)
{
	if (!req_param_str(req, key, required, max_len, out))
		return false;
	if (*out && !(*out)[0]) {
		free(*out);
		*out = NULL;
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must not be empty", key);
		return false;
	}
	return true;
}

bool req_param_int(struct request *req, const char *key, bool required, int64_t min, int64_t max,
		   int64_t *out, bool *present)
{
	const msgpack_object *o = param(req, key);
	int64_t v;
	if (present)
		*present = false;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (an integer)",
				 key);
			return false;
		}
		return true;
	}
	if (!pgc_obj_int64(o, &v)) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter '%s' must be a 64-bit signed integer, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (v < min || v > max) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter '%s' = %lld is out of range (%lld..%lld)", key, (long long)v,
			 (long long)min, (long long)max);
		return false;
	}
	*out = v;
	if (present)
		*present = true;
	return true;
}

bool req_param_bool(struct request *req, const char *key, bool required, bool *out, bool *present)
{
	const msgpack_object *o = param(req, key);
	if (present)
		*present = false;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (a boolean)",
				 key);
			return false;
		}
		return true;
	}
	if (!pgc_obj_bool(o, out)) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be a boolean, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (present)
		*present = true;
	return true;
}

bool req_param_enum(struct request *req, const char *key, bool required, const char *const *allowed,
		    int *out, bool *present)
{
	const msgpack_object *o = param(req, key);
	char names[256];
	size_t n = 0;

	if (present)
		*present = false;
	if (!absent(o) && o->type == MSGPACK_OBJECT_STR) {
		for (int i = 0; allowed[i]; i++) {
			if (pgc_obj_str_eq(o, allowed[i])) {
				*out = i;
				if (present)
					*present = true;
				return true;
			}
		}
	} else if (absent(o) && !required) {
		return true;
	}
	names[0] = '\0';
	for (int i = 0; allowed[i] && n < sizeof(names); i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
				      allowed[i]);
	if (absent(o))
		req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (one of %s)", key,
			 names);
	else if (o->type != MSGPACK_OBJECT_STR)
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be one of %s, not %s", key,
			 names, pgc_obj_type_name(o));
	else
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter '%s' must be one of %s, not \"%.*s\"", key, names,
			 (int)(o->via.str.size > 64 ? 64 : o->via.str.size), o->via.str.ptr);
	return false;
}

bool req_param_bytes(struct request *req, const char *key, bool required, size_t max_len,
		     const char **data, size_t *len, bool *present)
{
	const msgpack_object *o = param(req, key);
	if (present)
		*present = false;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (bin or str)",
				 key);
			return false;
		}
		return true;
	}
	if (o->type == MSGPACK_OBJECT_BIN) {
		*data = o->via.bin.ptr;
		*len = o->via.bin.size;
	} else if (o->type == MSGPACK_OBJECT_STR) {
		*data = o->via.str.ptr;
		*len = o->via.str.size;
	} else {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be bin or str, not %s",
			 key, pgc_obj_type_name(o));
		return false;
	}
	if (*len > max_len) {
		req_fail(req, PGC_E_TOO_LARGE, "parameter '%s' is longer than %zu bytes", key,
			 max_len);
		return false;
	}
	if (present)
		*present = true;
	return true;
}

bool req_param_array(struct request *req, const char *key, bool required, size_t min_items,
		     size_t max_items, const msgpack_object **out)
{
	const msgpack_object *o = param(req, key);
	*out = NULL;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (an array)",
				 key);
			return false;
		}
		return true;
	}
	if (o->type != MSGPACK_OBJECT_ARRAY) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be an array, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (o->via.array.size < min_items || o->via.array.size > max_items) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must have %zu to %zu elements",
			 key, min_items, max_items);
		return false;
	}
	*out = o;
	return true;
}

void dispatch_frame(struct conn *c, const char *data, size_t len)
{
	struct agent *ag = c->ag;
	struct pgc_message msg;
	struct request *req;
	char err[256];
	size_t off = 0;

	req = calloc(1, sizeof(*req));
	if (!req || !(req->frame = malloc(len))) {
		free(req);
		send_error(c, 0, PGC_E_INTERNAL, "out of memory");
		return;
	}
	memcpy(req->frame, data, len);
	msgpack_unpacked_init(&req->unpacked);
	msgpack_sbuffer_init(&req->out);
	msgpack_packer_init(&req->pk, &req->out, msgpack_sbuffer_write);
	req->ag = ag;
	req->conn = c;
	req->started_ms = mono_ms();
	clock_gettime(CLOCK_MONOTONIC, &req->started_ts);
	conn_ref(c);
	c->inflight++;

	/* the scanner already proved this is one complete object */
	if (msgpack_unpack_next(&req->unpacked, req->frame, len, &off) != MSGPACK_UNPACK_SUCCESS) {
		req_count(req, PGC_E_INVALID_REQUEST);
		send_error(c, 0, PGC_E_INVALID_REQUEST, "could not decode the message");
		req_free(req);
		return;
	}
	memset(&msg, 0, sizeof(msg));
	if (!pgc_parse_message(&req->unpacked.data, &msg, err, sizeof(err))) {
		req_count(req, PGC_E_INVALID_REQUEST);
		send_error(c, msg.type == PGC_RPC_REQUEST ? msg.msgid : 0, PGC_E_INVALID_REQUEST,
			   err);
		req_free(req);
		return;
	}
	if (msg.type != PGC_RPC_REQUEST) {
		req_count(req, PGC_E_INVALID_REQUEST);
		send_error(c, 0, PGC_E_INVALID_REQUEST,
			   "the agent accepts only requests ([0, msgid, method, [params]])");
		req_free(req);
		return;
	}
	req->msgid = msg.msgid;
	req->params = msg.params;
	req->method = find_method(msg.method, msg.method_len);
	if (!req->method) {
		char what[128];
		snprintf(what, sizeof(what), "no such method \"%.*s\"",
			 (int)(msg.method_len > 64 ? 64 : msg.method_len), msg.method);
		req_count(req, PGC_E_METHOD_NOT_FOUND);
		send_error(c, msg.msgid, PGC_E_METHOD_NOT_FOUND, what);
		req_free(req);
		return;
	}
	if (req->params && req->params->type != MSGPACK_OBJECT_MAP) {
		req_fail(req, PGC_E_INVALID_PARAMS, "params must be [map] or []");
		return;
	}
	if (!params_known(req))
		return;
	if (c->inflight > ag->cfg.max_inflight_per_conn) {
		req_fail(req, PGC_E_BUSY, "more than max_inflight_per_conn (%d) requests in flight",
			 ag->cfg.max_inflight_per_conn);
		return;
	}
	if (ag->state == AGENT_STOPPING && req->method->flags & (M_DB | M_SESSION)) {
		req_fail(req, PGC_E_SHUTTING_DOWN, "the agent is shutting down");
		return;
	}
	if (ag->state == AGENT_SUPERSEDED && req->method->flags & (M_DB | M_SESSION)) {
		req_fail(req, PGC_E_SUPERSEDED,
			 "this agent's replica_id was taken over by another incarnation");
		return;
	}
	if ((req->method->flags & M_ADMIN) && !req_is_admin(req)) {
		req_fail(req, PGC_E_FORBIDDEN,
			 "%s is an admin call; uid %u is not root, the agent's user, in "
			 "admin_uids or in admin_group",
			 req->method->name, (unsigned)c->uid);
		return;
	}
	if ((req->method->flags & M_SESSION) && !req_need_session(req))
		return;
	if ((req->method->flags & M_DB) && !(req->method->flags & M_DB_DOWN_OK) &&
	    (!ag->id.registered || !db_lane_up(ag->db, DB_LANE_REQUESTS))) {
		req_fail(req, PGC_E_UNAVAILABLE, "the database is unreachable; retry");
		return;
	}
	req->method->fn(req);
}
