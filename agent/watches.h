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

/* Starts the poll timer. */
__attribute__((warn_unused_result)) bool watches_start(struct agent *ag);
void watches_finish(struct agent *ag);

/* Counts for agent.status and the metrics. */
int watches_count(const struct agent *ag);
uint64_t watches_polls(const struct agent *ag);

/* A quota this agent's sessions watch, as the last poll read it. */
struct watched_quota {
	const char *key;
	int watchers; /* sessions watching it */
	bool read;    /* a poll has read it since it was watched */
	bool exists;
	int64_t limit, in_flight, uncertain;
};
typedef void (*watches_quota_fn)(void *arg, const struct watched_quota *q);

/* Calls fn once per watched quota key, for the status page. */
void watches_each_quota(const struct agent *ag, watches_quota_fn fn, void *arg);

#endif
