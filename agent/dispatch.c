/*
 * dispatch.c — see dispatch.h: the method table, and from a complete frame
 * to a method handler (decoding, unknown keys, limits, the agent's state,
 * the authorisation class, the session and database gates). What a handler
 * then calls to answer is request.c; its parameter readers are
 * request_params.c.
 */
#include "agent/dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch_internal.h"
#include "agent/methods.h"
#include "agent/metrics.h"
#include "agent/reply.h"

/*
 * Every method and its authorisation class (PROTOCOL.md, "Who may call
 * what"): M_READ answers anyone (fleet views; another uid's intents and
 * data come back nil with redacted: true), M_OWNER acts only on what the
 * caller's uid owns through its sessions — the handlers' statements check
 * the owner in the same transaction, and admins pass — and M_ADMIN is
 * refused here to anyone but an admin. The last column lists the
 * parameter keys each accepts (PROTOCOL.md's method headings): any other
 * key is refused before the handler runs, so a misspelled option is an
 * error rather than a silent default. REPLIES names the tables its result
 * is packed from (unit-dispatch holds them to PROTOCOL.md).
 */
#define REPLIES(...)                                                                               \
	(const struct reply_kind *const[])                                                         \
	{                                                                                          \
		__VA_ARGS__, NULL                                                                  \
	}

static const struct method methods[] = {
    {"agent.hello", rpc_agent_hello, M_READ, "client", REPLIES(&agent_hello_reply)},
    {"agent.ping", rpc_agent_ping, M_READ, "", REPLIES(&agent_ping_reply)},
    {"agent.status", rpc_agent_status, M_READ, "", REPLIES(&agent_status_reply)},
    /* a new session needs client_uids/client_group; a resume, the owner */
    {"session.open", rpc_session_open, M_OWNER | M_DB, "name, resume, keepalive_ms",
     REPLIES(&session_open_reply)},
    {"session.keepalive", rpc_session_keepalive, M_OWNER | M_SESSION, "",
     REPLIES(&session_keepalive_reply)},
    {"session.close", rpc_session_close, M_OWNER | M_DB | M_SESSION, "",
     REPLIES(&session_close_reply)},
    {"lease.acquire", rpc_lease_acquire, M_OWNER | M_DB | M_SESSION, "name, ttl_ms, renew_ms, wait",
     REPLIES(&lease_acquire_reply)},
    {"lease.release", rpc_lease_release, M_OWNER | M_DB | M_SESSION, "name",
     REPLIES(&lease_release_reply)},
    {"lease.status", rpc_lease_status, M_READ | M_DB, "name, watch", REPLIES(&lease_status_reply)},
    {"lease.list", rpc_lease_list, M_READ | M_DB, "limit, cursor", REPLIES(&lease_list_reply)},
    {"fleet.agents", rpc_fleet_agents, M_READ | M_DB, "limit, cursor",
     REPLIES(&fleet_agents_reply)},
    {"fleet.sessions", rpc_fleet_sessions, M_READ | M_DB, "limit, cursor",
     REPLIES(&fleet_sessions_reply)},
    {"quota.set", rpc_quota_set, M_ADMIN | M_DB, "key, limit, lapse_after_s",
     REPLIES(&quota_set_reply)},
    {"quota.get", rpc_quota_get, M_READ | M_DB, "key", REPLIES(&quota_get_reply)},
    {"quota.list", rpc_quota_list, M_READ | M_DB, "limit, cursor", REPLIES(&quota_list_reply)},
    {"quota.why", rpc_quota_why, M_READ | M_DB, "key, holders", REPLIES(&quota_why_reply)},
    /* a limit from a non-admin only creates a missing quota */
    {"permit.claim", rpc_permit_claim, M_OWNER | M_DB | M_SESSION,
     "id, quotas, intent, on_owner_loss, limit, wait_ms",
     REPLIES(&permit_granted_reply, &permit_denied_reply, &permit_queued_reply,
	     &permit_denied_unread_reply, &permit_queued_unread_reply)},
    {"permit.update", rpc_permit_update, M_OWNER | M_DB | M_SESSION, "id, phase",
     REPLIES(&permit_update_reply)},
    {"permit.mark_uncertain", rpc_permit_mark_uncertain, M_OWNER | M_DB | M_SESSION, "id, reason",
     REPLIES(&permit_marked_reply)},
    /* resolve and release need the owner's session (or its uid, for an
     * uncertain permit), or an admin; override: true is admin only. The
     * handlers check which */
    {"permit.resolve", rpc_permit_resolve, M_OWNER | M_DB, "id, outcome, evidence, override",
     REPLIES(&permit_resolved_reply)},
    {"permit.release", rpc_permit_release, M_OWNER | M_DB, "id, override, reason",
     REPLIES(&permit_release_reply)},
    {"permit.get", rpc_permit_get, M_READ | M_DB, "id", REPLIES(&permit_get_reply)},
    {"permit.list", rpc_permit_list, M_READ | M_DB, "quota, state, phase, owner, limit, cursor",
     REPLIES(&permit_list_reply)},
    {"permit.history", rpc_permit_history, M_READ | M_DB, "id", REPLIES(&permit_history_reply)},
    {"permit.check", rpc_permit_check, M_READ | M_DB, "", REPLIES(&permit_check_reply)},
    /* a waiting claim belongs to the session that queued it */
    {"permit.cancel", rpc_permit_cancel, M_OWNER | M_DB | M_SESSION, "id",
     REPLIES(&permit_cancel_reply)},
    {"record.put", rpc_record_put, M_OWNER | M_DB | M_SESSION, "kind, key, state, data, permit",
     REPLIES(&record_put_reply)},
    /* update and settle also run for a session the agent declared lost, so
     * its former owner hears `fenced` (or `session_expired`): record_writes.c */
    {"record.update", rpc_record_update, M_OWNER | M_DB, "kind, key, state, data, token",
     REPLIES(&record_write_reply)},
    {"record.settle", rpc_record_settle, M_OWNER | M_DB, "kind, key, state, token",
     REPLIES(&record_write_reply)},
    {"record.get", rpc_record_get, M_READ | M_DB, "kind, key", REPLIES(&record_get_reply)},
    {"record.list", rpc_record_list, M_READ | M_DB,
     "kind, owner, live_owner, terminal, limit, cursor", REPLIES(&record_list_reply)},
    /* a session unless dry_run; answers liveness_read: false by itself
     * while the database is down. Only the caller's uid's dead owners'
     * records, unless an admin */
    {"record.recover", rpc_record_recover, M_OWNER | M_DB | M_DB_DOWN_OK, "kinds, limit, dry_run",
     REPLIES(&recovery_reply, &recovery_unread_reply)},
    /* watches belong to the caller's session; what they push carries no
     * permit intent or record data, so there is nothing to redact */
    {"quota.watch", rpc_quota_watch, M_READ | M_SESSION, "key", REPLIES(&watch_reply)},
    {"permit.watch", rpc_permit_watch, M_READ | M_SESSION, "id", REPLIES(&watch_reply)},
    {"record.watch", rpc_record_watch, M_READ | M_SESSION, "kind", REPLIES(&watch_reply)},
    {"watch.cancel", rpc_watch_cancel, M_READ | M_SESSION, "watch", REPLIES(&watch_cancel_reply)},
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

const struct reply_kind *const *dispatch_method_results(size_t i)
{
	return i < dispatch_method_count() ? methods[i].results : NULL;
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
		dispatch_send_error(c, 0, PGC_E_INTERNAL, "out of memory");
		return;
	}
	memcpy(req->frame, data, len);
	msgpack_unpacked_init(&req->unpacked);
	msgpack_sbuffer_init(&req->out);
	msgpack_packer_init(&req->pk, &req->out, msgpack_sbuffer_write);
	req->ag = ag;
	req->conn = c;
	req->method_index = -1;
	req->started_ms = mono_ms();
	clock_gettime(CLOCK_MONOTONIC, &req->started_ts);
	conn_ref(c);
	c->inflight++;

	/* the scanner already proved this is one complete object */
	if (msgpack_unpack_next(&req->unpacked, req->frame, len, &off) != MSGPACK_UNPACK_SUCCESS) {
		dispatch_req_count(req, PGC_E_INVALID_REQUEST);
		dispatch_send_error(c, 0, PGC_E_INVALID_REQUEST, "could not decode the message");
		dispatch_req_free(req);
		return;
	}
	memset(&msg, 0, sizeof(msg));
	if (!pgc_parse_message(&req->unpacked.data, &msg, err, sizeof(err))) {
		dispatch_req_count(req, PGC_E_INVALID_REQUEST);
		dispatch_send_error(c, msg.type == PGC_RPC_REQUEST ? msg.msgid : 0,
				    PGC_E_INVALID_REQUEST, err);
		dispatch_req_free(req);
		return;
	}
	if (msg.type != PGC_RPC_REQUEST) {
		dispatch_req_count(req, PGC_E_INVALID_REQUEST);
		dispatch_send_error(
		    c, 0, PGC_E_INVALID_REQUEST,
		    "the agent accepts only requests ([0, msgid, method, [params]])");
		dispatch_req_free(req);
		return;
	}
	req->msgid = msg.msgid;
	req->params = msg.params;
	req->method = find_method(msg.method, msg.method_len);
	if (req->method)
		req->method_index = (int)(req->method - methods);
	if (!req->method) {
		char what[128];
		snprintf(what, sizeof(what), "no such method \"%.*s\"",
			 (int)(msg.method_len > 64 ? 64 : msg.method_len), msg.method);
		dispatch_req_count(req, PGC_E_METHOD_NOT_FOUND);
		dispatch_send_error(c, msg.msgid, PGC_E_METHOD_NOT_FOUND, what);
		dispatch_req_free(req);
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
