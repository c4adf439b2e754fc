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
#include "agent/leases.h"
#include "agent/sessions.h"

struct heartbeat {
	struct agent *ag;
	uint64_t sent_ms;
	struct lease_beat leases; /* the renewals it carries */
};

/* The columns of the beat's statement. */
enum { HB_AGENT_OK, HB_LOST, HB_NOW_MS, HB_RENEWED, HB__COUNT };

/* agent_beat's renewed, a Postgres array literal {t,f,...}, into one flag
 * per lease the beat carried; false when it does not say that many. */
static bool parse_renewed(const char *lit, bool *out, size_t n)
{
	size_t i = 0;
	if (*lit++ != '{')
		return false;
	for (; *lit && *lit != '}'; lit++) {
		if (*lit == ',')
			continue;
		if (i == n || (*lit != 't' && *lit != 'f'))
			return false;
		out[i++] = *lit == 't';
	}
	return i == n;
}

/* What the beat's answer says of its leases: each renewed or not; NULL
 * (proves nothing) when the beat failed or cannot be read. */
static void leases_answered(struct heartbeat *hb, const struct db_result *r)
{
	struct agent *ag = hb->ag;
	bool *renewed = NULL;
	size_t n = hb->leases.n;

	if (n == 0)
		return;
	if (r->ok && PQntuples(r->res) == 1 && PQnfields(r->res) == HB__COUNT &&
	    PQgetvalue(r->res, 0, HB_AGENT_OK)[0] == 't' && (renewed = calloc(n, sizeof(bool))) &&
	    !parse_renewed(PQgetvalue(r->res, 0, HB_RENEWED), renewed, n)) {
		log_error(&ag->log, "identity", "heartbeat answered renewals unreadably: %s",
			  PQgetvalue(r->res, 0, HB_RENEWED));
		free(renewed);
		renewed = NULL;
	}
	leases_beat_done(ag, &hb->leases, hb->sent_ms, renewed);
	free(renewed);
}

static void heartbeat_done(const struct db_result *r, void *arg)
{
	struct heartbeat *hb = arg;
	struct agent *ag = hb->ag;
	uint64_t sent = hb->sent_ms;

	leases_answered(hb, r);
	free(hb);
	ag->id.hb_in_flight = false;
	if (ag->state == AGENT_STOPPING || ag->state == AGENT_SUPERSEDED)
		return;
	if (!r->ok) {
		log_warn(&ag->log, "identity", "heartbeat failed: %s", r->message);
		return;
	}
	if (PQntuples(r->res) != 1 || PQnfields(r->res) != HB__COUNT) {
		log_error(&ag->log, "identity", "heartbeat returned %d rows of %d columns",
			  PQntuples(r->res), PQnfields(r->res));
		return;
	}
	if (strcmp(PQgetvalue(r->res, 0, HB_AGENT_OK), "t") != 0) {
		ag->id.hb_hooks->superseded(ag);
		return;
	}
	ag->id.hb_last_ok_ms = sent;
	ag->id.db_now_ms = strtoll(PQgetvalue(r->res, 0, HB_NOW_MS), NULL, 10);
	ag->id.hb_hooks->renewed(ag);

	/* lost sessions come back as a Postgres array literal {1,2,3} */
	const char *lost = PQgetvalue(r->res, 0, HB_LOST);
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
	hb = calloc(1, sizeof(*hb));
	if (!ids || !hb) {
		free(ids);
		free(hb);
		return;
	}
	hb->ag = ag;
	hb->sent_ms = mono_ms();
	/* out of memory: this beat renews no lease, their own timers do */
	if (!leases_beat_take(ag, hb->sent_ms, ag->cfg.heartbeat_interval_ms, &hb->leases))
		log_warn(&ag->log, "identity", "heartbeat carries no lease renewal: out of memory");
	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	snprintf(ttl, sizeof(ttl), "%d", ag->cfg.session_ttl_ms);
	/* $9, the beat's server-side bound, is filled in when it is sent */
	const char *params[9] = {ag->cfg.replica_id,
				 inc,
				 ttl,
				 ids,
				 hb->leases.n ? hb->leases.names : "{}",
				 hb->leases.n ? hb->leases.sessions : "{}",
				 hb->leases.n ? hb->leases.epochs : "{}",
				 hb->leases.n ? hb->leases.ttls : "{}",
				 NULL};
	if (db_query_bounding(
		ag->db, DB_LANE_HEARTBEAT,
		"SELECT agent_ok, lost, now_ms, renewed FROM pgcoord.agent_beat($1, $2, "
		"$3, $4::bigint[], $5::text[], $6::bigint[], $7::bigint[], "
		"$8::bigint[], $9::integer)",
		9, params, 9, heartbeat_done, hb)) {
		ag->id.hb_in_flight = true;
		ag->id.hb_last_sent_ms = hb->sent_ms;
	} else {
		log_warn(&ag->log, "identity", "heartbeat not sent: the database is unreachable");
		leases_beat_done(ag, &hb->leases, hb->sent_ms, NULL);
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
