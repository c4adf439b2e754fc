/*
 * heartbeat.h — the one statement per heartbeat_interval_ms that renews
 * this agent and every session it holds (agent_heartbeat), and reports
 * the sessions the database no longer holds live. It decides nothing
 * about fencing: it tells identity.c through hooks, so it calls nothing
 * above it.
 */
#ifndef PGCOORD_AGENT_HEARTBEAT_H
#define PGCOORD_AGENT_HEARTBEAT_H

#include <stdbool.h>

struct agent;

struct heartbeat_hooks {
	/* the database confirmed this incarnation; ag->id.hb_last_ok_ms is
	 * the send time of that heartbeat */
	void (*renewed)(struct agent *ag);
	/* another incarnation holds our replica_id */
	void (*superseded)(struct agent *ag);
};

/* Creates the timer; hooks must outlive the agent. */
__attribute__((warn_unused_result)) bool heartbeat_init(struct agent *ag,
							const struct heartbeat_hooks *hooks);

/* Registered: heartbeats from now on, every heartbeat_interval_ms. */
void heartbeat_run(struct agent *ag);

void heartbeat_stop(struct agent *ag);
void heartbeat_finish(struct agent *ag);

#endif
