/*
 * deliver.c — handing what was read to the application's callbacks:
 * pgcoord_poll (notifications, queued-claim outcomes as permit events) and
 * pgcoord_consume (pgcoord_send's answers), never from inside another
 * call. The top of the library: it reads frames (inbound.c), empties the
 * queues (notify.c, async.c) and decodes permit events (waits.c).
 */
#include <stdlib.h>

#include "handle.h"

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

	while ((n = pgcoord__note_pop(c))) {
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

/* Hands each kept answer to its callback; unlinked first, so fn may send. */
static int deliver_answers(pgcoord *c)
{
	int count = 0;
	while (c->answered) {
		struct pgcoord_async *a = c->answered;
		c->answered = a->next;
		if (!c->answered)
			c->answered_tail = NULL;
		a->fn(a->user, a->msgid, a->err, a->result, a->result_len,
		      a->message ? a->message : "");
		pgcoord__async_free(a);
		count++;
	}
	return count;
}

pgcoord_err pgcoord_consume(pgcoord *c, int *completed)
{
	pgcoord_err err = PGCOORD_OK;
	int count = 0, delivered = 0;

	if (completed)
		*completed = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (c->fd >= 0) {
		for (;;) {
			err = pgcoord__drain_frames(c, NULL);
			if (err != PGCOORD_OK)
				break;
			err = pgcoord__read_more(c, pgcoord__deadline(0));
			if (err == PGCOORD_E_CALL_TIMEOUT) {
				err = PGCOORD_OK; /* nothing more for now */
				break;
			}
			if (err != PGCOORD_OK)
				break;
		}
	} else {
		err = PGCOORD_E_CLOSED;
	}
	if (c->fd < 0)
		pgcoord__async_fail_inflight(c, PGCOORD_E_IO);
	count = deliver_answers(c);
	/* notifications, as pgcoord_poll(c, 0) would deliver them */
	if (c->fd >= 0 || c->nq_head) {
		pgcoord_err perr = pgcoord_poll(c, 0, &delivered);
		if (err == PGCOORD_OK && perr != PGCOORD_OK && perr != PGCOORD_E_CLOSED)
			err = perr;
		count += deliver_answers(c); /* answers read by that poll */
	}
	if (completed)
		*completed = count;
	return err;
}
