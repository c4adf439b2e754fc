/*
 * fleet_reads.c — fleet.agents and fleet.sessions as C structs (struct
 * pgcoord_agent_list, struct pgcoord_session_list), for operators' views
 * of the whole fleet.
 */
#include <stdlib.h>

#include <msgpack.h>

#include "pages.h"
#include "typed_read.h"

/* Every page of a fleet list, as one list. */
static pgcoord_err fleet_get(pgcoord *c, const char *method, const char *items, int timeout_ms,
			     const struct pgcoord__reply_kind *k, void **out)
{
	void *raw = NULL;
	size_t raw_len = 0;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord__list_all(c, method, NULL, 0, items, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, k, out);
}

/* --- fleet.agents ---------------------------------------------------------- */

#define AF(...) PGCOORD__FIELD(struct pgcoord_agent_info, __VA_ARGS__)

static const struct pgcoord__field agent_fields[] = {
    AF("replica_id", STR, replica_id, 0, true),
    AF("incarnation", INT, incarnation, 0, false),
    AF("host", STR, host, 0, false),
    AF("pid", INT, pid, 0, false),
    AF("version", STR, version, 0, false),
    AF("started_at", INT, started_at, -1, false),
    AF("heartbeat_at", INT, heartbeat_at, -1, false),
    AF("expires_at", INT, expires_at, -1, false),
    AF("stopped_at", INT, stopped_at, -1, false),
    AF("live", BOOL, live, 0, false),
};

static const struct pgcoord__row_kind agent_row =
    PGCOORD__ROW_KIND(struct pgcoord_agent_info, agent_fields);

void pgcoord_agent_list_free(struct pgcoord_agent_list *l)
{
	if (!l)
		return;
	pgcoord__table_free((void *)l->agents, l->count, &agent_row);
	free(l);
}

static bool agent_list_read(const msgpack_object *m, void *box)
{
	struct pgcoord_agent_list *l = box;
	void *rows;
	bool ok = pgcoord__table_read(m, "agents", &agent_row, &rows, &l->count);
	l->agents = rows;
	l->now_at = pgcoord__int_or(m, "now_at", -1);
	return ok;
}

static void agent_list_free_box(void *box)
{
	pgcoord_agent_list_free(box);
}

static const struct pgcoord__reply_kind agent_list_kind = {
    sizeof(struct pgcoord_agent_list), agent_list_read, agent_list_free_box,
    "the fleet.agents result lacks its agents with their replica_id"};

pgcoord_err pgcoord_fleet_agents_get(pgcoord *c, int timeout_ms, struct pgcoord_agent_list **out)
{
	return fleet_get(c, "fleet.agents", "agents", timeout_ms, &agent_list_kind, (void **)out);
}

/* --- fleet.sessions -------------------------------------------------------- */

#define SF(...) PGCOORD__FIELD(struct pgcoord_session_info, __VA_ARGS__)

static const struct pgcoord__field session_fields[] = {
    SF("session", INT, session, 0, true),	 SF("name", STR, name, 0, false),
    SF("replica_id", STR, replica_id, 0, false), SF("incarnation", INT, incarnation, 0, false),
    SF("opened_at", INT, opened_at, -1, false),	 SF("expires_at", INT, expires_at, -1, false),
    SF("owner_uid", INT, owner_uid, -1, false),
};

static const struct pgcoord__row_kind session_row =
    PGCOORD__ROW_KIND(struct pgcoord_session_info, session_fields);

void pgcoord_session_list_free(struct pgcoord_session_list *l)
{
	if (!l)
		return;
	pgcoord__table_free((void *)l->sessions, l->count, &session_row);
	free(l);
}

static bool session_list_read(const msgpack_object *m, void *box)
{
	struct pgcoord_session_list *l = box;
	void *rows;
	bool ok = pgcoord__table_read(m, "sessions", &session_row, &rows, &l->count);
	l->sessions = rows;
	l->now_at = pgcoord__int_or(m, "now_at", -1);
	return ok;
}

static void session_list_free_box(void *box)
{
	pgcoord_session_list_free(box);
}

static const struct pgcoord__reply_kind session_list_kind = {
    sizeof(struct pgcoord_session_list), session_list_read, session_list_free_box,
    "the fleet.sessions result lacks its sessions with their ids"};

pgcoord_err pgcoord_fleet_sessions_get(pgcoord *c, int timeout_ms,
				       struct pgcoord_session_list **out)
{
	return fleet_get(c, "fleet.sessions", "sessions", timeout_ms, &session_list_kind,
			 (void **)out);
}
