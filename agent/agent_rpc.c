/*
 * agent_rpc.c — agent.hello, agent.ping, agent.status: answered from
 * memory, never from the database, so they work while it is down.
 */
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/janitor.h"
#include "agent/waiters.h"
#include "agent/watches.h"
#include "agent/leases.h"
#include "agent/methods.h"
#include "agent/migrate.h"

void rpc_agent_hello(struct request *req)
{
	struct agent *ag = req->ag;
	char *client = NULL;
	if (!req_param_str(req, "client", false, 200, &client))
		return;
	free(client);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 6);
	pgc_pack_kv_str(pk, "agent", "pgcoord-agent");
	pgc_pack_kv_str(pk, "version", PGCOORD_VERSION_STRING);
	pgc_pack_kv_int(pk, "protocol", PGC_PROTOCOL_VERSION);
	pgc_pack_kv_str(pk, "replica_id", ag->cfg.replica_id);
	pgc_pack_kv_int(pk, "incarnation", ag->id.incarnation);
	pgc_pack_kv_int(pk, "max_message_bytes", ag->cfg.max_message_bytes);
	req_done(req);
}

void rpc_agent_ping(struct request *req)
{
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 1);
	pgc_pack_kv_bool(pk, "pong", true);
	req_done(req);
}

static const char *state_name(enum agent_state st)
{
	switch (st) {
	case AGENT_STARTING:
		return "starting";
	case AGENT_SERVING:
		return "serving";
	case AGENT_STOPPING:
		return "stopping";
	case AGENT_SUPERSEDED:
		return "superseded";
	}
	return "unknown";
}

/* What the database server said about failover (replication.h): known
 * fields are nil until a connection was checked. */
static void pack_replication(msgpack_packer *pk, const struct replication_view *v)
{
	char detail[512];

	replication_describe(v, detail, sizeof(detail));
	pgc_pack_cstr(pk, "replication");
	msgpack_pack_map(pk, 6);
	pgc_pack_kv_str(pk, "failover", replication_failover_word(v));
	pgc_pack_kv_str(pk, "detail", detail);
	if (v->checked) {
		pgc_pack_kv_str(pk, "server", v->server);
		pgc_pack_kv_str(pk, "synchronous_standby_names", v->standby_names);
		pgc_pack_kv_str(pk, "synchronous_commit", v->synchronous_commit);
		pgc_pack_kv_int(pk, "sync_standbys", v->sync_standbys);
	} else {
		pgc_pack_kv_nil(pk, "server");
		pgc_pack_kv_nil(pk, "synchronous_standby_names");
		pgc_pack_kv_nil(pk, "synchronous_commit");
		pgc_pack_kv_nil(pk, "sync_standbys");
	}
}

void rpc_agent_status(struct request *req)
{
	struct agent *ag = req->ag;
	uint64_t now = mono_ms();
	struct db_stats st;

	db_get_stats(ag->db, &st);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 25);
	pgc_pack_kv_str(pk, "replica_id", ag->cfg.replica_id);
	pgc_pack_kv_int(pk, "incarnation", ag->id.incarnation);
	pgc_pack_kv_str(pk, "host", ag->id.host);
	pgc_pack_kv_int(pk, "pid", getpid());
	pgc_pack_kv_str(pk, "version", PGCOORD_VERSION_STRING);
	pgc_pack_kv_str(pk, "state", state_name(ag->state));
	pgc_pack_kv_str(pk, "db", db_lane_up(ag->db, DB_LANE_REQUESTS) ? "up" : "down");
	pgc_pack_kv_bool(pk, "registered", ag->id.registered);
	pgc_pack_kv_int(pk, "schema_version", ag->id.schema_version);
	pgc_pack_kv_int(pk, "schema_required", migrate_latest_version());
	pgc_pack_kv_int(pk, "sessions", ag->nsessions);
	pgc_pack_kv_int(pk, "connections", ag->nconns);
	pgc_pack_kv_int(pk, "leases_held", leases_held_count(ag));
	pgc_pack_kv_bool(pk, "janitor", janitor_active(ag));
	pgc_pack_kv_int(pk, "uptime_ms", (int64_t)(now - ag->started_ms));
	pgc_pack_kv_int(pk, "last_heartbeat_ms_ago",
			ag->id.registered ? (int64_t)(now - ag->id.hb_last_ok_ms) : -1);
	pgc_pack_kv_int(pk, "db_reconnects", (int64_t)st.reconnects);
	pgc_pack_kv_int(pk, "db_queries", (int64_t)st.queries);
	pgc_pack_kv_int(pk, "db_failures", (int64_t)st.failures);
	pgc_pack_kv_int(pk, "watches", watches_count(ag));
	pgc_pack_kv_int(pk, "watch_polls", (int64_t)watches_polls(ag));
	pgc_pack_kv_int(pk, "waiters", waiters_count(ag));
	pgc_pack_kv_int(pk, "db_standby_refusals", (int64_t)st.standby_refusals);
	pgc_pack_kv_int(pk, "db_sync_waits_cancelled", (int64_t)st.sync_waits_cancelled);
	pack_replication(pk, db_replication(ag->db));
	req_done(req);
}
