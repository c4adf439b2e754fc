/*
 * records.c — what every record.* method shares: the call's context, kind
 * and key, the actor named in the audit trail, and a record_status row as
 * the wire sends it. The methods live by role: record_writes.c (put,
 * update, settle), record_reads.c (get, list) and record_recovery.c
 * (record.recover: the records of dead owners, guarantee 8).
 *
 * Every method is ONE statement calling one function of
 * migrations/0007_records.sql, where all deciding happens. These files
 * validate parameters, supply the caller's session — the only source of
 * ownership: no parameter names an owner — and the actor for the audit
 * trail, and turn rows into replies. Refusals come back as SQLSTATEs of
 * class PC that db.c maps to wire errors (not_found, fenced, conflict,
 * forbidden, session_expired) with the schema's message.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/dispatch.h"
#include "agent/pgrow.h"
#include "agent/methods.h"
#include "agent/records_internal.h"
#include "agent/reply.h"

/* Frees what a call points to; the request frees the call. */
void record_call_free(void *ctx)
{
	struct record_call *call = ctx;

	free(call->kind);
	free(call->key);
	page_free(&call->page);
}

struct record_call *record_call_new(struct request *req)
{
	return req_ctx_alloc(req, sizeof(struct record_call), record_call_free);
}

/* The audit trail's actor for a call made through a session. */
void record_session_actor(struct request *req, int64_t session, char *buf, size_t len)
{
	snprintf(buf, len, "session:%" PRId64 "@%s", session, req->ag->cfg.replica_id);
}

/* kind and key, which name every record. */
bool record_param_kind_key(struct request *req, struct record_call *call)
{
	return req_param_name(req, "kind", true, RECORD_KIND_MAX, &call->kind) &&
	       req_param_name(req, "key", true, RECORD_KEY_MAX, &call->key);
}

/* A record_status row as the wire sends it; reads add `redacted` after
 * it (RECORD_READ_COLS), which only record_read_row includes. */
static const struct reply_col record_read_cols[] = {
    {"kind", REPLY_STR, RS_KIND, 0},
    {"key", REPLY_STR, RS_KEY, 0},
    {"state", REPLY_STR, RS_STATE, 0},
    {"terminal", REPLY_BOOL, RS_TERMINAL, 0},
    {"data", REPLY_HEX_BIN, RS_DATA, 0},
    {"permit", REPLY_STR, RS_PERMIT, 0},
    {"owner_session", REPLY_INT, RS_OWNER, 0},
    {"owner_replica", REPLY_STR, RS_REPLICA, 0},
    {"owner_live", REPLY_BOOL, RS_LIVE, 0},
    {"token", REPLY_INT, RS_TOKEN, 0},
    {"created_at", REPLY_INT, RS_CREATED, 0},
    {"updated_at", REPLY_INT, RS_UPDATED, 0},
    {"settled_at", REPLY_INT, RS_SETTLED, 0},
    {"adopted_from", REPLY_INT, RS_ADOPTED_FROM, 0},
    {"adopted_at", REPLY_INT, RS_ADOPTED_AT, 0},
    {"redacted", REPLY_BOOL, RS__COUNT, 0},
};
const struct reply_kind record_row = {record_read_cols, RS__COUNT};
const struct reply_kind record_read_row = REPLY_KIND(record_read_cols);

/* {[created,] record, now_at} from a one-row result: now_at in column 0,
 * then `created` (record.put only), then the record. */
static const struct reply_col put_cols[] = {
    {"created", REPLY_BOOL, 1, 0},
    REPLY_ROW_AT("record", record_row, 2),
    {"now_at", REPLY_INT, 0, 0},
};
const struct reply_kind record_put_reply = REPLY_KIND(put_cols);

static const struct reply_col write_cols[] = {
    REPLY_ROW_AT("record", record_row, 1),
    {"now_at", REPLY_INT, 0, 0},
};
const struct reply_kind record_write_reply = REPLY_KIND(write_cols);

static const struct reply_col get_cols[] = {
    REPLY_ROW_AT("record", record_read_row, 1),
    {"now_at", REPLY_INT, 0, 0},
};
const struct reply_kind record_get_reply = REPLY_KIND(get_cols);

void record_reply(struct request *req, const PGresult *res, bool has_created, bool with_redacted)
{
	const struct reply_kind *kind = has_created	? &record_put_reply
					: with_redacted ? &record_get_reply
							: &record_write_reply;
	if (!req_rows_are(req, kind, res, 0))
		return;
	if (PQntuples(res) != 1) {
		req_fail(req, PGC_E_INTERNAL, "%s returned %d rows", req->method->name,
			 PQntuples(res));
		return;
	}
	reply_pack_row(req_result(req), kind, res, 0, 0);
	req_done(req);
}
