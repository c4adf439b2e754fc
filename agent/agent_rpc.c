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

/* agent.hello's reply, from the agent's configuration and identity. */
struct hello_view {
	const char *agent, *version, *replica_id;
	int64_t protocol, incarnation, max_message_bytes;
};

static const struct reply_col hello_cols[] = {
    REPLY_FIELD("agent", REPLY_FIELD_STR, struct hello_view, agent),
    REPLY_FIELD("version", REPLY_FIELD_STR, struct hello_view, version),
    REPLY_FIELD("protocol", REPLY_FIELD_INT, struct hello_view, protocol),
    REPLY_FIELD("replica_id", REPLY_FIELD_STR, struct hello_view, replica_id),
    REPLY_FIELD("incarnation", REPLY_FIELD_INT, struct hello_view, incarnation),
    REPLY_FIELD("max_message_bytes", REPLY_FIELD_INT, struct hello_view, max_message_bytes),
};
const struct reply_kind agent_hello_reply = REPLY_KIND(hello_cols);

void rpc_agent_hello(struct request *req)
{
	struct agent *ag = req->ag;
	char *client = NULL;
	if (!req_param_str(req, "client", false, 200, &client))
		return;
	free(client);
	struct hello_view v = {
	    .agent = "pgcoord-agent",
	    .version = PGCOORD_VERSION_STRING,
	    .replica_id = ag->cfg.replica_id,
	    .protocol = PGC_PROTOCOL_VERSION,
	    .incarnation = ag->id.incarnation,
	    .max_message_bytes = ag->cfg.max_message_bytes,
	};
	reply_pack_struct(req_result(req), &agent_hello_reply, &v);
	req_done(req);
}

struct ping_view {
	bool pong;
};

static const struct reply_col ping_cols[] = {
    REPLY_FIELD("pong", REPLY_FIELD_BOOL, struct ping_view, pong),
};
const struct reply_kind agent_ping_reply = REPLY_KIND(ping_cols);

void rpc_agent_ping(struct request *req)
{
	struct ping_view v = {.pong = true};

	reply_pack_struct(req_result(req), &agent_ping_reply, &v);
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

/* What the database server said about failover (replication.h): the
 * server's fields are nil until a connection was checked. */
struct replication_fields {
	const char *failover, *detail, *server, *standby_names, *synchronous_commit;
	int64_t sync_standbys;
	bool checked;
};

static void pack_sync_standbys(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	const struct replication_fields *r = field;

	(void)src;
	if (r->checked)
		msgpack_pack_int64(pk, r->sync_standbys);
	else
		msgpack_pack_nil(pk);
}

static const struct reply_col replication_cols[] = {
    REPLY_FIELD("failover", REPLY_FIELD_STR, struct replication_fields, failover),
    REPLY_FIELD("detail", REPLY_FIELD_STR, struct replication_fields, detail),
    REPLY_FIELD("server", REPLY_FIELD_STR, struct replication_fields, server),
    REPLY_FIELD("synchronous_standby_names", REPLY_FIELD_STR, struct replication_fields,
		standby_names),
    REPLY_FIELD("synchronous_commit", REPLY_FIELD_STR, struct replication_fields,
		synchronous_commit),
    REPLY_CALL("sync_standbys", "int", pack_sync_standbys),
};
static const struct reply_kind replication_reply = REPLY_KIND(replication_cols);

/* agent.status's reply: everything from memory. */
struct status_view {
	const char *replica_id, *host, *version, *state, *db, *prepared_statements, *statement_mode;
	int64_t incarnation, pid, schema_version, schema_required, sessions, connections,
	    leases_held, uptime_ms, last_heartbeat_ms_ago, db_reconnects, db_queries, db_failures,
	    watches, watch_polls, waiters, db_standby_refusals, db_sync_waits_cancelled;
	bool registered, janitor, db_pooler;
	struct replication_fields replication;
};

#define STATUS_STR(key) REPLY_FIELD(#key, REPLY_FIELD_STR, struct status_view, key)
#define STATUS_INT(key) REPLY_FIELD(#key, REPLY_FIELD_INT, struct status_view, key)
#define STATUS_BOOL(key) REPLY_FIELD(#key, REPLY_FIELD_BOOL, struct status_view, key)

static const struct reply_col status_cols[] = {
    STATUS_STR(replica_id),
    STATUS_INT(incarnation),
    STATUS_STR(host),
    STATUS_INT(pid),
    STATUS_STR(version),
    STATUS_STR(state),
    STATUS_STR(db),
    STATUS_BOOL(registered),
    STATUS_INT(schema_version),
    STATUS_INT(schema_required),
    STATUS_INT(sessions),
    STATUS_INT(connections),
    STATUS_INT(leases_held),
    STATUS_BOOL(janitor),
    STATUS_INT(uptime_ms),
    STATUS_INT(last_heartbeat_ms_ago),
    STATUS_INT(db_reconnects),
    STATUS_INT(db_queries),
    STATUS_INT(db_failures),
    STATUS_INT(watches),
    STATUS_INT(watch_polls),
    STATUS_INT(waiters),
    STATUS_INT(db_standby_refusals),
    STATUS_INT(db_sync_waits_cancelled),
    STATUS_STR(prepared_statements),
    STATUS_STR(statement_mode),
    STATUS_BOOL(db_pooler),
    REPLY_NESTED("replication", replication_reply, struct status_view, replication),
};
const struct reply_kind agent_status_reply = REPLY_KIND(status_cols);

void rpc_agent_status(struct request *req)
{
	struct agent *ag = req->ag;
	uint64_t now = mono_ms();
	const struct replication_view *rv = db_replication(ag->db);
	char detail[512];
	struct db_stats st;

	db_get_stats(ag->db, &st);
	replication_describe(rv, detail, sizeof(detail));
	struct status_view v = {
	    .replica_id = ag->cfg.replica_id,
	    .incarnation = ag->id.incarnation,
	    .host = ag->id.host,
	    .pid = getpid(),
	    .version = PGCOORD_VERSION_STRING,
	    .state = state_name(ag->state),
	    .db = db_lane_up(ag->db, DB_LANE_REQUESTS) ? "up" : "down",
	    .registered = ag->id.registered,
	    .schema_version = ag->id.schema_version,
	    .schema_required = migrate_latest_version(),
	    .sessions = ag->nsessions,
	    .connections = ag->nconns,
	    .leases_held = leases_held_count(ag),
	    .janitor = janitor_active(ag),
	    .uptime_ms = (int64_t)(now - ag->started_ms),
	    .last_heartbeat_ms_ago = ag->id.registered ? (int64_t)(now - ag->id.hb_last_ok_ms) : -1,
	    .db_reconnects = (int64_t)st.reconnects,
	    .db_queries = (int64_t)st.queries,
	    .db_failures = (int64_t)st.failures,
	    .watches = watches_count(ag),
	    .watch_polls = (int64_t)watches_polls(ag),
	    .waiters = waiters_count(ag),
	    .db_standby_refusals = (int64_t)st.standby_refusals,
	    .db_sync_waits_cancelled = (int64_t)st.sync_waits_cancelled,
	    .prepared_statements = stmt_setting_name(ag->cfg.prepared_statements),
	    .statement_mode = stmt_mode_name(db_statement_mode(ag->db)),
	    .db_pooler = db_pooler_seen(ag->db),
	    .replication =
		{
		    .failover = replication_failover_word(rv),
		    .detail = detail,
		    .server = rv->checked ? rv->server : NULL,
		    .standby_names = rv->checked ? rv->standby_names : NULL,
		    .synchronous_commit = rv->checked ? rv->synchronous_commit : NULL,
		    .sync_standbys = rv->sync_standbys,
		    .checked = rv->checked,
		},
	};
	reply_pack_struct(req_result(req), &agent_status_reply, &v);
	req_done(req);
}
