/*
 * handle.h — libpgcoord's private view of a `pgcoord` handle, shared by the
 * files that make up the library. They call each other in layers, each
 * only the ones below it (the include-graph test reads the calls from the
 * objects):
 *
 *   deliver.c      pgcoord_poll, pgcoord_consume: to the app's callbacks
 *   the typed calls: session.c, permits.c, waits.c (queued-claim outcomes),
 *                  records.c, leases.c (lease calls, belief questions),
 *                  watches.c, pages.c (listing every page), typed_read.c
 *                  (typed_read.h) under typed_reads.c, lease_reads.c,
 *                  agent_reads.c, fleet_reads.c (reads as structs)
 *   client.c       the call core: connect, close, pgcoord_call, pgcoord_send
 *   inbound.c      framing: reading and dispatching frames
 *   async.c        pgcoord_send's write queue and answers
 *   notify.c       the notification queue
 *   handle.c       messages, encoding, closing the socket
 *   beliefs.c      the local leadership belief, moved by lease messages
 *   transport.c    the socket and the clock; errors.c
 *
 * Nothing here is exported: the version script keeps everything but
 * pgcoord_* local.
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

/*
 * What this handle believes about one lease it campaigns for or leads.
 * Deadlines are CLOCK_MONOTONIC ms, counted from the moment the agent's
 * message was provably not yet in our socket (see pgcoord.quiet_ms), so
 * they are never later than the agent's own.
 */
struct pgcoord_belief {
	struct pgcoord_belief *next;
	char *name;
	bool leader;	  /* the last lease.changed (or acquire result) said so */
	int64_t epoch;	  /* of that belief */
	int64_t until_ms; /* belief ends here unless renewed */
	int64_t ttl_ms;	  /* as the last acquire result said; 0 before one */
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

/* A pgcoord_send request: in flight, then answered and waiting for
 * pgcoord_consume to hand the answer to fn. */
struct pgcoord_async {
	struct pgcoord_async *next;
	uint32_t msgid;
	pgcoord_reply_fn fn;
	void *user;
	pgcoord_err err;
	char *result; /* encoded result, when err is OK */
	size_t result_len;
	char *message; /* the agent's error message, or NULL */
};

struct pgcoord {
	int fd; /* -1 once the connection is closed */
	uint32_t next_msgid;
	int64_t session_id;
	int keepalive_ms; /* asked for by session.open/resume; 0: none */

	/* Bytes read but not yet consumed: rbuf[rpos..rlen). */
	char *rbuf;
	size_t rpos, rlen, rcap;

	/*
	 * Receive times, for lease deadlines (leases.c). quiet_ms: a moment
	 * at which the socket's receive queue was known to be empty, so every
	 * byte read later was sent after it. rstamp_ms: that bound for the
	 * oldest unconsumed byte in rbuf; reply_stamp_ms: for the last
	 * response taken.
	 */
	int64_t quiet_ms, rstamp_ms, reply_stamp_ms;

	struct pgcoord_note *nq_head, *nq_tail;
	pgcoord_notify_fn notify_fn;
	void *notify_user;
	pgcoord_permit_event_fn permit_event_fn;
	void *permit_event_user;

	struct pgcoord_belief *beliefs;

	/* Requests pgcoord_send queued and the socket has not taken yet:
	 * wbuf[wpos..wlen). */
	char *wbuf;
	size_t wpos, wlen;
	struct pgcoord_async *inflight;			/* sent, not answered */
	struct pgcoord_async *answered, *answered_tail; /* for pgcoord_consume */

	char message[512];
};

/* --- handle.c --- */

/* Sets pgcoord_last_message(c). */
void pgcoord__set_message(pgcoord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An options struct's size: at least the first version's (min), at most
 * what this library knows (max); otherwise sets the message and false. */
bool pgcoord__opts_size_ok(pgcoord *c, const void *opts, size_t size, size_t min, size_t max,
			   const char *init);
/* Closes the socket (and ends every belief); the handle stays allocated
 * and answers PGCOORD_E_CLOSED. */
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
/* Appends bytes that are already MessagePack (a failure sets `failed`). */
void pgcoord__writer_raw(struct pgcoord_writer *w, const char *buf, size_t len);
/* Moves the encoding out as a malloc'd buffer; NULL when packing failed. */
char *pgcoord__writer_release(struct pgcoord_writer *w, size_t *len);
void pgcoord__writer_destroy(struct pgcoord_writer *w);

/* Re-encodes o into a malloc'd buffer. PGCOORD_E_NOMEM on failure. */
PGCOORD_WUR pgcoord_err pgcoord__encode(const msgpack_object *o, char **out, size_t *len);

/* --- client.c --- */

/* pgcoord_call with the params packed in w (consumed, also on failure);
 * the raw result when result is non-NULL. */
PGCOORD_WUR pgcoord_err pgcoord__call_packed(pgcoord *c, const char *method,
					     struct pgcoord_writer *w, int timeout_ms,
					     void **result, size_t *result_len);

/* pgcoord__call_packed, then decodes the result, which must be a map, into
 * u (the caller destroys u and frees *raw when this returns OK). */
PGCOORD_WUR pgcoord_err pgcoord__call_decoded(pgcoord *c, const char *method,
					      struct pgcoord_writer *w, int timeout_ms,
					      msgpack_unpacked *u, void **raw, size_t *raw_len);

/* --- time (transport.c) --- */

/* CLOCK_MONOTONIC in ms. */
int64_t pgcoord__now_ms(void);

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
void pgcoord__note_free(struct pgcoord_note *n);
/* Unlinks and returns the oldest queued note, or NULL. */
struct pgcoord_note *pgcoord__note_pop(pgcoord *c);
/* Unlinks and returns the first queued note match() accepts, or NULL. */
struct pgcoord_note *
pgcoord__note_take(pgcoord *c, bool (*match)(const struct pgcoord_note *n, void *arg), void *arg);

/* --- async.c --- */

/* Writes the queued requests by deadline (before a synchronous call puts
 * its own on the wire). OK, PGCOORD_E_CALL_TIMEOUT (what was written
 * stays written) or PGCOORD_E_IO (the handle is closed). */
PGCOORD_WUR pgcoord_err pgcoord__flush_by(pgcoord *c, int64_t deadline);

/* A response that is not the synchronous call's: completes the
 * pgcoord_send request with its msgid (dropped when there is none). */
PGCOORD_WUR pgcoord_err pgcoord__async_response(pgcoord *c, uint32_t msgid,
						const msgpack_object *error,
						const msgpack_object *result);

/* Appends a whole encoded request to the write queue. */
PGCOORD_WUR pgcoord_err pgcoord__queue_request(pgcoord *c, const char *req, size_t len);
/* Registers a request whose answer goes to a->fn. */
void pgcoord__async_track(pgcoord *c, struct pgcoord_async *a);

/* Frees every queued request and answer, calling nothing. */
void pgcoord__async_free_all(pgcoord *c);
void pgcoord__async_free(struct pgcoord_async *a);
/* Every request still in flight ends with err (the connection is gone)
 * and waits in the answers for pgcoord_consume. */
void pgcoord__async_fail_inflight(pgcoord *c, pgcoord_err err);

/* --- waits.c --- */

/* Decodes a queued permit.admitted / permit.expired into a new event;
 * NULL for any other method, a malformed message or no memory. */
struct pgcoord_permit_event *pgcoord__permit_event_decode(const struct pgcoord_note *n);

/* --- beliefs.c --- */

/*
 * While the handle tracks a lease, waits for input are cut into slices of
 * this many ms so quiet_ms stays fresh: a lease message that arrives in the
 * middle of a long wait is dated at most this much too early.
 */
#define PGCOORD_QUIET_SLICE_MS 50

/* True when some lease is tracked (the waits above are sliced). */
bool pgcoord__tracking_leases(const pgcoord *c);

/*
 * Applies a notification to the lease beliefs, called for every
 * notification as it is read (before it is queued for the callback):
 * lease.changed and lease.renewed move a deadline, session.lost and
 * session.suspended of this handle's session end or cap every belief.
 * stamp_ms dates the message (rstamp_ms). Malformed lease messages are
 * ignored: the belief they would have touched keeps its deadline.
 */
void pgcoord__lease_note(pgcoord *c, const char *method, size_t method_len,
			 const msgpack_object *params, int64_t stamp_ms);

/* Every belief ends and is forgotten (the connection is gone, or the
 * session is). */
void pgcoord__beliefs_end(pgcoord *c);

/* The belief about name, or NULL; _get makes one (NULL: out of memory). */
struct pgcoord_belief *pgcoord__belief_find(const pgcoord *c, const char *name, size_t len);
struct pgcoord_belief *pgcoord__belief_get(pgcoord *c, const char *name, size_t len);
/* Forgets the belief about name. */
void pgcoord__belief_drop(pgcoord *c, const char *name);
/* Belief starts or ends, as a lease.changed or an acquire result says. */
void pgcoord__belief_set(pgcoord *c, const char *name, size_t len, bool leader, int64_t epoch,
			 int64_t until_ms);
/* True while b says leader and now is before its deadline. */
bool pgcoord__belief_live(const struct pgcoord_belief *b, int64_t now);
/* The deadline a message grants: stamp + valid_ms, capped by the agent's
 * own monotonic deadline when it sent one. */
int64_t pgcoord__belief_deadline(const msgpack_object *params, int64_t stamp_ms, int64_t valid_ms);

#endif
