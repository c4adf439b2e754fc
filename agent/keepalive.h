/*
 * keepalive.h — application liveness: a session opened with keepalive_ms
 * must call session.keepalive at least that often. When it does not, the
 * agent stops renewing it and its leases and declares it lost, exactly as
 * if its heartbeat had failed: its leases lapse by their own expiry (the
 * hung client may still believe, so nothing is handed back early) and the
 * janitor applies its permits' on_owner_loss rule once the row expires.
 *
 * The deadline is a per-session timer on CLOCK_MONOTONIC, independent of
 * the heartbeat, and it keeps running while the session is detached. The
 * heartbeat never renews a session past its deadline, even when the timer
 * has not run yet.
 */
#ifndef PGCOORD_AGENT_KEEPALIVE_H
#define PGCOORD_AGENT_KEEPALIVE_H

#include <stdbool.h>
#include <stdint.h>

struct agent;
struct session;

#define KEEPALIVE_MS_MIN 100
#define KEEPALIVE_MS_MAX 600000

/* The reason session.lost carries for a missed keepalive. */
#define KEEPALIVE_LOST_REASON "keepalive missed"

/* What a missed keepalive does: the session layer (sessions.c) passes
 * its sessions_lost, so this file stays below it. */
typedef void (*keepalive_lost_fn)(struct agent *ag, int64_t session_id, const char *reason);

/* Starts enforcing keepalive_ms (> 0) on s, due keepalive_ms from now;
 * lost is called when a keepalive is missed. False when out of memory. */
bool keepalive_start(struct agent *ag, struct session *s, int keepalive_ms, keepalive_lost_fn lost);

/* A session.keepalive arrived: the next one is due keepalive_ms from now.
 * False (and s is lost, through the lost callback, and freed) when the
 * deadline had already passed. */
bool keepalive_touch(struct agent *ag, struct session *s);

/* Milliseconds until the next keepalive is due (0 when not enforced). */
int64_t keepalive_due_in_ms(const struct session *s);

/* Stops the timer; called when the session is removed. */
void keepalive_stop(struct session *s);

#endif
