/*
 * janitor.c — see janitor.h.
 */
#include "agent/janitor.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/leases.h"
#include "agent/sessions.h"

/* How many rows one duty statement may touch, so a backlog is worked off
 * in short transactions instead of one long one. */
#define JANITOR_BATCH "1000"

struct janitor_duty {
	const char *name;
	/* one statement, $1 = batch size (and $2 = retention_s for a retention
	 * duty), one row, one count column */
	const char *sql;
	bool retention; /* runs only when retention_s > 0 */
};

/* The janitor's duties, run in order each sweep. Add new ones here. Records
 * are purged before permits: a record's permit stays while it names it. */
static const struct janitor_duty janitor_duties[] = {
    {"expire lapsed sessions", "SELECT pgcoord.janitor_expire_sessions($1)", false},
    {"release lapsed permits", "SELECT pgcoord.janitor_lapse_permits($1)", false},
    /* before the purge, which deletes only audit rows already folded */
    {"fold audit totals for permit.check", "SELECT pgcoord.janitor_fold_audit($1)", false},
    {"delete settled records past retention", "SELECT pgcoord.janitor_purge_records($1, $2)", true},
    {"delete released permits past retention", "SELECT pgcoord.janitor_purge_permits($1, $2)",
     true},
    {"delete lease events past retention", "SELECT pgcoord.janitor_purge_lease_events($1, $2)",
     true},
};
#define JANITOR_DUTY_COUNT (sizeof(janitor_duties) / sizeof(janitor_duties[0]))

struct janitor {
	struct agent *ag;
	int64_t session_id; /* the agent's own session; 0 while none */
	bool opening;
	bool leader;
	bool sweeping;
	size_t next_duty;
	struct event *tick;
};

static void sweep_step(struct janitor *j);

static void duty_done(const struct db_result *r, void *arg)
{
	struct janitor *j = arg;
	const struct janitor_duty *d = &janitor_duties[j->next_duty];
	if (!r->ok) {
		log_warn(&j->ag->log, "janitor", "%s failed: %s", d->name, r->message);
	} else if (PQntuples(r->res) == 1 && strcmp(PQgetvalue(r->res, 0, 0), "0") != 0) {
		log_info(&j->ag->log, "janitor", "%s: %s", d->name, PQgetvalue(r->res, 0, 0));
	}
	j->next_duty++;
	sweep_step(j);
}

/* Runs the duties one after another; stops as soon as belief ends, so a
 * deposed janitor never starts another duty. */
static void sweep_step(struct janitor *j)
{
	char keep[24];
	const char *params[2] = {JANITOR_BATCH, keep};
	const struct janitor_duty *d;

	/* retention_s is reloadable: read it at every duty */
	while (j->next_duty < JANITOR_DUTY_COUNT && janitor_duties[j->next_duty].retention &&
	       j->ag->cfg.retention_s == 0)
		j->next_duty++;
	if (j->next_duty >= JANITOR_DUTY_COUNT || !janitor_active(j->ag)) {
		j->sweeping = false;
		return;
	}
	d = &janitor_duties[j->next_duty];
	snprintf(keep, sizeof(keep), "%d", j->ag->cfg.retention_s);
	if (!db_query(j->ag->db, DB_LANE_REQUESTS, d->sql, d->retention ? 2 : 1, params, duty_done,
		      j))
		j->sweeping = false;
}

static void on_change(struct agent *ag, bool leader)
{
	struct janitor *j = ag->janitor;
	j->leader = leader;
	log_info(&ag->log, "janitor",
		 leader ? "this agent is now the fleet's janitor"
			: "this agent is no longer the janitor");
}

static void opened(const struct db_result *r, void *arg)
{
	struct janitor *j = arg;
	struct agent *ag = j->ag;
	j->opening = false;
	if (!r->ok || PQntuples(r->res) != 1) {
		log_warn(&ag->log, "janitor", "cannot open the janitor session: %s",
			 r->ok ? "no session returned" : r->message);
		return;
	}
	j->session_id = strtoll(PQgetvalue(r->res, 0, 0), NULL, 10);
	sessions_add_internal(ag, j->session_id);
	if (!leases_campaign_internal(ag, JANITOR_LEASE, j->session_id, ag->cfg.lease_ttl_ms,
				      on_change))
		log_error(&ag->log, "janitor", "out of memory starting the janitor campaign");
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct janitor *j = arg;
	struct agent *ag = j->ag;
	char inc[24], ttl[24], uid[24];
	(void)fd;
	(void)what;

	if (ag->state != AGENT_SERVING)
		return;
	/* the session may have been lost (a long database outage): open anew */
	if (j->session_id && !sessions_find(ag, j->session_id)) {
		j->session_id = 0;
		j->leader = false;
	}
	if (!j->session_id && !j->opening) {
		snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
		snprintf(ttl, sizeof(ttl), "%d", ag->cfg.session_ttl_ms);
		/* the agent's own session is owned by the agent's user */
		snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
		const char *params[5] = {ag->cfg.replica_id, inc, "pgcoord-agent", ttl, uid};
		if (db_query(ag->db, DB_LANE_HEARTBEAT,
			     "SELECT pgcoord.session_open($1, $2, $3, $4, true, $5)", 5, params,
			     opened, j))
			j->opening = true;
		return;
	}
	if (janitor_active(ag) && !j->sweeping) {
		j->sweeping = true;
		j->next_duty = 0;
		sweep_step(j);
	}
}

bool janitor_active(struct agent *ag)
{
	struct janitor *j = ag->janitor;
	return j && j->session_id && leases_believes(ag, JANITOR_LEASE, j->session_id);
}

bool janitor_start(struct agent *ag)
{
	struct janitor *j = calloc(1, sizeof(*j));
	struct timeval tv = {ag->cfg.janitor_interval_ms / 1000,
			     (ag->cfg.janitor_interval_ms % 1000) * 1000};
	if (!j)
		return false;
	j->ag = ag;
	j->tick = event_new(ag->base, -1, EV_PERSIST, tick_cb, j);
	if (!j->tick) {
		free(j);
		return false;
	}
	ag->janitor = j;
	event_add(j->tick, &tv);
	tick_cb(-1, 0, j);
	return true;
}

void janitor_finish(struct agent *ag)
{
	struct janitor *j = ag->janitor;
	if (!j)
		return;
	event_free(j->tick);
	free(j);
	ag->janitor = NULL;
}
