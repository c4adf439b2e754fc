/*
 * record_recovery.c — record.recover: the records of dead owners adopted
 * by the caller's session in one function call (guarantee 8), or only
 * looked at (dry_run). Apart from the owners' own writes because it acts on
 * other sessions' records, and answers by itself while the database is
 * down (liveness_read: false).
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
#include "agent/records_internal.h"
#include "agent/reply.h"
#include "agent/sessions.h"

#define RECORD_MAX_KINDS 64
#define RECORD_RECOVER_DEFAULT 1000
#define RECORD_RECOVER_MAX 10000

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

/* What record.recover answers beside the rows: whether liveness was read,
 * and why not. */
struct recovery_view {
	bool liveness_read, dry_run;
	const char *reason;
};

static void pack_nil(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	(void)field;
	(void)src;
	msgpack_pack_nil(pk);
}

static void pack_no_rows(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	(void)field;
	(void)src;
	msgpack_pack_array(pk, 0);
}

/* Nothing read: no records, no permits, no totals. */
static const struct reply_col unread_cols[] = {
    REPLY_FIELD("liveness_read", REPLY_FIELD_BOOL, struct recovery_view, liveness_read),
    REPLY_FIELD("dry_run", REPLY_FIELD_BOOL, struct recovery_view, dry_run),
    REPLY_CALL("adopted", "array", pack_no_rows),
    REPLY_CALL("permits", "array", pack_no_rows),
    REPLY_CALL("left_alone", "int", pack_nil),
    REPLY_CALL("remaining", "int", pack_nil),
    REPLY_FIELD("reason", REPLY_FIELD_STR, struct recovery_view, reason),
    REPLY_CALL("now_at", "int", pack_nil),
};
const struct reply_kind recovery_unread_reply = REPLY_KIND(unread_cols);

/*
 * Liveness could not be read, so nothing was adopted: a result, not an
 * error, so that a replica's boot code handles every database failure the
 * same way (and leaves the records for its next recovery).
 */
static void reply_unread(struct request *req, bool dry_run, const char *why)
{
	log_warn(&req->ag->log, "records", "recovery adopted nothing: liveness unreadable (%s)",
		 why);
	struct recovery_view v = {.liveness_read = false, .dry_run = dry_run, .reason = why};
	reply_pack_struct(req_result(req), &recovery_unread_reply, &v);
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
static bool pack_permit_rows(msgpack_packer *pk, const PGresult *res, int nrecords)
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

static void pack_permits(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	(void)field;
	if (!pack_permit_rows(pk, src->res, src->nrows))
		msgpack_pack_array(pk, 0); /* out of memory: the records say which */
}

/* Read: the adopted records (the first rows), the permits they name, and
 * the totals (on every row). */
static const struct reply_col recovered_cols[] = {
    REPLY_FIELD("liveness_read", REPLY_FIELD_BOOL, struct recovery_view, liveness_read),
    REPLY_FIELD("dry_run", REPLY_FIELD_BOOL, struct recovery_view, dry_run),
    REPLY_EACH_ROW("adopted", record_row, RV_RECORD),
    REPLY_CALL_ROWS("permits", recovered_permit_row, pack_permits),
    {"left_alone", REPLY_INT, RV_LEFT_ALONE, 0},
    {"remaining", REPLY_INT, RV_REMAINING, 0},
    {"now_at", REPLY_INT, RV_NOW, 0},
    REPLY_FIELD("reason", REPLY_FIELD_STR, struct recovery_view, reason),
};
const struct reply_kind recovery_reply = REPLY_KIND(recovered_cols);

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
	struct recovery_view v = {.liveness_read = true, .dry_run = call->dry_run};
	struct reply_src src = {.res = res, .row = 0, .nrows = count, .c = &v};
	reply_pack(req_result(req), &recovery_reply, &src);
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
	record_session_actor(req, call->session, actor, sizeof(actor));
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
