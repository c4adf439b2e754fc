/*
 * inbound.c — bytes from the agent: buffering them, cutting them into
 * MessagePack frames without trusting declared lengths, and dispatching
 * each frame (the pending call's response, a notification to queue, a late
 * response to drop). Anything that is not pgcoord MessagePack-RPC closes the
 * handle with PGCOORD_E_PROTOCOL: once framing is in doubt, no later byte
 * can be trusted to start a message.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

#define READ_CHUNK (64 * 1024)

static pgcoord_err protocol_error(pgcoord *c)
{
	pgcoord__disconnect(c);
	c->rpos = c->rlen = 0;
	return PGCOORD_E_PROTOCOL;
}

static pgcoord_err io_error(pgcoord *c)
{
	pgcoord__disconnect(c);
	return PGCOORD_E_IO;
}

static pgcoord_err reserve(pgcoord *c)
{
	if (c->rpos > 0) {
		memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
		c->rlen -= c->rpos;
		c->rpos = 0;
	}
	if (c->rcap - c->rlen >= READ_CHUNK)
		return PGCOORD_OK;
	/* Bounded: drain_frames refuses any frame over PGCOORD_MAX_FRAME. */
	size_t cap = c->rcap ? c->rcap * 2 : READ_CHUNK;
	if (cap < c->rlen + READ_CHUNK)
		cap = c->rlen + READ_CHUNK;
	char *buf = realloc(c->rbuf, cap);
	if (!buf) {
		pgcoord__set_message(c, "out of memory buffering the agent's reply");
		return PGCOORD_E_NOMEM;
	}
	c->rbuf = buf;
	c->rcap = cap;
	return PGCOORD_OK;
}

pgcoord_err pgcoord__read_more(pgcoord *c, int64_t deadline)
{
	if (c->fd < 0) {
		pgcoord__set_message(c, "the connection to the agent is closed");
		return PGCOORD_E_CLOSED;
	}
	pgcoord_err err = reserve(c);
	if (err != PGCOORD_OK)
		return err;
	for (;;) {
		int64_t before = pgcoord__now_ms(), until = deadline;
		/* A long wait in slices, so quiet_ms dates a lease message that
		 * comes in the middle of it to within one slice. */
		if (pgcoord__tracking_leases(c) &&
		    (deadline < 0 || deadline - before > PGCOORD_QUIET_SLICE_MS))
			until = before + PGCOORD_QUIET_SLICE_MS;
		err = pgcoord__sock_wait_readable(c->fd, until);
		if (err == PGCOORD_E_CALL_TIMEOUT) {
			/* nothing was queued when the wait gave up, after `before` */
			c->quiet_ms = before;
			if (until == deadline)
				return err;
			continue;
		}
		if (err != PGCOORD_OK) {
			pgcoord__set_message(c, "waiting for the agent: %s", strerror(errno));
			return io_error(c);
		}
		size_t room = c->rcap - c->rlen;
		bool was_empty = c->rpos == c->rlen;
		before = pgcoord__now_ms();
		ssize_t n = recv(c->fd, c->rbuf + c->rlen, room, 0);
		if (n > 0) {
			if (was_empty)
				c->rstamp_ms = c->quiet_ms;
			/* A stream recv stops short of room only when it emptied
			 * the queue, which it did after `before`. */
			if ((size_t)n < room)
				c->quiet_ms = before;
			c->rlen += (size_t)n;
			return PGCOORD_OK;
		}
		if (n == 0) {
			pgcoord__set_message(c, "the agent closed the connection%s",
					     c->rlen > c->rpos ? " in the middle of a message"
							       : "");
			return io_error(c);
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			c->quiet_ms = before;
		else if (errno != EINTR) {
			pgcoord__set_message(c, "reading from the agent: %s", strerror(errno));
			return io_error(c);
		}
	}
}

static bool str_is(const char *s, size_t len, const char *lit)
{
	return strlen(lit) == len && memcmp(s, lit, len) == 0;
}

/* The answer to the pending call: its error code and message, or its result. */
static pgcoord_err take_response(pgcoord *c, const struct pgc_message *m, struct pgcoord_pending *p)
{
	/*
	 * A response with another msgid answers a pgcoord_send (kept for
	 * pgcoord_consume) or a call that already timed out (dropped). msgid 0 with an error is the
	 * agent saying it could not read the request it was just sent.
	 */
	if (!p || p->done || !(m->msgid == p->msgid || (m->msgid == 0 && m->error)))
		return pgcoord__async_response(c, m->msgid, m->error, m->result);

	if (m->error) {
		const char *code, *text = "";
		size_t code_len, text_len = 0;
		if (m->error->type != MSGPACK_OBJECT_MAP ||
		    !pgc_obj_str(pgc_map_get(m->error, "code"), &code, &code_len)) {
			pgcoord__set_message(c, "the agent's error reply has no code");
			return protocol_error(c);
		}
		const msgpack_object *msg = pgc_map_get(m->error, "message");
		if (msg && !pgc_obj_str(msg, &text, &text_len))
			text = "";
		enum pgc_error_code ec = pgc_error_from_name(code, code_len);
		if (ec == PGC_E_INTERNAL && !str_is(code, code_len, "internal"))
			/* A newer agent's code: keep its name for the operator. */
			pgcoord__set_message(c, "%.*s (error code \"%.*s\")", (int)text_len, text,
					     (int)code_len, code);
		else
			pgcoord__set_message(c, "%.*s", (int)text_len, text);
		p->err = (pgcoord_err)ec;
		p->done = true;
		return PGCOORD_OK;
	}

	c->reply_stamp_ms = c->rstamp_ms;
	if (p->want_result) {
		static const msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
		if (pgcoord__encode(m->result ? m->result : &nil, &p->result, &p->result_len) !=
		    PGCOORD_OK) {
			pgcoord__set_message(c, "out of memory copying the result");
			p->err = PGCOORD_E_NOMEM;
			p->done = true;
			return PGCOORD_OK;
		}
	}
	p->err = PGCOORD_OK;
	p->done = true;
	return PGCOORD_OK;
}

static pgcoord_err queue_notification(pgcoord *c, const struct pgc_message *m)
{
	static const char empty_map[] = "\x80";
	char *params = NULL;
	size_t len = 0;
	pgcoord_err err;

	if (m->params) {
		err = pgcoord__encode(m->params, &params, &len);
		if (err != PGCOORD_OK) {
			pgcoord__set_message(c, "out of memory queueing a notification");
			return err;
		}
	}
	/*
	 * A lost session, or a lease belief that ended, is gone for this
	 * handle the moment the agent says so, not when the application gets
	 * round to polling.
	 */
	pgcoord__lease_note(c, m->method, m->method_len, m->params, c->rstamp_ms);
	int64_t lost;
	if (str_is(m->method, m->method_len, "session.lost") && m->params &&
	    pgc_obj_int64(pgc_map_get(m->params, "session"), &lost) && lost == c->session_id)
		c->session_id = 0;

	err = pgcoord__note_push(c, m->method, m->method_len, params ? params : empty_map,
				 params ? len : 1);
	free(params);
	if (err != PGCOORD_OK)
		pgcoord__set_message(c, "out of memory queueing a notification");
	return err;
}

static pgcoord_err dispatch_frame(pgcoord *c, const char *frame, size_t len,
				  struct pgcoord_pending *p)
{
	msgpack_unpacked u;
	size_t off = 0;
	pgcoord_err err;
	struct pgc_message m;
	char why[160];

	msgpack_unpacked_init(&u);
	msgpack_unpack_return ur = msgpack_unpack_next(&u, frame, len, &off);
	if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
		pgcoord__set_message(c, "out of memory decoding the agent's message");
		err = PGCOORD_E_NOMEM;
	} else if (ur != MSGPACK_UNPACK_SUCCESS || off != len) {
		pgcoord__set_message(c, "the agent sent MessagePack that does not decode");
		err = protocol_error(c);
	} else if (!pgc_parse_message(&u.data, &m, why, sizeof(why))) {
		pgcoord__set_message(c, "the agent sent a bad envelope: %s", why);
		err = protocol_error(c);
	} else if (m.type == PGC_RPC_RESPONSE) {
		err = take_response(c, &m, p);
	} else if (m.type == PGC_RPC_NOTIFY) {
		err = queue_notification(c, &m);
	} else {
		pgcoord__set_message(c, "the agent sent a request (%.*s); it never should",
				     (int)m.method_len, m.method);
		err = protocol_error(c);
	}
	msgpack_unpacked_destroy(&u);
	return err;
}

pgcoord_err pgcoord__drain_frames(pgcoord *c, struct pgcoord_pending *p)
{
	while (c->rpos < c->rlen && !(p && p->done)) {
		const char *frame = c->rbuf + c->rpos;
		size_t len = 0;
		enum pgc_scan_result r = pgc_frame_scan(frame, c->rlen - c->rpos, PGCOORD_MAX_FRAME,
							PGCOORD_MAX_DEPTH, &len);
		if (r == PGC_SCAN_NEED_MORE)
			break;
		if (r != PGC_SCAN_COMPLETE) {
			pgcoord__set_message(c, "the agent sent an unreadable message (%s)",
					     pgc_scan_result_name(r));
			return protocol_error(c);
		}
		pgcoord_err err = dispatch_frame(c, frame, len, p);
		if (err == PGCOORD_E_PROTOCOL)
			return err; /* the buffer is already discarded */
		c->rpos += len;
		if (err != PGCOORD_OK)
			return err;
	}
	if (c->rpos == c->rlen)
		c->rpos = c->rlen = 0;
	return PGCOORD_OK;
}
