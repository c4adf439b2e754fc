/*
 * agent.c — the small helpers of the agent context that every module uses:
 * the monotonic clock and the way out of the event loop.
 */
#include "agent/agent.h"

#include <time.h>

uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void agent_exit(struct agent *ag, int code)
{
	struct timeval tv = {0, 100 * 1000};
	ag->exit_code = code;
	/* a short delay lets replies and notifications reach clients */
	if (ag->base)
		event_base_loopexit(ag->base, &tv);
}
