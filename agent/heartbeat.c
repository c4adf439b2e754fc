/*
 * heartbeat.c — see heartbeat.h.
 */
#include "agent/heartbeat.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/sessions.h"

struct heartbeat {
	struct agent *ag;
	uint64_t sent_ms;
};

static void heartbeat_done(const struct db_result *r, void *arg)
{
	struct heartbeat *hb = arg;
	struct agent *ag = hb->ag;
	uint64_t sent = hb->sent_ms;

	free(hb);
	ag->id.hb_in_flight = false;
	if (ag->state == AGENT_STOPPING || ag->state == AGENT_SUPERSEDED)
		return;
	if (!r->ok) {
		log_warn(&ag->log, "identity", "heartbeat failed: %s", r->message);
		return;
	}
	if (PQntuples(r->res) != 1) {
		log_error(&ag->log, "identity", "heartbeat returned %d rows", PQntuples(r->res));
		return;
	}
	if (strcmp(PQgetvalue(r->res, 0, 0), "t") != 0) {
		ag->id.hb_hooks->superseded(ag);
		return;
	}
	ag->id.hb_last_ok_ms = sent;
	ag->id.db_now_ms = strtoll(PQgetvalue(r->res, 0, 2), NULL, 10);
	ag->id.hb_hooks->renewed(ag);

	/* lost sessions come back as a Postgres array literal {1,2,3} */
	const char *lost = PQgetvalue(r->res, 0, 1);
	for (const char *p = lost; *p;) {
		if (*p < '0' || *p > '9') {
			p++;
			continue;
		}
		char *end;
		int64_t id = strtoll(p, &end, 10);
		sessions_lost(ag, id, "the database no longer holds the session live");
		p = end;
	}
}

static void heartbeat_send(struct agent *ag)
{
	char inc[24], ttl[24];
	struct heartbeat *hb;
	char *ids;

	if (!ag->id.registered || ag->state != AGENT_SERVING)
		return;
	if (ag->id.hb_in_flight) {
		/* never pile heartbeats up behind a slow database */
		log_debug(&ag->log, "identity", "previous heartbeat still in flight");
		return;
	}
	ids = sessions_renew_list(ag);
	hb = malloc(sizeof(*hb));
	if (!ids || !hb) {
		free(ids);
		free(hb);
		return;
	}
	hb->ag = ag;
	hb->sent_ms = mono_ms();
	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	snprintf(ttl, sizeof(ttl), "%d", ag->cfg.session_ttl_ms);
	const char *params[4] = {ag->cfg.replica_id, inc, ttl, ids};
	if (db_query(ag->db, DB_LANE_HEARTBEAT,
		     "SELECT agent_ok, lost, now_ms FROM pgcoord.agent_heartbeat($1, $2, $3, "
		     "$4::bigint[])",
		     4, params, heartbeat_done, hb)) {
		ag->id.hb_in_flight = true;
		ag->id.hb_last_sent_ms = hb->sent_ms;
	} else {
		log_warn(&ag->log, "identity", "heartbeat not sent: the database is unreachable");
		free(hb);
	}
	free(ids);
}

static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	(void)fd;
	(void)what;
	heartbeat_send(ag);
	sessions_expire_grace(ag);
}

bool heartbeat_init(struct agent *ag, const struct heartbeat_hooks *hooks)
{
	ag->id.hb_hooks = hooks;
	ag->id.hb_timer = event_new(ag->base, -1, 0, heartbeat_cb, ag);
	return ag->id.hb_timer != NULL;
}

void heartbeat_run(struct agent *ag)
{
	struct timeval tv = {ag->cfg.heartbeat_interval_ms / 1000,
			     (ag->cfg.heartbeat_interval_ms % 1000) * 1000};
	event_assign(ag->id.hb_timer, ag->base, -1, EV_PERSIST, heartbeat_cb, ag);
	event_add(ag->id.hb_timer, &tv);
}

void heartbeat_stop(struct agent *ag)
{
	event_del(ag->id.hb_timer);
}

void heartbeat_finish(struct agent *ag)
{
	if (ag->id.hb_timer)
		event_free(ag->id.hb_timer);
	ag->id.hb_timer = NULL;
}
