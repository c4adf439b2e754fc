/*
 * test_harness_server.c — hpg_* control the test's Postgres server, and
 * hbouncer_* the PgBouncer in front of it. These stop the server (or the
 * pooler) under every test of the executable, so it runs with one Criterion
 * job (tests/integration/meson.build).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "proto/codec.h"

TestSuite(harness_server, .timeout = 120);

Test(harness_server, committed_rows_survive_an_immediate_restart)
{
	struct harness_db *db = hdb_create();

	hdb_exec(db, "CREATE TABLE t (x int)");
	for (int i = 0; i < 50; i++)
		hdb_exec(db, "INSERT INTO t VALUES (%d)", i);
	/* A crash: nothing acknowledged may be lost (synchronous_commit stays on). */
	hpg_restart("immediate");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM t"), 50);
	hpg_restart("fast");
	cr_assert_eq(hdb_query_long(db, "SELECT sum(x) FROM t"), 49 * 50 / 2);
	hdb_drop(db);
}

Test(harness_server, stop_refuses_connections_until_start)
{
	struct harness_db *db = hdb_create();

	hpg_stop(NULL);
	PGconn *conn = PQconnectdb(hdb_conninfo(db));
	cr_assert_neq(PQstatus(conn), CONNECTION_OK, "the server still answers after hpg_stop");
	PQfinish(conn);
	hpg_start();
	cr_assert_eq(hdb_query_long(db, "SELECT 1"), 1);
	hdb_drop(db);
}

/* Counts the client connections PgBouncer holds for dbname (SHOW CLIENTS on
 * its admin console); -1 when the console cannot be reached. */
static long bouncer_clients(const char *dbname)
{
	char conninfo[1024];
	long n = 0;

	snprintf(conninfo, sizeof(conninfo), "host=%s port=%s user=postgres dbname=pgbouncer",
		 henv("PGCOORD_TEST_PGBOUNCER_HOST"), henv("PGCOORD_TEST_PGBOUNCER_PORT"));
	PGconn *admin = PQconnectdb(conninfo);
	if (PQstatus(admin) != CONNECTION_OK) {
		PQfinish(admin);
		return -1;
	}
	/* the console speaks the simple query protocol only */
	PGresult *res = PQexec(admin, "SHOW CLIENTS");
	int col = PQfnumber(res, "database");
	for (int i = 0; PQresultStatus(res) == PGRES_TUPLES_OK && col >= 0 && i < PQntuples(res);
	     i++)
		n += strcmp(PQgetvalue(res, i, col), dbname) == 0;
	PQclear(res);
	PQfinish(admin);
	return n;
}

static bool agent_db_up(struct hagent *a)
{
	msgpack_unpacked u;
	struct pgc_message m;
	char err[128];
	bool up = false;
	int fd = hraw_connect(hagent_socket(a));

	if (fd < 0)
		return false;
	msgpack_unpacked_init(&u);
	if (hraw_call(fd, 1, "agent.status", NULL, 0, 2000, &u) == HRAW_MSG &&
	    pgc_parse_message(&u.data, &m, err, sizeof(err)) && m.result)
		up = pgc_obj_str_eq(pgc_map_get(m.result, "db"), "up");
	msgpack_unpacked_destroy(&u);
	close(fd);
	return up;
}

Test(harness, agents_connect_through_pgbouncer_which_can_be_killed_and_restarted)
{
	if (!hbouncer_enabled())
		cr_skip_test("only under with-postgres --pgbouncer");
	struct harness_db *db = hdb_create();
	cr_assert_str_neq(hdb_agent_conninfo(db), hdb_conninfo(db));
	hdb_migrate(db);
	/* a short query timeout so the agent notices the pooler's death quickly */
	const char *const args[] = {"--query-timeout-ms", "1000", NULL};
	struct hagent *a = hagent_start(db, "harness-bounced", args);

	/* the request pool and the heartbeat connection, all through PgBouncer */
	cr_assert_geq(bouncer_clients(hdb_name(db)), 2, "log:\n%s", hagent_log(a));

	hbouncer_stop(true);
	cr_assert_eq(bouncer_clients(hdb_name(db)), -1, "PgBouncer still answers");
	int64_t deadline = hnow_ms() + 10000;
	while (agent_db_up(a) && hnow_ms() < deadline)
		hsleep_ms(50);
	cr_assert_not(agent_db_up(a), "the agent did not notice PgBouncer died; log:\n%s",
		      hagent_log(a));

	hbouncer_start();
	deadline = hnow_ms() + 15000;
	while (!agent_db_up(a) && hnow_ms() < deadline)
		hsleep_ms(50);
	cr_assert(agent_db_up(a), "the agent did not reconnect; log:\n%s", hagent_log(a));
	cr_assert_geq(bouncer_clients(hdb_name(db)), 1);
	cr_assert_eq(hagent_stop(a), 0, "log:\n%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}
