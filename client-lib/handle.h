/*
 * handle.h — libpgcoord's private view of a `pgcoord` handle, shared by the
 * files that make up the library (client.c: handle and calls; inbound.c:
 * reading and dispatching frames; notify.c: the notification queue;
 * transport.c: the socket; session.c: the typed helpers). Nothing here is
 * exported: the version script keeps everything but pgcoord_* local.
 */
#ifndef PGCOORD_CLIENT_HANDLE_H
#define PGCOORD_CLIENT_HANDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"

#define PGCOORD_WUR __attribute__((warn_unused_result))

/*
 * The reader accepts bigger messages than the agent does (1 MiB): the agent
 * is trusted to be sane, the limit only stops a broken peer from making us
 * allocate without bound. Depth cannot go past 32: msgpack-c decodes no
 * deeper and reports a deeper object as out of memory, so the scanner must
 * refuse it first.
 */
#define PGCOORD_MAX_FRAME (16u * 1024 * 1024)
#define PGCOORD_MAX_DEPTH 32u

/* One queued notification; method is NUL-terminated, params a msgpack map. */
struct pgcoord_note {
	struct pgcoord_note *next;
	char *method;
	char *params;
	size_t params_len;
};

/* The call waiting for its response while frames are read. */
struct pgcoord_pending {
	uint32_t msgid;
	bool want_result;
	bool done;
	pgcoord_err err; /* the answer: OK, or the agent's error code */
	char *result;	 /* malloc'd re-encoding of the result, when wanted */
	size_t result_len;
};

struct pgcoord {
	int fd; /* -1 once the connection is closed */
	uint32_t next_msgid;
	int64_t session_id;

	/* Bytes read but not yet consumed: rbuf[rpos..rlen). */
	char *rbuf;
	size_t rpos, rlen, rcap;

	struct pgcoord_note *nq_head, *nq_tail;
	pgcoord_notify_fn notify_fn;
	void *notify_user;

	char message[512];
};

/* --- client.c --- */

/* Sets pgcoord_last_message(c). */
void pgcoord__set_message(pgcoord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Closes the socket; the handle stays allocated and answers PGCOORD_E_CLOSED. */
void pgcoord__disconnect(pgcoord *c);

/*
 * An sbuffer whose write callback remembers a failed allocation: the
 * msgpack_pack_* results are easy to lose across many calls, so callers
 * pack freely and check `failed` once at the end.
 */
struct pgcoord_writer {
	msgpack_sbuffer sb;
	msgpack_packer pk;
	bool failed;
};

void pgcoord__writer_init(struct pgcoord_writer *w);
/* Moves the encoding out as a malloc'd buffer; NULL when packing failed. */
char *pgcoord__writer_release(struct pgcoord_writer *w, size_t *len);
void pgcoord__writer_destroy(struct pgcoord_writer *w);

/* Re-encodes o into a malloc'd buffer. PGCOORD_E_NOMEM on failure. */
PGCOORD_WUR pgcoord_err pgcoord__encode(const msgpack_object *o, char **out, size_t *len);

/* --- time (transport.c) --- */

/* A CLOCK_MONOTONIC deadline in ms; -1 means none (wait forever). */
int64_t pgcoord__deadline(int timeout_ms);
/* ms left until deadline for poll(): -1 when there is none, 0 when past. */
int pgcoord__remaining(int64_t deadline);

/* --- transport.c --- */

/*
 * Connects a non-blocking, close-on-exec AF_UNIX stream socket to path by
 * deadline. On failure returns PGCOORD_E_CONNECT (or _ARG for a path that
 * does not fit), leaves errno at the cause and writes a reason to msg.
 */
PGCOORD_WUR pgcoord_err pgcoord__sock_connect(const char *path, int64_t deadline, int *fd_out,
					      char *msg, size_t msglen);

/*
 * Writes all len bytes by deadline. *sent says how many went out, so the
 * caller can tell a clean timeout (nothing sent) from a torn request.
 * Returns OK, PGCOORD_E_CALL_TIMEOUT or PGCOORD_E_IO (errno set).
 */
PGCOORD_WUR pgcoord_err pgcoord__sock_send(int fd, const char *buf, size_t len, int64_t deadline,
					   size_t *sent);

/*
 * Waits until fd is readable or deadline passes. Returns OK,
 * PGCOORD_E_CALL_TIMEOUT or PGCOORD_E_IO (errno set).
 */
PGCOORD_WUR pgcoord_err pgcoord__sock_wait_readable(int fd, int64_t deadline);

/* --- inbound.c --- */

/*
 * Waits (until deadline) for more bytes from the agent and appends them to
 * the read buffer. PGCOORD_E_CALL_TIMEOUT when nothing came in time;
 * PGCOORD_E_IO (and the handle is closed) on EOF or a socket error.
 */
PGCOORD_WUR pgcoord_err pgcoord__read_more(pgcoord *c, int64_t deadline);

/*
 * Consumes the complete frames in the read buffer: notifications are
 * queued, responses to `pending` (may be NULL) fill it in and stop the
 * scan, other responses are dropped. A violation of the protocol closes the
 * handle and returns PGCOORD_E_PROTOCOL.
 */
PGCOORD_WUR pgcoord_err pgcoord__drain_frames(pgcoord *c, struct pgcoord_pending *pending);

/* --- notify.c --- */

/* Queues a notification; params/params_len are copied. */
PGCOORD_WUR pgcoord_err pgcoord__note_push(pgcoord *c, const char *method, size_t method_len,
					   const char *params, size_t params_len);
void pgcoord__note_free_all(pgcoord *c);

#endif
