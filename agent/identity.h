/*
 * identity.h — who this agent is in the fleet (guarantee 9): the schema
 * check, registration of (replica_id, incarnation, host, pid), the
 * heartbeat that renews the agent and all its sessions in one statement,
 * and the reaction to being superseded.
 */
#ifndef PGCOORD_AGENT_IDENTITY_H
#define PGCOORD_AGENT_IDENTITY_H

#include <stdbool.h>

struct agent;

/* Picks a new incarnation and starts trying to register. */
__attribute__((warn_unused_result)) bool identity_start(struct agent *ag);

/* Records the clean stop (sessions closed, replica_id free); calls done
 * when the database answered or could not. */
void identity_stop(struct agent *ag, void (*done)(struct agent *ag));

void identity_finish(struct agent *ag);

#endif
