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
#include "agent/reply.h"

void rpc_agent_hello(struct request *req)
{
	struct agent *ag = req->ag;
	char *client = NULL;
	if (!req_param_str(req, "client", false, 200, &client))
		return;
	free(client);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "agent", "pgcoord-agent");
	reply_kv_str(&m, "version", PGCOORD_VERSION_STRING);
	reply_kv_int(&m, "protocol", PGC_PROTOCOL_VERSION);
	reply_kv_str(&m, "replica_id", ag->cfg.replica_id);
	reply_kv_int(&m, "incarnation", ag->id.incarnation);
	reply_kv_int(&m, "max_message_bytes", ag->cfg.max_message_bytes);
	reply_map_end(&m);
	req_done(req);
}

void rpc_agent_ping(struct request *req)
{
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_bool(&m, "pong", true);
	reply_map_end(&m);
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
static void pack_replication(msgpack_packer *out, const struct replication_view *v)
{
	char detail[512];
	struct reply_map m;

	replication_describe(v, detail, sizeof(detail));
	reply_map_begin(&m, out);
	reply_kv_str(&m, "failover", replication_failover_word(v));
	reply_kv_str(&m, "detail", detail);
	if (v->checked) {
		reply_kv_str(&m, "server", v->server);
		reply_kv_str(&m, "synchronous_standby_names", v->standby_names);
		reply_kv_str(&m, "synchronous_commit", v->synchronous_commit);
		reply_kv_int(&m, "sync_standbys", v->sync_standbys);
	} else {
		reply_kv_nil(&m, "server");
		reply_kv_nil(&m, "synchronous_standby_names");
		reply_kv_nil(&m, "synchronous_commit");
		reply_kv_nil(&m, "sync_standbys");
	}
	reply_map_end(&m);
}

void rpc_agent_status(struct request *req)
{
	struct agent *ag = req->ag;
	uint64_t now = mono_ms();
	struct db_stats st;

	db_get_stats(ag->db, &st);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "replica_id", ag->cfg.replica_id);
	reply_kv_int(&m, "incarnation", ag->id.incarnation);
	reply_kv_str(&m, "host", ag->id.host);
	reply_kv_int(&m, "pid", getpid());
	reply_kv_str(&m, "version", PGCOORD_VERSION_STRING);
	reply_kv_str(&m, "state", state_name(ag->state));
	reply_kv_str(&m, "db", db_lane_up(ag->db, DB_LANE_REQUESTS) ? "up" : "down");
	reply_kv_bool(&m, "registered", ag->id.registered);
	reply_kv_int(&m, "schema_version", ag->id.schema_version);
	reply_kv_int(&m, "schema_required", migrate_latest_version());
	reply_kv_int(&m, "sessions", ag->nsessions);
	reply_kv_int(&m, "connections", ag->nconns);
	reply_kv_int(&m, "leases_held", leases_held_count(ag));
	reply_kv_bool(&m, "janitor", janitor_active(ag));
	reply_kv_int(&m, "uptime_ms", (int64_t)(now - ag->started_ms));
	reply_kv_int(&m, "last_heartbeat_ms_ago",
		     ag->id.registered ? (int64_t)(now - ag->id.hb_last_ok_ms) : -1);
	reply_kv_int(&m, "db_reconnects", (int64_t)st.reconnects);
	reply_kv_int(&m, "db_queries", (int64_t)st.queries);
	reply_kv_int(&m, "db_failures", (int64_t)st.failures);
	reply_kv_int(&m, "watches", watches_count(ag));
	reply_kv_int(&m, "watch_polls", (int64_t)watches_polls(ag));
	reply_kv_int(&m, "waiters", waiters_count(ag));
	reply_kv_int(&m, "db_standby_refusals", (int64_t)st.standby_refusals);
	reply_kv_int(&m, "db_sync_waits_cancelled", (int64_t)st.sync_waits_cancelled);
	reply_kv_str(&m, "prepared_statements", stmt_setting_name(ag->cfg.prepared_statements));
	reply_kv_str(&m, "statement_mode", stmt_mode_name(db_statement_mode(ag->db)));
	reply_kv_bool(&m, "db_pooler", db_pooler_seen(ag->db));
	pack_replication(reply_key(&m, "replication"), db_replication(ag->db));
	reply_map_end(&m);
	req_done(req);
}
