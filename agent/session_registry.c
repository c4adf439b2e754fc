/*
 * session_registry.c — finding a session by id (session_registry.h). On
 * its own so the lease files, waiters and watches, which sessions.c
 * calls, can look sessions up without calling back into sessions.c.
 */
#include "agent/session_registry.h"

#include "agent/agent.h"

struct session *sessions_find(struct agent *ag, int64_t id)
{
	for (struct session *s = ag->sessions; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}
