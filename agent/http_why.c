/*
 * http_why.c — the /why?key=QUOTA page: who holds a quota's room, the
 * rows of pgcoord.quota_why (0012_quota_why.sql) that quota.why and
 * `pgcoordctl why` show, as HTML. /status links each quota here. Every
 * cell is escaped: keys, ids, replicas and reasons are chosen by clients.
 */
#include <event2/buffer.h>
#include <event2/http.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/http.h"
#include "agent/http_internal.h"
#include "agent/pgrow.h"
#include "agent/quota_why.h"

/* the schema version that brings quota_why */
#define SCHEMA_WHY 12
/* each list's rows */
#define WHY_PAGE_HOLDERS 10

static const char why_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<title>pgcoord-agent: who holds the room</title><style>"
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}"
    "table{border-collapse:collapse;min-width:40%}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;white-space:nowrap}"
    "th{background:#f0f0f0}p.note{color:#555}"
    "</style></head><body>\n<p><a href=\"/status\">&larr; status</a></p>\n";

static void cell(struct evbuffer *out, const PGresult *res, int row, int col)
{
	evbuffer_add(out, "<td>", 4);
	if (!pgrow_null(res, row, col))
		http_add_escaped(out, pgrow_text(res, row, col));
	evbuffer_add(out, "</td>", 5);
}

static void numbers(struct evbuffer *out, const PGresult *res)
{
	static const struct {
		const char *name;
		int col;
	} rows[] = {{"limit", QW_LIMIT},
		    {"in flight", QW_IN_FLIGHT},
		    {"waiting", QW_WAITING},
		    {"open permits", QW_HOLDERS},
		    {"uncertain weight", QW_UNCERTAIN_WEIGHT}};
	int64_t limit = pgrow_int(res, 0, QW_LIMIT), in_flight = pgrow_int(res, 0, QW_IN_FLIGHT);

	evbuffer_add_printf(out, "<table id=\"quota\"><tbody>\n");
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		evbuffer_add_printf(out, "<tr><th>%s</th>", rows[i].name);
		cell(out, res, 0, rows[i].col);
		evbuffer_add(out, "</tr>\n", 6);
	}
	evbuffer_add_printf(out, "<tr><th>available</th><td>%" PRId64 "</td></tr>\n",
			    limit > in_flight ? limit - in_flight : 0);
	evbuffer_add(out, "</tbody></table>\n", 17);
	if (pgrow_null(res, 0, QW_HEAD_WEIGHT)) {
		evbuffer_add_printf(out,
				    "<p class=\"note\" id=\"queue\">no claim is waiting</p>\n");
		return;
	}
	evbuffer_add_printf(out,
			    "<h2>Head of the queue</h2>\n<table id=\"queue\"><thead><tr>"
			    "<th>id</th><th>weight</th><th>waited ms</th></tr></thead><tbody><tr>");
	cell(out, res, 0, QW_HEAD_ID);
	cell(out, res, 0, QW_HEAD_WEIGHT);
	cell(out, res, 0, QW_HEAD_WAITED);
	evbuffer_add(out, "</tr></tbody></table>\n", 22);
}

static void list(struct evbuffer *out, const PGresult *res, const char *part, const char *title)
{
	static const int cols[] = {QW_ID,      QW_WEIGHT,	 QW_STATE,
				   QW_PHASE,   QW_OWNER_REPLICA, QW_OWNER_SESSION,
				   QW_HELD_MS, QW_STATE_MS,	 QW_REASON};
	int shown = 0;

	evbuffer_add_printf(out,
			    "<h2>%s</h2>\n<table id=\"%s\"><thead><tr><th>id</th><th>weight</th>"
			    "<th>state</th><th>phase</th><th>owner replica</th><th>owner "
			    "session</th><th>held ms</th><th>in state ms</th><th>reason</th>"
			    "</tr></thead><tbody>\n",
			    title, part);
	for (int i = 1; i < PQntuples(res); i++) {
		if (strcmp(PQgetvalue(res, i, QW_PART), part) != 0)
			continue;
		evbuffer_add(out, "<tr>", 4);
		for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
			cell(out, res, i, cols[c]);
		evbuffer_add(out, "</tr>\n", 6);
		shown++;
	}
	evbuffer_add(out, "</tbody></table>\n", 17);
	if (!shown)
		evbuffer_add_printf(out, "<p class=\"note\">none</p>\n");
}

static void why_done(const struct db_result *r, void *arg)
{
	struct job *j = arg;
	const PGresult *res = r->res;
	int code = 200;
	const char *reason = "OK";

	if (!j->h) {
		http_job_free(j);
		return;
	}
	evbuffer_add(j->body, why_head, sizeof(why_head) - 1);
	evbuffer_add(j->body, "<h1>Who holds quota &quot;", 26);
	http_add_escaped(j->body, j->arg);
	evbuffer_add(j->body, "&quot;</h1>\n", 12);
	if (!r->ok || PQnfields(res) != QW__COUNT) {
		code = 503;
		reason = "Service Unavailable";
		evbuffer_add(j->body, "<p class=\"note\">could not read from the database: ", 50);
		http_add_escaped(j->body, r->ok ? "unexpected columns" : r->message);
		evbuffer_add(j->body, "</p>\n", 5);
	} else if (PQntuples(res) == 0) {
		code = 404;
		reason = "Not Found";
		evbuffer_add_printf(j->body, "<p class=\"note\">no such quota</p>\n");
	} else {
		numbers(j->body, res);
		list(j->body, res, "uncertain", "Uncertain, longest first");
		list(j->body, res, "largest", "Largest");
		list(j->body, res, "oldest", "Longest held");
	}
	evbuffer_add(j->body, "</body></html>\n", 15);
	http_reply(j->req, code, reason, "text/html; charset=utf-8", j->body);
	http_job_free(j);
}

void http_serve_why(struct http *h, struct evhttp_request *req, const char *key)
{
	struct agent *ag = h->ag;
	char limit[16];

	if (!ag->id.registered || ag->id.schema_version < SCHEMA_WHY) {
		http_reply_text(req, 503, "Service Unavailable",
				"not read: the agent has not registered, or the schema has no "
				"quota_why yet");
		return;
	}
	struct job *j = http_job_new(h, req, JOB_WHY);
	if (!j || !(j->arg = strdup(key))) {
		if (j)
			http_job_free(j);
		http_reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	/* the page answers whoever reaches the listener, as /status does
	 * (it names uncertain permits and their owners too): an operator's
	 * view, every detail */
	snprintf(limit, sizeof(limit), "%d", WHY_PAGE_HOLDERS);
	const char *params[2] = {key, limit};
	if (!db_query(ag->db, DB_LANE_REQUESTS,
		      "SELECT * FROM pgcoord.quota_why($1, NULL, true, $2)", 2, params, why_done,
		      j)) {
		http_job_free(j);
		http_reply_text(req, 503, "Service Unavailable", "the database is unreachable");
	}
}
