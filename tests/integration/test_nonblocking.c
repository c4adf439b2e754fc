/*
 * test_nonblocking.c — libpgcoord's event-loop calls (pgcoord_send,
 * pgcoord_flush, pgcoord_consume) driven by a poll(2) loop against a real
 * agent: several requests in flight at once, each answer to its own
 * callback, a synchronous call mixed in, and the database agreeing.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <msgpack.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(nonblocking, .timeout = 60);

#define CALL_MS 10000

struct answer {
	int calls;
	uint32_t msgid;
	pgcoord_err err;
	char message[128];
	char status[16]; /* permit.claim's result status */
};

static void on_reply(void *user, uint32_t msgid, pgcoord_err err, const void *result,
		     size_t result_len, const char *message)
{
	struct answer *a = user;
	a->calls++;
	a->msgid = msgid;
	a->err = err;
	snprintf(a->message, sizeof(a->message), "%s", message);
	if (err != PGCOORD_OK)
		return;
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, result, result_len, NULL) == MSGPACK_UNPACK_SUCCESS) {
		const msgpack_object *st = pgc_map_get(&u.data, "status");
		const char *s;
		size_t n;
		if (st && pgc_obj_str(st, &s, &n))
			snprintf(a->status, sizeof(a->status), "%.*s", (int)n, s);
	}
	msgpack_unpacked_destroy(&u);
}

/* {id: id, quotas: [{key: "q"}]} */
static char *claim_params(const char *id, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	pgc_pack_kv_str(&pk, "id", id);
	pgc_pack_cstr(&pk, "quotas");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_map(&pk, 1);
	pgc_pack_kv_str(&pk, "key", "q");
	*len = sb.size;
	return sb.data; /* the caller frees it */
}

/* The loop: POLLOUT while requests wait to be written, POLLIN always,
 * until every answer in `answers` came. */
static void run_loop(pgcoord *c, struct answer *const *answers, size_t n)
{
	int64_t until = hnow_ms() + CALL_MS;
	for (;;) {
		size_t done = 0;
		for (size_t i = 0; i < n; i++)
			done += answers[i]->calls > 0;
		if (done == n)
			return;
		cr_assert_lt(hnow_ms(), until, "%zu of %zu answers in %d ms", done, n, CALL_MS);
		struct pollfd pfd = {.fd = pgcoord_fd(c),
				     .events = POLLIN | (pgcoord_want_write(c) ? POLLOUT : 0)};
		cr_assert_geq(poll(&pfd, 1, 100), 0);
		if (pfd.revents & POLLOUT)
			cr_assert_eq(pgcoord_flush(c), PGCOORD_OK, "%s", pgcoord_last_message(c));
		if (pfd.revents & (POLLIN | POLLHUP))
			cr_assert_eq(pgcoord_consume(c, NULL), PGCOORD_OK, "%s",
				     pgcoord_last_message(c));
	}
}

Test(nonblocking, calls_in_flight_at_once_each_reach_their_callback)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "nonblocking", NULL);
	pgcoord *c = NULL;
	struct answer claim = {0}, ping = {0}, missing = {0};
	uint32_t claim_id, ping_id, missing_id;
	size_t len;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "loop", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "q", 1, -1, CALL_MS), PGCOORD_OK);

	/* three requests queued before any answer is read */
	char *params = claim_params("nb-1", &len);
	cr_assert_eq(pgcoord_send(c, "permit.claim", params, len, on_reply, &claim, &claim_id),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	free(params);
	cr_assert_eq(pgcoord_send(c, "agent.ping", NULL, 0, on_reply, &ping, &ping_id), PGCOORD_OK);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	pgc_pack_kv_str(&pk, "key", "no-such-quota");
	cr_assert_eq(
	    pgcoord_send(c, "quota.get", sb.data, sb.size, on_reply, &missing, &missing_id),
	    PGCOORD_OK);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(claim_id != ping_id && ping_id != missing_id && claim_id != missing_id);
	cr_assert_eq(claim.calls + ping.calls + missing.calls, 0, "answered before consume");

	struct answer *const all[] = {&claim, &ping, &missing};
	run_loop(c, all, 3);
	cr_assert_eq(claim.calls, 1);
	cr_assert_eq(claim.msgid, claim_id);
	cr_assert_eq(claim.err, PGCOORD_OK, "%s", claim.message);
	cr_assert_str_eq(claim.status, "admitted");
	cr_assert_eq(ping.calls, 1);
	cr_assert_eq(ping.msgid, ping_id);
	cr_assert_eq(ping.err, PGCOORD_OK);
	cr_assert_eq(missing.calls, 1);
	cr_assert_eq(missing.msgid, missing_id);
	cr_assert_eq(missing.err, PGCOORD_E_NOT_FOUND);
	cr_assert_neq(missing.message[0], '\0');
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits WHERE id = 'nb-1' "
				    "AND state = 'held' AND owner_session = %lld",
				    (long long)pgcoord_session_id(c)),
		     1);

	/* a synchronous call while a sent request is unanswered: the sent
	 * one's answer waits for pgcoord_consume */
	struct answer second = {0};
	params = claim_params("nb-2", &len);
	cr_assert_eq(pgcoord_send(c, "permit.claim", params, len, on_reply, &second, NULL),
		     PGCOORD_OK);
	free(params);
	cr_assert_eq(pgcoord_ping(c, CALL_MS), PGCOORD_OK, "%s", pgcoord_last_message(c));
	struct answer *const one[] = {&second};
	run_loop(c, one, 1);
	cr_assert_eq(second.err, PGCOORD_OK);
	cr_assert_str_eq(second.status, "denied");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'nb-2'"),
		     0);

	/* more than the socket takes: the rest stays queued, in order, and
	 * goes out as the loop flushes (the send buffer made small for it).
	 * The agent is stopped while the requests are sent: a running agent
	 * can read the socket as fast as it fills, and then all of it goes
	 * out at once. */
	int small = 4096;
	cr_assert_eq(setsockopt(pgcoord_fd(c), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	cr_assert_eq(kill(hagent_pid(a), SIGSTOP), 0);
	enum { BIG = 6 };
	struct answer big[BIG] = {{0}};
	struct answer *big_all[BIG];
	char *pad = calloc(1, 100000);
	cr_assert_not_null(pad);
	for (int i = 0; i < BIG; i++) {
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		msgpack_pack_map(&pk, 2);
		pgc_pack_kv_str(&pk, "key", "q");
		pgc_pack_cstr(&pk, "x-padding"); /* keys starting with x- are ignored */
		msgpack_pack_bin(&pk, 100000);
		msgpack_pack_bin_body(&pk, pad, 100000);
		cr_assert_eq(
		    pgcoord_send(c, "quota.get", sb.data, sb.size, on_reply, &big[i], NULL),
		    PGCOORD_OK, "%s", pgcoord_last_message(c));
		msgpack_sbuffer_destroy(&sb);
		big_all[i] = &big[i];
	}
	free(pad);
	cr_assert(pgcoord_want_write(c), "600 kB went into a 4 kB send buffer at once");
	cr_assert_eq(kill(hagent_pid(a), SIGCONT), 0);
	run_loop(c, big_all, BIG);
	cr_assert_not(pgcoord_want_write(c));
	for (int i = 0; i < BIG; i++)
		cr_assert(big[i].err == PGCOORD_OK || big[i].err == PGCOORD_E_BUSY, "%d: %d %s", i,
			  big[i].err, big[i].message);
	cr_assert_eq(big[0].err, PGCOORD_OK, "%s", big[0].message);

	/* the agent goes away: what is in flight ends with PGCOORD_E_IO */
	struct answer orphan = {0};
	cr_assert_eq(pgcoord_send(c, "agent.ping", NULL, 0, on_reply, &orphan, NULL), PGCOORD_OK);
	hagent_destroy(a);
	int64_t until = hnow_ms() + CALL_MS;
	while (orphan.calls == 0) {
		cr_assert_lt(hnow_ms(), until);
		struct pollfd pfd = {.fd = pgcoord_fd(c), .events = POLLIN};
		if (pfd.fd < 0)
			break;
		poll(&pfd, 1, 100);
		pgcoord_consume(c, NULL);
	}
	cr_assert_eq(orphan.calls, 1);
	cr_assert(orphan.err == PGCOORD_E_IO || orphan.err == PGCOORD_OK, "%d", orphan.err);
	/* then the end of the connection itself */
	pgcoord_err end;
	while ((end = pgcoord_consume(c, NULL)) == PGCOORD_OK) {
		cr_assert_lt(hnow_ms(), until, "the closed connection was not noticed");
		poll(&(struct pollfd){.fd = pgcoord_fd(c), .events = POLLIN}, 1, 100);
	}
	cr_assert(end == PGCOORD_E_IO || end == PGCOORD_E_CLOSED, "%d", end);
	cr_assert_eq(pgcoord_consume(c, NULL), PGCOORD_E_CLOSED);

	pgcoord_close(c);
	hdb_drop(db);
}
