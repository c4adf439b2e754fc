/*
 * fleet.c — fleet.agents and fleet.sessions: what the database says is
 * registered and live, fleet-wide.
 */
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"

static void pack_nullable_ms(msgpack_packer *pk, const char *key, const PGresult *res, int row,
			     int col)
{
	if (PQgetisnull(res, row, col))
		pgc_pack_kv_nil(pk, key);
	else
		pgc_pack_kv_int(pk, key, pgrow_int(res, row, col));
}

static void agents_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	int n = PQntuples(r->res);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 2);
	pgc_pack_cstr(pk, "agents");
	msgpack_pack_array(pk, (size_t)n);
	for (int i = 0; i < n; i++) {
		msgpack_pack_map(pk, 10);
		pgc_pack_kv_str(pk, "replica_id", PQgetvalue(r->res, i, 0));
		pgc_pack_kv_int(pk, "incarnation", pgrow_int(r->res, i, 1));
		pgc_pack_kv_str(pk, "host", PQgetvalue(r->res, i, 2));
		pgc_pack_kv_int(pk, "pid", pgrow_int(r->res, i, 3));
		pgc_pack_kv_str(pk, "version", PQgetvalue(r->res, i, 4));
		pgc_pack_kv_int(pk, "started_at", pgrow_int(r->res, i, 5));
		pgc_pack_kv_int(pk, "heartbeat_at", pgrow_int(r->res, i, 6));
		pgc_pack_kv_int(pk, "expires_at", pgrow_int(r->res, i, 7));
		pack_nullable_ms(pk, "stopped_at", r->res, i, 8);
		pgc_pack_kv_bool(pk, "live", strcmp(PQgetvalue(r->res, i, 9), "t") == 0);
	}
	pgc_pack_kv_int(pk, "now_at", PQntuples(r->res) ? pgrow_int(r->res, 0, 10) : 0);
	req_done(req);
}

void rpc_fleet_agents(struct request *req)
{
	req_query(req,
		  "SELECT replica_id, incarnation, host, pid, version, pgcoord.ms(started_at), "
		  "pgcoord.ms(heartbeat_at), pgcoord.ms(expires_at), pgcoord.ms(stopped_at), "
		  "stopped_at IS NULL AND expires_at > now(), pgcoord.ms(now()) "
		  "FROM pgcoord.agents ORDER BY replica_id",
		  0, NULL, agents_done);
}

static void sessions_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	int n = PQntuples(r->res);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 2);
	pgc_pack_cstr(pk, "sessions");
	msgpack_pack_array(pk, (size_t)n);
	for (int i = 0; i < n; i++) {
		msgpack_pack_map(pk, 7);
		pgc_pack_kv_int(pk, "session", pgrow_int(r->res, i, 0));
		pgc_pack_kv_str(pk, "name", PQgetvalue(r->res, i, 1));
		pgc_pack_kv_str(pk, "replica_id", PQgetvalue(r->res, i, 2));
		pgc_pack_kv_int(pk, "incarnation", pgrow_int(r->res, i, 3));
		pgc_pack_kv_int(pk, "opened_at", pgrow_int(r->res, i, 4));
		pgc_pack_kv_int(pk, "expires_at", pgrow_int(r->res, i, 5));
		/* nil: opened before owners were recorded */
		pgrow_kv_int(pk, "owner_uid", r->res, i, 7);
	}
	/* now_at lets a client show ages by the database clock */
	pgc_pack_kv_int(pk, "now_at", n ? pgrow_int(r->res, 0, 6) : 0);
	req_done(req);
}

void rpc_fleet_sessions(struct request *req)
{
	req_query(req,
		  "SELECT id, name, replica_id, incarnation, pgcoord.ms(opened_at), "
		  "pgcoord.ms(expires_at), pgcoord.ms(now()), owner_uid "
		  "FROM pgcoord.live_sessions ORDER BY id",
		  0, NULL, sessions_done);
}
