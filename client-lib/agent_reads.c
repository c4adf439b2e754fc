/*
 * agent_reads.c — agent.status as a C struct (struct pgcoord_agent_status),
 * for health checks that should not decode MessagePack themselves.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

#define STATUS_STRS 6

struct status_box {
	struct pgcoord_agent_status pub; /* first: the caller's pointer */
	char *strs[STATUS_STRS];
};

static int64_t int_or(const msgpack_object *map, const char *key, int64_t dflt)
{
	int64_t v;
	return pgc_obj_int64(pgc_map_get(map, key), &v) ? v : dflt;
}

static bool bool_or_false(const msgpack_object *map, const char *key)
{
	bool v = false;
	pgc_obj_bool(pgc_map_get(map, key), &v);
	return v;
}

/* A string field, copied into the box's slot i; NULL when absent or nil.
 * *ok false when memory ran out. */
static const char *str_into(struct status_box *b, size_t i, const msgpack_object *map,
			    const char *key, bool *ok)
{
	const msgpack_object *o = pgc_map_get(map, key);
	if (!o || o->type != MSGPACK_OBJECT_STR)
		return NULL;
	if (!(b->strs[i] = pgc_obj_strdup(o)))
		*ok = false;
	return b->strs[i];
}

void pgcoord_agent_status_free(struct pgcoord_agent_status *s)
{
	struct status_box *b = (struct status_box *)s;
	if (!b)
		return;
	for (size_t i = 0; i < STATUS_STRS; i++)
		free(b->strs[i]);
	free(b);
}

static bool status_read(const msgpack_object *m, struct status_box *b)
{
	struct pgcoord_agent_status *s = &b->pub;
	const msgpack_object *db = pgc_map_get(m, "db"), *repl = pgc_map_get(m, "replication");
	bool ok = true;

	s->replica_id = str_into(b, 0, m, "replica_id", &ok);
	s->host = str_into(b, 1, m, "host", &ok);
	s->version = str_into(b, 2, m, "version", &ok);
	s->state = str_into(b, 3, m, "state", &ok);
	s->incarnation = int_or(m, "incarnation", 0);
	s->pid = int_or(m, "pid", 0);
	s->db_up = db && db->type == MSGPACK_OBJECT_STR && db->via.str.size == 2 &&
		   memcmp(db->via.str.ptr, "up", 2) == 0;
	s->registered = bool_or_false(m, "registered");
	s->schema_version = int_or(m, "schema_version", 0);
	s->schema_required = int_or(m, "schema_required", 0);
	s->sessions = int_or(m, "sessions", 0);
	s->connections = int_or(m, "connections", 0);
	s->leases_held = int_or(m, "leases_held", 0);
	s->janitor = bool_or_false(m, "janitor");
	s->uptime_ms = int_or(m, "uptime_ms", 0);
	s->last_heartbeat_ms_ago = int_or(m, "last_heartbeat_ms_ago", -1);
	s->db_reconnects = int_or(m, "db_reconnects", 0);
	s->db_queries = int_or(m, "db_queries", 0);
	s->db_failures = int_or(m, "db_failures", 0);
	s->watches = int_or(m, "watches", 0);
	s->watch_polls = int_or(m, "watch_polls", 0);
	s->waiters = int_or(m, "waiters", 0);
	s->db_standby_refusals = int_or(m, "db_standby_refusals", 0);
	s->db_sync_waits_cancelled = int_or(m, "db_sync_waits_cancelled", 0);
	s->sync_standbys = -1;
	if (repl && repl->type == MSGPACK_OBJECT_MAP) {
		s->failover = str_into(b, 4, repl, "failover", &ok);
		s->replication_detail = str_into(b, 5, repl, "detail", &ok);
		s->sync_standbys = int_or(repl, "sync_standbys", -1);
	}
	return ok && s->replica_id && s->state;
}

pgcoord_err pgcoord_agent_status_get(pgcoord *c, int timeout_ms, struct pgcoord_agent_status **out)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 0);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "agent.status", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	struct status_box *b = calloc(1, sizeof(*b));
	if (b && status_read(&u.data, b)) {
		*out = &b->pub;
	} else {
		pgcoord_agent_status_free(b ? &b->pub : NULL);
		pgcoord__set_message(c, "the agent.status result lacks replica_id or state (or "
					"memory ran out)");
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}
