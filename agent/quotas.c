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
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"

#define QUOTA_KEY_MAX 200

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
	char kv[4 * 200 + 128] = ""; /* room for a fully escaped key */
	log_kv_int(kv, sizeof(kv), "uid", req->conn->uid);
	log_kv_str(kv, sizeof(kv), "quota", PQgetvalue(res, 0, 0));
	log_kv_str(kv, sizeof(kv), "limit", PQgetvalue(res, 0, 1));
	log_kv_str(kv, sizeof(kv), "was", pgrow_null(res, 0, 4) ? NULL : PQgetvalue(res, 0, 4));
	log_write(&req->ag->log, LOG_LEVEL_INFO, "quotas", kv, "quota limit set");
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 7);
	pgrow_kv_str(pk, "key", res, 0, 0);
	pgrow_kv_int(pk, "limit", res, 0, 1);
	pgrow_kv_int(pk, "in_flight", res, 0, 2);
	pgrow_kv_int(pk, "lapse_after_s", res, 0, 3);
	pgrow_kv_int(pk, "previous_limit", res, 0, 4);
	pgc_pack_kv_bool(pk, "created", pgrow_bool(res, 0, 5));
	pgrow_kv_int(pk, "now_at", res, 0, 6);
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
#define QUOTA_STATUS_SELECT                                                                        \
	"SELECT n.now_at, q.key, q.\"limit\", q.in_flight, q.held, q.uncertain, q.permits, "       \
	"q.lapse_after_s, pgcoord.ms(q.created_at), pgcoord.ms(q.updated_at) "                     \
	"FROM (SELECT pgcoord.ms(now()) AS now_at) n LEFT JOIN pgcoord.quota_status q "

static void pack_quota(msgpack_packer *pk, const PGresult *res, int row)
{
	int64_t limit = pgrow_int(res, row, 2), in_flight = pgrow_int(res, row, 3);
	msgpack_pack_map(pk, 10);
	pgrow_kv_str(pk, "key", res, row, 1);
	pgc_pack_kv_int(pk, "limit", limit);
	pgc_pack_kv_int(pk, "in_flight", in_flight);
	pgrow_kv_int(pk, "held", res, row, 4);
	pgrow_kv_int(pk, "uncertain", res, row, 5);
	/* a limit lowered below in_flight leaves no room, not negative room */
	pgc_pack_kv_int(pk, "available", limit > in_flight ? limit - in_flight : 0);
	pgrow_kv_int(pk, "permits", res, row, 6);
	pgrow_kv_int(pk, "lapse_after_s", res, row, 7);
	pgrow_kv_int(pk, "created_at", res, row, 8);
	pgrow_kv_int(pk, "updated_at", res, row, 9);
}

static void quota_got(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const PGresult *res = r->res;
	char *key = req->ctx; /* req is gone once answered: keep the key */

	req->ctx = NULL;
	if (!r->ok) {
		req_fail_db(req, r);
		free(key);
		return;
	}
	if (PQntuples(res) != 1 || pgrow_null(res, 0, 1)) {
		req_fail(req, PGC_E_NOT_FOUND, "no quota \"%s\" (quota.set creates one)", key);
		free(key);
		return;
	}
	free(key);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 2);
	pgc_pack_cstr(pk, "quota");
	pack_quota(pk, res, 0);
	pgrow_kv_int(pk, "now_at", res, 0, 0);
	req_done(req);
}

void rpc_quota_get(struct request *req)
{
	char *key = NULL;
	if (!req_param_str(req, "key", true, QUOTA_KEY_MAX, &key))
		return;
	const char *params[1] = {key};
	req->ctx = key;
	if (!req_query(req, QUOTA_STATUS_SELECT "ON q.key = $1", 1, params, quota_got))
		free(key);
}

static void quotas_listed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const PGresult *res = r->res;
	int n, count = 0;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_fit(req, res, "read the quotas one at a time with quota.get"))
		return;
	n = PQntuples(res);
	for (int i = 0; i < n; i++)
		count += !pgrow_null(res, i, 1);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 2);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, (size_t)count);
	for (int i = 0; i < n; i++)
		if (!pgrow_null(res, i, 1))
			pack_quota(pk, res, i);
	pgc_pack_kv_int(pk, "now_at", n ? pgrow_int(res, 0, 0) : 0);
	req_done(req);
}

void rpc_quota_list(struct request *req)
{
	req_query(req, QUOTA_STATUS_SELECT "ON true ORDER BY q.key", 0, NULL, quotas_listed);
}
