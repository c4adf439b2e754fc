/*
 * http.c — see http.h.
 */
#include "agent/http.h"

#include <sys/queue.h> /* before event2: TAILQ_FOREACH over its header list */

#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/http_request.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/metrics.h"
#include "agent/metrics_render.h"
#include "agent/migrate.h"
#include "agent/notify.h"
#include "agent/pgrow.h"
#include "agent/watches.h"

#define HTTP_TIMEOUT_S 10
#define HTTP_MAX_HEADERS 8192
#define UNCERTAIN_CACHE_MS 1000
/* /status is rebuilt (5 queries) at most this often; hits in between, and
 * hits while a build runs, get the same page */
#define STATUS_CACHE_MS 1000
#define STATUS_MAX_WAITERS 64
/* rows are LIMITed per section; this bounds the page whatever they hold */
#define STATUS_MAX_BYTES (512 * 1024)
/* the schema versions that bring quotas and permits (0004_permits.sql) and
 * waiting claims (0006_waiting_claims.sql) */
#define SCHEMA_PERMITS 4
#define SCHEMA_WAITS 6

struct job;

struct http {
	struct agent *ag;
	struct evhttp *ev;
	struct job *jobs;     /* requests waiting for the database */
	char addr[80];	      /* as listened on, for logs */
	char listen_host[64]; /* metrics_listen's host part, an allowed Host */
	/* /status: the last page, and the hits waiting for the one being built */
	struct evbuffer *status_page;
	uint64_t status_built_ms;
	bool status_building;
	struct evhttp_request *status_waiters[STATUS_MAX_WAITERS];
	int nstatus_waiters;
};

enum job_kind { JOB_STATUS, JOB_METRICS };

struct job {
	struct job *next, *prev;
	struct http *h; /* NULL once the listener is gone: just free on completion */
	struct evhttp_request *req;
	enum job_kind kind;
	struct evbuffer *body;
	int step;
};

static void job_unlink(struct job *j)
{
	if (!j->h)
		return;
	if (j->prev)
		j->prev->next = j->next;
	else
		j->h->jobs = j->next;
	if (j->next)
		j->next->prev = j->prev;
	j->next = j->prev = NULL;
}

static void job_free(struct job *j)
{
	job_unlink(j);
	if (j->body)
		evbuffer_free(j->body);
	free(j);
}

static struct job *job_new(struct http *h, struct evhttp_request *req, enum job_kind kind)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->body = evbuffer_new();
	if (!j->body) {
		free(j);
		return NULL;
	}
	j->h = h;
	j->req = req;
	j->kind = kind;
	j->next = h->jobs;
	if (h->jobs)
		h->jobs->prev = j;
	h->jobs = j;
	return j;
}

/* Sends the reply. The request stays valid until this call even when the
 * client went away meanwhile (libevent then just frees it). */
static void reply(struct evhttp_request *req, int code, const char *reason,
		  const char *content_type, struct evbuffer *body)
{
	struct evkeyvalq *hdr = evhttp_request_get_output_headers(req);
	evhttp_add_header(hdr, "Content-Type", content_type);
	evhttp_add_header(hdr, "Cache-Control", "no-store");
	evhttp_add_header(hdr, "X-Content-Type-Options", "nosniff");
	evhttp_send_reply(req, code, reason, body);
}

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
	struct evbuffer *b = evbuffer_new();
	if (b)
		evbuffer_add_printf(b, "%s\n", text);
	reply(req, code, reason, "text/plain; charset=utf-8", b);
	if (b)
		evbuffer_free(b);
}

void http_add_escaped(struct evbuffer *out, const char *s)
{
	const char *run = s;
	for (; *s; s++) {
		const char *rep = NULL;
		switch (*s) {
		case '&':
			rep = "&amp;";
			break;
		case '<':
			rep = "&lt;";
			break;
		case '>':
			rep = "&gt;";
			break;
		case '"':
			rep = "&quot;";
			break;
		case '\'':
			rep = "&#39;";
			break;
		}
		if (rep) {
			evbuffer_add(out, run, (size_t)(s - run));
			evbuffer_add(out, rep, strlen(rep));
			run = s + 1;
		}
	}
	evbuffer_add(out, run, (size_t)(s - run));
}

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

/* --- /healthz -------------------------------------------------------- */

static void serve_healthz(struct http *h, struct evhttp_request *req)
{
	struct agent *ag = h->ag;
	char why[256];
	uint64_t lag = mono_ms() - ag->id.hb_last_ok_ms;

	if (ag->state != AGENT_SERVING)
		snprintf(why, sizeof(why), "not serving: %s",
			 ag->state == AGENT_STARTING   ? "starting (waiting for the database)"
			 : ag->state == AGENT_STOPPING ? "stopping"
						       : "superseded by another incarnation");
	else if (!db_lane_up(ag->db, DB_LANE_REQUESTS))
		snprintf(why, sizeof(why), "the database is unreachable");
	else if (ag->id.suspended || lag >= (uint64_t)ag->cfg.session_ttl_ms / 2)
		snprintf(why, sizeof(why), "heartbeats failing: last success %llu ms ago",
			 (unsigned long long)lag);
	else
		why[0] = '\0';
	if (why[0])
		reply_text(req, 503, "Service Unavailable", why);
	else
		reply_text(req, 200, "OK", "ok");
}

/* --- /metrics -------------------------------------------------------- */

static void metrics_finish(struct job *j)
{
	metrics_render(j->h->ag, j->body);
	reply(j->req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", j->body);
	job_free(j);
}

/* Reads the count and oldest age of uncertain permits (cheap: the partial
 * index on open permits) into the metrics cache. */
static const char uncertain_sql[] =
    "SELECT count(*), coalesce(max(pgcoord.ms(now()) - pgcoord.ms(state_at)), 0) "
    "FROM pgcoord.permit_status WHERE state <> 'released' AND effective_state = 'uncertain'";

static void uncertain_done(const struct db_result *r, void *arg)
{
	struct job *j = arg;
	if (!j->h) {
		job_free(j);
		return;
	}
	if (r->ok && PQntuples(r->res) == 1)
		metrics_set_uncertain(j->h->ag->metrics,
				      strtoll(PQgetvalue(r->res, 0, 0), NULL, 10),
				      strtoll(PQgetvalue(r->res, 0, 1), NULL, 10), mono_ms());
	metrics_finish(j);
}

static bool permits_readable(const struct agent *ag)
{
	return ag->id.registered && ag->id.schema_version >= SCHEMA_PERMITS &&
	       db_lane_up(ag->db, DB_LANE_REQUESTS);
}

static void serve_metrics(struct http *h, struct evhttp_request *req)
{
	struct agent *ag = h->ag;
	struct job *j = job_new(h, req, JOB_METRICS);
	int64_t n, oldest;

	if (!j) {
		reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	if (permits_readable(ag) &&
	    !metrics_get_uncertain(ag->metrics, mono_ms(), UNCERTAIN_CACHE_MS, &n, &oldest) &&
	    db_query(ag->db, DB_LANE_REQUESTS, uncertain_sql, 0, NULL, uncertain_done, j))
		return;
	metrics_finish(j);
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
	td(out, pgrow_text(res, i, 0));
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
		reply_text(req, 500, "Internal Server Error", "out of memory");
	} else {
		reply(req, 200, "OK", "text/html; charset=utf-8", b);
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
	job_free(j);
}

static void status_done(const struct db_result *r, void *arg)
{
	struct job *j = arg;
	if (!j->h) {
		job_free(j);
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

static void serve_status(struct http *h, struct evhttp_request *req)
{
	struct job *j;

	if (h->status_page && mono_ms() - h->status_built_ms < STATUS_CACHE_MS) {
		reply_status_page(h, req);
		return;
	}
	if (h->status_building) {
		if (h->nstatus_waiters == STATUS_MAX_WAITERS) {
			reply_text(req, 503, "Service Unavailable",
				   "too many /status requests at once; retry");
			return;
		}
		h->status_waiters[h->nstatus_waiters++] = req;
		return;
	}
	j = job_new(h, req, JOB_STATUS);
	if (!j) {
		reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	h->status_building = true;
	evbuffer_add(j->body, page_head, sizeof(page_head) - 1);
	render_self(j->body, h->ag);
	render_watched_quotas(j->body, h->ag);
	status_step(j);
}

/* --- routing --------------------------------------------------------- */

/*
 * What to answer is http_request_judge's (http_request.c), on the request
 * head as libevent parsed it, written out again (the request line and the
 * headers), so that what the fuzzer checks is what serves. libevent has
 * already refused a head over HTTP_MAX_HEADERS, a body, and methods other
 * than GET and HEAD.
 */
static bool head_of(struct evhttp_request *req, struct evbuffer *out)
{
	const char *uri = evhttp_request_get_uri(req);
	const char *method;
	struct evkeyval *kv;

	switch (evhttp_request_get_command(req)) {
	case EVHTTP_REQ_GET:
		method = "GET";
		break;
	case EVHTTP_REQ_HEAD:
		method = "HEAD";
		break;
	default:
		method = "OTHER";
		break;
	}
	if (!uri || evbuffer_add_printf(out, "%s %s HTTP/%d.%d\r\n", method, uri, req->major,
					req->minor) < 0)
		return false;
	TAILQ_FOREACH(kv, evhttp_request_get_input_headers(req), next)
	{
		if (evbuffer_add_printf(out, "%s: %s\r\n", kv->key, kv->value) < 0)
			return false;
	}
	return evbuffer_add(out, "\r\n", 2) == 0;
}

static void route(struct evhttp_request *req, void *arg)
{
	struct http *h = arg;
	struct evbuffer *head = evbuffer_new();
	struct http_verdict v;

	if (!head || !head_of(req, head)) {
		if (head)
			evbuffer_free(head);
		reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	size_t len = evbuffer_get_length(head);
	const char *bytes = (const char *)evbuffer_pullup(head, -1);
	http_request_judge(h->listen_host, bytes ? bytes : "", bytes ? len : 0, &v);
	evbuffer_free(head);
	switch (v.page) {
	case HTTP_PAGE_METRICS:
		serve_metrics(h, req);
		return;
	case HTTP_PAGE_HEALTHZ:
		serve_healthz(h, req);
		return;
	case HTTP_PAGE_STATUS:
		serve_status(h, req);
		return;
	case HTTP_PAGE_NONE:
		break;
	}
	if (v.code == 421)
		log_debug(&h->ag->log, "http", "refused a request: %s", v.text);
	if (v.location)
		evhttp_add_header(evhttp_request_get_output_headers(req), "Location", v.location);
	if (v.allow)
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", v.allow);
	reply_text(req, v.code, v.reason, v.text);
}

/* metrics_listen's host part ("localhost:9187" -> "localhost"); empty for
 * a bracketed IPv6 address, whose loopback forms are allowed anyway. */
static void listen_host(const char *listen, char *out, size_t outlen)
{
	const char *colon = strrchr(listen, ':');
	size_t len = colon ? (size_t)(colon - listen) : strlen(listen);

	out[0] = '\0';
	if (listen[0] == '[' || len >= outlen)
		return;
	memcpy(out, listen, len);
	out[len] = '\0';
}

struct http *http_create(struct agent *ag, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	char why[256], host[INET6_ADDRSTRLEN];
	struct http *h;
	int fd = -1, one = 1;

	if (!config_parse_listen(ag->cfg.metrics_listen, &ss, &sslen, why, sizeof(why))) {
		snprintf(err, errlen, "metrics_listen: %s", why);
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	h->ag = ag;
	listen_host(ag->cfg.metrics_listen, h->listen_host, sizeof(h->listen_host));
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "metrics_listen: socket: %s", strerror(errno));
		goto fail;
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sslen) != 0 || listen(fd, 64) != 0) {
		snprintf(err, errlen, "metrics_listen: cannot listen on %s: %s",
			 ag->cfg.metrics_listen, strerror(errno));
		goto fail;
	}
	sslen = sizeof(ss);
	getsockname(fd, (struct sockaddr *)&ss, &sslen);
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
		snprintf(h->addr, sizeof(h->addr), "%s:%u", host, ntohs(v4->sin_port));
	} else {
		struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
		snprintf(h->addr, sizeof(h->addr), "[%s]:%u", host, ntohs(v6->sin6_port));
	}
	h->ev = evhttp_new(ag->base);
	if (!h->ev || !evhttp_accept_socket_with_handle(h->ev, fd)) {
		snprintf(err, errlen, "metrics_listen: cannot serve HTTP on %s", h->addr);
		goto fail;
	}
	fd = -1; /* evhttp owns it now */
	evhttp_set_allowed_methods(h->ev, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_timeout(h->ev, HTTP_TIMEOUT_S);
	evhttp_set_max_headers_size(h->ev, HTTP_MAX_HEADERS);
	evhttp_set_max_body_size(h->ev, 0);
	evhttp_set_gencb(h->ev, route, h);
	char kv[128];
	snprintf(kv, sizeof(kv), "metrics_listen=%s", h->addr);
	log_write(&ag->log, LOG_LEVEL_INFO, "http", kv,
		  "serving /status, /metrics and /healthz on http://%s/", h->addr);
	return h;
fail:
	if (fd >= 0)
		close(fd);
	if (h->ev)
		evhttp_free(h->ev);
	free(h);
	return NULL;
}

void http_destroy(struct http *h)
{
	if (!h)
		return;
	/* answer before evhttp_free frees the requests; the jobs' database
	 * callbacks, if any are still to come, find h gone and only free */
	while (h->jobs) {
		struct job *j = h->jobs;
		job_unlink(j);
		reply_text(j->req, 503, "Service Unavailable", "the agent is shutting down");
		j->h = NULL;
		j->req = NULL;
	}
	for (int i = 0; i < h->nstatus_waiters; i++)
		reply_text(h->status_waiters[i], 503, "Service Unavailable",
			   "the agent is shutting down");
	if (h->status_page)
		evbuffer_free(h->status_page);
	evhttp_free(h->ev);
	free(h);
}
