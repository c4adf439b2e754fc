/*
 * session_order.c — statements of one session's lease go to the database
 * one at a time (see struct lease_registry's `dying`); a request that
 * would overtake a running one is parked and runs again after it.
 */
#include "agent/session_order.h"

#include <stdlib.h>
#include <string.h>

#include "agent/dispatch.h"
#include "agent/lease_registry.h"

/* A dying lease of session_id named name (any name when NULL). */
static struct lease *dying_for(struct agent *ag, int64_t session_id, const char *name)
{
	for (struct lease *l = lease_reg(ag)->dying; l; l = l->next)
		if (l->session_id == session_id && (!name || strcmp(l->name, name) == 0))
			return l;
	return NULL;
}

/* A dying lease's statement returned: its parked requests run again. */
void lease_settled(struct lease *l)
{
	struct lease_registry *rg = lease_reg(l->ag);
	struct lease **pp = &rg->dying;
	while (*pp && *pp != l)
		pp = &(*pp)->next;
	if (*pp)
		*pp = l->next;
	if (l->parked) {
		struct parked **tail = &rg->ready;
		while (*tail)
			tail = &(*tail)->next;
		*tail = l->parked;
		/* from the loop, never inside the database callback that got here */
		event_active(rg->rerun, EV_TIMEOUT, 1);
	}
	lease_free(l);
}

void session_order_rerun_cb(evutil_socket_t fd, short what, void *arg)
{
	struct lease_registry *rg = lease_reg(arg);
	(void)fd;
	(void)what;
	while (rg->ready) {
		struct parked *p = rg->ready;
		struct request *req = p->req;
		rg->ready = p->next;
		free(p);
		/* the session may have ended while the request waited */
		if ((req->method->flags & M_SESSION) && !req_need_session(req))
			continue;
		req->method->fn(req);
	}
}

bool leases_busy(struct agent *ag, int64_t session_id, const char *name)
{
	return ag->leases && dying_for(ag, session_id, name) != NULL;
}

bool leases_park_if_busy(struct agent *ag, int64_t session_id, const char *name,
			 struct request *req)
{
	struct lease *l = ag->leases ? dying_for(ag, session_id, name) : NULL;
	struct parked *p, **tail;
	if (!l || !(p = calloc(1, sizeof(*p))))
		return false;
	p->req = req;
	for (tail = &l->parked; *tail; tail = &(*tail)->next)
		;
	*tail = p;
	return true;
}
