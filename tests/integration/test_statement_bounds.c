/*
 * test_statement_bounds.c — every statement carries a server-side bound
 * just under query_timeout_ms: a claim stuck behind a lock another
 * connection holds is answered `timeout`, its backend stops waiting in the
 * database at once (not when the lock goes), and it never admits afterwards.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "itest.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

TestSuite(statement_bounds, .timeout = 120);

#define CALL_MS 10000
#define QUERY_TIMEOUT_MS 1500

static pgcoord *client(struct hagent *a, const char *session_name)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(hagent_socket(a), CALL_MS, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect: %s", pgcoord_strerror(err));
	err = pgcoord_session_open(c, session_name, CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "session.open: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return c;
}

static void exec_ok(PGconn *pg, const char *sql)
{
	PGresult *res = PQexec(pg, sql);
	ExecStatusType st = PQresultStatus(res);
	cr_assert(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK, "%s: %s", sql,
		  PQerrorMessage(pg));
	PQclear(res);
}

/* Backends of the agent's (any but the test's own and the locker) still
 * waiting on a lock or running a claim. */
static long stuck_backends(struct harness_db *db, int locker_pid)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pg_stat_activity WHERE datname = "
			      "current_database() AND pid NOT IN (pg_backend_pid(), %d) AND "
			      "(wait_event_type = 'Lock' OR (state = 'active' AND query ILIKE "
			      "'%%claim%%'))",
			      locker_pid);
}

Test(statement_bounds, a_claim_behind_a_lock_stops_in_the_database_and_never_admits)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	char qt[16];
	snprintf(qt, sizeof(qt), "%d", QUERY_TIMEOUT_MS);
	const char *const args[] = {"--query-timeout-ms", qt, NULL};
	struct hagent *a = hagent_start(db, "r1", args);
	pgcoord *c = client(a, "claimer");
	cr_assert_eq(pgcoord_quota_set(c, "q", 5, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	long reconnects = (long)istatus_int(a, "db_reconnects");

	/* another client (psql, a migration, a stuck operator) holds the row */
	PGconn *locker = hdb_connect(db);
	exec_ok(locker, "BEGIN");
	exec_ok(locker, "SELECT * FROM pgcoord.quotas WHERE key = 'q' FOR UPDATE");
	int locker_pid = PQbackendPID(locker);

	const char *keys[1] = {"q"};
	pgcoord_claim *cl = NULL;
	int64_t sent = hnow_ms();
	pgcoord_err err = pgcoord_permit_claim(
	    c, "p1",
	    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					 .keys = keys,
					 .nquotas = 1,
					 .limit = PGCOORD_NO_LIMIT},
	    CALL_MS, &cl);
	int64_t answered = hnow_ms();
	cr_assert_eq(err, PGCOORD_E_TIMEOUT, "claim behind a lock: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert_null(cl);
	cr_assert(strstr(pgcoord_last_message(c), "rolled back"), "%s", pgcoord_last_message(c));
	/* the database's bound answered, before the agent's own deadline */
	cr_assert(answered - sent < QUERY_TIMEOUT_MS, "answered after %lld ms",
		  (long long)(answered - sent));

	/* within a second of the answer, nothing of the claim runs or waits */
	long stuck = -1;
	while ((stuck = stuck_backends(db, locker_pid)) != 0 && hnow_ms() - answered < 1000)
		hsleep_ms(50);
	cr_assert_eq(stuck, 0,
		     "a backend still runs or waits for the claim %lld ms after "
		     "the answer",
		     (long long)(hnow_ms() - answered));

	/* the lock goes: the claim must not come back to life */
	exec_ok(locker, "ROLLBACK");
	PQfinish(locker);
	hsleep_ms(QUERY_TIMEOUT_MS);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'p1'"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id = 'p1'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);

	/* the connection was kept, and serves the retry */
	cr_assert_eq(istatus_int(a, "db_reconnects"), reconnects);
	err = pgcoord_permit_claim(
	    c, "p1",
	    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					 .keys = keys,
					 .nquotas = 1,
					 .limit = PGCOORD_NO_LIMIT},
	    CALL_MS, &cl);
	cr_assert_eq(err, PGCOORD_OK, "the retry: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 1);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A backend terminated while the claim waits: the server's error comes
 * before the Sync, so the claim's transaction rolled back and the answer
 * says what happened (not "outcome unknown"); nothing is admitted. */
Test(statement_bounds, a_claim_whose_backend_is_terminated_rolled_back_and_never_admits)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	struct hagent *a = hagent_start(db, "r1", NULL); /* query_timeout_ms 5000 */
	int fd = iconnect(hagent_socket(a));
	isession_open(fd, "victim");
	hdb_exec(db, "INSERT INTO pgcoord.quotas (key, \"limit\") VALUES ('q', 5)");

	PGconn *locker = hdb_connect(db);
	exec_ok(locker, "BEGIN");
	exec_ok(locker, "SELECT * FROM pgcoord.quotas WHERE key = 'q' FOR UPDATE");

	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "id", "p2");
	msgpack_pack_str(pk, 6);
	msgpack_pack_str_body(pk, "quotas", 6);
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	pgc_pack_kv_str(pk, "key", "q");
	uint32_t msgid = inext_msgid();
	cr_assert(hraw_send_request(fd, msgid, "permit.claim", p.sb.data, p.sb.size));
	iparams_destroy(&p);

	cr_assert(iwait_sql(db, 3000,
			    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
			    "current_database() AND wait_event_type = 'Lock' AND pid <> %d",
			    PQbackendPID(locker)),
		  "the claim never waited for the lock");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
				    "WHERE datname = current_database() AND wait_event_type = "
				    "'Lock' AND pid <> %d",
				    PQbackendPID(locker)),
		     1);

	struct ireply r;
	char err[256];
	msgpack_unpacked_init(&r.u);
	cr_assert_eq(hraw_recv_msg(fd, 4000, &r.u), HRAW_MSG, "no answer to the claim");
	memset(&r.m, 0, sizeof(r.m));
	cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
	cr_assert_eq(r.m.msgid, msgid);
	if (hbouncer_enabled()) {
		/* PgBouncer closes its client on a server's death: the agent
		 * cannot tell, and says the outcome is unknown */
		ierr(&r, "unavailable", true, (const char *const[]){NULL});
	} else {
		ierr(&r, "unavailable", true,
		     (const char *const[]){"terminating connection", NULL});
	}
	ireply_destroy(&r);

	exec_ok(locker, "ROLLBACK");
	PQfinish(locker);
	hsleep_ms(500);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'p2'"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The heartbeat lane is bounded the same way: with the agent's own row
 * locked, no heartbeat backend waits much past the bound, the failure is
 * logged as the bound running out, and heartbeats succeed once the lock
 * goes. */
Test(statement_bounds, heartbeats_behind_a_lock_stop_at_the_bound)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	const char *const args[] = {"--query-timeout-ms", "1000", "--heartbeat-interval-ms", "200",
				    NULL};
	struct hagent *a = hagent_start(db, "r1", args);

	PGconn *locker = hdb_connect(db);
	exec_ok(locker, "BEGIN");
	exec_ok(locker, "SELECT * FROM pgcoord.agents WHERE replica_id = 'r1' FOR UPDATE");
	int64_t until = hnow_ms() + 3000;
	long waited = 0;
	while (hnow_ms() < until) {
		waited +=
		    hdb_query_long(db,
				   "SELECT count(*) FROM pg_stat_activity WHERE datname = "
				   "current_database() AND wait_event_type = 'Lock' AND pid <> %d",
				   PQbackendPID(locker));
		/* the bound is 900 ms from the statement's start */
		cr_assert_eq(
		    hdb_query_long(db,
				   "SELECT count(*) FROM pg_stat_activity WHERE datname = "
				   "current_database() AND wait_event_type = 'Lock' AND pid "
				   "<> %d AND now() - query_start > interval '1600 ms'",
				   PQbackendPID(locker)),
		    0, "a heartbeat waited past its bound");
		hsleep_ms(100);
	}
	cr_assert_gt(waited, 0, "no heartbeat ever waited for the lock");
	exec_ok(locker, "ROLLBACK");
	PQfinish(locker);

	cr_assert(iwait_sql(db, 3000,
			    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = 'r1' AND "
			    "heartbeat_at > now() - interval '500 ms'"),
		  "heartbeats did not resume");
	const char *log = hagent_log(a);
	cr_assert(
	    strstr(log, "heartbeat failed: the statement ran out of its time in the database"),
	    "%s", log);
	hagent_destroy(a);
	hdb_drop(db);
}
