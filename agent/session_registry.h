/*
 * session_registry.h — a session as the modules below sessions.c see it:
 * the registry entry, finding one by id, and declaring one lost. The
 * lease files, keepalive.c and request.c include this instead of
 * sessions.h, so that the session RPCs (sessions.c), which call them,
 * stay above them (agent/ARCHITECTURE.md). Finding is session_registry.c,
 * which calls nothing above it; losing one is sessions.c's (the files
 * below it that lose sessions are above it in the call graph, or, like
 * keepalive.c, are handed sessions_lost as a callback).
 */
#ifndef PGCOORD_AGENT_SESSION_REGISTRY_H
#define PGCOORD_AGENT_SESSION_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

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
	/* what a missed keepalive calls (sessions_lost), set by keepalive_start */
	void (*keepalive_lost)(struct agent *ag, int64_t id, const char *reason);
};

struct session *sessions_find(struct agent *ag, int64_t id);

/* The database no longer holds id live: tell its client and forget it. */
void sessions_lost(struct agent *ag, int64_t id, const char *reason);

#endif
