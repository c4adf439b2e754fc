/*
 * records.c — the record.* methods: records owned by the caller's session
 * (put, update, settle, get, list) and recovery of the records of dead
 * owners (guarantee 8).
 *
 * Every method is ONE statement calling one function of
 * migrations/0007_records.sql, where all deciding happens. This file
 * validates parameters, supplies the caller's session — the only source of
 * ownership: no parameter names an owner — and the actor for the audit
 * trail, and turns rows into replies. Refusals come back as SQLSTATEs of
 * class PC that db.c maps to wire errors (not_found, fenced, conflict,
 * forbidden, session_expired) with the schema's message.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/cursor.h"
#include "agent/reply.h"
#include "agent/sessions.h"

#define RECORD_KIND_MAX 200
#define RECORD_KEY_MAX 200
#define RECORD_STATE_MAX 64
#define RECORD_DATA_MAX 65536
#define RECORD_PERMIT_MAX 200
#define RECORD_MAX_KINDS 64
#define RECORD_LIST_DEFAULT 1000
#define RECORD_LIST_MAX 10000
#define RECORD_RECOVER_DEFAULT 1000
#define RECORD_RECOVER_MAX 10000

/* Columns of pgcoord.record_status, in order, from wherever a query puts
 * the first one. */
enum {
	RS_KIND,
	RS_KEY,
	RS_STATE,
	RS_TERMINAL,
	RS_DATA,
	RS_PERMIT,
	RS_OWNER,
	RS_REPLICA,
	RS_LIVE,
	RS_TOKEN,
	RS_CREATED,
	RS_UPDATED,
	RS_SETTLED,
	RS_ADOPTED_FROM,
	RS_ADOPTED_AT,
	RS__COUNT
};

/* What a handler keeps for its database callback (req_ctx_alloc). */
struct record_call {
	char *kind;
	char *key;
	int64_t session;
	bool dry_run;
	struct page page; /* record.list */
};

/* Frees what a call points to; the request frees the call. */
static void record_call_free(void *ctx)
{
	struct record_call *call = ctx;

	free(call->kind);
	free(call->key);
	page_free(&call->page);
}

static struct record_call *record_call_new(struct request *req)
{
	return req_ctx_alloc(req, sizeof(struct record_call), record_call_free);
}

/* The audit trail's actor for a call made through a session. */
static void session_actor(struct request *req, int64_t session, char *buf, size_t len)
{
	snprintf(buf, len, "session:%" PRId64 "@%s", session, req->ag->cfg.replica_id);
}

/* kind and key, which name every record. */
static bool param_kind_key(struct request *req, struct record_call *call)
{
	return req_param_name(req, "kind", true, RECORD_KIND_MAX, &call->kind) &&
	       req_param_name(req, "key", true, RECORD_KEY_MAX, &call->key);
}

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

/*
 * A record_status row for reads ($3: the caller's uid, $4: whether it is an
 * admin), followed by one more column, `redacted`: another uid's data never
 * leaves the database for a non-admin.
 */
#define RECORD_READ_COLS                                                                           \
	"s.kind, s.key, s.state, s.terminal, CASE WHEN NOT r.redacted THEN s.data_hex END AS "     \
	"data_hex, "                                                                               \
	"s.permit_id, s.owner_session, s.owner_replica, s.owner_live, s.token, s.created_at, "     \
	"s.updated_at, s.settled_at, s.adopted_from, s.adopted_at, r.redacted"
#define RECORD_READ_REDACTED                                                                       \
	"CROSS JOIN LATERAL (SELECT NOT $4::boolean AND "                                          \
	"pgcoord.session_owner_uid(s.owner_session) IS DISTINCT FROM $3::bigint AS redacted) r"

/* What a record adds to a reply, at most: its data (hex in the database)
 * and an allowance for the other fields (kind, key, state, permit and
 * replica are each at most 200 bytes) and their keys. Over l, then b. */
#define RECORD_REPLY_BYTES "coalesce(length(l.data_hex), 0) / 2 + 1280"
#define RECORD_REPLY_BYTES_B "coalesce(length(b.data_hex), 0) / 2 + 1280"

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
static const struct reply_kind record_row = {record_read_cols, RS__COUNT};
static const struct reply_kind record_read_row = REPLY_KIND(record_read_cols);

/* Replies {[created,] record, now_at} from a one-row result: now_at in
 * column 0, then `created` when has_created, then the record. */
static void reply_record(struct request *req, const PGresult *res, bool has_created,
			 bool with_redacted)
{
	int col = has_created ? 2 : 1;
	const struct reply_kind *kind = with_redacted ? &record_read_row : &record_row;
	if (!req_rows_are(req, kind, res, col))
		return;
	if (PQntuples(res) != 1) {
		req_fail(req, PGC_E_INTERNAL, "%s returned %d rows", req->method->name,
			 PQntuples(res));
		return;
	}
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	if (has_created)
		reply_kv_bool(&m, "created", pgrow_bool(res, 0, 1));
	reply_pack_row(reply_key(&m, "record"), kind, res, 0, col);
	reply_kv_int(&m, "now_at", pgrow_int(res, 0, 0));
	reply_map_end(&m);
	req_done(req);
}

/* --- record.put --------------------------------------------------------- */

static void put_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok)
		req_fail_db(req, r);
	else
		reply_record(req, r->res, true, false);
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
	if (!param_kind_key(req, call) || !param_state(req, true, &state) ||
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
	session_actor(req, req->conn->session->id, actor, sizeof(actor));
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
		reply_record(req, r->res, false, false);
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
	if (!param_kind_key(req, call) || !param_state(req, false, &state) ||
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
	session_actor(req, sid, actor, sizeof(actor));
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
	if (!param_kind_key(req, call) || !param_state(req, true, &state) ||
	    !req_param_int(req, "token", false, 1, INT64_MAX, &token, &has_token) ||
	    !caller_session(req, &sid, &lost))
		goto fail;
	snprintf(session, sizeof(session), "%" PRId64, sid);
	snprintf(token_s, sizeof(token_s), "%" PRId64, token);
	session_actor(req, sid, actor, sizeof(actor));
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

/* --- record.get, record.list --------------------------------------------- */

static void got(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct record_call *call = req->ctx;

	if (!r->ok)
		req_fail_db(req, r);
	else if (PQntuples(r->res) != 1 || pgrow_null(r->res, 0, 1 + RS_KIND))
		req_fail(req, PGC_E_NOT_FOUND, "no record %s/%s", call->kind, call->key);
	else
		reply_record(req, r->res, false, true);
}

void rpc_record_get(struct request *req)
{
	struct record_call *call = record_call_new(req);
	if (!call)
		return;
	if (!param_kind_key(req, call))
		return;
	char uid[24];
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	const char *params[4] = {call->kind, call->key, uid, req_is_admin(req) ? "true" : "false"};
	req_query(req,
		  "SELECT n.now_at, " RECORD_READ_COLS
		  " FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN (pgcoord.record_status s " RECORD_READ_REDACTED ") "
		  "ON s.kind = $1 AND s.key = $2",
		  4, params, got);
}

#define LIST_BYTES_COL (1 + RS__COUNT + 1)

/* record.list pages by (kind, key), the records' primary key */
static const struct cursor_kind record_cursor = {'r', 2, RECORD_KEY_MAX, false};

static void listed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const struct record_call *call = req->ctx;
	int64_t limit = call->page.limit;
	const PGresult *res = r->res;
	int n, count = 0;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	/* now_at, the record read, then the running total of reply bytes */
	if (!pgrow_has_cols(res, LIST_BYTES_COL + 1)) {
		req_fail(req, PGC_E_INTERNAL, "record.list: a statement answered %d columns",
			 PQnfields(res));
		return;
	}
	n = PQntuples(res);
	for (int i = 0; i < n; i++)
		count += !pgrow_null(res, i, 1 + RS_KIND);
	/* the query asked for one record more than limit, to say "truncated" */
	bool truncated = count > limit;
	if (truncated)
		count = (int)limit;
	if (count > 0 &&
	    (size_t)pgrow_int(res, count - 1, LIST_BYTES_COL) > req_reply_budget(req)) {
		int fit = 0;
		while (fit < count &&
		       (size_t)pgrow_int(res, fit, LIST_BYTES_COL) <= req_reply_budget(req))
			fit++;
		req_fail(req, PGC_E_TOO_LARGE,
			 "record.list would answer more than %zu bytes, over the reply budget "
			 "(max_output_bytes less headroom); page: ask with limit: %d or fewer, or "
			 "narrow by kind, owner, live_owner or terminal",
			 req_reply_budget(req), fit > 0 ? fit : 1);
		return;
	}
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	msgpack_packer *pk = reply_key(&m, "records");
	msgpack_pack_array(pk, (size_t)count);
	for (int i = 0; i < count; i++)
		reply_pack_row(pk, &record_read_row, res, i, 1);
	reply_kv_bool(&m, "truncated", truncated);
	reply_kv_int(&m, "now_at", n ? pgrow_int(res, 0, 0) : 0);
	reply_kv_next_cursor(&m, &record_cursor, res, truncated ? count - 1 : -1,
			     (const int[]){1 + RS_KIND, 1 + RS_KEY});
	reply_map_end(&m);
	req_done(req);
}

void rpc_record_list(struct request *req)
{
	char *kind = NULL;
	int64_t owner = 0;
	bool has_owner, live = false, has_live, terminal = false, has_terminal;
	char owner_s[24], uid[24], budget_s[24];

	if (!req_param_str(req, "kind", false, RECORD_KIND_MAX, &kind))
		return;
	if (!req_param_int(req, "owner", false, 1, INT64_MAX, &owner, &has_owner) ||
	    !req_param_bool(req, "live_owner", false, &live, &has_live) ||
	    !req_param_bool(req, "terminal", false, &terminal, &has_terminal)) {
		free(kind);
		return;
	}
	snprintf(owner_s, sizeof(owner_s), "%" PRId64, owner);
	struct record_call *call = req_ctx_alloc(req, sizeof(*call), record_call_free);
	if (!call || !req_param_page(req, &record_cursor, RECORD_LIST_DEFAULT, RECORD_LIST_MAX,
				     &call->page)) {
		free(kind);
		return;
	}
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	snprintf(budget_s, sizeof(budget_s), "%zu", req_reply_budget(req));
	const char *params[10] = {kind,
				  has_owner ? owner_s : NULL,
				  uid,
				  req_is_admin(req) ? "true" : "false",
				  has_live ? (live ? "true" : "false") : NULL,
				  has_terminal ? (terminal ? "true" : "false") : NULL,
				  call->page.fetch,
				  budget_s,
				  page_after(&call->page, 0),
				  page_after(&call->page, 1)};
	/* a range scan of records_pkey from the cursor on (one record more
	 * than a page, to say "another follows"). The reply budget is kept in
	 * the database: rows stop once the reply would be over it (the one
	 * that crosses it comes along, so listed() can tell), never building
	 * a reply the output cap drops */
	req_query(req,
		  "SELECT n.now_at, s.* FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN (SELECT b.* FROM (SELECT l.*, sum(" RECORD_REPLY_BYTES ") OVER "
		  "  (ORDER BY l.kind, l.key) AS reply_bytes FROM (SELECT " RECORD_READ_COLS
		  "  FROM pgcoord.record_status s " RECORD_READ_REDACTED
		  "  WHERE (s.kind, s.key) > ($9::text, $10::text)"
		  "   AND ($1::text IS NULL OR s.kind = $1)"
		  "   AND ($2::bigint IS NULL OR s.owner_session = $2)"
		  "   AND ($5::boolean IS NULL OR s.owner_live = $5)"
		  "   AND ($6::boolean IS NULL OR s.terminal = $6)"
		  "  ORDER BY s.kind, s.key LIMIT $7::integer) l) b "
		  " WHERE b.reply_bytes - (" RECORD_REPLY_BYTES_B ") <= $8::bigint) s ON true "
		  "ORDER BY s.kind, s.key",
		  10, params, listed);
	free(kind);
}

/* --- record.recover -------------------------------------------------------- */

/* Columns of pgcoord.record_recovery. */
enum {
	RV_NOW,
	RV_LEFT_ALONE,
	RV_REMAINING,
	RV_RECORD, /* RS__COUNT columns of the record */
	RV_P_STATE = RV_RECORD + RS__COUNT,
	RV_P_PHASE,
	RV_P_TOKEN,
	RV_P_OWNER,
	RV_P_REASON,
	RV__COUNT
};

/* A PostgreSQL array literal {"a","b"} of the kinds, quoted and escaped;
 * the elements were checked to be non-empty UTF-8 strings without NUL. */
static char *kinds_literal(const msgpack_object *arr)
{
	size_t cap = 3, len = 0;
	char *out;
	for (uint32_t i = 0; i < arr->via.array.size; i++)
		cap += 2 * arr->via.array.ptr[i].via.str.size + 3;
	out = malloc(cap);
	if (!out)
		return NULL;
	out[len++] = '{';
	for (uint32_t i = 0; i < arr->via.array.size; i++) {
		const msgpack_object *k = &arr->via.array.ptr[i];
		if (i)
			out[len++] = ',';
		out[len++] = '"';
		for (uint32_t j = 0; j < k->via.str.size; j++) {
			if (k->via.str.ptr[j] == '"' || k->via.str.ptr[j] == '\\')
				out[len++] = '\\';
			out[len++] = k->via.str.ptr[j];
		}
		out[len++] = '"';
	}
	out[len++] = '}';
	out[len] = '\0';
	return out;
}

static bool param_kinds(struct request *req, char **literal)
{
	const msgpack_object *arr;
	*literal = NULL;
	if (!req_param_array(req, "kinds", false, 1, RECORD_MAX_KINDS, &arr))
		return false;
	if (!arr)
		return true;
	for (uint32_t i = 0; i < arr->via.array.size; i++) {
		const msgpack_object *k = &arr->via.array.ptr[i];
		if (k->type != MSGPACK_OBJECT_STR || k->via.str.size == 0 ||
		    k->via.str.size > RECORD_KIND_MAX ||
		    memchr(k->via.str.ptr, '\0', k->via.str.size) ||
		    !utf8_valid(k->via.str.ptr, k->via.str.size)) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "kinds[%u] must be a UTF-8 string of 1..%d bytes", (unsigned)i,
				 RECORD_KIND_MAX);
			return false;
		}
	}
	*literal = kinds_literal(arr);
	if (!*literal) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return false;
	}
	return true;
}

/*
 * Liveness could not be read, so nothing was adopted: a result, not an
 * error, so that a replica's boot code handles every database failure the
 * same way (and leaves the records for its next recovery).
 */
static void reply_unread(struct request *req, bool dry_run, const char *why)
{
	log_warn(&req->ag->log, "records", "recovery adopted nothing: liveness unreadable (%s)",
		 why);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_bool(&m, "liveness_read", false);
	reply_kv_bool(&m, "dry_run", dry_run);
	msgpack_pack_array(reply_key(&m, "adopted"), 0);
	msgpack_pack_array(reply_key(&m, "permits"), 0);
	reply_kv_nil(&m, "left_alone");
	reply_kv_nil(&m, "remaining");
	reply_kv_str(&m, "reason", why);
	reply_kv_nil(&m, "now_at");
	reply_map_end(&m);
	req_done(req);
}

static int cmp_permit_rows(const void *a, const void *b, void *arg)
{
	const PGresult *res = arg;
	int x = *(const int *)a, y = *(const int *)b;
	int c = strcmp(PQgetvalue(res, x, RV_RECORD + RS_PERMIT),
		       PQgetvalue(res, y, RV_RECORD + RS_PERMIT));
	return c ? c : (x > y) - (x < y);
}

static bool same_permit(const PGresult *res, int x, int y)
{
	return strcmp(PQgetvalue(res, x, RV_RECORD + RS_PERMIT),
		      PQgetvalue(res, y, RV_RECORD + RS_PERMIT)) == 0;
}

static const struct reply_col recovered_permit_cols[] = {
    {"id", REPLY_STR, RV_RECORD + RS_PERMIT, 0}, {"state", REPLY_STR, RV_P_STATE, 0},
    {"phase", REPLY_STR, RV_P_PHASE, 0},	 {"token", REPLY_INT, RV_P_TOKEN, 0},
    {"owner_session", REPLY_INT, RV_P_OWNER, 0}, {"uncertain_reason", REPLY_STR, RV_P_REASON, 0},
};
static const struct reply_kind recovered_permit_row = REPLY_KIND(recovered_permit_cols);

/* The distinct permits of the adopted records, as {id, state, phase, token,
 * owner_session, uncertain_reason} as they are after the recovery. */
static bool pack_permits(msgpack_packer *pk, const PGresult *res, int nrecords)
{
	int *rows = calloc(nrecords > 0 ? (size_t)nrecords : 1, sizeof(*rows));
	int n = 0, distinct = 0;
	if (!rows)
		return false;
	for (int i = 0; i < nrecords; i++)
		if (!pgrow_null(res, i, RV_RECORD + RS_PERMIT))
			rows[n++] = i;
	qsort_r(rows, (size_t)n, sizeof(int), cmp_permit_rows, (void *)res);
	for (int i = 0; i < n; i++)
		distinct += i == 0 || !same_permit(res, rows[i - 1], rows[i]);
	msgpack_pack_array(pk, (size_t)distinct);
	for (int i = 0; i < n; i++) {
		int row = rows[i];
		if (i > 0 && same_permit(res, rows[i - 1], row))
			continue;
		reply_pack_row(pk, &recovered_permit_row, res, row, 0);
	}
	free(rows);
	return true;
}

static const struct reply_col recovery_totals_cols[] = {
    {"left_alone", REPLY_INT, RV_LEFT_ALONE, 0},
    {"remaining", REPLY_INT, RV_REMAINING, 0},
    {"now_at", REPLY_INT, RV_NOW, 0},
};
static const struct reply_kind recovery_totals_row = REPLY_KIND(recovery_totals_cols);

static void recovered(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct record_call *call = req->ctx;
	const PGresult *res = r->res;
	int n, count = 0;

	if (!r->ok) {
		if (r->refusal) {
			/* the caller's own session is not live: that is its error */
			req_fail_db(req, r);
		} else if (r->outcome_unknown && !call->dry_run) {
			req_fail(req, r->error,
				 "%s; the recovery may have committed: the records it adopted "
				 "then belong to session %" PRId64 " (record.list {owner: %" PRId64
				 "}), and calling "
				 "record.recover again is safe",
				 r->message, call->session, call->session);
		} else {
			reply_unread(req, call->dry_run, r->message);
		}
		return;
	}
	n = PQntuples(res);
	if (n < 1 || PQnfields(res) != RV__COUNT) {
		req_fail(req, PGC_E_INTERNAL, "record recovery returned %d rows of %d columns", n,
			 PQnfields(res));
		return;
	}
	for (int i = 0; i < n; i++)
		count += !pgrow_null(res, i, RV_RECORD + RS_KIND);
	if (count > 0 && !call->dry_run) {
		char kv[48];
		snprintf(kv, sizeof(kv), "session=%" PRId64, call->session);
		log_write(&req->ag->log, LOG_LEVEL_INFO, "records", kv,
			  "recovered %d record(s) of dead owners; left %s alone (live owners)",
			  count, PQgetvalue(res, 0, RV_LEFT_ALONE));
	}
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_bool(&m, "liveness_read", true);
	reply_kv_bool(&m, "dry_run", call->dry_run);
	msgpack_packer *pk = reply_key(&m, "adopted");
	msgpack_pack_array(pk, (size_t)count);
	for (int i = 0; i < count; i++)
		reply_pack_row(pk, &record_row, res, i, RV_RECORD);
	pk = reply_key(&m, "permits");
	if (!pack_permits(pk, res, count))
		msgpack_pack_array(pk, 0); /* out of memory: the records say which */
	reply_kv_row(&m, &recovery_totals_row, res, 0, 0);
	reply_kv_nil(&m, "reason");
	reply_map_end(&m);
	req_done(req);
}

void rpc_record_recover(struct request *req)
{
	struct agent *ag = req->ag;
	struct record_call *call = record_call_new(req);
	char *kinds = NULL;
	int64_t limit = RECORD_RECOVER_DEFAULT;
	bool dry_run = false;
	char session[24], limit_s[24], actor[256], uid[24], budget_s[24];

	if (!call)
		return;
	if (!param_kinds(req, &kinds) ||
	    !req_param_int(req, "limit", false, 1, RECORD_RECOVER_MAX, &limit, NULL) ||
	    !req_param_bool(req, "dry_run", false, &dry_run, NULL))
		goto fail;
	call->dry_run = dry_run;
	/* adopting makes the caller's session the owner: it needs one (a dry
	 * run only looks) */
	if (!dry_run && !req_need_session(req))
		goto fail;
	call->session = req->conn->session ? req->conn->session->id : 0;
	if (!ag->id.registered || !db_lane_up(ag->db, DB_LANE_REQUESTS)) {
		reply_unread(req, dry_run, "the agent has no connection to the database");
		goto fail;
	}
	snprintf(session, sizeof(session), "%" PRId64, call->session);
	snprintf(limit_s, sizeof(limit_s), "%" PRId64, limit);
	session_actor(req, call->session, actor, sizeof(actor));
	/* the uid is the principal: a non-admin recovers only the records of
	 * its own uid's dead sessions; NULL (an admin) recovers any */
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	const char *uid_or_all = req_is_admin(req) ? NULL : uid;
	/* it adopts no more than one reply can carry; remaining says to call
	 * again */
	snprintf(budget_s, sizeof(budget_s), "%zu", req_reply_budget(req));
	if (dry_run) {
		const char *params[5] = {call->session ? session : NULL, kinds, limit_s, uid_or_all,
					 budget_s};
		if (!db_query(ag->db, DB_LANE_REQUESTS,
			      "SELECT * FROM pgcoord.record_recover_preview($1, $2::text[], $3, "
			      "$4::bigint, $5::bigint)",
			      5, params, recovered, req))
			goto unqueued;
	} else {
		const char *params[6] = {session, kinds, limit_s, actor, uid_or_all, budget_s};
		/* guarantee 8: the whole recovery is this one function call */
		if (!db_query(ag->db, DB_LANE_REQUESTS,
			      "SELECT * FROM pgcoord.record_recover($1, $2::text[], $3, $4, "
			      "$5::bigint, $6::bigint)",
			      6, params, recovered, req))
			goto unqueued;
	}
	free(kinds);
	return;
unqueued:
	reply_unread(req, dry_run, "the database is unreachable (or its queue is full)");
fail:
	free(kinds);
}
