/*
 * watches.h — quota.watch, permit.watch, record.watch and watch.cancel:
 * sessions ask to hear of changes in the database instead of polling
 * lists themselves.
 *
 * Every watch of every session of this agent is read by ONE statement per
 * watch_poll_ms (the keys, ids and kinds batched into arrays, each read by
 * its primary key), whatever the number of watchers; a watcher is pushed a
 * notification only when what it watches changed since the last poll, and
 * the first poll after a watch (or after its session was resumed) pushes
 * the current state.
 */
#ifndef PGCOORD_AGENT_WATCHES_H
#define PGCOORD_AGENT_WATCHES_H

#include <stdbool.h>
#include <stdint.h>

struct agent;
struct evbuffer;

/* Starts the poll timer. */
__attribute__((warn_unused_result)) bool watches_start(struct agent *ag);
void watches_finish(struct agent *ag);

/* Counts for agent.status and the metrics. */
int watches_count(const struct agent *ag);
uint64_t watches_polls(const struct agent *ag);

/* The watched quotas with how many sessions watch each and what the last
 * poll read, as HTML table rows for the status page. Returns how many. */
int watches_quota_rows(const struct agent *ag, struct evbuffer *out);

#endif
