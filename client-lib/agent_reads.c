/*
 * agent_reads.c — agent.status as a C struct (struct pgcoord_agent_status),
 * for health checks that should not decode MessagePack themselves.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "typed_read.h"

#define F(...) PGCOORD__FIELD(struct pgcoord_agent_status, __VA_ARGS__)
#define REPL(...) PGCOORD__FIELD_IN(struct pgcoord_agent_status, "replication", __VA_ARGS__)

static const struct pgcoord__field status_fields[] = {
    F("replica_id", STR, replica_id, 0, true),
    F("host", STR, host, 0, false),
    F("version", STR, version, 0, false),
    F("state", STR, state, 0, true),
    F("incarnation", INT, incarnation, 0, false),
    F("pid", INT, pid, 0, false),
    F("registered", BOOL, registered, 0, false),
    F("schema_version", INT, schema_version, 0, false),
    F("schema_required", INT, schema_required, 0, false),
    F("sessions", INT, sessions, 0, false),
    F("connections", INT, connections, 0, false),
    F("leases_held", INT, leases_held, 0, false),
    F("janitor", BOOL, janitor, 0, false),
    F("uptime_ms", INT, uptime_ms, 0, false),
    F("last_heartbeat_ms_ago", INT, last_heartbeat_ms_ago, -1, false),
    F("db_reconnects", INT, db_reconnects, 0, false),
    F("db_queries", INT, db_queries, 0, false),
    F("db_failures", INT, db_failures, 0, false),
    F("watches", INT, watches, 0, false),
    F("watch_polls", INT, watch_polls, 0, false),
    F("waiters", INT, waiters, 0, false),
    F("db_standby_refusals", INT, db_standby_refusals, 0, false),
    F("db_sync_waits_cancelled", INT, db_sync_waits_cancelled, 0, false),
    REPL("failover", STR, failover, 0),
    REPL("detail", STR, replication_detail, 0),
    REPL("sync_standbys", INT, sync_standbys, -1),
};

static bool status_read(const msgpack_object *m, void *box)
{
	struct pgcoord_agent_status *s = box;
	const msgpack_object *db = pgc_map_get(m, "db");

	s->db_up = db && db->type == MSGPACK_OBJECT_STR && db->via.str.size == 2 &&
		   memcmp(db->via.str.ptr, "up", 2) == 0;
	return pgcoord__fields_read(m, status_fields, PGCOORD__NFIELDS(status_fields), s);
}

void pgcoord_agent_status_free(struct pgcoord_agent_status *s)
{
	pgcoord__fields_free(status_fields, PGCOORD__NFIELDS(status_fields), s);
	free(s);
}

static void status_free_box(void *box)
{
	pgcoord_agent_status_free(box);
}

static const struct pgcoord__reply_kind status_kind = {
    sizeof(struct pgcoord_agent_status), status_read, status_free_box,
    "the agent.status result lacks replica_id or state"};

pgcoord_err pgcoord_agent_status_get(pgcoord *c, int timeout_ms, struct pgcoord_agent_status **out)
{
	return pgcoord__typed_get(c, "agent.status", timeout_ms, &status_kind, (void **)out);
}
