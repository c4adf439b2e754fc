/*
 * quotas.c — quota.set, quota.get and quota.list: the limits of the permit
 * ledger, and how much of each is in flight, held by live owners or
 * uncertain. The SQL functions and views are in migrations/0004_permits.sql.
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
#include "agent/reply.h"

#define QUOTA_KEY_MAX 200

static const struct reply_col quota_set_cols[] = {
    {"key", REPLY_STR, 0, 0},
    {"limit", REPLY_INT, 1, 0},
    {"in_flight", REPLY_INT, 2, 0},
    {"lapse_after_s", REPLY_INT, 3, 0},
    {"previous_limit", REPLY_INT, 4, 0},
    {"created", REPLY_BOOL, 5, 0},
    {"now_at", REPLY_INT, 6, 0},
};
const struct reply_kind quota_set_reply = REPLY_KIND(quota_set_cols);

/* quota.set: admin only (M_ADMIN), audited with the caller's uid. */
static void quota_was_set(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const PGresult *res = r->res;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (PQntuples(res) != 1) {
		req_fail(req, PGC_E_INTERNAL, "quota_set returned %d rows", PQntuples(res));
		return;
	}
	if (!req_rows_are(req, &quota_set_reply, res, 0))
		return;
	char kv[4 * 200 + 128] = ""; /* room for a fully escaped key */
	log_kv_int(kv, sizeof(kv), "uid", req->conn->uid);
	log_kv_str(kv, sizeof(kv), "quota", PQgetvalue(res, 0, 0));
	log_kv_str(kv, sizeof(kv), "limit", PQgetvalue(res, 0, 1));
	log_kv_str(kv, sizeof(kv), "was", pgrow_null(res, 0, 4) ? NULL : PQgetvalue(res, 0, 4));
	log_write(&req->ag->log, LOG_LEVEL_INFO, "quotas", kv, "quota limit set");
	reply_pack_row(req_result(req), &quota_set_reply, res, 0, 0);
	req_done(req);
}

void rpc_quota_set(struct request *req)
{
	char *key = NULL;
	int64_t limit = 0, lapse = 0;
	bool has_lapse = false;
	char limit_s[24], lapse_s[24], actor[48];

	if (!req_param_name(req, "key", true, QUOTA_KEY_MAX, &key))
		return;
	if (!req_param_int(req, "limit", true, 0, INT32_MAX, &limit, NULL) ||
	    !req_param_int(req, "lapse_after_s", false, 0, INT32_MAX, &lapse, &has_lapse)) {
		free(key);
		return;
	}
	snprintf(limit_s, sizeof(limit_s), "%" PRId64, limit);
	snprintf(lapse_s, sizeof(lapse_s), "%" PRId64, lapse);
	snprintf(actor, sizeof(actor), "operator:uid=%u", (unsigned)req->conn->uid);
	/* lapse_after_s absent keeps the quota's policy; 0 turns it off */
	const char *params[4] = {key, limit_s, has_lapse ? lapse_s : NULL, actor};
	req_query(
	    req,
	    "SELECT key, \"limit\", in_flight, lapse_after_s, previous_limit, created, now_at "
	    "FROM pgcoord.quota_set($1, $2, $3, $4)",
	    4, params, quota_was_set);
	free(key);
}

/* --- quota.get, quota.list ------------------------------------------- */

/* Both read pgcoord.quota_status in one statement: one snapshot, so held +
 * uncertain = in_flight whenever the ledger is conserved. The outer row
 * carries now_at even when there is no quota. */
#define QUOTA_STATUS_COLS                                                                          \
	"SELECT n.now_at, q.key, q.\"limit\", q.in_flight, q.held, q.uncertain, q.permits, "       \
	"q.lapse_after_s, pgcoord.ms(q.created_at), pgcoord.ms(q.updated_at) "                     \
	"FROM (SELECT pgcoord.ms(now()) AS now_at) n "
#define QUOTA_STATUS_SELECT QUOTA_STATUS_COLS "LEFT JOIN pgcoord.quota_status q "

enum { QS_NOW, QS_KEY, QS_LIMIT, QS_IN_FLIGHT };

/* a limit lowered below in_flight leaves no room, not negative room */
static void pack_available(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	int64_t limit = pgrow_int(src->res, src->row, src->offset + QS_LIMIT),
		in_flight = pgrow_int(src->res, src->row, src->offset + QS_IN_FLIGHT);

	(void)field;
	msgpack_pack_int64(pk, limit > in_flight ? limit - in_flight : 0);
}

/* QUOTA, as quota.get and quota.list answer it. */
static const struct reply_col quota_status_cols[] = {
    {"now_at", REPLY_HIDDEN, QS_NOW, 0},
    {"key", REPLY_STR, QS_KEY, 0},
    {"limit", REPLY_INT, QS_LIMIT, 0},
    {"in_flight", REPLY_INT, QS_IN_FLIGHT, 0},
    {"held", REPLY_INT, 4, 0},
    {"uncertain", REPLY_INT, 5, 0},
    {"permits", REPLY_INT, 6, 0},
    {"lapse_after_s", REPLY_INT, 7, 0},
    {"created_at", REPLY_INT, 8, 0},
    {"updated_at", REPLY_INT, 9, 0},
    REPLY_CALL("available", "int", pack_available),
};
static const struct reply_kind quota_status_row = REPLY_KIND(quota_status_cols);

static const struct reply_col quota_get_cols[] = {
    REPLY_ROW_AT("quota", quota_status_row, 0),
    {"now_at", REPLY_INT, QS_NOW, 0},
};
const struct reply_kind quota_get_reply = REPLY_KIND(quota_get_cols);

static void pack_quota(msgpack_packer *pk, const PGresult *res, int row)
{
	reply_pack_row(pk, &quota_status_row, res, row, 0);
}

/* What quota.get keeps for its callback: the key, for a not_found. */
struct quota_call {
	char *key;
};

static void quota_call_free(void *ctx)
{
	free(((struct quota_call *)ctx)->key);
}

static void quota_got(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const PGresult *res = r->res;
	const struct quota_call *call = req->ctx;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &quota_status_row, res, 0))
		return;
	if (PQntuples(res) != 1 || pgrow_null(res, 0, QS_KEY)) {
		req_fail(req, PGC_E_NOT_FOUND, "no quota \"%s\" (quota.set creates one)",
			 call->key);
		return;
	}
	reply_pack_row(req_result(req), &quota_get_reply, res, 0, 0);
	req_done(req);
}

void rpc_quota_get(struct request *req)
{
	struct quota_call *call = req_ctx_alloc(req, sizeof(*call), quota_call_free);
	if (!call || !req_param_str(req, "key", true, QUOTA_KEY_MAX, &call->key))
		return;
	const char *params[1] = {call->key};
	req_query(req, QUOTA_STATUS_SELECT "ON q.key = $1", 1, params, quota_got);
}

/* The page's quotas: the rows with a key (an empty page has one row, for
 * now_at). */
static void pack_quotas(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	const struct page_view *v = field;

	msgpack_pack_array(pk, (size_t)v->count);
	for (int i = 0, done = 0; i < src->nrows && done < v->count; i++)
		if (!pgrow_null(src->res, i, QS_KEY)) {
			pack_quota(pk, src->res, i);
			done++;
		}
}

static const struct reply_col list_cols[] = {
    REPLY_CALL_ROWS("quotas", quota_status_row, pack_quotas),
    PAGE_NOW_AT,
    PAGE_NEXT_CURSOR,
};
const struct reply_kind quota_list_reply = REPLY_KIND(list_cols);

/* quota.list pages by key (the quotas' primary key) */
static const struct cursor_kind quota_cursor = {'q', 1, QUOTA_KEY_MAX, false};

static void quotas_listed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const struct page *pg = req->ctx;
	const PGresult *res = r->res;
	int n, count = 0, last = -1;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &quota_status_row, res, 0) ||
	    !req_rows_fit(req, res, "ask for a smaller page with limit"))
		return;
	n = PQntuples(res);
	for (int i = 0; i < n; i++)
		count += !pgrow_null(res, i, QS_KEY);
	/* the statement asked for one quota more than a page: another follows */
	bool more = count > pg->limit;
	if (more)
		count = (int)pg->limit;
	for (int i = 0, done = 0; i < n && done < count; i++)
		if (!pgrow_null(res, i, QS_KEY)) {
			last = i;
			done++;
		}
	struct page_view v = {.now_at = n ? pgrow_int(res, 0, QS_NOW) : 0, .count = count};
	if (!page_view_cursor(req, &v, &quota_cursor, res, more ? last : -1, (const int[]){QS_KEY}))
		return;
	struct reply_src src = {.res = res, .row = 0, .nrows = n, .c = &v};
	reply_pack(req_result(req), &quota_list_reply, &src);
	free(v.next_cursor);
	req_done(req);
}

void rpc_quota_list(struct request *req)
{
	struct page *pg = req_page_ctx(req, &quota_cursor, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX);
	if (!pg)
		return;
	const char *params[2] = {page_after(pg, 0), pg->fetch};
	/* quota_page (0011) reads the page's keys by quotas_pkey and sums
	 * those quotas only */
	req_query(req,
		  QUOTA_STATUS_COLS "LEFT JOIN pgcoord.quota_page($1, $2::integer) q ON true "
				    "ORDER BY q.key",
		  2, params, quotas_listed);
}
