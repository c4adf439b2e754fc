/*
 * metrics_render.h — every metric of the agent in the Prometheus text
 * format (version 0.0.4), for GET /metrics. Kept apart from metrics.c:
 * rendering reads the database, lease, group and janitor counts, while
 * the counters themselves depend on nothing, so any module may count.
 */
#ifndef PGCOORD_AGENT_METRICS_RENDER_H
#define PGCOORD_AGENT_METRICS_RENDER_H

struct agent;
struct evbuffer;

/* Appends every metric of the agent in the Prometheus text format. */
void metrics_render(struct agent *ag, struct evbuffer *out);

#endif
