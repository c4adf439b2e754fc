/*
 * notify.h — the systemd notification protocol (sd_notify), spoken
 * directly on $NOTIFY_SOCKET so the agent needs no libsystemd. Every call
 * is a no-op when the agent was not started by systemd.
 *
 *   STATUS=starting…        once the socket listens (notify_starting)
 *   READY=1, STATUS, MAINPID once the schema is verified and the agent is
 *                           registered (notify_ready)
 *   STATUS=…                a one-line summary, refreshed when it changes
 *   WATCHDOG=1              every WATCHDOG_USEC/2, only while the loop runs
 *                           and the last heartbeat succeeded within
 *                           session_ttl_ms
 *   RELOADING=1, READY=1    around a SIGHUP reload
 *   STOPPING=1              at SIGTERM
 */
#ifndef PGCOORD_AGENT_NOTIFY_H
#define PGCOORD_AGENT_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>

struct agent;

/* Sends one datagram of newline-separated assignments, e.g. "READY=1".
 * False when there is no $NOTIFY_SOCKET or the send failed. */
bool notify_send(const char *state);

/* The one-line summary STATUS= carries, e.g. "serving replica_id=api-1 on
 * /run/pgcoord/agent.sock: database up, 3 sessions, 1 lease held". */
void notify_summary(const struct agent *ag, char *buf, size_t len);

/* The socket listens; the agent waits for the database. Starts the timer
 * that keeps STATUS= current. */
void notify_starting(struct agent *ag);
/* READY=1 with STATUS and MAINPID; starts WATCHDOG=1 pings if systemd asked
 * for them (WATCHDOG_USEC, for this pid when WATCHDOG_PID is set). */
void notify_ready(struct agent *ag);
/* After a reload: READY=1 again if the agent was ready, and STATUS. */
void notify_ready_again(struct agent *ag);
/* Sends STATUS= now if the summary changed since the last one sent. */
void notify_status_update(struct agent *ag);
void notify_stopping(struct agent *ag);
void notify_finish(struct agent *ag);

#endif
