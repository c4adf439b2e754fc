/*
 * notify.c — see notify.h.
 */
#include "agent/notify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/leases.h"

#define STATUS_REFRESH_MS 2000

bool notify_send(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	socklen_t salen;
	size_t len;
	int fd;
	bool ok;

	if (!path || (path[0] != '/' && path[0] != '@'))
		return false;
	len = strlen(path);
	if (len >= sizeof(sa.sun_path))
		return false;
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0'; /* abstract namespace */
	salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	ok = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen) >= 0;
	close(fd);
	return ok;
}

void notify_summary(const struct agent *ag, char *buf, size_t len)
{
	const char *state = "starting";
	bool db_up = ag->db && db_lane_up(ag->db, DB_LANE_REQUESTS);
	int leases = leases_held_count(ag);

	switch (ag->state) {
	case AGENT_STARTING:
		snprintf(buf, len, "starting replica_id=%s on %s: %s", ag->cfg.replica_id,
			 ag->cfg.socket_path,
			 db_up ? "verifying the schema and registering"
			       : "waiting for the database");
		return;
	case AGENT_SERVING:
		state = "serving";
		break;
	case AGENT_STOPPING:
		state = "stopping";
		break;
	case AGENT_SUPERSEDED:
		state = "superseded";
		break;
	}
	snprintf(buf, len, "%s replica_id=%s on %s: database %s, %d session%s, %d lease%s held%s",
		 state, ag->cfg.replica_id, ag->cfg.socket_path, db_up ? "up" : "DOWN",
		 ag->nsessions, ag->nsessions == 1 ? "" : "s", leases, leases == 1 ? "" : "s",
		 ag->id.suspended ? ", heartbeats failing" : "");
}

/* Sends "prefix" plus STATUS=<summary>; remembers the summary. */
static void send_with_status(struct agent *ag, const char *prefix)
{
	char summary[sizeof(ag->notify_last_status)];
	char msg[sizeof(summary) + 128];
	notify_summary(ag, summary, sizeof(summary));
	snprintf(msg, sizeof(msg), "%sSTATUS=%s", prefix, summary);
	if (notify_send(msg))
		memcpy(ag->notify_last_status, summary, sizeof(summary));
}

void notify_status_update(struct agent *ag)
{
	char summary[sizeof(ag->notify_last_status)];
	if (!getenv("NOTIFY_SOCKET"))
		return;
	notify_summary(ag, summary, sizeof(summary));
	if (strcmp(summary, ag->notify_last_status) != 0)
		send_with_status(ag, "");
}

static void status_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	notify_status_update(arg);
}

/* WATCHDOG=1 only while the loop runs (this timer fires) and the heartbeat
 * is healthy, so systemd restarts an agent that can no longer keep its
 * sessions live. */
static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	(void)fd;
	(void)what;
	if (ag->state == AGENT_SERVING &&
	    mono_ms() - ag->id.hb_last_ok_ms < (uint64_t)ag->cfg.session_ttl_ms)
		notify_send("WATCHDOG=1");
}

void notify_starting(struct agent *ag)
{
	struct timeval tv = {STATUS_REFRESH_MS / 1000, (STATUS_REFRESH_MS % 1000) * 1000};
	if (!getenv("NOTIFY_SOCKET"))
		return;
	send_with_status(ag, "");
	if (!ag->notify_status_timer) {
		ag->notify_status_timer = event_new(ag->base, -1, EV_PERSIST, status_cb, ag);
		if (ag->notify_status_timer)
			event_add(ag->notify_status_timer, &tv);
	}
}

void notify_ready(struct agent *ag)
{
	char prefix[64];
	const char *usec = getenv("WATCHDOG_USEC");
	const char *wpid = getenv("WATCHDOG_PID");

	snprintf(prefix, sizeof(prefix), "READY=1\nMAINPID=%d\n", (int)getpid());
	send_with_status(ag, prefix);
	/* WATCHDOG_PID names the process the watchdog is for: not a child
	 * that inherited the environment */
	if (wpid && atoi(wpid) != (int)getpid())
		usec = NULL;
	if (usec && !ag->watchdog_timer) {
		long long us = strtoll(usec, NULL, 10);
		if (us > 0) {
			/* twice per period, as sd_watchdog_enabled(3) advises */
			struct timeval tv = {(time_t)(us / 2000000),
					     (suseconds_t)(us / 2 % 1000000)};
			ag->watchdog_timer = event_new(ag->base, -1, EV_PERSIST, watchdog_cb, ag);
			if (ag->watchdog_timer)
				event_add(ag->watchdog_timer, &tv);
			watchdog_cb(-1, 0, ag);
		}
	}
}

void notify_ready_again(struct agent *ag)
{
	send_with_status(ag, ag->state == AGENT_SERVING ? "READY=1\n" : "");
}

void notify_stopping(struct agent *ag)
{
	send_with_status(ag, "STOPPING=1\n");
}

void notify_finish(struct agent *ag)
{
	if (ag->watchdog_timer)
		event_free(ag->watchdog_timer);
	ag->watchdog_timer = NULL;
	if (ag->notify_status_timer)
		event_free(ag->notify_status_timer);
	ag->notify_status_timer = NULL;
}
