/*
 * client.c — the pgcoord handle: connecting, closing, and the generic
 * synchronous call (encode the request, write it, wait for its response),
 * and pgcoord_send's. Below it: handle.c (messages, encoding, closing the
 * socket), inbound.c (reading and dispatching frames), async.c (the write
 * queue), notify.c (the notification queue), transport.c (the socket).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

/* pgcoord_err's wire range is documented as equal to the codec's codes. */
_Static_assert(PGC_E_INVALID_REQUEST == (int)PGCOORD_E_INVALID_REQUEST, "error enums diverged");
_Static_assert(PGC_E_SHUTTING_DOWN == (int)PGCOORD_E_SHUTTING_DOWN, "error enums diverged");
_Static_assert(PGC_E_TOO_LARGE == (int)PGCOORD_E_TOO_LARGE, "error enums diverged");
_Static_assert(PGC_E__COUNT == (int)PGCOORD_E_TOO_LARGE + 1, "a wire code has no pgcoord_err");

static const char *default_socket_path(void)
{
	/* secure_getenv: a setuid caller must not be pointed at another socket. */
	const char *env = secure_getenv("PGCOORD_SOCKET_PATH");
	return env && *env ? env : PGCOORD_DEFAULT_SOCKET;
}

/*
 * On failure nothing is returned to hold a message, so errno is left at the
 * cause (ENOENT, ECONNREFUSED, EACCES, ETIMEDOUT, ENAMETOOLONG, …) for the
 * caller to report.
 */
pgcoord_err pgcoord_connect(const char *socket_path, int timeout_ms, pgcoord **out)
{
	if (!out) {
		errno = EINVAL;
		return PGCOORD_E_ARG;
	}
	*out = NULL;

	pgcoord *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return PGCOORD_E_NOMEM;
	}
	c->fd = -1;
	c->next_msgid = 1;

	const char *path = socket_path ? socket_path : default_socket_path();
	/* The agent cannot have sent anything before the socket existed. */
	c->quiet_ms = c->rstamp_ms = c->reply_stamp_ms = pgcoord__now_ms();
	pgcoord_err err = pgcoord__sock_connect(path, pgcoord__deadline(timeout_ms), &c->fd,
						c->message, sizeof(c->message));
	if (err != PGCOORD_OK) {
		int e = errno;
		free(c);
		errno = e;
		return err;
	}
	c->message[0] = '\0';
	*out = c;
	return PGCOORD_OK;
}

void pgcoord_close(pgcoord *c)
{
	if (!c)
		return;
	pgcoord__disconnect(c);
	pgcoord__note_free_all(c);
	pgcoord__async_free_all(c);
	free(c->rbuf);
	free(c);
}

const char *pgcoord_last_message(const pgcoord *c)
{
	return c ? c->message : "";
}

int pgcoord_fd(const pgcoord *c)
{
	return c ? c->fd : -1;
}

int64_t pgcoord_session_id(const pgcoord *c)
{
	return c ? c->session_id : 0;
}

/* msgid 0 is what the agent answers when it could not read ours: never use it. */
static uint32_t take_msgid(pgcoord *c)
{
	uint32_t id = c->next_msgid++;
	if (c->next_msgid == 0)
		c->next_msgid = 1;
	return id;
}

/*
 * The caller's params must be exactly one map. The scan runs first because
 * it bounds sizes and depth before msgpack would allocate for a declared
 * array count; the unpack then tells which type it is.
 */
static pgcoord_err check_params(pgcoord *c, const void *params, size_t len)
{
	size_t flen = 0;
	enum pgc_scan_result r =
	    pgc_frame_scan(params, len, PGCOORD_MAX_FRAME, PGCOORD_MAX_DEPTH, &flen);

	if (r == PGC_SCAN_TOO_BIG) {
		pgcoord__set_message(c, "params are larger than %u bytes", PGCOORD_MAX_FRAME);
		return PGCOORD_E_TOO_LARGE;
	}
	if (r == PGC_SCAN_NEED_MORE) {
		pgcoord__set_message(c, "params are a truncated MessagePack object");
		return PGCOORD_E_ARG;
	}
	if (r != PGC_SCAN_COMPLETE) {
		pgcoord__set_message(c, "params are not valid MessagePack: %s",
				     pgc_scan_result_name(r));
		return PGCOORD_E_ARG;
	}
	if (flen != len) {
		pgcoord__set_message(c, "params hold %zu bytes after the map", len - flen);
		return PGCOORD_E_ARG;
	}

	msgpack_unpacked u;
	size_t off = 0;
	pgcoord_err err = PGCOORD_OK;

	msgpack_unpacked_init(&u);
	msgpack_unpack_return ur = msgpack_unpack_next(&u, params, len, &off);
	if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
		pgcoord__set_message(c, "out of memory decoding params");
		err = PGCOORD_E_NOMEM;
	} else if (ur != MSGPACK_UNPACK_SUCCESS || off != len) {
		pgcoord__set_message(c, "params are not valid MessagePack");
		err = PGCOORD_E_ARG;
	} else if (u.data.type != MSGPACK_OBJECT_MAP) {
		pgcoord__set_message(c, "params must be a map, not %s", pgc_obj_type_name(&u.data));
		err = PGCOORD_E_ARG;
	}
	msgpack_unpacked_destroy(&u);
	return err;
}

/*
 * Reads until the pending call is answered or deadline passes. Returns the
 * answer (p->done) or why none came: CALL_TIMEOUT, IO, PROTOCOL, NOMEM.
 */
static pgcoord_err await_reply(pgcoord *c, struct pgcoord_pending *p, int64_t deadline)
{
	for (;;) {
		pgcoord_err err = pgcoord__drain_frames(c, p);
		if (err != PGCOORD_OK)
			return err;
		if (p->done)
			return p->err;
		err = pgcoord__read_more(c, deadline);
		if (err != PGCOORD_OK)
			return err;
	}
}

pgcoord_err pgcoord_call(pgcoord *c, const char *method, const void *params, size_t params_len,
			 int timeout_ms, void **result, size_t *result_len)
{
	if (result)
		*result = NULL;
	if (result_len)
		*result_len = 0;
	if (!c)
		return PGCOORD_E_ARG;
	c->message[0] = '\0';
	if (!method || !*method) {
		pgcoord__set_message(c, "method name is empty");
		return PGCOORD_E_ARG;
	}
	if (result && !result_len) {
		pgcoord__set_message(c, "result given without result_len");
		return PGCOORD_E_ARG;
	}
	if (!params && params_len) {
		pgcoord__set_message(c, "params is NULL but params_len is %zu", params_len);
		return PGCOORD_E_ARG;
	}
	if (c->fd < 0) {
		pgcoord__set_message(c, "the connection to the agent is closed");
		return PGCOORD_E_CLOSED;
	}
	pgcoord_err err;
	if (params_len) {
		err = check_params(c, params, params_len);
		if (err != PGCOORD_OK)
			return err;
	}

	int64_t deadline = pgcoord__deadline(timeout_ms);
	/* pgcoord_send's queued requests go first: a request must not be cut
	 * into by another. */
	err = pgcoord__flush_by(c, deadline);
	if (err != PGCOORD_OK)
		return err;
	struct pgcoord_pending p = {.msgid = take_msgid(c), .want_result = result != NULL};
	struct pgcoord_writer w;
	size_t len, sent;

	pgcoord__writer_init(&w);
	pgc_pack_request_begin(&w.pk, p.msgid, method);
	if (params_len)
		pgcoord__writer_raw(&w, params, params_len); /* already checked: one map */
	else
		msgpack_pack_map(&w.pk, 0);
	char *req = pgcoord__writer_release(&w, &len);
	if (!req) {
		pgcoord__set_message(c, "out of memory encoding the request");
		return PGCOORD_E_NOMEM;
	}
	err = pgcoord__sock_send(c->fd, req, len, deadline, &sent);
	free(req);

	if (err == PGCOORD_E_CALL_TIMEOUT && sent == 0) {
		pgcoord__set_message(c, "the agent did not take the request within %d ms",
				     timeout_ms);
		return err;
	}
	if (err == PGCOORD_E_CALL_TIMEOUT) {
		/* Half a request on the wire would corrupt the next one. */
		pgcoord__disconnect(c);
		pgcoord__set_message(
		    c, "timed out after sending %zu of %zu bytes; connection closed", sent, len);
		return PGCOORD_E_IO;
	}
	if (err != PGCOORD_OK) {
		int e = errno;
		/*
		 * The agent refuses an oversize request by answering with
		 * msgid 0 and closing before reading it all: look for that
		 * answer among what already arrived before blaming the socket.
		 */
		err = await_reply(c, &p, pgcoord__deadline(0));
		if (!p.done) {
			pgcoord__disconnect(c);
			pgcoord__set_message(c, "sending the request: %s", strerror(e));
			return PGCOORD_E_IO;
		}
	} else {
		err = await_reply(c, &p, deadline);
	}

	if (err == PGCOORD_E_CALL_TIMEOUT && !p.done)
		pgcoord__set_message(c, "no reply within %d ms; outcome unknown", timeout_ms);
	if (p.done && err == PGCOORD_OK && result) {
		*result = p.result;
		*result_len = p.result_len;
		p.result = NULL;
	}
	free(p.result);
	return err;
}

pgcoord_err pgcoord_send(pgcoord *c, const char *method, const void *params, size_t params_len,
			 pgcoord_reply_fn fn, void *user, uint32_t *msgid)
{
	if (msgid)
		*msgid = 0;
	if (!c)
		return PGCOORD_E_ARG;
	c->message[0] = '\0';
	if (!method || !*method || !fn || (!params && params_len)) {
		pgcoord__set_message(c, "a method, a callback and params (or NULL/0) are needed");
		return PGCOORD_E_ARG;
	}
	if (c->fd < 0) {
		pgcoord__set_message(c, "the connection to the agent is closed");
		return PGCOORD_E_CLOSED;
	}
	pgcoord_err err;
	if (params_len) {
		err = check_params(c, params, params_len);
		if (err != PGCOORD_OK)
			return err;
	}

	struct pgcoord_async *a = calloc(1, sizeof(*a));
	struct pgcoord_writer w;
	size_t len;

	if (!a) {
		pgcoord__set_message(c, "out of memory");
		return PGCOORD_E_NOMEM;
	}
	a->msgid = take_msgid(c);
	a->fn = fn;
	a->user = user;
	pgcoord__writer_init(&w);
	pgc_pack_request_begin(&w.pk, a->msgid, method);
	if (params_len)
		pgcoord__writer_raw(&w, params, params_len); /* already checked: one map */
	else
		msgpack_pack_map(&w.pk, 0);
	char *req = pgcoord__writer_release(&w, &len);
	if (!req || pgcoord__queue_request(c, req, len) != PGCOORD_OK) {
		free(req);
		free(a);
		pgcoord__set_message(c, "out of memory encoding the request");
		return PGCOORD_E_NOMEM;
	}
	free(req);
	pgcoord__async_track(c, a);
	if (msgid)
		*msgid = a->msgid;
	/* On a socket error the handle closes and every request in flight,
	 * this one too, is answered PGCOORD_E_IO through pgcoord_consume. */
	return pgcoord_flush(c);
}

pgcoord_err pgcoord__call_packed(pgcoord *c, const char *method, struct pgcoord_writer *w,
				 int timeout_ms, void **result, size_t *result_len)
{
	size_t plen;
	char *params = pgcoord__writer_release(w, &plen);
	if (!params) {
		pgcoord__set_message(c, "out of memory encoding %s", method);
		return PGCOORD_E_NOMEM;
	}
	pgcoord_err err = pgcoord_call(c, method, params, plen, timeout_ms, result, result_len);
	free(params);
	return err;
}

pgcoord_err pgcoord__call_decoded(pgcoord *c, const char *method, struct pgcoord_writer *w,
				  int timeout_ms, msgpack_unpacked *u, void **raw, size_t *raw_len)
{
	size_t off = 0;
	pgcoord_err err = pgcoord__call_packed(c, method, w, timeout_ms, raw, raw_len);
	if (err != PGCOORD_OK)
		return err;
	msgpack_unpacked_init(u);
	if (msgpack_unpack_next(u, *raw, *raw_len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u->data.type != MSGPACK_OBJECT_MAP) {
		msgpack_unpacked_destroy(u);
		pgcoord_free(*raw);
		*raw = NULL;
		pgcoord__set_message(c, "the %s result is not a map", method);
		return PGCOORD_E_PROTOCOL;
	}
	return PGCOORD_OK;
}
