/*
 * config.c — the option table; see config.h. Each option's type, default,
 * bounds and meaning: --help, docs/CONFIGURATION.md and every source read
 * it. What is done with the values is in the config_*.c files
 * (config_internal.h).
 */
#include "agent/config.h"

#include <stddef.h>
#include <sys/socket.h>

#define OFF(field) offsetof(struct config, field)
#define STR(x) #x
#define XSTR(x) STR(x) /* the value of a macro as a string */

const struct option_def config_options[] = {
    {"database_url", OPT_STRING, OFF(database_url), "", 0, 0, true, false,
     "libpq conninfo string or URI of the coordination database; empty uses libpq's "
     "environment (PGHOST, PGDATABASE, PGPASSFILE, ...). With several hosts and "
     "target_session_attrs=read-write the agent follows the primary; a failover keeps every "
     "acknowledged grant only with a synchronous standby (docs/OPERATIONS.md)."},
    {"replica_id", OPT_STRING, OFF(replica_id), "", 0, 0, false, false,
     "This agent's identity, unique in the fleet; empty means the host name."},
    {"socket_path", OPT_STRING, OFF(socket_path), "/run/pgcoord/agent.sock", 0, 0, false, false,
     "Unix socket the agent listens on."},
    {"socket_mode", OPT_MODE, OFF(socket_mode), "0660", 0, 0777, false, false,
     "Permission bits of the socket (octal)."},
    {"listen_backlog", OPT_INT, OFF(listen_backlog), XSTR(SOMAXCONN), 1, 65535, false, true,
     "Connections the kernel queues on the socket before the agent accepts them (the "
     "listen(2) backlog; the default is the system's SOMAXCONN). A burst of connects beyond "
     "it gets EAGAIN before the agent sees them (the clients retry within their connect "
     "timeout); accepted ones are then held to max_connections and max_connections_per_uid. "
     "The kernel caps it at net.core.somaxconn (/proc/sys/net/core/somaxconn), and the agent "
     "warns when it does. Also applied to a socket systemd passes, in place of the unit's "
     "Backlog=."},
    {"pool_size", OPT_INT, OFF(pool_size), "8", 1, 64, false, false,
     "Database connections for requests (the heartbeat has its own)."},
    {"group_statements_max", OPT_INT, OFF(group_statements_max), "1", 0, 64, false, false,
     "Group statements of one kind (permit claims, permit releases) in flight at once "
     "before a call on a quota key that one of them names waits in the agent and rides the "
     "next, larger group instead of queueing on that key's row lock in the database; a call "
     "on other keys goes at once. 0 never holds a call back."},
    {"group_kind_statements_max", OPT_INT, OFF(group_kind_statements_max), "2", 0, 64, false, false,
     "Group statements of one kind in flight at once, whatever keys they name, before a new "
     "call of that kind waits in the agent and rides the next statement, queued as soon as "
     "one of them ends (fewer, larger groups: fewer commits). A call never waits while none "
     "of its kind is in flight. 0 never holds a call back for this bound."},
    {"group_kind_hold_members", OPT_INT, OFF(group_kind_hold_members), "0", 0, 256, false, false,
     "Calls per group statement, averaged over the recent statements of a kind, from which "
     "a new call of that kind waits for the next statement even below "
     "group_kind_statements_max whenever one is in flight: under load that fills groups this "
     "large, one more commit "
     "costs the database more than a larger group, so the bound adapts to one; lighter load "
     "keeps the parallel statements. 0 = only group_kind_statements_max holds; 4 separates "
     "the load of 8 workers on one agent from that of 32 (docs/PERFORMANCE.md)."},
    {"heartbeat_interval_ms", OPT_INT, OFF(heartbeat_interval_ms), "1000", 50, 60000, false, false,
     "How often the agent renews itself and all its sessions, and the leases they hold "
     "(a lease renewed every two beats or more rarely is renewed inside the beat nearest its due "
     "time)."},
    {"session_ttl_ms", OPT_INT, OFF(session_ttl_ms), "10000", 200, 600000, false, false,
     "How far ahead of database now() each heartbeat renews liveness; a dead agent's "
     "sessions stop being live this long after its last heartbeat."},
    {"session_grace_ms", OPT_INT, OFF(session_grace_ms), "10000", 0, 3600000, false, true,
     "How long a session whose client disconnected stays resumable."},
    {"query_timeout_ms", OPT_INT, OFF(query_timeout_ms), "5000", 100, 600000, false, true,
     "Longest wait for a database answer (queueing included) before a request fails "
     "with a retryable timeout. Each statement also carries this bound, less max(100 ms, "
     "10 %), as its statement_timeout and lock_timeout, so the database stops and rolls it "
     "back first: the timeout then says nothing changed."},
    {"connect_timeout_ms", OPT_INT, OFF(connect_timeout_ms), "5000", 100, 600000, false, true,
     "Longest wait for one database connection attempt."},
    {"reconnect_max_ms", OPT_INT, OFF(reconnect_max_ms), "5000", 100, 600000, false, true,
     "Ceiling of the exponential reconnect backoff."},
    {"prepared_statements", OPT_STATEMENTS, OFF(prepared_statements), "auto", 0, 0, false, false,
     "auto, on or off: how statements reach the database. on: each database connection "
     "prepares the agent's statements once (named) and keeps statement_timeout and "
     "lock_timeout as session settings, so a call is one statement; right only when each "
     "connection is its own server session. off: each call sends its timeouts local to its "
     "transaction and an unnamed statement, so nothing outlives the transaction. auto "
     "decides, and agent.status, /status and /metrics (pgcoord_db_statement_mode) say what: "
     "named (as on) when the server's pg_backend_pid() is the one the connection was given; "
     "named-pooled (named statements, timeouts with each transaction) when it is not, i.e. a "
     "pooler is in between (PgBouncer in any pool mode); unnamed (as off) from the first "
     "named statement the server does not have or already has (SQLSTATE 26000 or 42P05: "
     "PgBouncer transaction pooling before 1.21 or without max_prepared_statements), for "
     "the life of the process, the call that met it sent again unnamed. See "
     "docs/OPERATIONS.md for each pooler."},
    {"shutdown_timeout_ms", OPT_INT, OFF(shutdown_timeout_ms), "3000", 0, 600000, false, true,
     "On SIGTERM, how long to wait for the database to record the clean stop."},
    {"lease_ttl_ms", OPT_INT, OFF(lease_ttl_ms), "15000", 1000, 600000, false, true,
     "Default ttl of a leadership lease; a lease.acquire may ask for another."},
    {"lease_retry_ms", OPT_INT, OFF(lease_retry_ms), "1000", 50, 60000, false, false,
     "How often a waiting campaign retries at most (it tries at the holder's expiry, plus a "
     "jitter of up to a quarter of this, when that comes first; the janitor lease's "
     "candidates try at the expiry only), and how often watched leases are polled."},
    {"janitor_interval_ms", OPT_INT, OFF(janitor_interval_ms), "1000", 100, 600000, false, false,
     "How often the elected janitor sweeps expired sessions and lapsed permits."},
    {"retention_s", OPT_INT, OFF(retention_s), "0", 0, 315360000, false, true,
     "How long released permits, settled records and their audit rows are kept before "
     "the janitor deletes them; 0 keeps them forever. A duplicate claim of a deleted "
     "permit's id is new work, so keep this far beyond any client's retries (at least "
     "3600)."},
    {"max_message_bytes", OPT_INT, OFF(max_message_bytes), "1048576", 1024, 67108864, false, false,
     "Largest request a client may send; checked before buffering."},
    {"max_depth", OPT_INT, OFF(max_depth), "32", 2, 32, false, false,
     "Deepest nesting of arrays and maps in a request (at most 32, the decoder's limit)."},
    {"max_connections", OPT_INT, OFF(max_connections), "1024", 1, 65536, false, false,
     "Client connections served at once; more get a busy error and are closed."},
    {"max_inflight_per_conn", OPT_INT, OFF(max_inflight_per_conn), "64", 1, 4096, false, false,
     "Requests one connection may have in flight; more get a busy error."},
    {"max_lease_watches_per_session", OPT_INT, OFF(max_lease_watches_per_session), "64", 1, 100000,
     false, true,
     "Leases one session may watch (lease.status {watch: true}); more get a busy error."},
    {"max_lease_campaigns_per_session", OPT_INT, OFF(max_lease_campaigns_per_session), "64", 1,
     100000, false, true,
     "Waiting campaigns (lease.acquire {wait: true} not yet won) one session may have; more "
     "get a busy error."},
    {"watch_poll_ms", OPT_INT, OFF(watch_poll_ms), "500", 50, 60000, false, false,
     "How often the agent reads everything its sessions watch (quota.watch, permit.watch, "
     "record.watch), in one statement whatever the number of watches."},
    {"wait_poll_ms", OPT_INT, OFF(wait_poll_ms), "100", 10, 10000, false, false,
     "How often the agent asks the database which of its sessions' waiting claims were "
     "admitted or expired (permit.claim {wait_ms}), in one statement whatever their number, "
     "and only while there are some."},
    {"max_watches_per_session", OPT_INT, OFF(max_watches_per_session), "64", 1, 100000, false, true,
     "Quotas, permits and record kinds one session may watch, together; more get a busy "
     "error."},
    {"max_output_bytes", OPT_INT, OFF(max_output_bytes), "4194304", 65536, 1073741824, false, false,
     "Output queued for a client that does not read before it is dropped."},
    {"max_message_objects", OPT_INT, OFF(max_message_objects), "65536", 16, 16777216, false, false,
     "Most MessagePack objects (array elements, map keys and values, the message itself) one "
     "request may hold; checked before decoding, which allocates 24 bytes or more for each."},
    {"partial_frame_timeout_ms", OPT_INT, OFF(partial_frame_timeout_ms), "10000", 100, 3600000,
     false, true,
     "How long a client may take to send the rest of a request it has begun; then the "
     "connection is closed."},
    {"idle_timeout_ms", OPT_INT, OFF(idle_timeout_ms), "600000", 0, 86400000, false, true,
     "How long a connection with no session and no request in flight may stay silent before "
     "it is closed; 0 never closes one. Connections with a session are never closed for "
     "idling."},
    {"max_connections_per_uid", OPT_INT, OFF(max_connections_per_uid), "64", 1, 65536, false, false,
     "Client connections one non-admin uid may hold at once; more are refused with a busy "
     "error."},
    {"admin_connection_reserve", OPT_INT, OFF(admin_connection_reserve), "16", 0, 65535, false,
     false,
     "Slots of max_connections only admin peers may use, so an operator can still connect "
     "when other clients fill the rest (at most max_connections - 1 of them)."},
    {"log_level", OPT_LEVEL, OFF(log_level), "info", 0, 0, false, true,
     "error, warn, info or debug."},
    {"admin_uids", OPT_STRING, OFF(admin_uids), "", 0, 0, false, false,
     "Comma-separated uids, besides root and the agent's own user, whose clients may make "
     "admin calls (quota.set, permit overrides)."},
    {"admin_group", OPT_STRING, OFF(admin_group), "", 0, 0, false, false,
     "A group whose members (by primary gid or membership) may make admin calls; empty "
     "for none. Resolved at start."},
    {"client_uids", OPT_STRING, OFF(client_uids), "", 0, 0, false, false,
     "Comma-separated uids whose clients may open sessions; with client_group empty too, "
     "every peer that can open the socket may. Admins always may."},
    {"client_group", OPT_STRING, OFF(client_group), "", 0, 0, false, false,
     "A group whose members (by primary gid or membership) may open sessions, besides "
     "client_uids; empty for none. Resolved at start."},
    {"metrics_listen", OPT_STRING, OFF(metrics_listen), "", 0, 0, false, false,
     "Loopback address:port of the HTTP listener for /metrics, /healthz and /status, e.g. "
     "127.0.0.1:9187 or [::1]:9187 (port 0 picks a free one); empty turns it off. Only "
     "loopback addresses are accepted: the pages are unauthenticated."},
};
const size_t config_options_count = sizeof(config_options) / sizeof(config_options[0]);
