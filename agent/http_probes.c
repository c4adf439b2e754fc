/*
 * http_probes.c — /healthz and /metrics, the pages monitoring polls: cheap,
 * at most one small query (the uncertain permits, cached). Separate from
 * the /status page, which reads the fleet.
 */
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/http_internal.h"
#include "agent/metrics.h"
#include "agent/metrics_render.h"

#define UNCERTAIN_CACHE_MS 1000

/* --- /healthz -------------------------------------------------------- */

void http_serve_healthz(struct http *h, struct evhttp_request *req)
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
		http_reply_text(req, 503, "Service Unavailable", why);
	else
		http_reply_text(req, 200, "OK", "ok");
}

/* --- /metrics -------------------------------------------------------- */

static void metrics_finish(struct job *j)
{
	metrics_render(j->h->ag, j->body);
	http_reply(j->req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", j->body);
	http_job_free(j);
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
		http_job_free(j);
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

void http_serve_metrics(struct http *h, struct evhttp_request *req)
{
	struct agent *ag = h->ag;
	struct job *j = http_job_new(h, req, JOB_METRICS);
	int64_t n, oldest;

	if (!j) {
		http_reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	if (permits_readable(ag) &&
	    !metrics_get_uncertain(ag->metrics, mono_ms(), UNCERTAIN_CACHE_MS, &n, &oldest) &&
	    db_query(ag->db, DB_LANE_REQUESTS, uncertain_sql, 0, NULL, uncertain_done, j))
		return;
	metrics_finish(j);
}
