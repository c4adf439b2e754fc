/*
 * janitor.h — fleet housekeeping done by exactly one agent at a time.
 *
 * Every agent campaigns for the lease "pgcoord.janitor" with a session of
 * its own; the one that believes it leads runs the duties in janitor.c's
 * table every janitor_interval_ms. When it dies its session lapses, the
 * lease expires, and another agent's campaign takes over.
 */
#ifndef PGCOORD_AGENT_JANITOR_H
#define PGCOORD_AGENT_JANITOR_H

#include <stdbool.h>

struct agent;

#define JANITOR_LEASE "pgcoord.janitor"

/* Called once the agent is registered: opens its session and campaigns. */
__attribute__((warn_unused_result)) bool janitor_start(struct agent *ag);
void janitor_finish(struct agent *ag);

/* True while this agent believes it is the janitor. */
bool janitor_active(struct agent *ag);

#endif
