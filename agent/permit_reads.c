/*
 * permit_reads.c — the permit.* calls that only read: permit.get,
 * permit.list (paged by id), permit.history (the audit rows) and
 * permit.check (conservation and stalled queues, in one snapshot). None
 * changes a permit, so none is grouped or ordered with the writes.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/cursor.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/permits_internal.h"
#include "agent/pgrow.h"
#include "agent/reply.h"

#define PERMIT_LIST_DEFAULT 1000
#define PERMIT_LIST_MAX 10000

static const char *const state_names[] = {"held", "uncertain", "released", NULL};

/*
 * One row per (permit, quota), permits in the order wanted, with the
 * permit's columns repeated; the outer row carries now_at when nothing
 * matches. One statement, so a permit and its quotas agree.
 */
#define PERMIT_COLS                                                                                \
	"n.now_at, s.id, s.token, s.effective_state, s.phase, s.owner_session, s.owner_replica, "  \
	"s.on_owner_loss, s.effective_reason, pgcoord.ms(s.created_at), "                          \
	"pgcoord.ms(s.phase_at), pgcoord.ms(s.state_at), pgcoord.ms(s.released_at), "              \
	"octet_length(s.intent), pq.key, pq.weight, "                                              \
	"s.owner_session IS NOT NULL AND pgcoord.session_is_live(s.owner_session)"

enum {
	PC_NOW,
	PC_ID,
	PC_TOKEN,
	PC_STATE,
	PC_PHASE,
	PC_OWNER,
	PC_REPLICA,
	PC_ON_LOSS,
	PC_REASON,
	PC_CREATED,
	PC_PHASE_AT,
	PC_STATE_AT,
	PC_RELEASED,
	PC_INTENT_LEN,
	PC_KEY,
	PC_WEIGHT,
	PC_OWNER_LIVE,
	PC_INTENT,  /* permit.get only */
	PC_REDACTED /* permit.get only: the intent was withheld (another uid's) */
};

/* A permit as permit.get and permit.list send it: its cells from its
 * first row, then its quotas (one row each: PC_KEY, PC_WEIGHT). */
static const struct reply_col permit_quota_cols[] = {
    {"key", REPLY_STR, PC_KEY, 0},
    {"weight", REPLY_INT, PC_WEIGHT, 0},
};
static const struct reply_kind permit_quota_row = REPLY_KIND(permit_quota_cols);

#define PERMIT_WIRE_COLS                                                                           \
	{"now_at", REPLY_HIDDEN, PC_NOW, 0}, {"id", REPLY_STR, PC_ID, 0},                          \
	    {"token", REPLY_INT, PC_TOKEN, 0}, {"state", REPLY_STR, PC_STATE, 0},                  \
	    {"phase", REPLY_STR, PC_PHASE, 0}, {"owner_session", REPLY_INT, PC_OWNER, 0},          \
	    {"owner_replica", REPLY_STR, PC_REPLICA, 0},                                           \
	    {"owner_live", REPLY_BOOL, PC_OWNER_LIVE, 0},                                          \
	    {"on_owner_loss", REPLY_STR, PC_ON_LOSS, 0},                                           \
	    {"uncertain_reason", REPLY_STR, PC_REASON, 0},                                         \
	    {"intent_bytes", REPLY_INT, PC_INTENT_LEN, 0},                                         \
	    {"created_at", REPLY_INT, PC_CREATED, 0}, {"phase_at", REPLY_INT, PC_PHASE_AT, 0},     \
	    {"state_at", REPLY_INT, PC_STATE_AT, 0},                                               \
	    {"released_at", REPLY_INT, PC_RELEASED,                                                \
	     0}, /* ages by the database clock, so they mean the same on every host */             \
	    {"age_ms", REPLY_AGE, PC_CREATED, PC_NOW},                                             \
	    {"phase_age_ms", REPLY_AGE, PC_PHASE_AT, PC_NOW},                                      \
	    {"state_age_ms", REPLY_AGE, PC_STATE_AT, PC_NOW}, {"key", REPLY_HIDDEN, PC_KEY, 0},    \
	{                                                                                          \
		"weight", REPLY_HIDDEN, PC_WEIGHT, 0                                               \
	}

/* permit.list's */
static const struct reply_col permit_cols[] = {
    PERMIT_WIRE_COLS,
    REPLY_EACH_ROW("quotas", permit_quota_row, 0),
};
static const struct reply_kind permit_row = REPLY_KIND(permit_cols);

/* permit.get's: with the intent, in whichever format bytea_output says */
static const struct reply_col permit_get_cols[] = {
    PERMIT_WIRE_COLS,
    {"intent", REPLY_BYTEA, PC_INTENT, 0},
    {"redacted", REPLY_BOOL, PC_REDACTED, 0},
    REPLY_EACH_ROW("quotas", permit_quota_row, 0),
};
static const struct reply_kind permit_get_row = REPLY_KIND(permit_get_cols);

static const struct reply_col permit_get_reply_cols[] = {
    REPLY_ROW_AT("permit", permit_get_row, 0),
    {"now_at", REPLY_INT, PC_NOW, 0},
};
const struct reply_kind permit_get_reply = REPLY_KIND(permit_get_reply_cols);

/* The rows of the permit whose rows start at `row`. */
static struct reply_src permit_rows(const PGresult *res, int row)
{
	int n = PQntuples(res), end = row;
	const char *id = PQgetvalue(res, row, PC_ID);

	while (end < n && strcmp(PQgetvalue(res, end, PC_ID), id) == 0)
		end++;
	return (struct reply_src){.res = res, .row = row, .nrows = end - row};
}

/* Packs the permit whose rows start at `row`; returns the first row of the
 * next permit. */
static int pack_permit(msgpack_packer *pk, const PGresult *res, int row,
		       const struct reply_kind *kind)
{
	struct reply_src src = permit_rows(res, row);

	reply_pack(pk, kind, &src);
	return src.row + src.nrows;
}

static void got(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok) {
		req_fail_db(req, r);
	} else if (!req_rows_are(req, &permit_get_row, res, 0)) {
		/* answered */
	} else if (PQntuples(res) < 1 || pgrow_null(res, 0, PC_ID)) {
		req_fail(req, PGC_E_NOT_FOUND, "no permit \"%s\"", call->id);
	} else {
		struct reply_src src = permit_rows(res, 0);
		reply_pack(req_result(req), &permit_get_reply, &src);
		req_done(req);
	}
}

void rpc_permit_get(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	if (!call)
		return;
	if (!permit_param_id(req, &call->id))
		return;
	char uid[24];
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	const char *params[3] = {call->id, uid, req_is_admin(req) ? "true" : "false"};
	/* another uid's intent never leaves the database for a non-admin */
	req_query(req,
		  "SELECT " PERMIT_COLS ", CASE WHEN NOT r.redacted THEN s.intent END, r.redacted "
		  "FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN (pgcoord.permit_status s "
		  "  JOIN pgcoord.permit_quotas pq ON pq.permit_id = s.id "
		  "  CROSS JOIN LATERAL (SELECT NOT $3::boolean AND "
		  "    pgcoord.session_owner_uid(s.owner_session) IS DISTINCT FROM $2::bigint "
		  "    AS redacted) r) ON s.id = $1 "
		  "ORDER BY pq.key",
		  3, params, got);
}

/* The page's permits, each with its rows. */
static void pack_permits(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	const struct page_view *v = field;

	msgpack_pack_array(pk, (size_t)v->count);
	for (int i = 0, done = 0; i < src->nrows && done < v->count; done++)
		i = pack_permit(pk, src->res, i, &permit_row);
}

static const struct reply_col list_cols[] = {
    REPLY_CALL_ROWS("permits", permit_row, pack_permits),
    PAGE_TRUNCATED,
    PAGE_NOW_AT,
    PAGE_NEXT_CURSOR,
};
const struct reply_kind permit_list_reply = REPLY_KIND(list_cols);

/* permit.list pages by id (the permits' primary key) */
static const struct cursor_kind permit_cursor = {'p', 1, PERMIT_ID_MAX, false};

static void listed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const struct permit_call *call = req->ctx;
	int64_t limit = call->page.limit;
	const PGresult *res = r->res;
	int n, count = 0;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &permit_row, res, 0) ||
	    !req_rows_fit(req, res, "page with a smaller limit or narrower filters"))
		return;
	n = PQntuples(res);
	for (int i = 0; i < n; i++)
		if (!pgrow_null(res, i, PC_ID) &&
		    (i == 0 || strcmp(PQgetvalue(res, i, PC_ID), PQgetvalue(res, i - 1, PC_ID))))
			count++;
	/* the query asked for one permit more than limit, to say "truncated" */
	bool truncated = count > limit;
	if (truncated)
		count = (int)limit;
	/* the cursor is the last permit's id: its first row will do */
	int last = -1;
	for (int i = 0, done = 0; i < n && done < count; done++) {
		struct reply_src rows = permit_rows(res, i);
		last = i;
		i = rows.row + rows.nrows;
	}
	struct page_view v = {
	    .truncated = truncated, .now_at = n ? pgrow_int(res, 0, PC_NOW) : 0, .count = count};
	if (!page_view_cursor(req, &v, &permit_cursor, res, truncated ? last : -1,
			      (const int[]){PC_ID}))
		return;
	struct reply_src src = {.res = res, .row = 0, .nrows = n, .c = &v};
	reply_pack(req_result(req), &permit_list_reply, &src);
	free(v.next_cursor);
	req_done(req);
}

void rpc_permit_list(struct request *req)
{
	char *quota = NULL;
	int state = 0, phase = 0;
	bool has_state, has_phase, has_owner;
	int64_t owner = 0;
	char owner_s[24];

	if (!req_param_str(req, "quota", false, PERMIT_KEY_MAX, &quota))
		return;
	if (!req_param_enum(req, "state", false, state_names, &state, &has_state) ||
	    !req_param_enum(req, "phase", false, permit_phase_names, &phase, &has_phase) ||
	    !req_param_int(req, "owner", false, 1, INT64_MAX, &owner, &has_owner)) {
		free(quota);
		return;
	}
	snprintf(owner_s, sizeof(owner_s), "%" PRId64, owner);
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	if (!call || !req_param_page(req, &permit_cursor, PERMIT_LIST_DEFAULT, PERMIT_LIST_MAX,
				     &call->page)) {
		free(quota);
		return;
	}
	const char *params[6] = {quota,
				 has_state ? state_names[state] : NULL,
				 has_phase ? permit_phase_names[phase] : NULL,
				 has_owner ? owner_s : NULL,
				 call->page.fetch,
				 page_after(&call->page, 0)};
	/* by id, a range scan of permits_pkey from the cursor on (the statement
	 * asks for one permit more than a page, to say "another follows");
	 * released tombstones only when asked for by state. The page's ids go
	 * to permit_quotas as an array, so its shares are read by permits_pkey
	 * too (joined on id alone, the planner hashes every permit) */
	req_query(req,
		  "WITH sel AS ("
		  " SELECT s.* FROM pgcoord.permit_status s"
		  " WHERE s.id > $6::text"
		  "  AND ($1::text IS NULL OR EXISTS (SELECT 1 FROM pgcoord.permit_quotas f"
		  "   WHERE f.permit_id = s.id AND f.key = $1))"
		  "  AND ($2::text IS NULL OR s.effective_state = $2)"
		  "  AND ($3::text IS NULL OR s.phase = $3)"
		  "  AND ($4::bigint IS NULL OR s.owner_session = $4)"
		  "  AND (s.state <> 'released' OR $2::text = 'released')"
		  " ORDER BY s.id"
		  " LIMIT $5::integer) "
		  "SELECT " PERMIT_COLS " FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN (sel s JOIN pgcoord.permit_quotas pq ON pq.permit_id = s.id"
		  "  AND pq.permit_id = ANY (ARRAY(SELECT id::text FROM sel))) ON true "
		  "ORDER BY s.id, pq.key",
		  6, params, listed);
	free(quota);
}

/* --- permit.history -------------------------------------------------------- */

enum { PE_NOW, PE_FOUND, PE_SEQ };

static const struct reply_col permit_event_cols[] = {
    {"now_at", REPLY_HIDDEN, PE_NOW, 0},
    {"found", REPLY_HIDDEN, PE_FOUND, 0},
    {"seq", REPLY_INT, PE_SEQ, 0},
    {"event", REPLY_STR, 3, 0},
    {"quota", REPLY_STR, 4, 0},
    {"delta", REPLY_INT, 5, 0},
    {"actor", REPLY_STR, 6, 0},
    {"reason", REPLY_STR, 7, 0},
    {"state", REPLY_STR, 8, 0},
    {"phase", REPLY_STR, 9, 0},
    {"at", REPLY_INT, 10, 0},
};
static const struct reply_kind permit_event_row = REPLY_KIND(permit_event_cols);

static const struct reply_col history_cols[] = {
    REPLY_FIELD("id", REPLY_FIELD_STR, struct permit_call, id),
    REPLY_EACH_ROW("events", permit_event_row, 0),
    {"now_at", REPLY_INT, PE_NOW, 0},
};
const struct reply_kind permit_history_reply = REPLY_KIND(history_cols);

static void history_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;
	int n;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &permit_event_row, res, 0))
		return;
	n = PQntuples(res);
	if (n < 1 || !pgrow_bool(res, 0, PE_FOUND)) {
		req_fail(req, PGC_E_NOT_FOUND, "no permit \"%s\"", call->id);
		return;
	}
	if (!req_rows_fit(req, res, "read the permit's audit rows in the database"))
		return;
	int count = pgrow_null(res, 0, PE_SEQ) ? 0 : n;
	struct reply_src src = {.res = res, .row = 0, .nrows = count, .c = call};
	reply_pack(req_result(req), &permit_history_reply, &src);
	req_done(req);
}

void rpc_permit_history(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	if (!call)
		return;
	if (!permit_param_id(req, &call->id))
		return;
	const char *params[1] = {call->id};
	req_query(req,
		  "SELECT n.now_at, n.found, e.id, e.event, e.key, e.delta, e.actor, e.reason, "
		  "e.state, e.phase, pgcoord.ms(e.at) "
		  "FROM (SELECT pgcoord.ms(now()) AS now_at, "
		  "  EXISTS (SELECT 1 FROM pgcoord.permits WHERE id = $1) AS found) n "
		  "LEFT JOIN pgcoord.permit_events e ON e.permit_id = $1 "
		  "ORDER BY e.id",
		  1, params, history_done);
}

/* --- permit.check ------------------------------------------------------------ */

/* permit.check's rows: a quota's conservation, or a stalled queue. */
enum { CK_NOW, CK_KEY, CK_PROBLEM = 6, CK_HEAD_ID, CK_HEAD_AGE };

static const struct reply_col violation_cols[] = {
    {"now_at", REPLY_HIDDEN, CK_NOW, 0},
    {"key", REPLY_STR, CK_KEY, 0},
    {"limit", REPLY_INT, 2, 0},
    {"in_flight", REPLY_INT, 3, 0},
    {"permit_weights", REPLY_INT, 4, 0},
    {"audit_sum", REPLY_INT, 5, 0},
    {"problem", REPLY_STR, CK_PROBLEM, 0},
    {"head_id", REPLY_HIDDEN, CK_HEAD_ID, 0},
    {"head_age_ms", REPLY_HIDDEN, CK_HEAD_AGE, 0},
};
static const struct reply_kind violation_row = REPLY_KIND(violation_cols);

static const struct reply_col stalled_cols[] = {
    {"key", REPLY_STR, CK_KEY, 0},
    {"head_id", REPLY_STR, CK_HEAD_ID, 0},
    {"head_age_ms", REPLY_INT, CK_HEAD_AGE, 0},
};
static const struct reply_kind stalled_row = REPLY_KIND(stalled_cols);

/* What checked() counted of the rows. */
struct check_view {
	bool ok;
	int64_t quotas, violations, stalled, now_at;
};

static void pack_violations(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	const struct check_view *v = field;
	const PGresult *res = src->res;

	msgpack_pack_array(pk, (size_t)v->violations);
	for (int i = 0; i < src->nrows; i++) {
		if (pgrow_null(res, i, CK_KEY) || !pgrow_null(res, i, CK_HEAD_ID) ||
		    PQgetlength(res, i, CK_PROBLEM) == 0)
			continue;
		reply_pack_row(pk, &violation_row, res, i, 0);
	}
}

/* a queue whose head fits was not handed its room (0006_waiting_claims.sql) */
static void pack_stalled(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	const struct check_view *v = field;
	const PGresult *res = src->res;

	msgpack_pack_array(pk, (size_t)v->stalled);
	for (int i = 0; i < src->nrows; i++) {
		if (pgrow_null(res, i, CK_KEY) || pgrow_null(res, i, CK_HEAD_ID))
			continue;
		reply_pack_row(pk, &stalled_row, res, i, 0);
	}
}

static const struct reply_col check_cols[] = {
    REPLY_FIELD("ok", REPLY_FIELD_BOOL, struct check_view, ok),
    REPLY_FIELD("quotas", REPLY_FIELD_INT, struct check_view, quotas),
    REPLY_CALL_ROWS("violations", violation_row, pack_violations),
    REPLY_CALL_ROWS("stalled_queues", stalled_row, pack_stalled),
    REPLY_FIELD("now_at", REPLY_FIELD_INT, struct check_view, now_at),
};
const struct reply_kind permit_check_reply = REPLY_KIND(check_cols);

static void checked(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const PGresult *res = r->res;
	int n, quotas = 0, bad = 0, stalled = 0;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &violation_row, res, 0))
		return;
	n = PQntuples(res);
	for (int i = 0; i < n; i++) {
		if (pgrow_null(res, i, CK_KEY))
			continue;
		if (!pgrow_null(res, i, CK_HEAD_ID)) {
			stalled++;
			continue;
		}
		quotas++;
		bad += PQgetlength(res, i, CK_PROBLEM) > 0;
	}
	if (bad)
		log_error(&req->ag->log, "permits",
			  "conservation check failed for %d quota(s); see permit.check", bad);
	if (stalled)
		log_error(&req->ag->log, "permits",
			  "%d waiting queue(s) have a head that fits but was not admitted; see "
			  "permit.check",
			  stalled);
	struct check_view v = {
	    .ok = bad == 0,
	    .quotas = quotas,
	    .violations = bad,
	    .stalled = stalled,
	    .now_at = n ? pgrow_int(res, 0, CK_NOW) : 0,
	};
	struct reply_src src = {.res = res, .row = 0, .nrows = n, .c = &v};
	reply_pack(req_result(req), &permit_check_reply, &src);
	req_done(req);
}

void rpc_permit_check(struct request *req)
{
	/* guarantee 2, checked in one statement: one consistent snapshot */
	req_query(req,
		  "SELECT n.now_at, c.key, c.\"limit\", c.in_flight, c.permit_weights, "
		  "c.audit_sum, c.problem, NULL::text, NULL::bigint "
		  "FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN pgcoord.permits_check() c ON true "
		  "UNION ALL SELECT pgcoord.ms(now()), s.key, NULL, NULL, NULL, NULL, NULL, "
		  "s.head_id, s.head_age_ms FROM pgcoord.stalled_queues() s",
		  0, NULL, checked);
}
