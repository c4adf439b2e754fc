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

void notify_ready(struct agent *ag)
{
	char msg[512];
	const char *usec = getenv("WATCHDOG_USEC");
	snprintf(msg, sizeof(msg), "READY=1\nSTATUS=serving replica_id=%s on %s\nMAINPID=%d",
		 ag->cfg.replica_id, ag->cfg.socket_path, (int)getpid());
	notify_send(msg);
	if (usec && !ag->watchdog_timer) {
		long long us = strtoll(usec, NULL, 10);
		if (us > 0) {
			struct timeval tv = {(time_t)(us / 2000000),
					     (suseconds_t)(us / 2 % 1000000)};
			ag->watchdog_timer = event_new(ag->base, -1, EV_PERSIST, watchdog_cb, ag);
			if (ag->watchdog_timer)
				event_add(ag->watchdog_timer, &tv);
		}
	}
}

void notify_stopping(struct agent *ag)
{
	(void)ag;
	notify_send("STOPPING=1\nSTATUS=stopping: handing back and closing sessions");
}

void notify_finish(struct agent *ag)
{
	if (ag->watchdog_timer)
		event_free(ag->watchdog_timer);
	ag->watchdog_timer = NULL;
}
