/*
 * waiters.h — waiting claims (permit.claim {wait_ms}) of this agent's
 * sessions: permit.cancel, and the poll that tells each session when its
 * waiter was admitted (permit.admitted) or left the queue unadmitted
 * (permit.expired).
 *
 * The queue lives in the database (migrations/0006_waiting_claims.sql), where hand-overs
 * happen inside the transactions that free room. The agent only learns of
 * them: ONE statement per wait_poll_ms while its sessions have waiters,
 * whatever their number; it expires its overdue waiters and returns (and
 * forgets) those that left the queue.
 */
#ifndef PGCOORD_AGENT_WAITERS_H
#define PGCOORD_AGENT_WAITERS_H

#include <stdbool.h>
#include <stdint.h>

struct agent;

__attribute__((warn_unused_result)) bool waiters_start(struct agent *ag);
void waiters_finish(struct agent *ag);

/* A claim of session_id queued as id: the poll runs until it left. */
void waiters_track(struct agent *ag, const char *id, int64_t session_id);

/* For agent.status and the metrics. */
int waiters_count(const struct agent *ag);
uint64_t waiters_admitted_total(const struct agent *ag);
uint64_t waiters_expired_total(const struct agent *ag);

#endif
