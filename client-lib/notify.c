/*
 * notify.c — notifications the agent pushes: a FIFO filled while calls wait
 * for their responses, emptied into the application's callback only by
 * pgcoord_poll() (deliver.c), so the callback never runs inside another
 * call.
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

struct pgcoord_note *pgcoord__note_pop(pgcoord *c)
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
	while ((n = pgcoord__note_pop(c)))
		pgcoord__note_free(n);
}
