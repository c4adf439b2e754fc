/*
 * fuzz_dispatch.c — libFuzzer target for the agent's request path: frames go
 * through dispatch_frame on a hand-built agent and connection, every method
 * handler runs (parameter checks, authorisation, the database call, the
 * reply), and tests/fuzz/fake_db.c stands in for the database.
 *
 * Input: one control byte, then the bytes a client sends, split into frames
 * by the scanner with the agent's limits as conn.c does. A frame that is a
 * lone nil (0xc0) is not sent: the client hangs up there and reconnects as
 * the other peer (root <-> unprivileged), so a later session.open {resume}
 * meets a detached session, up to MAX_CONNS connections per input.
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
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/identity.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/metrics.h"
#include "agent/sessions.h"
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

/* A connection as conn_create makes one, minus the socket: the bufferevent
 * has no fd and is never enabled, so replies stay in its output buffer. */
static struct conn *fake_conn(struct agent *ag, uid_t uid)
{
	struct conn *c = calloc(1, sizeof(*c));
	if (!c)
		abort();
	c->bev = bufferevent_socket_new(ag->base, -1, 0);
	if (!c->bev)
		abort();
	c->ag = ag;
	c->id = ++ag->next_conn_id;
	c->uid = uid;
	c->gid = uid;
	c->pid = 1;
	c->refs = 1;
	c->next = ag->conns;
	if (ag->conns)
		ag->conns->prev = c;
	ag->conns = c;
	ag->nconns++;
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

/* Everything queued for the client must be responses and notifications. */
static void check_output(struct conn *c)
{
	struct evbuffer *out;
	size_t len, off = 0;
	unsigned char *p;

	if (!c->bev)
		return;
	out = bufferevent_get_output(c->bev);
	len = evbuffer_get_length(out);
	p = evbuffer_pullup(out, (ev_ssize_t)len);
	while (off < len) {
		size_t frame_len = 0, used = 0;
		msgpack_object reply;
		struct pgc_message m;
		char err[256];

		if (pgc_frame_scan(p + off, len - off, (size_t)c->ag->cfg.max_output_bytes,
				   PGC_DEFAULT_MAX_DEPTH, &frame_len) != PGC_SCAN_COMPLETE)
			die("the agent sent bytes that are not one MessagePack object");
		if (msgpack_unpack((const char *)p + off, frame_len, &used, reply_zone, &reply) !=
		    MSGPACK_UNPACK_SUCCESS)
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
	evbuffer_drain(out, len);
}

/* Answers queued queries and runs what became active, until nothing moves.
 * Timers set in the future (retries, renewals, grace) do not fire. */
static void settle(struct agent *ag)
{
	for (int i = 0; i < SETTLE_MAX_STEPS; i++) {
		bool answered = fake_db_answer_one(ag->db);
		event_base_loop(ag->base, EVLOOP_NONBLOCK);
		if (!answered && fake_db_queued(ag->db) == 0)
			return;
	}
	die("the database queue never drained");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent ag;
	struct conn *conns[MAX_CONNS], *c;
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
	ag.id.registered = true;
	ag.id.incarnation = 7;
	ag.id.hb_last_ok_ms = ag.started_ms;
	snprintf(ag.id.host, sizeof(ag.id.host), "fuzz");
	ag.db = db_create(ag.base, NULL, &ag.log, NULL, NULL);
	ag.metrics = metrics;
	if (!ag.db || !leases_start(&ag))
		abort();
	fake_db_set(ag.db, (enum fake_answer)(ctl & CTL_ANSWER), (ctl >> CTL_SEED_SHIFT) & 3);

	c = conns[nconns++] = fake_conn(&ag, admin ? 0 : user);
	conn_ref(c); /* ours: each connection is read after it closes */
	while (off < size && !c->closing) {
		size_t frame_len = 0;
		enum pgc_scan_result r =
		    pgc_frame_scan(data + off, size - off, (size_t)ag.cfg.max_message_bytes,
				   (unsigned)ag.cfg.max_depth, &frame_len);
		if (r != PGC_SCAN_COMPLETE)
			break; /* conn.c answers the framing error and closes */
		if (frame_len == 1 && data[off] == RECONNECT && nconns < MAX_CONNS) {
			conn_close(c, "the client hung up to reconnect");
			admin = !admin;
			c = conns[nconns++] = fake_conn(&ag, admin ? 0 : user);
			conn_ref(c);
		} else if (!c->closed) {
			dispatch_frame(c, (const char *)data + off, frame_len);
		} else {
			break; /* dropped for its output: nothing more is read */
		}
		off += frame_len;
		if (!(ctl & CTL_PIPELINED))
			settle(&ag);
		check_output(c);
	}
	if (ctl & CTL_PIPELINED)
		conn_close(c, "the client hung up with requests in flight");
	settle(&ag);
	check_output(c);

	/* main.c's order at exit */
	while (ag.conns)
		conn_close(ag.conns, "agent exiting");
	sessions_lose_all(&ag, "the agent exited");
	db_destroy(ag.db);
	leases_finish(&ag);
	janitor_finish(&ag);
	identity_finish(&ag);
	event_base_free(ag.base);
	for (int i = 0; i < nconns; i++) {
		if (conns[i]->inflight != 0)
			die("a request never ended");
		conn_unref(conns[i]);
	}
	return 0;
}
