/*
 * fuzz_dispatch.c — libFuzzer target for the agent's request path: a client
 * writes to a connection conn_create made on a socketpair, conn.c reads and
 * frames the bytes and hands them to dispatch_frame on a hand-built agent,
 * every method handler runs (parameter checks, authorisation, the database
 * call, the reply), and tests/fuzz/fake_db.c stands in for the database.
 *
 * Input: one control byte, then the bytes a client sends. The client splits
 * them into frames with the one-shot scanner to send one at a time; from
 * the first one it cannot frame on, it sends the rest as it is and conn.c
 * answers the framing error. A frame that is a lone nil (0xc0) is not sent:
 * the client hangs up there and reconnects as the other peer (root <->
 * unprivileged), so a later session.open {resume} meets a detached session,
 * up to MAX_CONNS connections per input.
 *
 *   bits 0-2  how the fake database answers (enum fake_answer)
 *   bit 3     the peer is root (an admin); otherwise an unprivileged uid
 *   bits 4-5  which canned cells the rows carry
 *   bit 6     pipelined: every frame is dispatched before the database
 *             answers anything, then the client hangs up with requests in
 *             flight; otherwise each frame's queries are answered before
 *             the next frame, and the client hangs up at the end
 *   bit 7     the agent is stopping
 *
 * Every byte the agent sends back must be a well-formed response or
 * notification. Sessions, leases and watches the input creates are torn
 * down the way main.c does at exit, so LeakSanitizer sees a leak in any
 * path that forgets something.
 */
#include <errno.h>
#include <event2/event.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/groups.h"
#include "agent/identity.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/metrics.h"
#include "agent/methods.h"
#include "agent/sessions.h"
#include "agent/watches.h"
#include "proto/codec.h"
#include "tests/fuzz/fake_db.h"

#define CTL_ANSWER 0x07
#define CTL_ADMIN 0x08
#define CTL_SEED_SHIFT 4
#define CTL_PIPELINED 0x40
#define CTL_STOPPING 0x80

#define MAX_CONNS 4
#define RECONNECT 0xc0

/* Callbacks that queue more work settle well before this; more is a hang. */
#define SETTLE_MAX_STEPS 100000

static struct config fuzz_cfg;
static FILE *devnull;
/* One zone for decoding replies, cleared after each: a fresh one per reply
 * made the checks, not the agent, most of the run time. */
static msgpack_zone *reply_zone;
/* Counters only; one for the whole run keeps a large calloc out of every input. */
static struct metrics *metrics;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	config_defaults(&fuzz_cfg);
	devnull = fopen("/dev/null", "w");
	reply_zone = msgpack_zone_new(MSGPACK_ZONE_CHUNK_SIZE);
	metrics = metrics_create(dispatch_method_count(), dispatch_method_name);
	if (!devnull || !reply_zone || !metrics)
		abort();
	return 0;
}

static void die(const char *what)
{
	fprintf(stderr, "dispatch: %s\n", what);
	abort();
}

/* One client: its end of the socketpair, and the bytes the agent wrote to
 * it that do not yet form a whole frame. */
struct client {
	int fd;
	struct conn *c;
	unsigned char *in;
	size_t inlen, incap;
};

/* A connection made by conn_create itself on one end of a socketpair, so
 * the read event, timers, input buffer and scanner are the agent's own.
 * SO_PEERCRED names this process; the peer's uid is set afterwards, as the
 * listener would have read it from a different client. */
static struct conn *connect_client(struct agent *ag, struct client *cl, uid_t uid)
{
	int sv[2];
	struct conn *c;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	c = conn_create(ag, sv[1]);
	if (!c)
		abort();
	c->uid = uid;
	c->gid = uid;
	memset(cl, 0, sizeof(*cl));
	cl->fd = sv[0];
	cl->c = c;
	return c;
}

/* An error map as PROTOCOL.md defines it: a known code, a message, retryable. */
static void check_error_map(const msgpack_object *e)
{
	const char *code;
	size_t len;
	bool retryable;
	const msgpack_object *m = pgc_map_get(e, "message");

	if (!pgc_obj_str(pgc_map_get(e, "code"), &code, &len))
		die("an error without a code");
	if (pgc_error_from_name(code, len) == PGC_E_INTERNAL &&
	    !(len == 8 && !memcmp(code, "internal", 8)))
		die("an error code PROTOCOL.md does not list");
	if (!m || m->type != MSGPACK_OBJECT_STR)
		die("an error without a message");
	if (!pgc_obj_bool(pgc_map_get(e, "retryable"), &retryable))
		die("an error without retryable");
}

/* Everything the agent wrote to the client must be responses and
 * notifications. A frame cut short by the agent dropping the connection
 * stays unread in cl->in. */
static void check_output(struct client *cl)
{
	size_t off = 0;

	for (;;) {
		ssize_t n;

		if (cl->fd < 0)
			break;
		if (cl->incap - cl->inlen < 4096) {
			size_t cap = cl->incap ? cl->incap * 2 : 8192;
			unsigned char *p = realloc(cl->in, cap);
			if (!p)
				abort();
			cl->in = p;
			cl->incap = cap;
		}
		n = read(cl->fd, cl->in + cl->inlen, cl->incap - cl->inlen);
		if (n <= 0)
			break;
		cl->inlen += (size_t)n;
	}
	while (off < cl->inlen) {
		size_t frame_len = 0, used = 0;
		msgpack_object reply;
		struct pgc_message m;
		char err[256];
		enum pgc_scan_result r =
		    pgc_frame_scan(cl->in + off, cl->inlen - off, (size_t)fuzz_cfg.max_output_bytes,
				   PGC_DEFAULT_MAX_DEPTH, &frame_len);

		if (r == PGC_SCAN_NEED_MORE)
			break;
		if (r != PGC_SCAN_COMPLETE)
			die("the agent sent bytes that are not one MessagePack object");
		if (msgpack_unpack((const char *)cl->in + off, frame_len, &used, reply_zone,
				   &reply) != MSGPACK_UNPACK_SUCCESS)
			die("the agent sent a frame msgpack-c cannot decode");
		if (!pgc_parse_message(&reply, &m, err, sizeof(err))) {
			fprintf(stderr, "dispatch: the agent sent a bad envelope: %s\n", err);
			abort();
		}
		if (m.type == PGC_RPC_REQUEST)
			die("the agent sent a request");
		if (m.type == PGC_RPC_RESPONSE && m.error)
			check_error_map(m.error);
		msgpack_zone_clear(reply_zone);
		off += frame_len;
	}
	memmove(cl->in, cl->in + off, cl->inlen - off);
	cl->inlen -= off;
}

/* Runs the loop until the agent has read what was sent and written what it
 * queued (a reply that did not fit in the socket is written on a later
 * pass), then
 * reads it as the client. */
static void pump(struct agent *ag, struct client *cl)
{
	for (int i = 0; i < 3; i++)
		event_base_loop(ag->base, EVLOOP_NONBLOCK);
	check_output(cl);
}

/* Sends bytes as the client; the agent reads them through conn.c's own read
 * path. Stops when the agent stops reading (it closed, or is closing after
 * a framing error) or the socket stays full. */
static void client_send(struct agent *ag, struct client *cl, const uint8_t *p, size_t len)
{
	int stuck = 0;

	while (len > 0 && !cl->c->closed && !cl->c->closing && stuck < 16) {
		ssize_t n = send(cl->fd, p, len, MSG_NOSIGNAL);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			stuck = 0;
		} else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			break;
		} else {
			stuck++;
		}
		pump(ag, cl);
	}
}

/* The client hangs up: the agent sees EOF on its next read. */
static void client_hangup(struct agent *ag, struct client *cl)
{
	pump(ag, cl);
	close(cl->fd);
	cl->fd = -1;
	pump(ag, cl);
}

/* Answers queued queries and runs what became active, until nothing moves,
 * then reads the client's side. Timers set in the future (retries,
 * renewals, grace, the connection deadlines) do not fire. */
static void settle(struct agent *ag, struct client *cl)
{
	for (int i = 0; i < SETTLE_MAX_STEPS; i++) {
		bool answered = fake_db_answer_one(ag->db);
		event_base_loop(ag->base, EVLOOP_NONBLOCK);
		if (!answered && fake_db_queued(ag->db) == 0) {
			pump(ag, cl);
			return;
		}
	}
	die("the database queue never drained");
}

/* as main.c wires them */
static const struct conn_hooks fuzz_conn_hooks = {
    .frame = dispatch_frame,
    .closing = sessions_detach,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent ag;
	struct client clients[MAX_CONNS], *cl;
	int nconns = 0;
	uint8_t ctl;
	size_t off = 1;
	uid_t user = geteuid() == 4242 ? 4243 : 4242;
	bool admin;

	if (size < 1)
		return 0;
	ctl = data[0];
	admin = ctl & CTL_ADMIN;
	memset(&ag, 0, sizeof(ag));
	ag.base = event_base_new();
	if (!ag.base)
		abort();
	ag.cfg = fuzz_cfg;		/* shared, read-only: handlers do not change it */
	ag.log.level = LOG_LEVEL_DEBUG; /* the formatting of every line runs too */
	ag.log.out = devnull;
	ag.state = ctl & CTL_STOPPING ? AGENT_STOPPING : AGENT_SERVING;
	ag.started_ms = mono_ms();
	ag.conn_hooks = &fuzz_conn_hooks;
	ag.id.registered = true;
	ag.id.incarnation = 7;
	ag.id.hb_last_ok_ms = ag.started_ms;
	snprintf(ag.id.host, sizeof(ag.id.host), "fuzz");
	ag.db = db_create(ag.base, NULL, &ag.log, NULL, NULL);
	ag.metrics = metrics;
	/* main.c's groups: the fast kinds, handing on to the group functions */
	ag.claim_slow_group = group_create(&ag, &permit_claim_group_kind, NULL);
	ag.release_slow_group = group_create(&ag, &permit_release_group_kind, NULL);
	ag.claim_group = group_create(&ag, &permit_claim_fast_kind, ag.claim_slow_group);
	ag.release_group = group_create(&ag, &permit_release_fast_kind, ag.release_slow_group);
	if (!ag.db || !ag.claim_group || !ag.release_group || !ag.claim_slow_group ||
	    !ag.release_slow_group || !leases_start(&ag) || !watches_start(&ag))
		abort();
	fake_db_set(ag.db, (enum fake_answer)(ctl & CTL_ANSWER), (ctl >> CTL_SEED_SHIFT) & 3);

	cl = &clients[nconns++];
	connect_client(&ag, cl, admin ? 0 : user);
	conn_ref(cl->c); /* ours: each connection is read after it closes */
	while (off < size && !cl->c->closed && !cl->c->closing) {
		size_t frame_len = 0;
		enum pgc_scan_result r =
		    pgc_frame_scan(data + off, size - off, (size_t)ag.cfg.max_message_bytes,
				   (unsigned)ag.cfg.max_depth, &frame_len);
		if (r != PGC_SCAN_COMPLETE) {
			/* the rest goes as it is: conn.c answers a framing error
			 * and closes, or holds a partial frame */
			client_send(&ag, cl, data + off, size - off);
			break;
		}
		if (frame_len == 1 && data[off] == RECONNECT && nconns < MAX_CONNS) {
			client_hangup(&ag, cl);
			admin = !admin;
			cl = &clients[nconns++];
			connect_client(&ag, cl, admin ? 0 : user);
			conn_ref(cl->c);
		} else {
			client_send(&ag, cl, data + off, frame_len);
		}
		off += frame_len;
		if (!(ctl & CTL_PIPELINED))
			settle(&ag, cl);
	}
	if (ctl & CTL_PIPELINED)
		client_hangup(&ag, cl); /* with requests in flight */
	settle(&ag, cl);

	/* main.c's order at exit */
	while (ag.conns)
		conn_close(ag.conns, "agent exiting");
	sessions_lose_all(&ag, "the agent exited", LOG_LEVEL_INFO);
	db_destroy(ag.db);
	group_destroy(ag.claim_group);
	group_destroy(ag.release_group);
	group_destroy(ag.claim_slow_group);
	group_destroy(ag.release_slow_group);
	leases_finish(&ag);
	watches_finish(&ag);
	janitor_finish(&ag);
	identity_finish(&ag);
	event_base_free(ag.base);
	for (int i = 0; i < nconns; i++) {
		if (clients[i].c->inflight != 0)
			die("a request never ended");
		conn_unref(clients[i].c);
		if (clients[i].fd >= 0)
			close(clients[i].fd);
		free(clients[i].in);
	}
	return 0;
}
