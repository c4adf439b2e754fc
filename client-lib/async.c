/*
 * async.c — the non-blocking side of the handle, for event loops: the
 * queue of requests pgcoord_send could not write yet (pgcoord_flush), and
 * the answers to them, kept until pgcoord_consume (deliver.c) hands them
 * to their callbacks (never from inside another call, as for
 * notifications). Below the framing, which completes answers here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

void pgcoord__async_free(struct pgcoord_async *a)
{
	free(a->result);
	free(a->message);
	free(a);
}

void pgcoord__async_free_all(pgcoord *c)
{
	struct pgcoord_async *a, *next;
	for (a = c->inflight; a; a = next) {
		next = a->next;
		pgcoord__async_free(a);
	}
	for (a = c->answered; a; a = next) {
		next = a->next;
		pgcoord__async_free(a);
	}
	c->inflight = c->answered = c->answered_tail = NULL;
	free(c->wbuf);
	c->wbuf = NULL;
	c->wpos = c->wlen = 0;
}

static void answer(pgcoord *c, struct pgcoord_async *a)
{
	a->next = NULL;
	if (c->answered_tail)
		c->answered_tail->next = a;
	else
		c->answered = a;
	c->answered_tail = a;
}

pgcoord_err pgcoord__async_response(pgcoord *c, uint32_t msgid, const msgpack_object *error,
				    const msgpack_object *result)
{
	struct pgcoord_async **pp = &c->inflight;
	while (*pp && (*pp)->msgid != msgid)
		pp = &(*pp)->next;
	struct pgcoord_async *a = *pp;
	if (!a)
		return PGCOORD_OK; /* nobody waits for it */
	*pp = a->next;

	if (error) {
		const char *code = "", *text = "";
		size_t code_len = 0, text_len = 0;
		if (error->type == MSGPACK_OBJECT_MAP) {
			pgc_obj_str(pgc_map_get(error, "code"), &code, &code_len);
			pgc_obj_str(pgc_map_get(error, "message"), &text, &text_len);
		}
		a->err = (pgcoord_err)pgc_error_from_name(code, code_len);
		a->message = strndup(text, text_len);
	} else {
		static const msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
		a->err = pgcoord__encode(result ? result : &nil, &a->result, &a->result_len);
	}
	answer(c, a);
	return PGCOORD_OK;
}

/* Every request still in flight ends with err: the connection is gone. */
void pgcoord__async_fail_inflight(pgcoord *c, pgcoord_err err)
{
	while (c->inflight) {
		struct pgcoord_async *a = c->inflight;
		c->inflight = a->next;
		a->err = err;
		answer(c, a);
	}
	c->wpos = c->wlen = 0;
}

/* One non-blocking write of the queue; *again when the socket is full. */
static pgcoord_err write_some(pgcoord *c, bool *again)
{
	*again = false;
	while (c->wpos < c->wlen) {
		/* MSG_NOSIGNAL: a dead agent must give EPIPE, not kill the caller. */
		ssize_t n = send(c->fd, c->wbuf + c->wpos, c->wlen - c->wpos, MSG_NOSIGNAL);
		if (n > 0) {
			c->wpos += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			*again = true;
			return PGCOORD_OK;
		}
		pgcoord__set_message(c, "sending to the agent: %s", strerror(errno));
		pgcoord__disconnect(c);
		pgcoord__async_fail_inflight(c, PGCOORD_E_IO);
		return PGCOORD_E_IO;
	}
	c->wpos = c->wlen = 0;
	return PGCOORD_OK;
}

pgcoord_err pgcoord_flush(pgcoord *c)
{
	bool again;
	if (!c)
		return PGCOORD_E_ARG;
	if (c->fd < 0) {
		pgcoord__set_message(c, "the connection to the agent is closed");
		return PGCOORD_E_CLOSED;
	}
	return write_some(c, &again);
}

bool pgcoord_want_write(const pgcoord *c)
{
	return c && c->fd >= 0 && c->wpos < c->wlen;
}

pgcoord_err pgcoord__flush_by(pgcoord *c, int64_t deadline)
{
	for (;;) {
		bool again;
		pgcoord_err err = write_some(c, &again);
		if (err != PGCOORD_OK || !again)
			return err;
		size_t sent = 0;
		err = pgcoord__sock_send(c->fd, c->wbuf + c->wpos, c->wlen - c->wpos, deadline,
					 &sent);
		c->wpos += sent;
		if (err == PGCOORD_E_CALL_TIMEOUT) {
			pgcoord__set_message(c,
					     "the agent did not take the queued requests in time");
			return err;
		}
		if (err != PGCOORD_OK) {
			pgcoord__set_message(c, "sending to the agent: %s", strerror(errno));
			pgcoord__disconnect(c);
			pgcoord__async_fail_inflight(c, PGCOORD_E_IO);
			return PGCOORD_E_IO;
		}
		c->wpos = c->wlen = 0;
		return PGCOORD_OK;
	}
}

/* Appends a whole request to the queue. */
pgcoord_err pgcoord__queue_request(pgcoord *c, const char *req, size_t len)
{
	if (c->wpos == c->wlen)
		c->wpos = c->wlen = 0;
	char *nb = realloc(c->wbuf, c->wlen + len);
	if (!nb)
		return PGCOORD_E_NOMEM;
	c->wbuf = nb;
	memcpy(c->wbuf + c->wlen, req, len);
	c->wlen += len;
	return PGCOORD_OK;
}

void pgcoord__async_track(pgcoord *c, struct pgcoord_async *a)
{
	a->next = c->inflight;
	c->inflight = a;
}
