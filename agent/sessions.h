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

struct agent;
struct conn;
struct event;

struct session {
	struct session *next, *prev;
	int64_t id;
	char *name;
	/* the uid that opened it (SO_PEERCRED); -1 for a predecessor's
	 * session not yet resumed, whose uid only the database knows */
	int64_t owner_uid;
	struct conn *conn;    /* NULL while detached */
	uint64_t detached_ms; /* CLOCK_MONOTONIC start of the grace period */
	bool busy;	      /* a resume or close is in flight */
	bool closing;	      /* no longer renewed; removal pending */
	bool internal;	      /* the agent's own (janitor candidacy): never grace-expired */
	/* application liveness (keepalive.h): 0 when not enforced */
	int keepalive_ms;
	uint64_t keepalive_due; /* CLOCK_MONOTONIC deadline of the next session.keepalive */
	struct event *keepalive_timer;
	struct agent *ag; /* for the keepalive timer */
};

/* The connection closed: its session, if any, enters its grace period. */
void sessions_detach(struct agent *ag, struct conn *c);

struct session *sessions_find(struct agent *ag, int64_t id);

/* Adds a predecessor's live session, taken over at registration, as
 * detached so its client can resume it within the grace. */
void sessions_adopt_detached(struct agent *ag, int64_t id);

/* Registers the agent's own session, renewed like the others. */
void sessions_add_internal(struct agent *ag, int64_t id);

/* A Postgres array literal of the ids the heartbeat must renew. malloc'd. */
char *sessions_renew_list(struct agent *ag);

/* The database no longer holds id live: tell its client and forget it. */
void sessions_lost(struct agent *ag, int64_t id, const char *reason);

/* Every session is gone (the agent was superseded, or exits): tell all
 * clients; level says how it is logged (info for a clean shutdown). */
void sessions_lose_all(struct agent *ag, const char *reason, enum log_level level);

/* Closes detached sessions whose grace ran out. Called periodically. */
void sessions_expire_grace(struct agent *ag);

#endif
