/*
 * permits.c — what every permit.* method shares: the call's context, the
 * permit id, reason and override parameters, and the actor each names in
 * the audit trail. The methods live by role: permit_claim.c (claims),
 * permit_lifecycle.c (phase, uncertainty, resolve), permit_release.c and
 * permit_reads.c (get, list, history, check).
 *
 * Every method is ONE statement calling one function of
 * migrations/0004_permits.sql, so it is its own transaction: nothing stays
 * open across a round trip to a client, and it works through a
 * transaction-mode pooler. All deciding happens there; these files validate
 * parameters, name the actor for the audit trail, and turn rows into
 * replies. A database failure is answered as a retryable error, never as
 * an admission (guarantee 4).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/permits_internal.h"
#include "agent/sessions.h"

#define PERMIT_TEXT_MAX 4000 /* reasons and evidence */

const char *const permit_phase_names[] = {"reserved", "dispatched", "running", NULL};

/* Frees what a call points to; the request frees the call. */
void permit_call_free(void *ctx)
{
	struct permit_call *call = ctx;

	free(call->id);
	free(call->quotas);
	free(call->keys_lit);
	free(call->weights_lit);
	/* a request ends only after its read answered: never set here */
	free(call->pending);
	page_free(&call->page);
}

/* The audit trail's actor for a call made through a session. */
void permit_session_actor(struct request *req, char *buf, size_t len)
{
	snprintf(buf, len, "session:%" PRId64 "@%s", req->conn->session->id,
		 req->ag->cfg.replica_id);
}

/* The actor of an admin override: the peer's uid from SO_PEERCRED. */
void permit_operator_actor(struct request *req, char *buf, size_t len)
{
	snprintf(buf, len, "operator:uid=%u", (unsigned)req->conn->uid);
}

/* Reads the required, non-empty permit id. */
bool permit_param_id(struct request *req, char **id)
{
	return req_param_name(req, "id", true, PERMIT_ID_MAX, id);
}

/* Reads a text parameter that must say something (reason, evidence). */
bool permit_param_text(struct request *req, const char *key, bool required, char **out)
{
	if (!req_param_str(req, key, required, PERMIT_TEXT_MAX, out))
		return false;
	if (*out && strspn(*out, " \t\r\n") == strlen(*out)) {
		free(*out);
		*out = NULL;
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "parameter '%s' must not be empty: say what was observed", key);
			return false;
		}
	}
	return true;
}

/* override: true is for admins only; the reply names why it was refused. */
bool permit_param_override(struct request *req, bool *override)
{
	*override = false;
	if (!req_param_bool(req, "override", false, override, NULL))
		return false;
	if (*override && !req_is_admin(req)) {
		req_fail(req, PGC_E_FORBIDDEN,
			 "override is an admin call; uid %u is not root, the agent's user, in "
			 "admin_uids or in admin_group",
			 (unsigned)req->conn->uid);
		return false;
	}
	return true;
}

/* An admin override, audited in the log too: who, which permit, what now. */
void permit_log_override(struct request *req, const char *id, const char *what, const char *state)
{
	char kv[4 * 200 + 128] = ""; /* room for a fully escaped id */
	log_kv_int(kv, sizeof(kv), "uid", req->conn->uid);
	log_kv_str(kv, sizeof(kv), "permit", id);
	if (state)
		log_kv_str(kv, sizeof(kv), "state", state);
	log_write(&req->ag->log, LOG_LEVEL_WARN, "permits", kv, "%s", what);
}
