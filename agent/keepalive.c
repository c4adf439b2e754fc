/*
 * keepalive.c — see keepalive.h.
 */
#include "agent/keepalive.h"

#include <inttypes.h>
#include <stdio.h>

#include "agent/agent.h"
#include "agent/metrics.h"
#include "agent/session_registry.h"

static void arm(struct session *s)
{
	uint64_t now = mono_ms(), ms = s->keepalive_due > now ? s->keepalive_due - now : 0;
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	evtimer_del(s->keepalive_timer);
	evtimer_add(s->keepalive_timer, &tv);
}

static void missed(struct agent *ag, struct session *s)
{
	char kv[48];
	snprintf(kv, sizeof(kv), "session=%" PRId64, s->id);
	log_write(&ag->log, LOG_LEVEL_WARN, "sessions", kv,
		  "no session.keepalive for %" PRIu64 " ms (keepalive_ms %d): no longer renewed; "
		  "its leases lapse by their own expiry",
		  mono_ms() - (s->keepalive_due - (uint64_t)s->keepalive_ms), s->keepalive_ms);
	metrics_session_lost_keepalive(ag);
	s->keepalive_lost(ag, s->id, KEEPALIVE_LOST_REASON);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct session *s = arg;
	struct agent *ag = s->ag;
	(void)fd;
	(void)what;
	if (s->closing)
		return; /* being closed anyway: the close hands its leases back */
	if (mono_ms() < s->keepalive_due) {
		arm(s); /* a timer that fired early */
		return;
	}
	missed(ag, s);
}

bool keepalive_start(struct agent *ag, struct session *s, int keepalive_ms, keepalive_lost_fn lost)
{
	s->ag = ag;
	s->keepalive_lost = lost;
	if (!s->keepalive_timer) {
		s->keepalive_timer = evtimer_new(ag->base, timer_cb, s);
		if (!s->keepalive_timer)
			return false;
	}
	s->keepalive_ms = keepalive_ms;
	s->keepalive_due = mono_ms() + (uint64_t)keepalive_ms;
	arm(s);
	return true;
}

bool keepalive_touch(struct agent *ag, struct session *s)
{
	if (s->keepalive_ms <= 0)
		return true;
	if (mono_ms() >= s->keepalive_due) {
		/* due before the timer ran: late is late */
		missed(ag, s);
		return false;
	}
	s->keepalive_due = mono_ms() + (uint64_t)s->keepalive_ms;
	arm(s);
	return true;
}

int64_t keepalive_due_in_ms(const struct session *s)
{
	uint64_t now = mono_ms();
	if (s->keepalive_ms <= 0 || s->keepalive_due <= now)
		return 0;
	return (int64_t)(s->keepalive_due - now);
}

void keepalive_stop(struct session *s)
{
	if (s->keepalive_timer) {
		event_free(s->keepalive_timer);
		s->keepalive_timer = NULL;
	}
	s->keepalive_ms = 0;
}
