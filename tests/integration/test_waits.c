/*
 * test_waits.c — waiting claims (permit.claim {wait_ms}, permit.cancel,
 * permit.admitted, permit.expired) against a real Postgres and several
 * real agents. The database is the judge: the audit rows show who was
 * admitted, in which order, and that no admission came while the slot was
 * held; the queue is empty at the end.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(waits, .timeout = 60);

#define POLL_MS 50
/* a poll interval, the statement and the socket, on a busy CI machine */
#define HEAR_MS (POLL_MS + 3000)
#define WAITERS_PER_AGENT 10

static const char *const wait_args[] = {"--wait-poll-ms", "50", NULL};
static const char *const http_args[] = {"--wait-poll-ms", "50", "--metrics-listen", "127.0.0.1:0",
					NULL};

/* Claims and checks the status; answers the reply's position (0 if none). */
static int64_t claim(int fd, const char *id, const char *key, int64_t weight, int64_t wait_ms,
		     const char *want)
{
	struct ireply r;
	iclaim_call(fd, id, key, weight, wait_ms, &r);
	const msgpack_object *res = iok(&r, "permit.claim");
	char *status = istr(res, "status");
	cr_assert_str_eq(status, want, "claim %s", id);
	free(status);
	int64_t position = 0;
	if (strcmp(want, "queued") == 0) {
		position = iint(res, "position");
		cr_assert(ibool(res, "mine"));
		cr_assert_gt(iint(res, "deadline_at"), iint(res, "queued_at"));
	}
	ireply_destroy(&r);
	return position;
}

static const msgpack_object *id_call(int fd, const char *method, const char *id, struct ireply *r)
{
	struct iparams p;
	pgc_pack_kv_str(iparams_begin(&p, 1), "id", id);
	icall(fd, method, &p, r);
	iparams_destroy(&p);
	return r->m.type == PGC_RPC_RESPONSE && !r->m.error ? r->m.result : NULL;
}

static void release(int fd, const char *id)
{
	struct ireply r;
	id_call(fd, "permit.release", id, &r);
	iok(&r, "permit.release");
	ireply_destroy(&r);
}

/* 3 agents x 10 waiters on a quota of 1: each admitted exactly once, in
 * arrival order, never while the slot was held; the queue ends empty. */
Test(waits, thirty_waiters_on_three_agents_are_admitted_once_in_order)
{
	struct harness_db *db = idb_migrated();
	struct hagent *ag[3];
	int fds[3 * WAITERS_PER_AGENT], holder;
	char id[32];

	for (int a = 0; a < 3; a++) {
		snprintf(id, sizeof(id), "wait-%d", a);
		ag[a] = hagent_start(db, id, a == 0 ? http_args : wait_args);
	}
	holder = iconnect(hagent_socket(ag[0]));
	isession_open(holder, "holder");
	iquota_set(holder, "slot", 1);
	claim(holder, "first", "slot", 1, 0, "admitted");
	for (int i = 0; i < 3 * WAITERS_PER_AGENT; i++) {
		fds[i] = iconnect(hagent_socket(ag[i % 3]));
		isession_open(fds[i], "waiter");
		snprintf(id, sizeof(id), "w-%02d", i);
		cr_assert_eq(claim(fds[i], id, "slot", 1, 30000, "queued"), i + 1);
	}
	cr_assert_eq(hdb_query_long(db, "SELECT waiting FROM pgcoord.quotas WHERE key = 'slot'"),
		     3 * WAITERS_PER_AGENT);
	/* nobody overtakes the queue, even with room: not an immediate claim */
	claim(holder, "pushy", "slot", 1, 0, "denied");
	/* the queue on the status page; this agent's waiters in its metrics */
	char *page = ihttp_get(ag[0], "/status");
	cr_assert(strstr(page, "<table id=\"queues\">") &&
		      strstr(page, "<td>slot</td><td>30</td>") &&
		      strstr(page, "<td>w-00</td><td>1</td>"),
		  "%s", page);
	free(page);
	page = ihttp_get(ag[0], "/metrics");
	cr_assert(strstr(page, "\npgcoord_permit_waiters 10\n"), "%s", page);
	free(page);
	cr_assert_eq(istatus_int(ag[1], "waiters"), WAITERS_PER_AGENT);

	release(holder, "first");
	for (int i = 0; i < 3 * WAITERS_PER_AGENT; i++) {
		struct ireply n;
		snprintf(id, sizeof(id), "w-%02d", i);
		ihear(fds[i], "permit.admitted", HEAR_MS, &n);
		cr_assert(istr_is(n.m.params, "id", id));
		cr_assert_gt(iint(n.m.params, "token"), 0);
		cr_assert_eq(iint(n.m.params, "owner_session"),
			     hdb_query_long(db,
					    "SELECT owner_session FROM pgcoord.permits "
					    "WHERE id = '%s'",
					    id));
		cr_assert_geq(iint(n.m.params, "queued_ms"), 0);
		ireply_destroy(&n);
		cr_assert_eq(
		    hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'slot'"),
		    1);
		release(fds[i], id);
	}

	/* the audit trail: admitted and released alternate on the slot, in
	 * arrival order, each waiter exactly once */
	char *events = hdb_query_value(
	    db, "SELECT string_agg(event || ':' || permit_id, ',' ORDER BY id) "
		"FROM pgcoord.permit_events WHERE key = 'slot' AND permit_id IS NOT NULL");
	char want[4096] = "admitted:first,released:first";
	for (int i = 0; i < 3 * WAITERS_PER_AGENT; i++) {
		size_t len = strlen(want);
		snprintf(want + len, sizeof(want) - len, ",admitted:w-%02d,released:w-%02d", i, i);
	}
	cr_assert_str_eq(events, want);
	free(events);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.waiters"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT waiting + in_flight FROM pgcoord.quotas "
					"WHERE key = 'slot'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'pushy'"),
		     0);
	page = ihttp_get(ag[0], "/metrics");
	cr_assert(strstr(page, "\npgcoord_permit_waiters 0\n") &&
		      strstr(page, "\npgcoord_permit_queue_admitted_total 10\n"),
		  "%s", page);
	free(page);

	for (int i = 0; i < 3 * WAITERS_PER_AGENT; i++)
		close(fds[i]);
	close(holder);
	for (int a = 0; a < 3; a++)
		hagent_destroy(ag[a]);
	hdb_drop(db);
}

/* Expiry, retry, conflict, cancel, session end, and a raised limit. */
Test(waits, a_waiter_leaves_by_expiry_cancel_or_session_end_and_a_raised_limit_admits)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "wait-one", wait_args);
	int holder = iconnect(hagent_socket(a)), fa = iconnect(hagent_socket(a)),
	    fb = iconnect(hagent_socket(a)), fd = iconnect(hagent_socket(a));
	struct ireply r, n;
	const msgpack_object *res;

	isession_open(holder, "holder");
	isession_open(fa, "a");
	isession_open(fb, "b");
	int64_t sd = isession_open(fd, "d");
	iquota_set(holder, "q", 1);
	claim(holder, "held", "q", 1, 0, "admitted");

	/* "short" must outlive the next four calls (which count it in the
	 * queue) on a loaded machine, and still expire well within HEAR_MS */
	cr_assert_eq(claim(fa, "short", "q", 1, 1500, "queued"), 1);
	cr_assert_eq(claim(fb, "long", "q", 1, 30000, "queued"), 2);
	/* a retry answers where it stands; other weights are another claim */
	cr_assert_eq(claim(fb, "long", "q", 1, 30000, "queued"), 2);
	iclaim_call(fb, "long", "q", 2, 30000, &r);
	ierr(&r, "conflict", false, NULL);
	ireply_destroy(&r);
	/* out of range */
	iclaim_call(fb, "bad", "q", 1, 3600001, &r);
	ierr(&r, "invalid_params", false, NULL);
	ireply_destroy(&r);

	ihear(fa, "permit.expired", HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "id", "short"));
	cr_assert(istr_is(n.m.params, "reason", "wait_ms elapsed"));
	ireply_destroy(&n);
	cr_assert_eq(claim(fb, "long", "q", 1, 30000, "queued"), 1);
	/* the expired id is free again */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'short'"),
		     0);

	/* an admin (the tests run as root) cancels another session's waiter:
	 * its owner is told */
	id_call(fa, "permit.cancel", "long", &r);
	res = iok(&r, "permit.cancel");
	cr_assert(ibool(res, "cancelled"));
	ireply_destroy(&r);
	ihear(fb, "permit.expired", HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "id", "long"));
	cr_assert(istr_is(n.m.params, "reason", "cancelled"));
	ireply_destroy(&n);
	/* its own session cancels, once */
	cr_assert_eq(claim(fb, "mine", "q", 1, 30000, "queued"), 1);
	id_call(fb, "permit.cancel", "mine", &r);
	res = iok(&r, "permit.cancel");
	cr_assert(ibool(res, "cancelled"));
	cr_assert(istr_is(res, "status", "cancelled"));
	ireply_destroy(&r);
	id_call(fb, "permit.cancel", "mine", &r);
	ierr(&r, "not_found", false,
	     (const char *const[]){"no queued claim or permit \"mine\"", NULL});
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.waiters"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT waiting FROM pgcoord.quotas WHERE key = 'q'"), 0);

	/* session end takes its waiters out in the same transaction */
	claim(fd, "gone", "q", 1, 30000, "queued");
	struct ireply c;
	icall_ok(fd, "session.close", NULL, &c);
	ireply_destroy(&c);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.waiters WHERE session = %lld",
				    (long long)sd),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT waiting FROM pgcoord.quotas WHERE key = 'q'"), 0);

	/* a raised limit admits the head in the same commit */
	claim(fb, "next", "q", 1, 30000, "queued");
	iquota_set(holder, "q", 2);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'next' AND state = "
			       "'held'"),
	    1);
	ihear(fb, "permit.admitted", HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "id", "next"));
	ireply_destroy(&n);
	/* admitted: cancel says the caller holds it */
	res = id_call(fb, "permit.cancel", "next", &r);
	res = iok(&r, "permit.cancel");
	cr_assert_not(ibool(res, "cancelled"));
	cr_assert(istr_is(res, "status", "held"));
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 2);

	close(holder);
	close(fa);
	close(fb);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A heavy head blocks lighter waiters behind it until it fits. */
Test(waits, a_heavy_head_blocks_lighter_waiters_behind_it)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "wait-hol", wait_args);
	int holder = iconnect(hagent_socket(a)), fh = iconnect(hagent_socket(a)),
	    fl = iconnect(hagent_socket(a));
	struct ireply n;

	isession_open(holder, "holder");
	isession_open(fh, "heavy");
	isession_open(fl, "light");
	iquota_set(holder, "w", 3);
	claim(holder, "big", "w", 2, 0, "admitted");
	cr_assert_eq(claim(fh, "heavy", "w", 2, 30000, "queued"), 1);
	/* one unit is free, but the light claim waits behind the heavy one */
	cr_assert_eq(claim(fl, "light", "w", 1, 30000, "queued"), 2);
	claim(holder, "quick", "w", 1, 0, "denied");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'w'"), 2);
	/* a blocked head is no stalled queue */
	struct ireply c;
	const msgpack_object *check = icall_ok(holder, "permit.check", NULL, &c);
	cr_assert(ibool(check, "ok"));
	const msgpack_object *stalled = pgc_map_get(check, "stalled_queues");
	cr_assert(stalled && stalled->type == MSGPACK_OBJECT_ARRAY && stalled->via.array.size == 0);
	ireply_destroy(&c);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.stalled_queues()"), 0);
	/* a head that fits but was not handed its room is one (the hand-over
	 * switched off by hand, as a broken build would) */
	hdb_exec(db, "ALTER TABLE pgcoord.quotas DISABLE TRIGGER quotas_hand_over; "
		     "UPDATE pgcoord.quotas SET \"limit\" = 4 WHERE key = 'w'; "
		     "ALTER TABLE pgcoord.quotas ENABLE TRIGGER quotas_hand_over");
	check = icall_ok(holder, "permit.check", NULL, &c);
	stalled = pgc_map_get(check, "stalled_queues");
	cr_assert(stalled && stalled->type == MSGPACK_OBJECT_ARRAY && stalled->via.array.size == 1);
	cr_assert(istr_is(&stalled->via.array.ptr[0], "head_id", "heavy"));
	ireply_destroy(&c);
	hdb_exec(db, "UPDATE pgcoord.quotas SET \"limit\" = 3 WHERE key = 'w'");

	release(holder, "big");
	ihear(fh, "permit.admitted", HEAR_MS, &n);
	ireply_destroy(&n);
	ihear(fl, "permit.admitted", HEAR_MS, &n);
	ireply_destroy(&n);
	char *order = hdb_query_value(
	    db, "SELECT string_agg(permit_id, ',' ORDER BY id) FROM pgcoord.permit_events "
		"WHERE key = 'w' AND event = 'admitted'");
	cr_assert_str_eq(order, "big,heavy,light");
	free(order);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'w'"), 3);

	close(holder);
	close(fh);
	close(fl);
	hagent_destroy(a);
	hdb_drop(db);
}
