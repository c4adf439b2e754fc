/*
 * metrics_render.c — see metrics_render.h. It reads every module's
 * counts; nothing below it calls back, so metrics.c stays a sink.
 */
#include "agent/metrics_render.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/groups.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/metrics_store.h"
#include "agent/waiters.h"
#include "agent/watches.h"

static void header(struct evbuffer *out, const char *name, const char *type, const char *help)
{
	evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Label values are escaped as the text format requires (\\, \", \n). */
static void add_label_value(struct evbuffer *out, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			evbuffer_add_printf(out, "\\%c", *v);
		else if (*v == '\n')
			evbuffer_add(out, "\\n", 2);
		else
			evbuffer_add(out, v, 1);
	}
}

static void gauge(struct evbuffer *out, const char *name, const char *help, double v)
{
	header(out, name, "gauge", help);
	evbuffer_add_printf(out, "%s %.15g\n", name, v);
}

/* labels: "" or `key="value",…` without braces */
static void histogram_lines(struct evbuffer *out, const char *name, const char *labels,
			    const struct histogram *h)
{
	uint64_t cum = 0;
	const char *sep = labels[0] ? "," : "";
	for (int i = 0; i < METRICS_BUCKETS; i++) {
		cum += h->bucket[i];
		evbuffer_add_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
				    metrics_bucket_le[i], (unsigned long long)cum);
	}
	evbuffer_add_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
			    (unsigned long long)h->count);
	evbuffer_add_printf(out, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels,
			    labels[0] ? "}" : "", h->sum_s);
	evbuffer_add_printf(out, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
			    labels[0] ? "}" : "", (unsigned long long)h->count);
}

static const char *method_label(const struct metrics *m, size_t method)
{
	return method < m->nmethods ? m->method_name(method) : "unknown";
}

static const char *outcome_label(int outcome)
{
	return outcome == 0 ? "ok" : pgc_error_name((enum pgc_error_code)outcome);
}

static void render_rpc(const struct metrics *m, struct evbuffer *out)
{
	char labels[160];

	header(out, "pgcoord_rpc_requests_total", "counter",
	       "Requests answered, by method and outcome (ok or the wire error code).");
	for (size_t i = 0; i <= m->nmethods; i++) {
		for (int o = 0; o < OUTCOMES; o++) {
			const struct rpc_series *s = &m->rpc[i * OUTCOMES + (size_t)o];
			if (!s->count)
				continue;
			evbuffer_add_printf(
			    out,
			    "pgcoord_rpc_requests_total{method=\"%s\",outcome=\"%s\"} "
			    "%llu\n",
			    method_label(m, i), outcome_label(o), (unsigned long long)s->count);
		}
	}
	header(out, "pgcoord_rpc_duration_seconds", "histogram",
	       "Time from a request's arrival to its answer, by method and outcome.");
	for (size_t i = 0; i <= m->nmethods; i++) {
		for (int o = 0; o < OUTCOMES; o++) {
			const struct rpc_series *s = &m->rpc[i * OUTCOMES + (size_t)o];
			if (!s->count)
				continue;
			snprintf(labels, sizeof(labels), "method=\"%s\",outcome=\"%s\"",
				 method_label(m, i), outcome_label(o));
			histogram_lines(out, "pgcoord_rpc_duration_seconds", labels, &s->latency);
		}
	}
}

static const char *const lane_labels[DB_LANE__COUNT] = {"requests", "heartbeat"};

/* Only once a connection was checked: before that nothing is known. */
static void render_replication(const struct replication_view *v, struct evbuffer *out)
{
	if (!v->checked)
		return;
	gauge(out, "pgcoord_db_failover_safe",
	      "1 when commits wait for a synchronous standby, so a failover to it keeps every "
	      "acknowledged grant; 0 when acknowledged grants could be lost.",
	      replication_failover_safe(v));
	gauge(out, "pgcoord_db_sync_standbys",
	      "Synchronous standbys attached to the server, -1 when the role may not see "
	      "pg_stat_replication.sync_state.",
	      v->sync_standbys);
}

static void render_db(struct agent *ag, struct evbuffer *out)
{
	struct db_stats st;
	char labels[64];

	db_get_stats(ag->db, &st);
	gauge(out, "pgcoord_db_up", "1 while a request connection to the database is up.",
	      db_lane_up(ag->db, DB_LANE_REQUESTS));
	header(out, "pgcoord_db_connections", "gauge", "Database connections up, by lane.");
	for (int l = 0; l < DB_LANE__COUNT; l++)
		evbuffer_add_printf(out, "pgcoord_db_connections{lane=\"%s\"} %d\n", lane_labels[l],
				    st.connected[l]);
	header(out, "pgcoord_db_queue_depth", "gauge",
	       "Statements waiting for a free connection, by lane.");
	for (int l = 0; l < DB_LANE__COUNT; l++)
		evbuffer_add_printf(out, "pgcoord_db_queue_depth{lane=\"%s\"} %d\n", lane_labels[l],
				    st.queued[l]);
	header(out, "pgcoord_db_queries_total", "counter", "Statements sent to the database.");
	evbuffer_add_printf(out, "pgcoord_db_queries_total %lu\n", st.queries);
	header(out, "pgcoord_db_failures_total", "counter",
	       "Statements that failed (error, lost connection, timeout, or never ran).");
	evbuffer_add_printf(out, "pgcoord_db_failures_total %lu\n", st.failures);
	header(out, "pgcoord_db_timeouts_total", "counter",
	       "Statements that passed query_timeout_ms.");
	evbuffer_add_printf(out, "pgcoord_db_timeouts_total %lu\n", st.timeouts);
	header(out, "pgcoord_db_reconnects_total", "counter",
	       "Database connections lost and reopened.");
	evbuffer_add_printf(out, "pgcoord_db_reconnects_total %lu\n", st.reconnects);
	header(out, "pgcoord_db_standby_refusals_total", "counter",
	       "Connections dropped because the server was a standby (read-only).");
	evbuffer_add_printf(out, "pgcoord_db_standby_refusals_total %lu\n", st.standby_refusals);
	header(out, "pgcoord_db_sync_waits_cancelled_total", "counter",
	       "Commits whose wait for the synchronous standby was cancelled (not acknowledged).");
	evbuffer_add_printf(out, "pgcoord_db_sync_waits_cancelled_total %lu\n",
			    st.sync_waits_cancelled);
	header(out, "pgcoord_db_statement_mode", "gauge",
	       "1 for the statement mode in use (prepared_statements), 0 for the others.");
	for (int m = 0; m < STMT_MODE__COUNT; m++)
		evbuffer_add_printf(out, "pgcoord_db_statement_mode{mode=\"%s\"} %d\n",
				    stmt_mode_name((enum stmt_mode)m),
				    db_statement_mode(ag->db) == (enum stmt_mode)m);
	header(out, "pgcoord_db_pooler", "gauge",
	       "1 once a connection reached the server through a pooler (its backend pid is not "
	       "the server's).");
	evbuffer_add_printf(out, "pgcoord_db_pooler %d\n", db_pooler_seen(ag->db));
	header(out, "pgcoord_db_statements_resent_total", "counter",
	       "Statements sent again unnamed after their named statement went missing "
	       "(prepared_statements auto behind a transaction pooler).");
	evbuffer_add_printf(out, "pgcoord_db_statements_resent_total %lu\n", st.statements_resent);
	header(out, "pgcoord_db_statements_prepared_total", "counter",
	       "Statement texts prepared on a connection (the named modes).");
	evbuffer_add_printf(out, "pgcoord_db_statements_prepared_total %lu\n", st.prepares);
	header(out, "pgcoord_db_prepared_runs_total", "counter",
	       "Statements run by the name they were prepared under.");
	evbuffer_add_printf(out, "pgcoord_db_prepared_runs_total %lu\n", st.prepared_runs);
	header(out, "pgcoord_db_timeout_statements_total", "counter",
	       "set_config() statements of statement_timeout and lock_timeout sent: one per "
	       "statement in the unnamed and named-pooled modes; in the named mode once per "
	       "connection and for a statement that waited in the queue.");
	evbuffer_add_printf(out, "pgcoord_db_timeout_statements_total %lu\n", st.bound_statements);
	render_replication(db_replication(ag->db), out);
	header(out, "pgcoord_db_query_duration_seconds", "histogram",
	       "Time from queueing a statement to its result, by lane.");
	for (int l = 0; l < DB_LANE__COUNT; l++) {
		snprintf(labels, sizeof(labels), "lane=\"%s\"", lane_labels[l]);
		histogram_lines(out, "pgcoord_db_query_duration_seconds", labels, &st.latency[l]);
	}
}

/* Group admission (groups.h): members ÷ groups is the mean group size. */
static void render_groups(const struct agent *ag, struct evbuffer *out)
{
	const struct group *groups[] = {ag->claim_group, ag->release_group, ag->claim_slow_group,
					ag->release_slow_group};
	enum { NGROUPS = sizeof(groups) / sizeof(groups[0]) };
	struct group_stats st[NGROUPS];

	for (int i = 0; i < NGROUPS; i++)
		group_get_stats(groups[i], &st[i]);
	header(out, "pgcoord_permit_groups_total", "counter",
	       "Statements that carried a group of permit calls, by kind.");
	for (int i = 0; i < NGROUPS; i++)
		evbuffer_add_printf(out, "pgcoord_permit_groups_total{kind=\"%s\"} %llu\n",
				    group_name(groups[i]), (unsigned long long)st[i].groups);
	header(out, "pgcoord_permit_group_members_total", "counter",
	       "Permit calls sent in those statements, by kind.");
	for (int i = 0; i < NGROUPS; i++)
		evbuffer_add_printf(out, "pgcoord_permit_group_members_total{kind=\"%s\"} %llu\n",
				    group_name(groups[i]), (unsigned long long)st[i].members);
	header(out, "pgcoord_permit_group_largest", "gauge",
	       "The most permit calls one statement has carried, by kind.");
	for (int i = 0; i < NGROUPS; i++)
		evbuffer_add_printf(out, "pgcoord_permit_group_largest{kind=\"%s\"} %llu\n",
				    group_name(groups[i]), (unsigned long long)st[i].largest);
	header(out, "pgcoord_permit_group_statements_in_flight", "gauge",
	       "Group statements queued or running now, by kind (past group_statements_max only "
	       "for calls on keys none of them names; past group_kind_statements_max only for "
	       "a group over 256 calls or one sent again after a deadlock).");
	for (int i = 0; i < NGROUPS; i++)
		evbuffer_add_printf(out,
				    "pgcoord_permit_group_statements_in_flight{kind=\"%s\"} %llu\n",
				    group_name(groups[i]), (unsigned long long)st[i].in_flight);
	header(out, "pgcoord_permit_group_statements_in_flight_peak", "gauge",
	       "The most group statements of one kind ever in flight at once, by kind.");
	for (int i = 0; i < NGROUPS; i++)
		evbuffer_add_printf(
		    out, "pgcoord_permit_group_statements_in_flight_peak{kind=\"%s\"} %llu\n",
		    group_name(groups[i]), (unsigned long long)st[i].in_flight_peak);
	header(out, "pgcoord_permit_group_members_held_total", "counter",
	       "Calls that waited in the agent for a group statement in flight to end, by kind.");
	for (int i = 0; i < NGROUPS; i++)
		evbuffer_add_printf(out,
				    "pgcoord_permit_group_members_held_total{kind=\"%s\"} %llu\n",
				    group_name(groups[i]), (unsigned long long)st[i].held);
}

void metrics_render(struct agent *ag, struct evbuffer *out)
{
	static const char *const states[] = {"starting", "serving", "stopping", "superseded"};
	const struct metrics *m = ag->metrics;
	uint64_t now = mono_ms();
	int64_t uncertain, oldest;

	header(out, "pgcoord_agent_info", "gauge", "Always 1; labels say which agent this is.");
	evbuffer_add(out, "pgcoord_agent_info{version=\"", 28);
	add_label_value(out, PGCOORD_VERSION_STRING);
	evbuffer_add(out, "\",replica_id=\"", 14);
	add_label_value(out, ag->cfg.replica_id);
	evbuffer_add_printf(out, "\",incarnation=\"%lld\"} 1\n", (long long)ag->id.incarnation);
	header(out, "pgcoord_agent_state", "gauge", "1 for the agent's current state.");
	for (int i = 0; i < 4; i++)
		evbuffer_add_printf(out, "pgcoord_agent_state{state=\"%s\"} %d\n", states[i],
				    (int)ag->state == i);
	gauge(out, "pgcoord_uptime_seconds", "Seconds since the agent started.",
	      (double)(now - ag->started_ms) / 1000.0);
	if (ag->id.registered)
		gauge(out, "pgcoord_heartbeat_lag_seconds",
		      "Seconds since the send time of the last heartbeat that succeeded; "
		      "sessions are suspended at half of session_ttl_ms.",
		      (double)(now - ag->id.hb_last_ok_ms) / 1000.0);
	gauge(out, "pgcoord_heartbeat_failing",
	      "1 while heartbeats fail and clients were told session.suspended.", ag->id.suspended);
	gauge(out, "pgcoord_sessions", "Sessions this agent holds (its own janitor session too).",
	      ag->nsessions);
	gauge(out, "pgcoord_connections", "Client connections open.", ag->nconns);
	gauge(out, "pgcoord_leases_held",
	      "Leases a session of this agent is believed to lead right now.",
	      leases_held_count(ag));
	gauge(out, "pgcoord_janitor", "1 while this agent is the fleet's janitor.",
	      janitor_active(ag));
	gauge(out, "pgcoord_permit_waiters",
	      "Waiting claims of this agent's sessions still queued, as far as it knows.",
	      waiters_count(ag));
	header(out, "pgcoord_permit_queue_admitted_total", "counter",
	       "permit.admitted notifications pushed: waiting claims admitted from the queue.");
	evbuffer_add_printf(out, "pgcoord_permit_queue_admitted_total %llu\n",
			    (unsigned long long)waiters_admitted_total(ag));
	header(
	    out, "pgcoord_permit_queue_expired_total", "counter",
	    "permit.expired notifications pushed: waiting claims that left the queue unadmitted.");
	evbuffer_add_printf(out, "pgcoord_permit_queue_expired_total %llu\n",
			    (unsigned long long)waiters_expired_total(ag));
	gauge(out, "pgcoord_watches", "Quota, permit and record watches of this agent's sessions.",
	      watches_count(ag));
	header(out, "pgcoord_watch_polls_total", "counter",
	       "Statements that read every watch of the agent (one per watch_poll_ms at most, "
	       "whatever the number of watches).");
	evbuffer_add_printf(out, "pgcoord_watch_polls_total %llu\n",
			    (unsigned long long)watches_polls(ag));
	if (m) {
		header(out, "pgcoord_claims_total", "counter",
		       "permit.claim results: admitted (a new slot), held (a retry found the "
		       "grant), denied (no room).");
		for (int i = 0; i < CLAIM__COUNT; i++)
			evbuffer_add_printf(out, "pgcoord_claims_total{result=\"%s\"} %llu\n",
					    metrics_claim_names[i],
					    (unsigned long long)m->claims[i]);
		header(out, "pgcoord_sessions_lost_keepalive_total", "counter",
		       "Sessions declared lost because their client did not call "
		       "session.keepalive within keepalive_ms.");
		evbuffer_add_printf(out, "pgcoord_sessions_lost_keepalive_total %llu\n",
				    (unsigned long long)m->sessions_lost_keepalive);
		if (metrics_get_uncertain(m, now, 60000, &uncertain, &oldest)) {
			gauge(out, "pgcoord_permits_uncertain",
			      "Permits of the whole fleet whose outcome is unknown (they keep "
			      "counting until resolved).",
			      (double)uncertain);
			gauge(out, "pgcoord_permits_uncertain_oldest_age_seconds",
			      "Age of the oldest uncertain permit (0 when there is none).",
			      (double)oldest / 1000.0);
		}
		render_rpc(m, out);
	}
	if (ag->claim_group && ag->release_group && ag->claim_slow_group && ag->release_slow_group)
		render_groups(ag, out);
	if (ag->db)
		render_db(ag, out);
}
