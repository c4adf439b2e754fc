/*
 * notify.c — notifications the agent pushes: a FIFO filled while calls wait
 * for their responses, emptied into the application's callback only by
 * pgcoord_poll(), so the callback never runs inside another call.
 */
#include <stdlib.h>
#include <string.h>

#include "handle.h"

pgcoord_err pgcoord__note_push(pgcoord *c, const char *method, size_t method_len,
			       const char *params, size_t params_len)
{
	struct pgcoord_note *n = calloc(1, sizeof(*n));
	if (!n)
		return PGCOORD_E_NOMEM;
	n->method = strndup(method, method_len);
	n->params = malloc(params_len);
	if (!n->method || !n->params) {
		free(n->method);
		free(n->params);
		free(n);
		return PGCOORD_E_NOMEM;
	}
	memcpy(n->params, params, params_len);
	n->params_len = params_len;
	if (c->nq_tail)
		c->nq_tail->next = n;
	else
		c->nq_head = n;
	c->nq_tail = n;
	return PGCOORD_OK;
}

static struct pgcoord_note *note_pop(pgcoord *c)
{
	struct pgcoord_note *n = c->nq_head;
	if (n) {
		c->nq_head = n->next;
		if (!c->nq_head)
			c->nq_tail = NULL;
	}
	return n;
}

void pgcoord__note_free(struct pgcoord_note *n)
{
	free(n->method);
	free(n->params);
	free(n);
}

struct pgcoord_note *
pgcoord__note_take(pgcoord *c, bool (*match)(const struct pgcoord_note *n, void *arg), void *arg)
{
	struct pgcoord_note *prev = NULL;
	for (struct pgcoord_note *n = c->nq_head; n; prev = n, n = n->next) {
		if (!match(n, arg))
			continue;
		if (prev)
			prev->next = n->next;
		else
			c->nq_head = n->next;
		if (c->nq_tail == n)
			c->nq_tail = prev;
		n->next = NULL;
		return n;
	}
	return NULL;
}

void pgcoord__note_free_all(pgcoord *c)
{
	struct pgcoord_note *n;
	while ((n = note_pop(c)))
		pgcoord__note_free(n);
}

void pgcoord_set_notify(pgcoord *c, pgcoord_notify_fn fn, void *user)
{
	if (!c)
		return;
	c->notify_fn = fn;
	c->notify_user = user;
}

void pgcoord_set_permit_events(pgcoord *c, pgcoord_permit_event_fn fn, void *user)
{
	if (!c)
		return;
	c->permit_event_fn = fn;
	c->permit_event_user = user;
}

/* A permit.admitted / permit.expired to the typed callback when there is
 * one and the message decodes; true when it went there. */
static bool deliver_permit_event(pgcoord *c, const struct pgcoord_note *n)
{
	if (!c->permit_event_fn)
		return false;
	struct pgcoord_permit_event *ev = pgcoord__permit_event_decode(n);
	if (!ev)
		return false;
	c->permit_event_fn(c->permit_event_user, ev);
	pgcoord_permit_event_free(ev);
	return true;
}

/*
 * Each note is unlinked before its callback runs, so the callback may make
 * calls on c (which may queue more notes; they are delivered in this same
 * pass). It must not pgcoord_close(c). Without a callback, notes are dropped.
 * Queued-claim outcomes go to the typed callback when one is set.
 */
static int deliver_queued(pgcoord *c)
{
	struct pgcoord_note *n;
	int count = 0;

	while ((n = note_pop(c))) {
		if (deliver_permit_event(c, n)) {
			count++;
		} else if (c->notify_fn) {
			c->notify_fn(c->notify_user, n->method, n->params, n->params_len);
			count++;
		}
		pgcoord__note_free(n);
	}
	return count;
}

pgcoord_err pgcoord_poll(pgcoord *c, int timeout_ms, int *delivered)
{
	int64_t deadline = pgcoord__deadline(timeout_ms);
	pgcoord_err err;
	int count = 0;

	if (delivered)
		*delivered = 0;
	if (!c)
		return PGCOORD_E_ARG;
	for (;;) {
		/* Frames left in the buffer after a call may hold notifications too. */
		count += deliver_queued(c);
		err = pgcoord__drain_frames(c, NULL);
		count += deliver_queued(c);
		if (err != PGCOORD_OK)
			break;
		if (c->fd < 0) {
			pgcoord__set_message(c, "the connection to the agent is closed");
			err = PGCOORD_E_CLOSED;
			break;
		}
		/* Once something was delivered, only take what is already waiting. */
		err = pgcoord__read_more(c, count > 0 ? pgcoord__deadline(0) : deadline);
		if (err == PGCOORD_E_CALL_TIMEOUT) {
			err = PGCOORD_OK;
			break;
		}
		if (err != PGCOORD_OK)
			break; /* EOF: every complete frame before it was already drained */
	}
	if (delivered)
		*delivered = count;
	return err;
}
