/*
 * http_status.c — the /status page: this agent, then the fleet's agents,
 * sessions, leases, quotas, uncertain permits and waiting claims, one
 * query per section on the REQUESTS lane; built at most once a second and
 * shared by the hits meanwhile. Separate from the listener (http.c).
 */
#include <event2/buffer.h>
#include <event2/http.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/http.h"
#include "agent/http_internal.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/metrics.h"
#include "agent/migrate.h"
#include "agent/notify.h"
#include "agent/pgrow.h"
#include "agent/watches.h"

/* /status is rebuilt (5 queries) at most this often; hits in between, and
 * hits while a build runs, get the same page */
#define STATUS_CACHE_MS 1000
/* rows are LIMITed per section; this bounds the page whatever they hold */
#define STATUS_MAX_BYTES (512 * 1024)

/* "850ms", "12.3s", "4m05s", "2h03m", "3d04h" */
static void fmt_duration(char *buf, size_t len, int64_t ms)
{
	const char *sign = "";
	if (ms < 0) {
		sign = "-";
		ms = -ms;
	}
	if (ms < 1000)
		snprintf(buf, len, "%s%" PRId64 "ms", sign, ms);
	else if (ms < 60000)
		snprintf(buf, len, "%s%.1fs", sign, (double)ms / 1000.0);
	else if (ms < 3600000)
		snprintf(buf, len, "%s%" PRId64 "m%02" PRId64 "s", sign, ms / 60000,
			 ms / 1000 % 60);
	else if (ms < 86400000)
		snprintf(buf, len, "%s%" PRId64 "h%02" PRId64 "m", sign, ms / 3600000,
			 ms / 60000 % 60);
	else
		snprintf(buf, len, "%s%" PRId64 "d%02" PRId64 "h", sign, ms / 86400000,
			 ms / 3600000 % 24);
}

/* --- /status --------------------------------------------------------- */

struct section {
	const char *id;	   /* the table's id */
	const char *title; /* the heading */
	int min_schema;	   /* schema version that has its tables */
	const char *sql;
	const char *const *headers;
	void (*row)(struct evbuffer *out, const PGresult *res, int i);
	const char *empty; /* what an empty table says */
};

static void td(struct evbuffer *out, const char *text)
{
	evbuffer_add(out, "<td>", 4);
	http_add_escaped(out, text);
	evbuffer_add(out, "</td>", 5);
}

static void td_class(struct evbuffer *out, const char *cls, const char *text)
{
	evbuffer_add_printf(out, "<td class=\"%s\">", cls);
	http_add_escaped(out, text);
	evbuffer_add(out, "</td>", 5);
}

static void td_age(struct evbuffer *out, const PGresult *res, int i, int c, const char *suffix)
{
	char buf[48], d[32];
	if (PQgetisnull(res, i, c)) {
		td(out, "");
		return;
	}
	fmt_duration(d, sizeof(d), pgrow_int(res, i, c));
	snprintf(buf, sizeof(buf), "%s%s", d, suffix);
	td(out, buf);
}

/* Every section's last column is count(*) OVER (): the total before LIMIT. */
#define TOTAL ", count(*) OVER ()"

static const char *const agent_headers[] = {"replica",	"live",	       "host",	  "pid",
					    "version",	"incarnation", "started", "heartbeat",
					    "sessions", NULL};
static void agent_row(struct evbuffer *out, const PGresult *res, int i)
{
	bool live = pgrow_bool(res, i, 1), stopped = pgrow_bool(res, i, 9);
	td(out, pgrow_text(res, i, 0));
	td_class(out, live ? "ok" : "bad", live ? "live" : stopped ? "stopped" : "lapsed");
	td(out, pgrow_text(res, i, 2));
	td(out, pgrow_text(res, i, 3));
	td(out, pgrow_text(res, i, 4));
	td(out, pgrow_text(res, i, 5));
	td_age(out, res, i, 6, " ago");
	td_age(out, res, i, 7, " ago");
	td(out, pgrow_text(res, i, 8));
}

static const char *const session_headers[] = {"session", "name",       "replica",
					      "opened",	 "expires in", NULL};
static void session_row(struct evbuffer *out, const PGresult *res, int i)
{
	td(out, pgrow_text(res, i, 0));
	td(out, pgrow_text(res, i, 1));
	td(out, pgrow_text(res, i, 2));
	td_age(out, res, i, 3, " ago");
	td_age(out, res, i, 4, "");
}

static const char *const lease_headers[] = {"lease", "holder",	   "session",  "epoch",
					    "ttl",   "expires in", "acquired", NULL};
static void lease_row(struct evbuffer *out, const PGresult *res, int i)
{
	bool held = pgrow_bool(res, i, 7);
	char ttl[32];
	td(out, pgrow_text(res, i, 0));
	td_class(out, held ? "ok" : "idle", held ? pgrow_text(res, i, 1) : "(free)");
	td(out, held ? pgrow_text(res, i, 2) : "");
	td(out, pgrow_text(res, i, 3));
	fmt_duration(ttl, sizeof(ttl), pgrow_int(res, i, 4));
	td(out, ttl);
	if (held)
		td_age(out, res, i, 5, "");
	else
		td(out, "");
	td_age(out, res, i, 6, " ago");
}

static const char *const quota_headers[] = {"quota",	 "limit",   "in flight", "held",
					    "uncertain", "permits", "used",	 NULL};
static void quota_row(struct evbuffer *out, const PGresult *res, int i)
{
	int64_t limit = pgrow_int(res, i, 1), inflight = pgrow_int(res, i, 2);
	char pct[32];
	/* the key links to who holds its room (http_why.c) */
	evbuffer_add(out, "<td><a href=\"/why?key=", 22);
	http_add_query_escaped(out, pgrow_text(res, i, 0));
	evbuffer_add(out, "\">", 2);
	http_add_escaped(out, pgrow_text(res, i, 0));
	evbuffer_add(out, "</a></td>", 9);
	td(out, pgrow_text(res, i, 1));
	td(out, pgrow_text(res, i, 2));
	td(out, pgrow_text(res, i, 3));
	td_class(out, pgrow_int(res, i, 4) ? "warn" : "", pgrow_text(res, i, 4));
	td(out, pgrow_text(res, i, 5));
	if (limit > 0)
		snprintf(pct, sizeof(pct), "%.0f%%", 100.0 * (double)inflight / (double)limit);
	else
		snprintf(pct, sizeof(pct), "%s", inflight ? "over" : "closed");
	td_class(out,
		 limit == 0 || inflight >= limit ? "bad"
		 : inflight * 10 >= limit * 8	 ? "warn"
						 : "ok",
		 pct);
}

static const char *const permit_headers[] = {"permit", "reason", "uncertain for", "phase", "quotas",
					     "owner",  NULL};
static void permit_row(struct evbuffer *out, const PGresult *res, int i)
{
	char owner[300];
	td(out, pgrow_text(res, i, 0));
	td_class(out, "warn", pgrow_text(res, i, 1));
	td_age(out, res, i, 2, "");
	td(out, pgrow_text(res, i, 3));
	td(out, pgrow_text(res, i, 4));
	if (PQgetisnull(res, i, 5))
		snprintf(owner, sizeof(owner), "(none)");
	else
		snprintf(owner, sizeof(owner), "%s@%s", pgrow_text(res, i, 5),
			 pgrow_text(res, i, 6));
	td(out, owner);
}

static const char *const queue_headers[] = {"quota",	     "waiters",	    "head waits",
					    "oldest waiter", "head weight", NULL};
static void queue_row(struct evbuffer *out, const PGresult *res, int i)
{
	td(out, pgrow_text(res, i, 0));
	td(out, pgrow_text(res, i, 1));
	td_age(out, res, i, 2, "");
	td(out, pgrow_text(res, i, 3));
	td(out, pgrow_text(res, i, 4));
}

static const struct section sections[] = {
    {"agents", "Agents", 1,
     "SELECT a.replica_id, a.stopped_at IS NULL AND a.expires_at > now(), a.host, a.pid, "
     "a.version, a.incarnation, pgcoord.ms(now()) - pgcoord.ms(a.started_at), "
     "pgcoord.ms(now()) - pgcoord.ms(a.heartbeat_at), "
     "(SELECT count(*) FROM pgcoord.live_sessions s WHERE s.replica_id = a.replica_id), "
     "a.stopped_at IS NOT NULL" TOTAL " FROM pgcoord.agents a "
     "ORDER BY a.stopped_at IS NULL AND a.expires_at > now() DESC, a.replica_id LIMIT 200",
     agent_headers, agent_row, "no agent has registered"},
    {"sessions", "Live sessions", 1,
     "SELECT s.id, s.name, s.replica_id, pgcoord.ms(now()) - pgcoord.ms(s.opened_at), "
     "pgcoord.ms(s.expires_at) - pgcoord.ms(now())" TOTAL " FROM pgcoord.live_sessions s "
     "ORDER BY s.replica_id, s.id LIMIT 200",
     session_headers, session_row, "no live session"},
    {"leases", "Leases", 2,
     "SELECT l.name, l.holder_replica, l.holder_session, l.epoch, l.ttl_ms, "
     "pgcoord.ms(l.expires_at) - pgcoord.ms(now()), "
     "pgcoord.ms(now()) - pgcoord.ms(l.acquired_at), "
     "l.holder_session IS NOT NULL AND l.expires_at > now()" TOTAL " FROM pgcoord.leases l "
     "ORDER BY l.name LIMIT 200",
     lease_headers, lease_row, "no lease was ever acquired"},
    {"quotas", "Quotas nearest their limit", SCHEMA_PERMITS,
     "SELECT q.key, q.\"limit\", q.in_flight, q.held, q.uncertain, q.permits" TOTAL
     " FROM pgcoord.quota_status q ORDER BY CASE WHEN q.\"limit\" = 0 THEN 2 "
     "ELSE q.in_flight::float8 / q.\"limit\" END DESC, q.key LIMIT 20",
     quota_headers, quota_row, "no quota is defined"},
    {"permits", "Uncertain permits", SCHEMA_PERMITS,
     "SELECT s.id, s.effective_reason, pgcoord.ms(now()) - pgcoord.ms(s.state_at), s.phase, "
     "(SELECT string_agg(pq.key || ':' || pq.weight, ', ' ORDER BY pq.key) "
     " FROM pgcoord.permit_quotas pq WHERE pq.permit_id = s.id), "
     "s.owner_session, s.owner_replica" TOTAL " FROM pgcoord.permit_status s "
     "WHERE s.state <> 'released' AND s.effective_state = 'uncertain' "
     "ORDER BY s.state_at, s.id LIMIT 100",
     permit_headers, permit_row, "no uncertain permit: every reservation's outcome is known"},
    {"queues", "Waiting claims", SCHEMA_WAITS,
     "SELECT q.key, q.length, q.head_age_ms, q.oldest_id, q.head_weight" TOTAL
     " FROM pgcoord.queues() q ORDER BY q.head_age_ms DESC, q.key LIMIT 50",
     queue_headers, queue_row, "no claim is waiting (permit.claim {wait_ms})"},
};
#define NSECTIONS (sizeof(sections) / sizeof(sections[0]))

static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<meta http-equiv=\"refresh\" content=\"5\">"
    "<title>pgcoord-agent status</title><style>"
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}"
    "table{border-collapse:collapse;min-width:40%}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;white-space:nowrap}"
    "th{background:#f0f0f0}td.ok{color:#176f2c}td.bad{color:#b00020;font-weight:bold}"
    "td.warn{color:#9a5b00}td.idle{color:#777}p.err{color:#b00020}p.note{color:#555}"
    "</style></head><body>\n";

static void section_table_start(struct evbuffer *out, const struct section *s)
{
	evbuffer_add_printf(out, "<h2>%s</h2>\n<table id=\"%s\"><thead><tr>", s->title, s->id);
	for (const char *const *hd = s->headers; *hd; hd++)
		evbuffer_add_printf(out, "<th>%s</th>", *hd);
	evbuffer_add(out, "</tr></thead><tbody>\n", 21);
}

static void section_note(struct evbuffer *out, const struct section *s, const char *cls,
			 const char *text)
{
	evbuffer_add_printf(out, "<h2>%s</h2>\n<p class=\"%s\" id=\"%s-note\">", s->title, cls,
			    s->id);
	http_add_escaped(out, text);
	evbuffer_add(out, "</p>\n", 5);
}

static void render_section(struct job *j, const struct section *s, const struct db_result *r)
{
	struct evbuffer *out = j->body;
	int n, total, ncols;

	if (!r->ok) {
		char msg[600];
		snprintf(msg, sizeof(msg), "could not read from the database: %s", r->message);
		section_note(out, s, "err", msg);
		return;
	}
	n = PQntuples(r->res);
	ncols = PQnfields(r->res);
	total = n ? (int)pgrow_int(r->res, 0, ncols - 1) : 0;
	section_table_start(out, s);
	for (int i = 0; i < n; i++) {
		if (evbuffer_get_length(out) > STATUS_MAX_BYTES) {
			/* the rest is counted, not shown */
			total = total > n ? total : n;
			n = i;
			break;
		}
		evbuffer_add(out, "<tr>", 4);
		s->row(out, r->res, i);
		evbuffer_add(out, "</tr>\n", 6);
	}
	evbuffer_add(out, "</tbody></table>\n", 17);
	if (n == 0)
		evbuffer_add_printf(out, "<p class=\"note\">%s</p>\n", s->empty);
	else if (total > n)
		evbuffer_add_printf(out, "<p class=\"note\">%d more not shown</p>\n", total - n);
	/* the permits section counts every uncertain permit: keep the
	 * metrics' copy current too */
	if (strcmp(s->id, "permits") == 0) {
		int64_t oldest = n ? pgrow_int(r->res, 0, 2) : 0;
		metrics_set_uncertain(j->h->ag->metrics, total, oldest, mono_ms());
	}
}

static void render_self(struct evbuffer *out, struct agent *ag)
{
	char summary[256], d[32];
	uint64_t now = mono_ms();
	struct db_stats st;

	notify_summary(ag, summary, sizeof(summary));
	db_get_stats(ag->db, &st);
	evbuffer_add(out, "<h1>pgcoord-agent ", 18);
	http_add_escaped(out, ag->cfg.replica_id);
	evbuffer_add(out, "</h1>\n<p id=\"summary\">", 22);
	http_add_escaped(out, summary);
	evbuffer_add(out, "</p>\n<table id=\"agent\"><tbody>\n", 31);
	evbuffer_add_printf(out, "<tr><th>version</th><td>%s (schema %d, needs %d)</td></tr>\n",
			    PGCOORD_VERSION_STRING, ag->id.schema_version,
			    migrate_latest_version());
	evbuffer_add_printf(out, "<tr><th>incarnation</th><td>%lld</td></tr>\n",
			    (long long)ag->id.incarnation);
	evbuffer_add(out, "<tr><th>host, pid</th><td>", 26);
	http_add_escaped(out, ag->id.host);
	evbuffer_add_printf(out, ", %d</td></tr>\n", (int)getpid());
	fmt_duration(d, sizeof(d), (int64_t)(now - ag->started_ms));
	evbuffer_add_printf(out, "<tr><th>uptime</th><td>%s</td></tr>\n", d);
	if (ag->id.registered) {
		fmt_duration(d, sizeof(d), (int64_t)(now - ag->id.hb_last_ok_ms));
		evbuffer_add_printf(
		    out, "<tr><th>last heartbeat</th><td class=\"%s\">%s ago</td></tr>\n",
		    ag->id.suspended ? "bad" : "ok", d);
	}
	bool db_up = db_lane_up(ag->db, DB_LANE_REQUESTS);
	evbuffer_add_printf(out, "<tr><th>database</th><td class=\"%s\">%s", db_up ? "ok" : "bad",
			    db_up ? "up" : "DOWN");
	/* "DOWN" alone sends the reader to the log; libpq's reason is here */
	if (!db_up && db_last_error(ag->db)[0]) {
		evbuffer_add(out, " (", 2);
		http_add_escaped(out, db_last_error(ag->db));
		evbuffer_add(out, ")", 1);
	}
	evbuffer_add_printf(out,
			    ": %d+%d connections, %lu queries, %lu failures, %lu "
			    "reconnects</td></tr>\n",
			    st.connected[DB_LANE_REQUESTS], st.connected[DB_LANE_HEARTBEAT],
			    st.queries, st.failures, st.reconnects);
	const struct replication_view *rv = db_replication(ag->db);
	char repl[512];
	replication_describe(rv, repl, sizeof(repl));
	evbuffer_add_printf(out, "<tr><th>failover</th><td class=\"%s\">%s: ",
			    replication_failover_safe(rv) ? "ok" : "bad",
			    replication_failover_word(rv));
	http_add_escaped(out, repl);
	evbuffer_add_printf(out,
			    " (%lu standby connections refused, %lu synchronous waits "
			    "cancelled)</td></tr>\n",
			    st.standby_refusals, st.sync_waits_cancelled);
	evbuffer_add_printf(out,
			    "<tr><th>statements</th><td id=\"statement-mode\">%s "
			    "(prepared_statements = %s%s)</td></tr>\n",
			    stmt_mode_name(db_statement_mode(ag->db)),
			    stmt_setting_name(ag->cfg.prepared_statements),
			    db_pooler_seen(ag->db) ? "; a pooler is in between" : "");
	int leases = leases_held_count(ag);
	evbuffer_add_printf(out,
			    "<tr><th>here</th><td>%d client connection%s, %d session%s, %d "
			    "lease%s held%s</td></tr>\n",
			    ag->nconns, ag->nconns == 1 ? "" : "s", ag->nsessions,
			    ag->nsessions == 1 ? "" : "s", leases, leases == 1 ? "" : "s",
			    janitor_active(ag) ? ", the fleet's janitor" : "");
	evbuffer_add(out, "</tbody></table>\n", 17);
}

static void watched_quota_row(void *arg, const struct watched_quota *q)
{
	struct evbuffer *out = arg;
	char n[24];
	evbuffer_add(out, "<tr>", 4);
	td(out, q->key);
	snprintf(n, sizeof(n), "%d", q->watchers);
	td(out, n);
	if (!q->read || !q->exists) {
		td_class(out, "idle", q->read ? "no such quota" : "not read yet");
		td(out, "");
		td(out, "");
		td(out, "");
	} else {
		int64_t room = q->limit > q->in_flight ? q->limit - q->in_flight : 0;
		snprintf(n, sizeof(n), "%" PRId64, q->limit);
		td(out, n);
		snprintf(n, sizeof(n), "%" PRId64, q->in_flight);
		td(out, n);
		snprintf(n, sizeof(n), "%" PRId64, q->uncertain);
		td_class(out, q->uncertain ? "warn" : "ok", n);
		snprintf(n, sizeof(n), "%" PRId64, room);
		td_class(out, room ? "ok" : "warn", n);
	}
	evbuffer_add(out, "</tr>\n", 6);
}

/* What this agent's sessions watch, as its last poll read it: no query. */
static void render_watched_quotas(struct evbuffer *out, struct agent *ag)
{
	size_t before;
	evbuffer_add_printf(out, "<h2>Quotas watched here</h2>\n<table id=\"watched\"><thead><tr>"
				 "<th>quota</th><th>watchers</th><th>limit</th><th>in flight</th>"
				 "<th>uncertain</th><th>room</th></tr></thead><tbody>\n");
	before = evbuffer_get_length(out);
	watches_each_quota(ag, watched_quota_row, out);
	bool none = evbuffer_get_length(out) == before;
	evbuffer_add(out, "</tbody></table>\n", 17);
	if (none)
		evbuffer_add_printf(out, "<p class=\"note\">no session of this agent watches a "
					 "quota (quota.watch)</p>\n");
}

static void status_step(struct job *j);

static const char page_foot[] =
    "<p class=\"note\">Ages by the database clock. This page refreshes every 5 s; "
    "<a href=\"/metrics\">/metrics</a>, <a href=\"/healthz\">/healthz</a>.</p>\n"
    "</body></html>\n";

/* Sends a copy of the cached page: evhttp_send_reply drains what it sends. */
static void reply_status_page(struct http *h, struct evhttp_request *req)
{
	struct evbuffer *b = evbuffer_new();
	size_t len = evbuffer_get_length(h->status_page);

	if (!b || evbuffer_add(b, evbuffer_pullup(h->status_page, (ev_ssize_t)len), len) != 0) {
		http_reply_text(req, 500, "Internal Server Error", "out of memory");
	} else {
		http_reply(req, 200, "OK", "text/html; charset=utf-8", b);
	}
	if (b)
		evbuffer_free(b);
}

static void status_finish(struct job *j)
{
	struct http *h = j->h;

	evbuffer_add(j->body, page_foot, sizeof(page_foot) - 1);
	/* the page becomes the cache; the hit that built it and every hit that
	 * came meanwhile get it */
	if (h->status_page)
		evbuffer_free(h->status_page);
	h->status_page = j->body;
	j->body = NULL;
	h->status_built_ms = mono_ms();
	h->status_building = false;
	reply_status_page(h, j->req);
	for (int i = 0; i < h->nstatus_waiters; i++)
		reply_status_page(h, h->status_waiters[i]);
	h->nstatus_waiters = 0;
	http_job_free(j);
}

static void status_done(const struct db_result *r, void *arg)
{
	struct job *j = arg;
	if (!j->h) {
		http_job_free(j);
		return;
	}
	render_section(j, &sections[j->step], r);
	j->step++;
	status_step(j);
}

/* Runs the next section's query, or finishes the page. Sections the
 * database cannot be asked for are rendered at once, in a loop. */
static void status_step(struct job *j)
{
	struct agent *ag = j->h->ag;
	for (; (size_t)j->step < NSECTIONS; j->step++) {
		const struct section *s = &sections[j->step];
		if (!ag->id.registered) {
			section_note(j->body, s, "err",
				     "not read: the agent has not registered yet (database "
				     "unreachable or schema not verified)");
			continue;
		}
		if (ag->id.schema_version < s->min_schema) {
			section_note(j->body, s, "note", "not in this database's schema version");
			continue;
		}
		if (db_query(ag->db, DB_LANE_REQUESTS, s->sql, 0, NULL, status_done, j))
			return;
		section_note(j->body, s, "err", "not read: the database is unreachable");
	}
	status_finish(j);
}

void http_serve_status(struct http *h, struct evhttp_request *req)
{
	struct job *j;

	if (h->status_page && mono_ms() - h->status_built_ms < STATUS_CACHE_MS) {
		reply_status_page(h, req);
		return;
	}
	if (h->status_building) {
		if (h->nstatus_waiters == STATUS_MAX_WAITERS) {
			http_reply_text(req, 503, "Service Unavailable",
					"too many /status requests at once; retry");
			return;
		}
		h->status_waiters[h->nstatus_waiters++] = req;
		return;
	}
	j = http_job_new(h, req, JOB_STATUS);
	if (!j) {
		http_reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	h->status_building = true;
	evbuffer_add(j->body, page_head, sizeof(page_head) - 1);
	render_self(j->body, h->ag);
	render_watched_quotas(j->body, h->ag);
	status_step(j);
}
