/*
 * notify.h — the systemd notification protocol (sd_notify), spoken
 * directly on $NOTIFY_SOCKET so the agent needs no libsystemd. Every call
 * is a no-op when the agent was not started by systemd.
 */
#ifndef PGCOORD_AGENT_NOTIFY_H
#define PGCOORD_AGENT_NOTIFY_H

#include <stdbool.h>

struct agent;

/* Sends one datagram of newline-separated assignments, e.g. "READY=1". */
bool notify_send(const char *state);

/* READY=1 with a STATUS line; starts WATCHDOG=1 pings if systemd asked for them. */
void notify_ready(struct agent *ag);
void notify_stopping(struct agent *ag);
void notify_finish(struct agent *ag);

#endif
