/*
 * ctl_top.h — `pgcoordctl top`: a compact view of the local agent and the
 * fleet, redrawn every interval until interrupted (or `count` frames).
 */
#ifndef PGCOORD_CTL_TOP_H
#define PGCOORD_CTL_TOP_H

#include <stdbool.h>

struct ctl_top_options {
	const char *socket_path;
	int timeout_ms;	 /* per call */
	int interval_ms; /* between frames */
	int count;	 /* frames to draw; 0 = until interrupted */
	bool json;	 /* one JSON object per frame instead of text */
};

/*
 * Draws frames from agent.status, fleet.agents, fleet.sessions, lease.list,
 * quota.list and permit.list {state: uncertain}. A method the agent does
 * not have (method_not_found) drops its section; an agent that is not
 * reachable is retried at the next frame. Returns pgcoordctl's exit code:
 * 0, or 3 when the last frame could not reach the agent.
 */
int ctl_top(const struct ctl_top_options *opt);

#endif
