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

/* One counter of /metrics, e.g. pgcoord_db_queries_total. */
static long metric(struct hagent *a, const char *name)
{
	char *page = ihttp_get(a, "/metrics");
	char line[128];
	long v = -1;

	snprintf(line, sizeof(line), "\n%s ", name);
	const char *at = strstr(page, line);
	if (at)
		v = atol(at + strlen(line));
	free(page);
	cr_assert_geq(v, 0, "no %s in /metrics", name);
	return v;
}

/* claim id on q and release it; the claim's error (PGCOORD_OK when done). */
static pgcoord_err claim_and_release(pgcoord *c, const char *id)
{
	pgcoord_claim *cl = NULL;
	pgcoord_err err = iclaim_one(c, id, "q", CALL_MS, &cl);
	if (err != PGCOORD_OK)
		return err;
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	err = pgcoord_permit_release(c, id, 0, NULL, CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "release %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return PGCOORD_OK;
}

/* With the default prepared_statements (auto), directly (the named mode)
 * each connection prepares a text once and runs every later call by name,
 * and sends the timeouts once per connection, not with each call. Behind
 * PgBouncer the timeouts go with every call (named-pooled), and once a
 * named statement lands on a server connection without it, every call is
 * unnamed: the one that met it was sent again. */
Test(statement_bounds, statements_are_prepared_once_per_connection_and_run_by_name)
{
	enum { CYCLES = 40, POOL = 2 };
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	const char *const args[] = {"--pool-size", "2", "--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "r1", args);
	pgcoord *c = client(a, "cycler");

	cr_assert_eq(pgcoord_quota_set(c, "q", 5, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	for (int i = 0; i < CYCLES; i++) {
		char id[32];
		snprintf(id, sizeof(id), "p%d", i);
		pgcoord_err err = claim_and_release(c, id);
		cr_assert_eq(err, PGCOORD_OK, "claim %s: %s (%s)", id, pgcoord_strerror(err),
			     pgcoord_last_message(c));
	}
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE state = "
					"'released' AND released_at IS NOT NULL"),
		     CYCLES);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);

	long queries = metric(a, "pgcoord_db_queries_total");
	long prepared = metric(a, "pgcoord_db_statements_prepared_total");
	long by_name = metric(a, "pgcoord_db_prepared_runs_total");
	long bounds = metric(a, "pgcoord_db_timeout_statements_total");
	long resent = metric(a, "pgcoord_db_statements_resent_total");
	char *mode = istatus_str(a, "statement_mode");
	cr_assert_geq(queries, 2 * CYCLES);
	if (hbouncer_enabled()) {
		cr_assert(strcmp(mode, "named-pooled") == 0 || strcmp(mode, "unnamed") == 0, "%s",
			  mode);
		cr_assert(istatus_bool(a, "db_pooler"));
		/* a resent call counts as two queries, each with its bound */
		cr_assert_eq(bounds, queries, "%ld timeout statements for %ld queries", bounds,
			     queries);
		if (strcmp(mode, "unnamed") == 0)
			cr_assert_gt(resent, 0);
		else
			cr_assert_eq(by_name, queries, "%ld of %ld queries ran by name", by_name,
				     queries);
	} else {
		cr_assert_str_eq(mode, "named");
		cr_assert_not(istatus_bool(a, "db_pooler"));
		cr_assert_eq(resent, 0);
		/* a few texts (claim, release, heartbeat, ...) per connection */
		cr_assert_geq(prepared, 2);
		cr_assert_lt(prepared, CYCLES / 2, "%ld statements prepared for %ld queries",
			     prepared, queries);
		cr_assert_eq(by_name, queries, "%ld of %ld queries ran by name", by_name, queries);
		/* once per connection: the request lane's and the heartbeat's */
		cr_assert_leq(bounds, POOL + 1, "%ld timeout statements for %ld queries", bounds,
			      queries);
	}
	free(mode);
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* quota.set {key, limit} sent on fd without waiting; returns its msgid. */
static uint32_t send_quota_set(int fd, const char *key, int64_t limit)
{
	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "key", key);
	pgc_pack_kv_int(pk, "limit", limit);
	uint32_t msgid = inext_msgid();
	cr_assert(hraw_send_request(fd, msgid, "quota.set", p.sb.data, p.sb.size));
	iparams_destroy(&p);
	return msgid;
}

/* Its answer: `timeout`, rolled back in the database, before the agent's
 * deadline counted from sent. */
static void expect_rolled_back_timeout(int fd, uint32_t msgid, int64_t sent)
{
	struct ireply r;
	char err[256];
	msgpack_unpacked_init(&r.u);
	do { /* past notifications (agent.db_down if the connection was dropped) */
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, &r.u), HRAW_MSG, "no answer to quota.set");
		memset(&r.m, 0, sizeof(r.m));
		cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
	} while (r.m.type == PGC_RPC_NOTIFY);
	int64_t answered = hnow_ms();
	cr_assert_eq(r.m.msgid, msgid);
	ierr(&r, "timeout", true, (const char *const[]){"rolled back", NULL});
	cr_assert(answered - sent < QUERY_TIMEOUT_MS, "answered after %lld ms",
		  (long long)(answered - sent));
	ireply_destroy(&r);
}

/* One request connection: the second statement waits in the queue for
 * most of its deadline while the first waits for a lock. It must still be
 * stopped by the database, with its own smaller bound, and answered as
 * rolled back before the agent's deadline (the session's bound alone would
 * let it run past it, and the agent would drop the connection). */
Test(statement_bounds, a_statement_that_waited_in_the_queue_keeps_its_own_smaller_bound)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	char qt[16];
	snprintf(qt, sizeof(qt), "%d", QUERY_TIMEOUT_MS);
	const char *const args[] = {"--query-timeout-ms", qt, "--pool-size", "1", NULL};
	struct hagent *a = hagent_start(db, "r1", args);
	int first = iconnect(hagent_socket(a)), second = iconnect(hagent_socket(a));
	iquota_set(first, "q", 5);
	long reconnects = (long)istatus_int(a, "db_reconnects");

	PGconn *locker = hdb_connect(db);
	exec_ok(locker, "BEGIN");
	exec_ok(locker, "SELECT * FROM pgcoord.quotas WHERE key = 'q' FOR UPDATE");

	int64_t sent = hnow_ms();
	uint32_t id1 = send_quota_set(first, "q", 7);
	uint32_t id2 = send_quota_set(second, "q", 9);
	expect_rolled_back_timeout(first, id1, sent);
	expect_rolled_back_timeout(second, id2, sent);

	exec_ok(locker, "ROLLBACK");
	PQfinish(locker);
	cr_assert_eq(istatus_int(a, "db_reconnects"), reconnects,
		     "the agent dropped its connection: the database did not stop in time");
	cr_assert_eq(hdb_query_long(db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'q'"), 5);
	close(first);
	close(second);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The server sessions the agent prepared on go away. Directly, the agent's
 * connections go with them and the new ones prepare again. Behind a
 * transaction pooler with prepared_statements forced on (a
 * misconfiguration: the agent warns at connect), the agent's connection
 * stays but its next transaction reaches a new server session: the call
 * fails retryably with nothing done, the log says what to set, and a retry
 * of the same id succeeds. */
Test(statement_bounds, prepared_statements_lost_with_the_server_session_are_made_again)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	const char *const args[] = {"--pool-size", "1", "--prepared-statements", "on", NULL};
	struct hagent *a = hagent_start(db, "r1", args);
	pgcoord *c = client(a, "cycler");
	cr_assert_eq(pgcoord_quota_set(c, "q", 5, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(claim_and_release(c, "p0"), PGCOORD_OK, "%s", pgcoord_last_message(c));

	if (hbouncer_enabled()) {
		/* PgBouncer closes its server connections once idle, keeping
		 * the clients' */
		char info[512];
		snprintf(info, sizeof(info), "host=%s port=%s dbname=pgbouncer user=postgres",
			 getenv("PGCOORD_TEST_PGBOUNCER_HOST"),
			 getenv("PGCOORD_TEST_PGBOUNCER_PORT"));
		PGconn *admin = PQconnectdb(info);
		cr_assert_eq(PQstatus(admin), CONNECTION_OK, "%s", PQerrorMessage(admin));
		PGresult *res = PQexec(admin, "RECONNECT");
		cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQerrorMessage(admin));
		PQclear(res);
		PQfinish(admin);
	} else {
		cr_assert_gt(hdb_query_long(db,
					    "SELECT count(pg_terminate_backend(pid)) FROM "
					    "pg_stat_activity WHERE datname = current_database() "
					    "AND pid <> pg_backend_pid() AND backend_type = "
					    "'client backend'"),
			     0);
	}
	int failed = 0;
	for (int i = 1; i <= 5; i++) {
		char id[16];
		snprintf(id, sizeof(id), "p%d", i);
		pgcoord_err err;
		int tries = 0;
		while ((err = claim_and_release(c, id)) != PGCOORD_OK && ++tries < 20) {
			cr_assert(pgcoord_err_retryable(err), "%s: %s (%s)", id,
				  pgcoord_strerror(err), pgcoord_last_message(c));
			cr_assert_eq(hdb_query_long(db,
						    "SELECT count(*) FROM pgcoord.permits WHERE "
						    "id = '%s'",
						    id),
				     0, "a failed claim left its permit");
			failed++;
			hsleep_ms(100);
		}
		cr_assert_eq(err, PGCOORD_OK, "%s after %d tries: %s (%s)", id, tries,
			     pgcoord_strerror(err), pgcoord_last_message(c));
	}
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE state = "
					"'released'"),
		     6);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);
	const char *log = hagent_log(a);
	char *mode = istatus_str(a, "statement_mode");
	cr_assert_str_eq(mode, "named", "on is named, whatever it meets");
	free(mode);
	if (hbouncer_enabled()) {
		cr_assert_gt(failed, 0, "no call failed on the new server session");
		cr_assert(strstr(log, "Set prepared_statements = auto (or off) behind one"), "%s",
			  log);
		cr_assert(strstr(log, "prepared_statements = on keeps the statement timeouts as "
				      "session settings"),
			  "%s", log);
	} else {
		cr_assert_null(strstr(log, "Set prepared_statements = auto"), "%s", log);
		cr_assert_null(strstr(log, "through a pooler"), "%s", log);
	}
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A beat carries its own bound (a parameter of agent_beat, which sets
 * lock_timeout): in the modes that send the timeouts with each statement
 * (here unnamed, as behind a pooler that lost a named statement) the
 * heartbeat lane sends no set_config() beside it, so an idle agent's beat is
 * one statement. Its waits stay bounded: heartbeats_behind_a_lock_stop_at_the_bound. */
Test(statement_bounds, a_beat_is_one_statement_with_its_bound_inside)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	const char *const args[] = {"--prepared-statements",
				    "off",
				    "--heartbeat-interval-ms",
				    "100",
				    "--janitor-interval-ms",
				    "60000",
				    "--metrics-listen",
				    "127.0.0.1:0",
				    NULL};
	struct hagent *a = hagent_start(db, "one-statement", args);

	/* the janitor's first sweep and the registration come first */
	hsleep_ms(1500);
	long queries = metric(a, "pgcoord_db_queries_total");
	long bounds = metric(a, "pgcoord_db_timeout_statements_total");
	hsleep_ms(2000);
	queries = metric(a, "pgcoord_db_queries_total") - queries;
	bounds = metric(a, "pgcoord_db_timeout_statements_total") - bounds;
	fprintf(stderr, "in 2 s of beats: %ld statements, %ld set_config() bounds\n", queries,
		bounds);
	cr_assert_geq(queries, 10, "only %ld statements in 2 s of beats every 100 ms", queries);
	/* /metrics itself runs no statement; a lost janitor campaign may */
	cr_assert_leq(bounds, 2, "%ld bound statements beside %ld beats", bounds, queries);
	cr_assert(
	    iwait_sql(db, 1000,
		      "SELECT count(*) FROM pgcoord.agents WHERE replica_id = 'one-statement' "
		      "AND heartbeat_at > now() - interval '500 ms'"),
	    "the beats did not renew the agent");
	hagent_destroy(a);
	hdb_drop(db);
}
