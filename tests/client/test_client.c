/*
 * test_client.c — libpgcoord against a scripted fake agent.
 *
 * Each test starts a listener on a fresh socket and a thread that accepts
 * one connection and plays a script (read a request, answer it, push a
 * notification, send garbage, hang up …) built with the shared codec, so the
 * library is checked against the same wire encoding the agent uses. The
 * script never asserts from its thread: it records the first surprise in
 * `fail`, checked by fake_stop() on the test's thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

/* --- the fake agent ------------------------------------------------------- */

struct fake {
	char dir[64];
	char path[108]; /* sizeof(sun_path) */
	int lfd;
	int cfd;
	pthread_t thread;
	void (*script)(struct fake *);
	char fail[512];
	char buf[1 << 16];
	size_t len;
};

/* One request as the fake agent read it; params borrows from frame. */
struct req {
	char *frame;
	msgpack_unpacked u;
	uint32_t msgid;
	char method[64];
	const msgpack_object *params; /* NULL for [] */
};

struct out {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static struct fake fake;

static void fake_failf(struct fake *f, const char *fmt, ...)
{
	va_list ap;

	if (f->fail[0])
		return; /* keep the first surprise: later ones follow from it */
	va_start(ap, fmt);
	vsnprintf(f->fail, sizeof(f->fail), fmt, ap);
	va_end(ap);
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;

	f->cfd = accept(f->lfd, NULL, NULL);
	if (f->cfd < 0) {
		fake_failf(f, "accept: %s", strerror(errno));
		return NULL;
	}
	f->script(f);
	close(f->cfd);
	return NULL;
}

static void fake_start(void (*script)(struct fake *))
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};

	memset(&fake, 0, sizeof(fake));
	fake.script = script;
	strcpy(fake.dir, "/tmp/pgcoord-client-XXXXXX");
	cr_assert_not_null(mkdtemp(fake.dir));
	snprintf(fake.path, sizeof(fake.path), "%s/agent.sock", fake.dir);
	memcpy(sun.sun_path, fake.path, strlen(fake.path) + 1);
	fake.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fake.lfd, 0);
	cr_assert_eq(bind(fake.lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	cr_assert_eq(listen(fake.lfd, 4), 0);
	cr_assert_eq(pthread_create(&fake.thread, NULL, fake_main, &fake), 0);
}

static void fake_stop(void)
{
	pthread_join(fake.thread, NULL);
	close(fake.lfd);
	unlink(fake.path);
	rmdir(fake.dir);
	cr_assert_eq(fake.fail[0], '\0', "fake agent: %s", fake.fail);
}

static void fake_write(struct fake *f, const void *p, size_t n)
{
	const char *s = p;
	while (n > 0) {
		ssize_t w = send(f->cfd, s, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			fake_failf(f, "send: %s", strerror(errno));
			return;
		}
		s += w;
		n -= (size_t)w;
	}
}

static void req_free(struct req *r)
{
	if (r->frame) {
		msgpack_unpacked_destroy(&r->u);
		free(r->frame);
	}
	memset(r, 0, sizeof(*r));
}

/* Reads the next request; false (and fail set) on EOF or a bad message. */
static bool fake_read(struct fake *f, struct req *r)
{
	memset(r, 0, sizeof(*r));
	for (;;) {
		size_t flen = 0;
		enum pgc_scan_result s =
		    pgc_frame_scan(f->buf, f->len, sizeof(f->buf), PGC_DEFAULT_MAX_DEPTH, &flen);
		if (s == PGC_SCAN_COMPLETE) {
			struct pgc_message m;
			char why[128];
			size_t off = 0;
			r->frame = malloc(flen);
			memcpy(r->frame, f->buf, flen);
			memmove(f->buf, f->buf + flen, f->len - flen);
			f->len -= flen;
			msgpack_unpacked_init(&r->u);
			if (msgpack_unpack_next(&r->u, r->frame, flen, &off) !=
				MSGPACK_UNPACK_SUCCESS ||
			    !pgc_parse_message(&r->u.data, &m, why, sizeof(why)) ||
			    m.type != PGC_RPC_REQUEST) {
				fake_failf(f, "client sent a bad request: %s", why);
				return false;
			}
			r->msgid = m.msgid;
			snprintf(r->method, sizeof(r->method), "%.*s", (int)m.method_len, m.method);
			r->params = m.params;
			return true;
		}
		if (s != PGC_SCAN_NEED_MORE) {
			fake_failf(f, "client sent unframeable bytes: %s", pgc_scan_result_name(s));
			return false;
		}
		ssize_t n = recv(f->cfd, f->buf + f->len, sizeof(f->buf) - f->len, 0);
		if (n <= 0) {
			fake_failf(f, "client hung up before sending a request");
			return false;
		}
		f->len += (size_t)n;
	}
}

static bool fake_expect(struct fake *f, struct req *r, const char *method)
{
	if (!fake_read(f, r))
		return false;
	if (strcmp(r->method, method) != 0) {
		fake_failf(f, "expected %s, got %s", method, r->method);
		return false;
	}
	return true;
}

/* Keeps the connection open until the client closes its end. */
static void fake_wait_hangup(struct fake *f)
{
	char b;
	while (recv(f->cfd, &b, 1, 0) > 0)
		;
}

static void out_init(struct out *o)
{
	msgpack_sbuffer_init(&o->sb);
	msgpack_packer_init(&o->pk, &o->sb, msgpack_sbuffer_write);
}

static void out_send(struct fake *f, struct out *o)
{
	fake_write(f, o->sb.data, o->sb.size);
	msgpack_sbuffer_destroy(&o->sb);
}

static void reply_pong(struct fake *f, uint32_t msgid)
{
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, msgid);
	msgpack_pack_map(&o.pk, 1);
	pgc_pack_kv_bool(&o.pk, "pong", true);
	out_send(f, &o);
}

static void reply_which(struct fake *f, uint32_t msgid, int64_t which)
{
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, msgid);
	msgpack_pack_map(&o.pk, 1);
	pgc_pack_kv_int(&o.pk, "which", which);
	out_send(f, &o);
}

static void reply_error(struct fake *f, uint32_t msgid, const char *code, const char *msg,
			bool retryable)
{
	struct out o;
	out_init(&o);
	pgc_pack_response_error(&o.pk, msgid, code, msg, retryable);
	out_send(f, &o);
}

static void reply_session(struct fake *f, uint32_t msgid, int64_t session, bool resumed)
{
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, msgid);
	msgpack_pack_map(&o.pk, 4);
	pgc_pack_kv_int(&o.pk, "session", session);
	pgc_pack_kv_bool(&o.pk, "resumed", resumed);
	pgc_pack_kv_int(&o.pk, "ttl_ms", 15000);
	pgc_pack_kv_int(&o.pk, "grace_ms", 30000);
	out_send(f, &o);
}

static void notify_session_lost(struct fake *f, int64_t session)
{
	struct out o;
	out_init(&o);
	pgc_pack_notify_begin(&o.pk, "session.lost");
	msgpack_pack_map(&o.pk, 2);
	pgc_pack_kv_int(&o.pk, "session", session);
	pgc_pack_kv_str(&o.pk, "reason", "superseded");
	out_send(f, &o);
}

/* --- client-side helpers -------------------------------------------------- */

static pgcoord *connect_fake(void)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(fake.path, 2000, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect: %s", pgcoord_strerror(err));
	cr_assert_not_null(c);
	return c;
}

struct seen_notes {
	int count;
	char method[64];
	int64_t session;
	char reason[64];
};

static void on_notify(void *user, const char *method, const void *params, size_t len)
{
	struct seen_notes *s = user;
	msgpack_unpacked u;
	size_t off = 0;
	const char *str;
	size_t slen;

	s->count++;
	snprintf(s->method, sizeof(s->method), "%s", method);
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, len, &off) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_MAP) {
		pgc_obj_int64(pgc_map_get(&u.data, "session"), &s->session);
		if (pgc_obj_str(pgc_map_get(&u.data, "reason"), &str, &slen))
			snprintf(s->reason, sizeof(s->reason), "%.*s", (int)slen, str);
	}
	msgpack_unpacked_destroy(&u);
}

/* --- round trips ---------------------------------------------------------- */

static void script_two_pings(struct fake *f)
{
	struct req r;
	for (int i = 0; i < 2; i++) {
		if (!fake_expect(f, &r, "agent.ping"))
			return;
		if (r.params && r.params->via.map.size != 0)
			fake_failf(f, "agent.ping sent %u params", r.params->via.map.size);
		reply_pong(f, r.msgid);
		req_free(&r);
	}
}

Test(client, ping_round_trip_succeeds, .timeout = 10)
{
	fake_start(script_two_pings);
	pgcoord *c = connect_fake();

	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	cr_assert_str_eq(pgcoord_last_message(c), "");

	void *res = NULL;
	size_t len = 0;
	cr_assert_eq(pgcoord_call(c, "agent.ping", NULL, 0, 2000, &res, &len), PGCOORD_OK);
	cr_assert_not_null(res);

	msgpack_unpacked u;
	size_t off = 0;
	bool pong = false;
	msgpack_unpacked_init(&u);
	cr_assert_eq(msgpack_unpack_next(&u, res, len, &off), MSGPACK_UNPACK_SUCCESS);
	cr_assert_eq(off, len, "the result is exactly one object");
	cr_assert(pgc_obj_bool(pgc_map_get(&u.data, "pong"), &pong) && pong);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);

	pgcoord_close(c);
	fake_stop();
}

static void script_check_params(struct fake *f)
{
	struct req r;
	int64_t k = 0;
	if (!fake_expect(f, &r, "test.params"))
		return;
	if (!pgc_obj_int64(pgc_map_get(r.params, "k"), &k) || k != 7)
		fake_failf(f, "params did not arrive verbatim");
	reply_pong(f, r.msgid);
	req_free(&r);
}

Test(client, params_map_is_sent_verbatim_and_non_maps_are_refused, .timeout = 10)
{
	fake_start(script_check_params);
	pgcoord *c = connect_fake();

	/* Refused locally: nothing reaches the agent. */
	cr_assert_eq(pgcoord_call(c, "test.params", "\x91\x01", 2, 2000, NULL, NULL), PGCOORD_E_ARG,
		     "an array is not a params map");
	cr_assert_str_neq(pgcoord_last_message(c), "");
	cr_assert_eq(pgcoord_call(c, "test.params", "\x81\xa1", 2, 2000, NULL, NULL), PGCOORD_E_ARG,
		     "a truncated map");
	cr_assert_eq(pgcoord_call(c, "test.params", "\x80\x80", 2, 2000, NULL, NULL), PGCOORD_E_ARG,
		     "bytes after the map");
	cr_assert_eq(pgcoord_call(c, "test.params", "\xc1", 1, 2000, NULL, NULL), PGCOORD_E_ARG);
	char deep[48] = "\x81\xa1k";
	for (size_t i = 3; i < sizeof(deep) - 1; i++)
		deep[i] = (char)0x91;
	deep[sizeof(deep) - 1] = 0x01;
	cr_assert_eq(pgcoord_call(c, "test.params", deep, sizeof(deep), 2000, NULL, NULL),
		     PGCOORD_E_ARG, "nested deeper than the decoder goes");
	cr_assert_eq(pgcoord_call(c, "", NULL, 0, 2000, NULL, NULL), PGCOORD_E_ARG);

	cr_assert_eq(pgcoord_call(c, "test.params", "\x81\xa1k\x07", 4, 2000, NULL, NULL),
		     PGCOORD_OK);
	pgcoord_close(c);
	fake_stop();
}

static void script_split_reply(struct fake *f)
{
	struct req r;
	struct out o;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 1);
	pgc_pack_kv_bool(&o.pk, "pong", true);
	/* One byte per write, with pauses, so the client sees every partial frame. */
	for (size_t i = 0; i < o.sb.size; i++) {
		fake_write(f, o.sb.data + i, 1);
		usleep(2000);
	}
	msgpack_sbuffer_destroy(&o.sb);
	req_free(&r);
}

Test(client, reply_arriving_byte_by_byte_is_reassembled, .timeout = 10)
{
	fake_start(script_split_reply);
	pgcoord *c = connect_fake();
	cr_assert_eq(pgcoord_ping(c, 5000), PGCOORD_OK);
	pgcoord_close(c);
	fake_stop();
}

/* --- errors --------------------------------------------------------------- */

static void script_errors(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_error(f, r.msgid, "unavailable", "database is down", true);
	req_free(&r);
	if (!fake_expect(f, &r, "session.keepalive"))
		return;
	reply_error(f, r.msgid, "no_session", "call session.open first", false);
	req_free(&r);
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_error(f, r.msgid, "brand_new_code", "from the future", false);
	req_free(&r);
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_pong(f, r.msgid);
	req_free(&r);
}

Test(client, error_reply_maps_code_message_and_retryable, .timeout = 10)
{
	fake_start(script_errors);
	pgcoord *c = connect_fake();

	pgcoord_err err = pgcoord_ping(c, 2000);
	cr_assert_eq(err, PGCOORD_E_UNAVAILABLE);
	cr_assert_str_eq(pgcoord_last_message(c), "database is down");
	cr_assert(pgcoord_err_retryable(err));

	err = pgcoord_call(c, "session.keepalive", NULL, 0, 2000, NULL, NULL);
	cr_assert_eq(err, PGCOORD_E_NO_SESSION);
	cr_assert_str_eq(pgcoord_last_message(c), "call session.open first");
	cr_assert_not(pgcoord_err_retryable(err));

	/* A code this library does not know yet is internal, but keeps its name. */
	err = pgcoord_ping(c, 2000);
	cr_assert_eq(err, PGCOORD_E_INTERNAL);
	cr_assert_not_null(strstr(pgcoord_last_message(c), "brand_new_code"));
	cr_assert_not_null(strstr(pgcoord_last_message(c), "from the future"));

	/* An error reply leaves the connection usable. */
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	cr_assert_str_eq(pgcoord_last_message(c), "", "a success clears the message");
	pgcoord_close(c);
	fake_stop();
}

static void script_msgid_zero(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_error(f, 0, "too_large", "message over 1048576 bytes", false);
	req_free(&r);
}

Test(client, msgid_zero_error_answers_the_pending_call, .timeout = 10)
{
	fake_start(script_msgid_zero);
	pgcoord *c = connect_fake();
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_E_TOO_LARGE);
	cr_assert_str_eq(pgcoord_last_message(c), "message over 1048576 bytes");
	pgcoord_close(c);
	fake_stop();
}

Test(errors, every_code_has_a_description_and_retry_class)
{
	static const pgcoord_err retryable[] = {
	    PGCOORD_E_UNAVAILABLE,   PGCOORD_E_TIMEOUT,	     PGCOORD_E_BUSY,
	    PGCOORD_E_SHUTTING_DOWN, PGCOORD_E_CALL_TIMEOUT, PGCOORD_E_IO,
	};
	for (int e = 0; e <= PGCOORD_E_EXPIRED; e++) {
		if (e > PGCOORD_E_TOO_LARGE && e < PGCOORD_E_CONNECT)
			continue;
		const char *s = pgcoord_strerror((pgcoord_err)e);
		cr_assert_not_null(s);
		cr_assert_str_neq(s, "unknown pgcoord error", "code %d has no text", e);
		bool want = false;
		for (size_t i = 0; i < sizeof(retryable) / sizeof(retryable[0]); i++)
			want = want || retryable[i] == (pgcoord_err)e;
		cr_assert_eq(pgcoord_err_retryable((pgcoord_err)e), want, "code %d", e);
		/* The wire range mirrors the codec's table. */
		if (e >= 1 && e <= PGCOORD_E_TOO_LARGE)
			cr_assert_eq(pgcoord_err_retryable((pgcoord_err)e),
				     pgc_error_retryable((enum pgc_error_code)e), "code %d", e);
	}
	cr_assert_str_eq(pgcoord_strerror((pgcoord_err)9999), "unknown pgcoord error");
}

Test(errors, wire_codes_have_their_wire_names)
{
	for (int e = 1; e <= PGCOORD_E_TOO_LARGE; e++)
		cr_assert_str_eq(pgcoord_err_name((pgcoord_err)e),
				 pgc_error_name((enum pgc_error_code)e), "code %d", e);
	cr_assert_null(pgcoord_err_name(PGCOORD_OK));
	cr_assert_null(pgcoord_err_name(PGCOORD_E_CONNECT));
	cr_assert_null(pgcoord_err_name(PGCOORD_E_CLOSED));
}

/* --- claim options -------------------------------------------------------- */

/* Checks that every field of the options reached the wire, then admits. */
static void script_claim_with_options(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "permit.claim"))
		return;
	const msgpack_object *quotas = pgc_map_get(r.params, "quotas");
	const msgpack_object *intent = pgc_map_get(r.params, "intent");
	int64_t weight = 0, limit = 0;
	if (!pgc_obj_str_eq(pgc_map_get(r.params, "id"), "job-1") || !quotas ||
	    quotas->type != MSGPACK_OBJECT_ARRAY || quotas->via.array.size != 1 ||
	    !pgc_obj_str_eq(pgc_map_get(&quotas->via.array.ptr[0], "key"), "gpu") ||
	    !pgc_obj_int64(pgc_map_get(&quotas->via.array.ptr[0], "weight"), &weight) ||
	    weight != 3 || !intent || intent->type != MSGPACK_OBJECT_BIN ||
	    intent->via.bin.size != 2 || memcmp(intent->via.bin.ptr, "hi", 2) != 0 ||
	    !pgc_obj_int64(pgc_map_get(r.params, "limit"), &limit) || limit != 9 ||
	    !pgc_obj_str_eq(pgc_map_get(r.params, "on_owner_loss"), "release"))
		fake_failf(f, "permit.claim params do not match the options");
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 4);
	pgc_pack_kv_str(&o.pk, "status", "admitted");
	pgc_pack_kv_int(&o.pk, "token", 77);
	pgc_pack_kv_int(&o.pk, "owner_session", 42);
	pgc_pack_kv_bool(&o.pk, "mine", true);
	out_send(f, &o);
	req_free(&r);
	fake_wait_hangup(f);
}

Test(claim, options_reach_the_wire_and_uninitialised_ones_are_refused, .timeout = 10)
{
	fake_start(script_claim_with_options);
	pgcoord *c = connect_fake();
	const char *keys[] = {"gpu"};
	const int32_t weights[] = {3};
	pgcoord_claim *cl = NULL;

	/* Refused before anything is sent: the fake sees only the next claim. */
	struct pgcoord_claim_opts unset = {0};
	unset.keys = keys;
	unset.nquotas = 1;
	cr_assert_eq(pgcoord_permit_claim(c, "job-1", &unset, 2000, &cl), PGCOORD_E_ARG);
	cr_assert_null(cl);
	cr_assert_eq(pgcoord_permit_claim(c, "job-1", NULL, 2000, &cl), PGCOORD_E_ARG);

	struct pgcoord_claim_opts opts;
	pgcoord_claim_opts_init(&opts);
	cr_assert_eq(opts.size, sizeof(opts));
	cr_assert_eq(opts.limit, PGCOORD_NO_LIMIT);
	opts.keys = keys;
	opts.weights = weights;
	opts.nquotas = 1;
	opts.intent = "hi";
	opts.intent_len = 2;
	opts.limit = 9;
	opts.flags = PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS;
	cr_assert_eq(pgcoord_permit_claim(c, "job-1", &opts, 2000, &cl), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	cr_assert_eq(pgcoord_claim_get_token(cl), 77);
	pgcoord_claim_free(cl);

	pgcoord_close(c);
	fake_stop();
}

/* A claim that waits: wait_ms on the wire, a queued answer, then a cancel. */
static void script_queued_claim_then_cancel(struct fake *f)
{
	struct req r;
	int64_t wait_ms = 0;
	if (!fake_expect(f, &r, "permit.claim"))
		return;
	if (!pgc_obj_int64(pgc_map_get(r.params, "wait_ms"), &wait_ms) || wait_ms != 1500)
		fake_failf(f, "permit.claim without wait_ms 1500");
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 7);
	pgc_pack_kv_str(&o.pk, "status", "queued");
	pgc_pack_kv_str(&o.pk, "id", "job-2");
	pgc_pack_kv_int(&o.pk, "position", 2);
	pgc_pack_kv_int(&o.pk, "queued_at", 1000);
	pgc_pack_kv_int(&o.pk, "deadline_at", 2500);
	pgc_pack_kv_bool(&o.pk, "mine", true);
	pgc_pack_kv_int(&o.pk, "now_at", 1000);
	out_send(f, &o);
	req_free(&r);

	if (!fake_expect(f, &r, "permit.cancel"))
		return;
	if (!pgc_obj_str_eq(pgc_map_get(r.params, "id"), "job-2"))
		fake_failf(f, "permit.cancel without id job-2");
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 4);
	pgc_pack_kv_str(&o.pk, "id", "job-2");
	pgc_pack_kv_bool(&o.pk, "cancelled", true);
	pgc_pack_kv_str(&o.pk, "status", "cancelled");
	pgc_pack_kv_int(&o.pk, "now_at", 1001);
	out_send(f, &o);
	req_free(&r);
	fake_wait_hangup(f);
}

Test(claim, a_waiting_claim_is_queued_with_its_place_and_can_be_cancelled, .timeout = 10)
{
	fake_start(script_queued_claim_then_cancel);
	pgcoord *c = connect_fake();
	const char *keys[] = {"gpu"};
	pgcoord_claim *cl = NULL;
	struct pgcoord_claim_opts opts = PGCOORD_CLAIM_OPTS_INIT;
	opts.keys = keys;
	opts.nquotas = 1;

	opts.wait_ms = 3600001; /* refused before anything is sent */
	cr_assert_eq(pgcoord_permit_claim(c, "job-2", &opts, 2000, &cl), PGCOORD_E_ARG);
	opts.wait_ms = 1500;
	cr_assert_eq(pgcoord_permit_claim(c, "job-2", &opts, 2000, &cl), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_QUEUED);
	cr_assert_eq(pgcoord_claim_queue_position(cl), 2);
	cr_assert_eq(pgcoord_claim_queue_deadline_at(cl), 2500);
	cr_assert(pgcoord_claim_is_mine(cl));
	cr_assert_eq(pgcoord_claim_get_token(cl), 0, "a queued claim holds nothing yet");
	pgcoord_claim_free(cl);

	pgcoord_cancel_status st = 0;
	cr_assert_eq(pgcoord_permit_cancel(c, "job-2", 2000, &st), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(st, PGCOORD_CANCEL_CANCELLED);
	cr_assert_eq(pgcoord_permit_cancel(c, "", 2000, &st), PGCOORD_E_ARG);

	pgcoord_close(c);
	fake_stop();
}

/* --- notifications -------------------------------------------------------- */

static void script_notify_during_call(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "session.open"))
		return;
	const char *name;
	size_t len;
	if (!pgc_obj_str(pgc_map_get(r.params, "name"), &name, &len) || len != 6 ||
	    memcmp(name, "worker", 6) != 0)
		fake_failf(f, "session.open without name \"worker\"");
	reply_session(f, r.msgid, 42, false);
	req_free(&r);

	if (!fake_expect(f, &r, "agent.ping"))
		return;
	notify_session_lost(f, 42);
	reply_pong(f, r.msgid);
	req_free(&r);
	fake_wait_hangup(f);
}

Test(client, notification_during_call_is_queued_until_poll, .timeout = 10)
{
	struct seen_notes seen = {0};
	int delivered = -1;
	int64_t id = 0;

	fake_start(script_notify_during_call);
	pgcoord *c = connect_fake();
	pgcoord_set_notify(c, on_notify, &seen);

	cr_assert_eq(pgcoord_session_open(c, "worker", 2000, &id), PGCOORD_OK);
	cr_assert_eq(id, 42);
	cr_assert_eq(pgcoord_session_id(c), 42);

	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	cr_assert_eq(seen.count, 0, "callbacks run only from pgcoord_poll");
	cr_assert_eq(pgcoord_session_id(c), 0, "session.lost ends the handle's session at once");

	cr_assert_eq(pgcoord_poll(c, 0, &delivered), PGCOORD_OK);
	cr_assert_eq(delivered, 1);
	cr_assert_eq(seen.count, 1);
	cr_assert_str_eq(seen.method, "session.lost");
	cr_assert_eq(seen.session, 42);
	cr_assert_str_eq(seen.reason, "superseded");

	cr_assert_eq(pgcoord_poll(c, 50, &delivered), PGCOORD_OK);
	cr_assert_eq(delivered, 0, "nothing is delivered twice");
	pgcoord_close(c);
	fake_stop();
}

static void script_push_then_hang_up(struct fake *f)
{
	struct req r;
	notify_session_lost(f, 5);
	/* Wait for the client's ping: it proves the poll got the push first. */
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	notify_session_lost(f, 6);
	reply_pong(f, r.msgid);
	req_free(&r);
}

Test(client, poll_waits_for_pushes_and_reports_eof, .timeout = 10)
{
	struct seen_notes seen = {0};
	int delivered = 0;

	fake_start(script_push_then_hang_up);
	pgcoord *c = connect_fake();
	pgcoord_set_notify(c, on_notify, &seen);

	cr_assert_eq(pgcoord_poll(c, 5000, &delivered), PGCOORD_OK);
	cr_assert_eq(delivered, 1);
	cr_assert_eq(seen.session, 5);

	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	fake_stop();

	/* The push before the hang-up is delivered, then the EOF is reported. */
	pgcoord_err err;
	int total = 0;
	do {
		err = pgcoord_poll(c, 2000, &delivered);
		total += delivered;
	} while (err == PGCOORD_OK);
	cr_assert_eq(err, PGCOORD_E_IO);
	cr_assert_eq(total, 1);
	cr_assert_eq(seen.session, 6);
	pgcoord_close(c);
}

/* --- timeouts ------------------------------------------------------------- */

static void script_late_reply(struct fake *f)
{
	struct req first, second;
	if (!fake_expect(f, &first, "test.slow"))
		return;
	/* The second request proves the client gave up on the first. */
	if (!fake_expect(f, &second, "test.fast"))
		return;
	reply_which(f, first.msgid, 1);
	reply_which(f, second.msgid, 2);
	req_free(&first);
	req_free(&second);
}

Test(client, call_timeout_keeps_connection_and_drops_late_reply, .timeout = 10)
{
	fake_start(script_late_reply);
	pgcoord *c = connect_fake();

	pgcoord_err err = pgcoord_call(c, "test.slow", NULL, 0, 100, NULL, NULL);
	cr_assert_eq(err, PGCOORD_E_CALL_TIMEOUT);
	cr_assert(pgcoord_err_retryable(err));
	cr_assert_str_neq(pgcoord_last_message(c), "");
	cr_assert_geq(pgcoord_fd(c), 0, "a timeout does not close the connection");

	void *res = NULL;
	size_t len = 0;
	int64_t which = 0;
	cr_assert_eq(pgcoord_call(c, "test.fast", NULL, 0, 2000, &res, &len), PGCOORD_OK);
	msgpack_unpacked u;
	size_t off = 0;
	msgpack_unpacked_init(&u);
	cr_assert_eq(msgpack_unpack_next(&u, res, len, &off), MSGPACK_UNPACK_SUCCESS);
	cr_assert(pgc_obj_int64(pgc_map_get(&u.data, "which"), &which));
	cr_assert_eq(which, 2, "the late reply to the timed-out call must not answer this one");
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);

	pgcoord_close(c);
	fake_stop();
}

/* --- broken connections and broken agents ---------------------------------- */

static void script_hang_up(struct fake *f)
{
	struct req r;
	if (fake_expect(f, &r, "agent.ping"))
		req_free(&r);
}

Test(client, eof_mid_call_is_io_then_closed, .timeout = 10)
{
	fake_start(script_hang_up);
	pgcoord *c = connect_fake();

	pgcoord_err err = pgcoord_ping(c, 2000);
	cr_assert_eq(err, PGCOORD_E_IO);
	cr_assert(pgcoord_err_retryable(err));
	cr_assert_eq(pgcoord_fd(c), -1);
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_E_CLOSED);
	cr_assert_eq(pgcoord_poll(c, 0, NULL), PGCOORD_E_CLOSED);
	pgcoord_close(c);
	fake_stop();
}

static void script_cut_mid_frame(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	/* [1, msgid, nil, {"pong": true}] without its last bytes, then EOF. */
	unsigned char part[] = {0x94,
				0x01,
				0xce,
				(unsigned char)(r.msgid >> 24),
				(unsigned char)(r.msgid >> 16),
				(unsigned char)(r.msgid >> 8),
				(unsigned char)r.msgid,
				0xc0,
				0x81,
				0xa4,
				'p',
				'o'};
	fake_write(f, part, sizeof(part));
	req_free(&r);
}

Test(client, frame_cut_short_then_eof_is_io_not_a_hang, .timeout = 10)
{
	fake_start(script_cut_mid_frame);
	pgcoord *c = connect_fake();
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	pgcoord_err err = pgcoord_ping(c, 5000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_eq(err, PGCOORD_E_IO, "got %s", pgcoord_strerror(err));
	cr_assert(pgcoord_err_retryable(err), "the reply was never read: the outcome is unknown");
	cr_assert_lt(t1.tv_sec - t0.tv_sec, 2, "the call waited for the rest of the frame");
	cr_assert_str_neq(pgcoord_last_message(c), "");
	cr_assert_eq(pgcoord_fd(c), -1);
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_E_CLOSED);
	pgcoord_close(c);
	fake_stop();
}

static const char *garbage_bytes;
static size_t garbage_len;

static void script_garbage(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	fake_write(f, garbage_bytes, garbage_len);
	req_free(&r);
	/* Stay connected: the client must give up on its own, not on EOF. */
	fake_wait_hangup(f);
}

static void expect_protocol_error(const char *bytes, size_t len)
{
	garbage_bytes = bytes;
	garbage_len = len;
	fake_start(script_garbage);
	pgcoord *c = connect_fake();

	cr_assert_eq(pgcoord_ping(c, 5000), PGCOORD_E_PROTOCOL);
	cr_assert_str_neq(pgcoord_last_message(c), "");
	cr_assert_eq(pgcoord_fd(c), -1, "framing is lost: the handle is closed");
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_E_CLOSED);
	pgcoord_close(c); /* lets the fake agent's read end */
	fake_stop();
}

Test(client, byte_that_starts_no_type_is_protocol_error, .timeout = 10)
{
	expect_protocol_error("\xc1\xc1\xc1", 3);
}

Test(client, oversize_declared_length_is_protocol_error_at_once, .timeout = 10)
{
	/* str32 of 4 GiB: refused from the header, nothing is buffered for it. */
	expect_protocol_error("\xdb\xff\xff\xff\xff", 5);
}

Test(client, well_formed_non_envelope_is_protocol_error, .timeout = 10)
{
	/* [1, 1, "oops", nil]: error must be nil or a map. */
	expect_protocol_error("\x94\x01\x01\xa4oops\xc0", 9);
}

Test(client, reply_nested_deeper_than_the_decoder_is_protocol_error, .timeout = 10)
{
	/* [1, 1, nil, {"x": [[[[...40 deep...]]]]}] */
	static char deep[64];
	size_t n = 0;
	memcpy(deep, "\x94\x01\x01\xc0\x81\xa1x", 7);
	n = 7;
	for (int i = 0; i < 40; i++)
		deep[n++] = (char)0x91;
	deep[n++] = 0x01;
	expect_protocol_error(deep, n);
}

Test(client, request_from_the_agent_is_protocol_error, .timeout = 10)
{
	/* [0, 9, "x", []] */
	expect_protocol_error("\x94\x00\x09\xa1x\x90", 6);
}

/* --- sessions ------------------------------------------------------------- */

static void script_session_lifecycle(struct fake *f)
{
	struct req r;
	int64_t resume = 0;

	if (!fake_expect(f, &r, "session.open"))
		return;
	if (r.params && r.params->via.map.size != 0)
		fake_failf(f, "an unnamed open sent params");
	reply_session(f, r.msgid, 77, false);
	req_free(&r);

	if (!fake_expect(f, &r, "session.close"))
		return;
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 1);
	pgc_pack_kv_bool(&o.pk, "closed", true);
	out_send(f, &o);
	req_free(&r);

	if (!fake_expect(f, &r, "session.open"))
		return;
	if (!pgc_obj_int64(pgc_map_get(r.params, "resume"), &resume) || resume != 77)
		fake_failf(f, "resume did not send {resume: 77}");
	reply_session(f, r.msgid, 77, true);
	req_free(&r);

	if (!fake_expect(f, &r, "session.open"))
		return;
	reply_error(f, r.msgid, "conflict", "this connection already has session 77", false);
	req_free(&r);
}

Test(client, session_open_close_resume_track_the_id, .timeout = 10)
{
	fake_start(script_session_lifecycle);
	pgcoord *c = connect_fake();

	cr_assert_eq(pgcoord_session_id(c), 0);
	cr_assert_eq(pgcoord_session_open(c, NULL, 2000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_id(c), 77);
	cr_assert_eq(pgcoord_session_close(c, 2000), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_id(c), 0);
	cr_assert_eq(pgcoord_session_resume(c, 77, 2000), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_id(c), 77);

	int64_t id = -1;
	cr_assert_eq(pgcoord_session_open(c, "again", 2000, &id), PGCOORD_E_CONFLICT);
	cr_assert_eq(id, 0);
	cr_assert_eq(pgcoord_session_id(c), 77, "a refused open keeps the session");

	cr_assert_eq(pgcoord_session_resume(c, 0, 2000), PGCOORD_E_ARG);
	pgcoord_close(c);
	fake_stop();
}

/* --- connecting ----------------------------------------------------------- */

static void script_one_ping(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_pong(f, r.msgid);
	req_free(&r);
}

Test(connect, null_path_uses_environment, .timeout = 10)
{
	fake_start(script_one_ping);
	setenv("PGCOORD_SOCKET_PATH", fake.path, 1);
	pgcoord *c = NULL;
	cr_assert_eq(pgcoord_connect(NULL, 2000, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	pgcoord_close(c);
	fake_stop();
}

Test(connect, missing_socket_is_connect_error_with_errno)
{
	pgcoord *c = (pgcoord *)1;
	cr_assert_eq(pgcoord_connect("/nonexistent/pgcoord/agent.sock", 1000, &c),
		     PGCOORD_E_CONNECT);
	cr_assert_eq(errno, ENOENT);
	cr_assert_null(c);
}

Test(connect, overlong_path_is_argument_error)
{
	char path[300];
	pgcoord *c = NULL;
	memset(path, 'a', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	cr_assert_eq(pgcoord_connect(path, 1000, &c), PGCOORD_E_ARG);
	cr_assert_null(c);
	cr_assert_eq(pgcoord_connect("", 1000, &c), PGCOORD_E_ARG);
}

Test(connect, null_handles_are_harmless)
{
	pgcoord_close(NULL);
	cr_assert_str_eq(pgcoord_last_message(NULL), "");
	cr_assert_eq(pgcoord_fd(NULL), -1);
	cr_assert_eq(pgcoord_session_id(NULL), 0);
	cr_assert_eq(pgcoord_ping(NULL, 10), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_poll(NULL, 0, NULL), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_connect(NULL, 10, NULL), PGCOORD_E_ARG);
}

/* --- leases --------------------------------------------------------------- */

static void reply_acquire(struct fake *f, uint32_t msgid, bool leader, int64_t epoch,
			  int64_t valid_ms)
{
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, msgid);
	msgpack_pack_map(&o.pk, 8);
	pgc_pack_kv_str(&o.pk, "name", "job");
	pgc_pack_kv_bool(&o.pk, "leader", leader);
	pgc_pack_kv_int(&o.pk, "epoch", epoch);
	pgc_pack_kv_int(&o.pk, "valid_ms", valid_ms);
	pgc_pack_kv_bool(&o.pk, "campaigning", !leader);
	pgc_pack_kv_int(&o.pk, "ttl_ms", 3000);
	pgc_pack_cstr(&o.pk, "holder");
	msgpack_pack_nil(&o.pk);
	pgc_pack_kv_int(&o.pk, "expires_in_ms", 0);
	out_send(f, &o);
}

static void notify_changed(struct fake *f, const char *name, int64_t epoch, bool leader,
			   int64_t valid_ms, int64_t session)
{
	struct out o;
	out_init(&o);
	pgc_pack_notify_begin(&o.pk, "lease.changed");
	msgpack_pack_map(&o.pk, 7);
	pgc_pack_kv_str(&o.pk, "name", name);
	pgc_pack_kv_int(&o.pk, "epoch", epoch);
	pgc_pack_kv_bool(&o.pk, "leader", leader);
	pgc_pack_kv_int(&o.pk, "valid_ms", valid_ms);
	pgc_pack_kv_int(&o.pk, "session", session);
	pgc_pack_cstr(&o.pk, "holder");
	msgpack_pack_nil(&o.pk);
	pgc_pack_kv_str(&o.pk, "reason", leader ? "acquired" : "released by its holder");
	out_send(f, &o);
}

static void notify_renewed(struct fake *f, const char *name, int64_t epoch, int64_t valid_ms)
{
	struct out o;
	out_init(&o);
	pgc_pack_notify_begin(&o.pk, "lease.renewed");
	msgpack_pack_map(&o.pk, 4);
	pgc_pack_kv_str(&o.pk, "name", name);
	pgc_pack_kv_int(&o.pk, "epoch", epoch);
	pgc_pack_kv_bool(&o.pk, "leader", true);
	pgc_pack_kv_int(&o.pk, "valid_ms", valid_ms);
	out_send(f, &o);
}

/* session.open answered 42, then lease.acquire of "job" won with epoch 7 and
 * valid_ms as the agent does it: lease.changed first, then the result. */
static bool fake_open_and_win(struct fake *f, int64_t valid_ms)
{
	struct req r;
	if (!fake_expect(f, &r, "session.open"))
		return false;
	reply_session(f, r.msgid, 42, false);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.acquire"))
		return false;
	notify_changed(f, "job", 7, true, valid_ms, 42);
	reply_acquire(f, r.msgid, true, 7, valid_ms);
	req_free(&r);
	return true;
}

static void open_and_win(pgcoord *c)
{
	bool leader = false;
	int64_t epoch = 0;
	cr_assert_eq(pgcoord_session_open(c, "leader", 2000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", 0, false, 2000, &leader, &epoch), PGCOORD_OK,
		     "%s", pgcoord_last_message(c));
	cr_assert(leader);
	cr_assert_eq(epoch, 7);
}

static void script_acquire_then_silence(struct fake *f)
{
	struct req r;
	int64_t ttl = 0;
	bool wait = false;
	if (!fake_expect(f, &r, "session.open"))
		return;
	reply_session(f, r.msgid, 42, false);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.acquire"))
		return;
	if (!pgc_obj_str_eq(pgc_map_get(r.params, "name"), "job") ||
	    !pgc_obj_int64(pgc_map_get(r.params, "ttl_ms"), &ttl) || ttl != 3000 ||
	    !pgc_obj_bool(pgc_map_get(r.params, "wait"), &wait) || !wait)
		fake_failf(f, "lease.acquire did not send {name: job, ttl_ms: 3000, wait: true}");
	notify_changed(f, "job", 7, true, 300, 42);
	reply_acquire(f, r.msgid, true, 7, 300);
	req_free(&r);
	/* then nothing at all, as from an agent frozen by SIGSTOP */
	fake_wait_hangup(f);
}

Test(lease, belief_ends_at_the_local_deadline_without_any_message, .timeout = 10)
{
	struct seen_notes seen = {0};
	bool leader = false;
	int64_t epoch = 0;
	int delivered = 0;

	fake_start(script_acquire_then_silence);
	pgcoord *c = connect_fake();
	pgcoord_set_notify(c, on_notify, &seen);
	cr_assert_eq(pgcoord_session_open(c, NULL, 2000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", 3000, true, 2000, &leader, &epoch), PGCOORD_OK,
		     "%s", pgcoord_last_message(c));
	cr_assert(leader);
	cr_assert_eq(epoch, 7);
	cr_assert(pgcoord_lease_is_leader(c, "job"));
	cr_assert_eq(pgcoord_lease_epoch(c, "job"), 7);
	cr_assert_eq(pgcoord_lease_ttl_ms(c, "job"), 3000, "the ttl from the acquire result");
	int64_t left = pgcoord_lease_valid_ms(c, "job");
	cr_assert(left > 0 && left <= 300, "valid_ms %lld", (long long)left);
	cr_assert_not(pgcoord_lease_is_leader(c, "other"));

	usleep(350 * 1000);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"), "the deadline passed in silence");
	cr_assert_eq(pgcoord_lease_valid_ms(c, "job"), 0);
	cr_assert_eq(pgcoord_lease_epoch(c, "job"), 0);

	/* The library read the notification, and the application still gets it. */
	cr_assert_eq(pgcoord_poll(c, 0, &delivered), PGCOORD_OK);
	cr_assert_eq(delivered, 1);
	cr_assert_str_eq(seen.method, "lease.changed");
	pgcoord_close(c);
	fake_stop();
}

static void script_campaign_renew_and_lose(struct fake *f)
{
	struct req r;
	if (!fake_expect(f, &r, "session.open"))
		return;
	reply_session(f, r.msgid, 42, false);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.acquire"))
		return;
	reply_acquire(f, r.msgid, false, 3, 0); /* campaigning: someone else holds epoch 3 */
	req_free(&r);

	if (!fake_expect(f, &r, "agent.ping"))
		return;
	/* Not ours: another session's win must not make this handle lead. */
	notify_changed(f, "job", 8, true, 5000, 99);
	notify_changed(f, "job", 9, true, 400, 42);
	reply_pong(f, r.msgid);
	req_free(&r);

	if (!fake_expect(f, &r, "agent.ping"))
		return;
	notify_renewed(f, "job", 9, 1500);
	notify_renewed(f, "job", 8, 60000); /* another epoch: ignored */
	reply_pong(f, r.msgid);
	req_free(&r);

	/* The client now waits for the push below without calling. */
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_pong(f, r.msgid);
	req_free(&r);
	usleep(100 * 1000);
	notify_changed(f, "job", 9, false, 0, 42);
	fake_wait_hangup(f);
}

Test(lease, renewals_extend_belief_and_a_pushed_end_counts_after_refresh, .timeout = 10)
{
	struct seen_notes seen = {0};
	bool leader = true;
	int64_t epoch = 0;
	int delivered = 0;

	fake_start(script_campaign_renew_and_lose);
	pgcoord *c = connect_fake();
	pgcoord_set_notify(c, on_notify, &seen);
	cr_assert_eq(pgcoord_session_open(c, NULL, 2000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", 0, true, 2000, &leader, &epoch), PGCOORD_OK);
	cr_assert_not(leader);
	cr_assert_eq(epoch, 3, "the holder's epoch");
	cr_assert_not(pgcoord_lease_is_leader(c, "job"));

	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	cr_assert(pgcoord_lease_is_leader(c, "job"), "lease.changed leader=true, read by a call");
	cr_assert_eq(pgcoord_lease_epoch(c, "job"), 9, "our own win, not session 99's");
	cr_assert_leq(pgcoord_lease_valid_ms(c, "job"), 400);

	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	int64_t left = pgcoord_lease_valid_ms(c, "job");
	cr_assert(left > 400 && left <= 1500, "renewed to %lld ms", (long long)left);

	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	int64_t t0 = 0;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	while (pgcoord_lease_is_leader(c, "job")) {
		usleep(5 * 1000);
		cr_assert_eq(pgcoord_lease_refresh(c), PGCOORD_OK);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		cr_assert_lt((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 - t0, 1000,
			     "the pushed lease.changed leader=false was not taken in");
	}
	cr_assert_eq(seen.count, 0, "callbacks still run only from pgcoord_poll");
	cr_assert_eq(pgcoord_poll(c, 0, &delivered), PGCOORD_OK);
	cr_assert_eq(delivered, 5, "every lease notification reaches the application too");
	cr_assert_str_eq(seen.method, "lease.changed");
	cr_assert_str_eq(seen.reason, "released by its holder");
	pgcoord_close(c);
	fake_stop();
}

static void script_renewal_left_unread(struct fake *f)
{
	struct req r;
	if (!fake_open_and_win(f, 5000))
		return;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	reply_pong(f, r.msgid);
	req_free(&r);
	/* After the pong, in a read of its own: the client is not reading. */
	usleep(30 * 1000);
	notify_renewed(f, "job", 7, 300);
	fake_wait_hangup(f);
}

Test(lease, deadline_counts_from_when_the_socket_was_last_seen_empty, .timeout = 10)
{
	fake_start(script_renewal_left_unread);
	pgcoord *c = connect_fake();
	open_and_win(c);
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	/* The renewal (300 ms) waits unread in the socket for 400 ms: dating it
	 * by when it was read would believe for 300 ms more. */
	usleep(400 * 1000);
	cr_assert_eq(pgcoord_lease_refresh(c), PGCOORD_OK);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"));
	pgcoord_close(c);
	fake_stop();
}

static void script_lost_then_hang_up(struct fake *f)
{
	struct req r;
	if (!fake_open_and_win(f, 60000))
		return;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	notify_session_lost(f, 42);
	reply_pong(f, r.msgid);
	req_free(&r);

	if (!fake_expect(f, &r, "session.open"))
		return;
	reply_session(f, r.msgid, 43, false);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.acquire"))
		return;
	notify_changed(f, "job", 10, true, 60000, 43);
	reply_acquire(f, r.msgid, true, 10, 60000);
	req_free(&r);
	/* then the agent dies */
}

Test(lease, session_loss_and_a_broken_connection_end_belief_at_once, .timeout = 10)
{
	bool leader = false;
	fake_start(script_lost_then_hang_up);
	pgcoord *c = connect_fake();
	open_and_win(c);
	cr_assert(pgcoord_lease_is_leader(c, "job"));
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"), "session.lost ends every belief");

	cr_assert_eq(pgcoord_session_open(c, NULL, 2000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", 0, false, 2000, &leader, NULL), PGCOORD_OK);
	cr_assert(leader);
	fake_stop(); /* the fake agent hangs up */
	/* The question does no I/O: it neither reads the hang-up nor closes. */
	cr_assert(pgcoord_lease_is_leader(c, "job"));
	cr_assert_neq(pgcoord_fd(c), -1);
	cr_assert_eq(pgcoord_lease_refresh(c), PGCOORD_E_IO);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"), "no agent, no belief");
	cr_assert_eq(pgcoord_fd(c), -1);
	cr_assert_eq(pgcoord_lease_refresh(c), PGCOORD_E_CLOSED);
	pgcoord_close(c);
}

static void script_release_unanswered(struct fake *f)
{
	struct req r;
	if (!fake_open_and_win(f, 60000))
		return;
	if (!fake_expect(f, &r, "lease.release"))
		return;
	if (!pgc_obj_str_eq(pgc_map_get(r.params, "name"), "job"))
		fake_failf(f, "lease.release without name \"job\"");
	req_free(&r); /* never answered */
	if (!fake_expect(f, &r, "lease.release"))
		return;
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 1);
	pgc_pack_kv_bool(&o.pk, "released", true);
	out_send(f, &o);
	req_free(&r);
	fake_wait_hangup(f);
}

Test(lease, release_ends_belief_before_the_agent_answers, .timeout = 10)
{
	bool released = false;
	fake_start(script_release_unanswered);
	pgcoord *c = connect_fake();
	open_and_win(c);
	cr_assert_eq(pgcoord_lease_release(c, "job", 100, &released), PGCOORD_E_CALL_TIMEOUT);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"));
	cr_assert_eq(pgcoord_lease_release(c, "job", 2000, &released), PGCOORD_OK);
	cr_assert(released);
	pgcoord_close(c);
	fake_stop();
}

static void script_suspended(struct fake *f)
{
	struct req r;
	struct out o;
	if (!fake_open_and_win(f, 60000))
		return;
	if (!fake_expect(f, &r, "agent.ping"))
		return;
	out_init(&o);
	pgc_pack_notify_begin(&o.pk, "session.suspended");
	msgpack_pack_map(&o.pk, 2);
	pgc_pack_kv_int(&o.pk, "session", 42);
	pgc_pack_kv_int(&o.pk, "safe_ms", 200);
	out_send(f, &o);
	reply_pong(f, r.msgid);
	req_free(&r);
	fake_wait_hangup(f);
}

Test(lease, session_suspended_caps_belief_at_safe_ms, .timeout = 10)
{
	fake_start(script_suspended);
	pgcoord *c = connect_fake();
	open_and_win(c);
	cr_assert_eq(pgcoord_ping(c, 2000), PGCOORD_OK);
	cr_assert(pgcoord_lease_is_leader(c, "job"));
	cr_assert_leq(pgcoord_lease_valid_ms(c, "job"), 200);
	usleep(250 * 1000);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"));
	pgcoord_close(c);
	fake_stop();
}

static void script_status_and_list(struct fake *f)
{
	struct req r;
	struct out o;
	if (!fake_expect(f, &r, "lease.status"))
		return;
	if (!pgc_obj_str_eq(pgc_map_get(r.params, "name"), "job"))
		fake_failf(f, "lease.status without name \"job\"");
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 2);
	pgc_pack_kv_str(&o.pk, "name", "job");
	pgc_pack_kv_int(&o.pk, "epoch", 12);
	out_send(f, &o);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.status"))
		return;
	reply_error(f, r.msgid, "not_found", "no lease named \"nope\" was ever acquired", false);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.list"))
		return;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 1);
	pgc_pack_cstr(&o.pk, "leases");
	msgpack_pack_array(&o.pk, 0);
	out_send(f, &o);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.acquire"))
		return;
	reply_error(f, r.msgid, "no_session", "call session.open first", false);
	req_free(&r);
}

Test(lease, status_and_list_hand_back_the_result_map, .timeout = 10)
{
	void *res = NULL;
	size_t len = 0;
	int64_t epoch = -1;
	bool leader = true;

	fake_start(script_status_and_list);
	pgcoord *c = connect_fake();
	cr_assert_eq(pgcoord_lease_status(c, "job", 2000, &res, &len), PGCOORD_OK);
	msgpack_unpacked u;
	size_t off = 0;
	msgpack_unpacked_init(&u);
	cr_assert_eq(msgpack_unpack_next(&u, res, len, &off), MSGPACK_UNPACK_SUCCESS);
	cr_assert(pgc_obj_int64(pgc_map_get(&u.data, "epoch"), &epoch));
	cr_assert_eq(epoch, 12);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);

	cr_assert_eq(pgcoord_lease_status(c, "nope", 2000, &res, &len), PGCOORD_E_NOT_FOUND);
	cr_assert_null(res);
	cr_assert_eq(pgcoord_lease_list(c, 2000, &res, &len), PGCOORD_OK);
	cr_assert_not_null(res);
	pgcoord_free(res);

	/* Refused locally: nothing is sent. */
	cr_assert_eq(pgcoord_lease_acquire(c, "", 0, false, 2000, &leader, &epoch), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", -1, false, 2000, NULL, NULL), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_lease_release(c, NULL, 2000, NULL), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_lease_status(c, "", 2000, NULL, NULL), PGCOORD_E_ARG);

	cr_assert_eq(pgcoord_lease_acquire(c, "job", 0, true, 2000, &leader, &epoch),
		     PGCOORD_E_NO_SESSION);
	cr_assert_not(leader);
	cr_assert_eq(epoch, 0);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"));
	pgcoord_close(c);
	fake_stop();
}

Test(lease, null_arguments_are_harmless)
{
	cr_assert_not(pgcoord_lease_is_leader(NULL, "job"));
	cr_assert_eq(pgcoord_lease_valid_ms(NULL, "job"), 0);
	cr_assert_eq(pgcoord_lease_epoch(NULL, "job"), 0);
	cr_assert_eq(pgcoord_lease_ttl_ms(NULL, "job"), 0);
	cr_assert_eq(pgcoord_lease_acquire(NULL, "job", 0, false, 10, NULL, NULL), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_lease_release(NULL, "job", 10, NULL), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_lease_status(NULL, "job", 10, NULL, NULL), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_lease_list(NULL, 10, NULL, NULL), PGCOORD_E_ARG);
}

/* An agent that computed valid_ms, then stalled before writing: its
 * monotonic deadline (shared on one host) is earlier than receipt +
 * valid_ms, and that earlier deadline is the one that counts. */
static void script_win_with_stale_valid_ms(struct fake *f)
{
	struct req r;
	struct timespec ts;
	if (!fake_expect(f, &r, "session.open"))
		return;
	reply_session(f, r.msgid, 42, false);
	req_free(&r);
	if (!fake_expect(f, &r, "lease.acquire"))
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	struct out o;
	out_init(&o);
	pgc_pack_response_ok_begin(&o.pk, r.msgid);
	msgpack_pack_map(&o.pk, 5);
	pgc_pack_kv_str(&o.pk, "name", "job");
	pgc_pack_kv_bool(&o.pk, "leader", true);
	pgc_pack_kv_int(&o.pk, "epoch", 7);
	pgc_pack_kv_int(&o.pk, "valid_ms", 5000);
	pgc_pack_kv_int(&o.pk, "valid_until_mono_ms", now + 200);
	out_send(f, &o);
	req_free(&r);
	fake_wait_hangup(f);
}

Test(lease, the_agents_monotonic_deadline_caps_a_stale_valid_ms, .timeout = 10)
{
	bool leader = false;
	int64_t epoch = 0;

	fake_start(script_win_with_stale_valid_ms);
	pgcoord *c = connect_fake();
	cr_assert_eq(pgcoord_session_open(c, NULL, 2000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", 0, false, 2000, &leader, &epoch), PGCOORD_OK,
		     "%s", pgcoord_last_message(c));
	cr_assert(leader);
	int64_t left = pgcoord_lease_valid_ms(c, "job");
	cr_assert(left > 0 && left <= 200, "valid_ms %lld, not capped at 200", (long long)left);
	usleep(250 * 1000);
	cr_assert_not(pgcoord_lease_is_leader(c, "job"));
	pgcoord_close(c);
	fake_stop();
}
