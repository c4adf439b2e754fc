/*
 * record_writes.c — record.put, record.update and record.settle: the
 * writes a record's owner makes through its session (update and settle
 * also as a session already lost, so its former owner hears `fenced`).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/records_internal.h"
#include "agent/sessions.h"

#define RECORD_STATE_MAX 64
#define RECORD_DATA_MAX 65536
#define RECORD_PERMIT_MAX 200

/* The state: when given, 1..64 bytes; absent leaves *out NULL. */
static bool param_state(struct request *req, bool required, char **out)
{
	return req_param_name(req, "state", required, RECORD_STATE_MAX, out);
}

/*
 * The session a write is made as. update and settle are served for a
 * session the agent already declared lost as well (lost = true): the
 * schema refuses every write from it, and says `fenced` when the record
 * was adopted meanwhile, which is what its former owner must hear.
 */
static bool caller_session(struct request *req, int64_t *session, bool *lost)
{
	struct conn *c = req->conn;
	if (c->session) {
		*session = c->session->id;
		*lost = false;
		return true;
	}
	if (c->lost_session) {
		*session = c->lost_session;
		*lost = true;
		return true;
	}
	return req_need_session(req);
}

/* --- record.put --------------------------------------------------------- */

static void put_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok)
		req_fail_db(req, r);
	else
		record_reply(req, r->res, true, false);
}

void rpc_record_put(struct request *req)
{
	struct record_call *call = record_call_new(req);
	char *state = NULL, *permit = NULL, *data_hex = NULL;
	const char *data = NULL;
	size_t data_len = 0;
	bool has_data = false;
	char session[24], actor[256];

	if (!call)
		return;
	if (!record_param_kind_key(req, call) || !param_state(req, true, &state) ||
	    !req_param_bytes(req, "data", false, RECORD_DATA_MAX, &data, &data_len, &has_data) ||
	    !req_param_str(req, "permit", false, RECORD_PERMIT_MAX, &permit))
		goto fail;
	if (permit && !permit[0]) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter 'permit' must not be empty");
		goto fail;
	}
	if (has_data && !(data_hex = pgrow_bytea_param(data, data_len))) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		goto fail;
	}
	/* the owner is the connection's session, never a parameter */
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	record_session_actor(req, req->conn->session->id, actor, sizeof(actor));
	const char *params[7] = {call->kind, call->key, state, data_hex, permit, session, actor};
	req_query(req,
		  "SELECT pgcoord.ms(now()), p.* "
		  "FROM pgcoord.record_put($1, $2, $3, $4::bytea, $5, $6, $7) p",
		  7, params, put_done);
fail:
	free(state);
	free(permit);
	free(data_hex);
}

/* --- record.update, record.settle ---------------------------------------- */

static void written(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok)
		req_fail_db(req, r);
	else
		record_reply(req, r->res, false, false);
}

void rpc_record_update(struct request *req)
{
	struct record_call *call = record_call_new(req);
	char *state = NULL, *data_hex = NULL;
	const char *data = NULL;
	size_t data_len = 0;
	bool has_data = false, has_token = false, lost = false;
	int64_t token = 0, sid = 0;
	char session[24], token_s[24], actor[256];

	if (!call)
		return;
	if (!record_param_kind_key(req, call) || !param_state(req, false, &state) ||
	    !req_param_bytes(req, "data", false, RECORD_DATA_MAX, &data, &data_len, &has_data) ||
	    !req_param_int(req, "token", false, 1, INT64_MAX, &token, &has_token))
		goto fail;
	if (!state && !has_data) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "record.update needs 'state', 'data' or both: nothing to change");
		goto fail;
	}
	if (!caller_session(req, &sid, &lost))
		goto fail;
	if (has_data && !(data_hex = pgrow_bytea_param(data, data_len))) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		goto fail;
	}
	snprintf(session, sizeof(session), "%" PRId64, sid);
	snprintf(token_s, sizeof(token_s), "%" PRId64, token);
	record_session_actor(req, sid, actor, sizeof(actor));
	const char *params[8] = {call->kind,
				 call->key,
				 state,
				 data_hex,
				 has_token ? token_s : NULL,
				 session,
				 lost ? "true" : "false",
				 actor};
	/* guarantee 8: only the owner, live, while the record is open */
	req_query(req,
		  "SELECT pgcoord.ms(now()), u.* "
		  "FROM pgcoord.record_update($1, $2, $3, $4::bytea, $5, $6, $7, $8) u",
		  8, params, written);
fail:
	free(state);
	free(data_hex);
}

void rpc_record_settle(struct request *req)
{
	struct record_call *call = record_call_new(req);
	char *state = NULL;
	bool has_token = false, lost = false;
	int64_t token = 0, sid = 0;
	char session[24], token_s[24], actor[256];

	if (!call)
		return;
	if (!record_param_kind_key(req, call) || !param_state(req, true, &state) ||
	    !req_param_int(req, "token", false, 1, INT64_MAX, &token, &has_token) ||
	    !caller_session(req, &sid, &lost))
		goto fail;
	snprintf(session, sizeof(session), "%" PRId64, sid);
	snprintf(token_s, sizeof(token_s), "%" PRId64, token);
	record_session_actor(req, sid, actor, sizeof(actor));
	const char *params[7] = {call->kind, call->key,
				 state,	     has_token ? token_s : NULL,
				 session,    lost ? "true" : "false",
				 actor};
	req_query(req,
		  "SELECT pgcoord.ms(now()), s.* "
		  "FROM pgcoord.record_settle($1, $2, $3, $4, $5, $6, $7) s",
		  7, params, written);
fail:
	free(state);
}
