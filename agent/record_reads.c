/*
 * record_reads.c — record.get and record.list (paged by kind and key):
 * reads for anyone, with another uid's data redacted in the database, and
 * a list that stops in the database before its reply would be too large.
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
#include "agent/pgrow.h"
#include "agent/records_internal.h"
#include "agent/reply.h"

#define RECORD_LIST_DEFAULT 1000
#define RECORD_LIST_MAX 10000

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

static void got(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct record_call *call = req->ctx;

	if (!r->ok)
		req_fail_db(req, r);
	else if (PQntuples(r->res) != 1 || pgrow_null(r->res, 0, 1 + RS_KIND))
		req_fail(req, PGC_E_NOT_FOUND, "no record %s/%s", call->kind, call->key);
	else
		record_reply(req, r->res, false, true);
}

void rpc_record_get(struct request *req)
{
	struct record_call *call = record_call_new(req);
	if (!call)
		return;
	if (!record_param_kind_key(req, call))
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

/* The records from column 1 (column 0 is now_at), each with `redacted`. */
static const struct reply_col list_cols[] = {
    REPLY_EACH_ROW("records", record_read_row, 1),
    PAGE_TRUNCATED,
    PAGE_NOW_AT,
    PAGE_NEXT_CURSOR,
};
const struct reply_kind record_list_reply = REPLY_KIND(list_cols);

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
	struct page_view v = {.truncated = truncated, .now_at = n ? pgrow_int(res, 0, 0) : 0};
	if (!page_view_cursor(req, &v, &record_cursor, res, truncated ? count - 1 : -1,
			      (const int[]){1 + RS_KIND, 1 + RS_KEY}))
		return;
	struct reply_src src = {.res = res, .row = 0, .nrows = count, .c = &v};
	reply_pack(req_result(req), &record_list_reply, &src);
	free(v.next_cursor);
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
