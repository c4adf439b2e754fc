/*
 * test_harness_server.c — hpg_* control the test's Postgres server. These
 * stop the server under every test of the executable, so it runs with one
 * Criterion job (tests/integration/meson.build).
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "harness.h"

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
