/*
 * fleet.c — fleet.agents and fleet.sessions: what the database says is
 * registered and live, fleet-wide.
 */
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/cursor.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/reply.h"

static const struct reply_col agent_cols[] = {
    {"replica_id", REPLY_STR, 0, 0},   {"incarnation", REPLY_INT, 1, 0},
    {"host", REPLY_STR, 2, 0},	       {"pid", REPLY_INT, 3, 0},
    {"version", REPLY_STR, 4, 0},      {"started_at", REPLY_INT, 5, 0},
    {"heartbeat_at", REPLY_INT, 6, 0}, {"expires_at", REPLY_INT, 7, 0},
    {"stopped_at", REPLY_INT, 8, 0},   {"live", REPLY_BOOL, 9, 0},
    {"now_at", REPLY_HIDDEN, 10, 0},
};
static const struct reply_kind agent_row = REPLY_KIND(agent_cols);

static const struct reply_col agents_cols[] = {
    REPLY_EACH_ROW("agents", agent_row, 0),
    PAGE_NOW_AT,
    PAGE_NEXT_CURSOR,
};
const struct reply_kind fleet_agents_reply = REPLY_KIND(agents_cols);

/* fleet.agents pages by replica_id, fleet.sessions by session id: their
 * primary keys */
static const struct cursor_kind agent_cursor = {'a', 1, 200, false};
static const struct cursor_kind session_cursor = {'s', 1, 20, true};

/* A fleet list: {<key>: [rows], now_at, next_cursor}, now_at read from
 * column now_col so that a client can show ages by the database clock;
 * the key is column 0. */
static void pack_rows(struct request *req, const struct reply_kind *reply, const PGresult *res,
		      int now_col)
{
	const struct page *pg = req->ctx;
	int n = PQntuples(res);
	/* the statement asked for one row more than a page: another page follows */
	bool more = n > pg->limit;
	struct page_view v = {.req = req};

	if (more)
		n = (int)pg->limit;
	v.now_at = n ? pgrow_int(res, 0, now_col) : 0;
	if (!page_view_cursor(req, &v, pg->kind, res, more ? n - 1 : -1, (const int[]){0}))
		return;
	struct reply_src src = {.res = res, .row = 0, .nrows = n, .c = &v};
	reply_pack(req_result(req), reply, &src);
	free(v.next_cursor);
	req_done(req);
}

static void agents_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (req_rows_are(req, &agent_row, r->res, 0))
		pack_rows(req, &fleet_agents_reply, r->res, 10);
}

void rpc_fleet_agents(struct request *req)
{
	struct page *pg = req_page_ctx(req, &agent_cursor, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX);
	if (!pg)
		return;
	const char *params[2] = {page_after(pg, 0), pg->fetch};
	req_query(req,
		  "SELECT replica_id, incarnation, host, pid, version, pgcoord.ms(started_at), "
		  "pgcoord.ms(heartbeat_at), pgcoord.ms(expires_at), pgcoord.ms(stopped_at), "
		  "stopped_at IS NULL AND expires_at > now(), pgcoord.ms(now()) "
		  "FROM pgcoord.agents WHERE replica_id > $1 ORDER BY replica_id LIMIT $2::integer",
		  2, params, agents_done);
}

static const struct reply_col session_cols[] = {
    {"session", REPLY_INT, 0, 0},
    {"name", REPLY_STR, 1, 0},
    {"replica_id", REPLY_STR, 2, 0},
    {"incarnation", REPLY_INT, 3, 0},
    {"opened_at", REPLY_INT, 4, 0},
    {"expires_at", REPLY_INT, 5, 0},
    {"now_at", REPLY_HIDDEN, 6, 0},
    /* nil: opened before owners were recorded */
    {"owner_uid", REPLY_INT, 7, 0},
};
static const struct reply_kind session_row = REPLY_KIND(session_cols);

static const struct reply_col sessions_cols[] = {
    REPLY_EACH_ROW("sessions", session_row, 0),
    PAGE_NOW_AT,
    PAGE_NEXT_CURSOR,
};
const struct reply_kind fleet_sessions_reply = REPLY_KIND(sessions_cols);

static void sessions_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (req_rows_are(req, &session_row, r->res, 0))
		pack_rows(req, &fleet_sessions_reply, r->res, 6);
}

void rpc_fleet_sessions(struct request *req)
{
	struct page *pg = req_page_ctx(req, &session_cursor, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX);
	if (!pg)
		return;
	const char *params[2] = {page_after(pg, 0), pg->fetch};
	req_query(req,
		  "SELECT id, name, replica_id, incarnation, pgcoord.ms(opened_at), "
		  "pgcoord.ms(expires_at), pgcoord.ms(now()), owner_uid "
		  "FROM pgcoord.live_sessions WHERE id > $1::bigint ORDER BY id LIMIT $2::integer",
		  2, params, sessions_done);
}
