/*
 * sessions.h — the sessions this agent incarnation holds: attached to a
 * client connection, or detached and resumable for session_grace_ms.
 * The database row is the truth for liveness; this registry decides which
 * rows the heartbeat renews.
 */
#ifndef PGCOORD_AGENT_SESSIONS_H
#define PGCOORD_AGENT_SESSIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/log.h"
#include "agent/session_registry.h"

struct agent;
struct conn;

/* The connection closed: its session, if any, enters its grace period. */
void sessions_detach(struct agent *ag, struct conn *c);

/* Adds a predecessor's live session, taken over at registration, as
 * detached so its client can resume it within the grace. */
void sessions_adopt_detached(struct agent *ag, int64_t id);

/* Registers the agent's own session, renewed like the others. */
void sessions_add_internal(struct agent *ag, int64_t id);

/* A Postgres array literal of the ids the heartbeat must renew. malloc'd. */
char *sessions_renew_list(struct agent *ag);

/* Every session is gone (the agent was superseded, or exits): tell all
 * clients; level says how it is logged (info for a clean shutdown). */
void sessions_lose_all(struct agent *ag, const char *reason, enum log_level level);

/* Closes detached sessions whose grace ran out. Called periodically. */
void sessions_expire_grace(struct agent *ag);

#endif
