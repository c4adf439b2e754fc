/*
 * test_db_roles.c — least privilege in the database: every pgcoord function
 * is SECURITY DEFINER with a pinned search_path and not PUBLIC's (so a
 * future migration that forgets is caught here), the runtime role can only
 * execute them and read what the agent reads, agents run as it, and
 * `migrate` puts back what a later CREATE OR REPLACE would reset.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "itest.h"

TestSuite(db_roles, .timeout = 120);

#define PINNED "search_path=pg_catalog, pgcoord, pg_temp"

static const char *role(void)
{
	return henv("PGCOORD_TEST_RUNTIME_ROLE");
}

/*
 * pgcoord routines lacking SECURITY DEFINER, the pinned search_path or JIT
 * off. Other settings may stand beside them (0004 plans the claim and
 * release without sequential scans); a function has one search_path
 * setting at most.
 */
static long unpinned(struct harness_db *db)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
			      "'pgcoord'::regnamespace AND p.prokind IN ('f', 'p') AND NOT "
			      "(p.prosecdef AND '%s' = ANY (coalesce(p.proconfig, '{}')) "
			      "AND 'jit=off' = ANY (p.proconfig))",
			      PINNED);
}

/* pgcoord routines PUBLIC may execute. */
static long public_executable(struct harness_db *db)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pg_proc p, "
			      "aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a "
			      "WHERE p.pronamespace = 'pgcoord'::regnamespace AND a.grantee = 0 "
			      "AND a.privilege_type = 'EXECUTE'");
}

/* Runs sql as the runtime role, straight to the server; returns the
 * SQLSTATE of its failure, or "" when it succeeded. Caller frees. */
static char *as_runtime(struct harness_db *db, const char *sql)
{
	char conninfo[2048];
	snprintf(conninfo, sizeof(conninfo), "%s user='%s'", hdb_conninfo(db), role());
	PGconn *pg = PQconnectdb(conninfo);
	cr_assert_eq(PQstatus(pg), CONNECTION_OK, "connect as %s: %s", role(), PQerrorMessage(pg));
	PGresult *res = PQexec(pg, sql);
	ExecStatusType st = PQresultStatus(res);
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	char *out =
	    strdup(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? "" : (state ? state : "?"));
	PQclear(res);
	PQfinish(pg);
	return out;
}

static void assert_denied(struct harness_db *db, const char *sql)
{
	char *state = as_runtime(db, sql);
	cr_assert_str_eq(state, "42501", "the runtime role ran: %s (SQLSTATE '%s')", sql, state);
	free(state);
}

static void assert_allowed(struct harness_db *db, const char *sql)
{
	char *state = as_runtime(db, sql);
	cr_assert_str_eq(state, "", "the runtime role may not: %s (SQLSTATE %s)", sql, state);
	free(state);
}

Test(db_roles, every_function_is_definer_pinned_and_not_public)
{
	struct harness_db *db = idb_migrated();
	cr_assert_gt(hdb_query_long(db, "SELECT count(*) FROM pg_proc WHERE pronamespace = "
					"'pgcoord'::regnamespace"),
		     20);
	cr_assert_eq(unpinned(db), 0,
		     "functions without SECURITY DEFINER, the pinned path or JIT off");
	cr_assert_eq(public_executable(db), 0, "functions PUBLIC may execute");
	hdb_drop(db);
}

Test(db_roles, the_runtime_role_can_only_execute_the_functions_and_read)
{
	struct harness_db *db = idb_migrated();

	/* by the catalog: no writes, no DDL, on anything in the schema */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pg_class c WHERE c.relnamespace = "
				    "'pgcoord'::regnamespace AND c.relkind IN ('r', 'v', 'S', "
				    "'p') AND has_table_privilege('%s', c.oid, 'INSERT, UPDATE, "
				    "DELETE, TRUNCATE, REFERENCES, TRIGGER')",
				    role()),
		     0);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM (SELECT oid FROM pg_class WHERE relnamespace = "
			   "'pgcoord'::regnamespace AND relkind = 'S' OFFSET 0) c WHERE "
			   "has_sequence_privilege('%s', c.oid, 'USAGE, UPDATE')",
			   role()),
	    0);
	cr_assert_eq(hdb_query_long(
			 db, "SELECT has_schema_privilege('%s', 'pgcoord', 'CREATE')::int", role()),
		     0);
	/* every function but the owner's two */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
				    "'pgcoord'::regnamespace AND p.proname NOT IN "
				    "('grant_runtime', 'secure_functions') AND NOT "
				    "has_function_privilege('%s', p.oid, 'EXECUTE')",
				    role()),
		     0);

	/* and by trying */
	assert_denied(db, "INSERT INTO pgcoord.quotas (key, \"limit\") VALUES ('x', 1)");
	assert_denied(db, "UPDATE pgcoord.quotas SET in_flight = 0");
	assert_denied(db, "DELETE FROM pgcoord.permits");
	assert_denied(db, "TRUNCATE pgcoord.permit_events_log");
	assert_denied(db, "INSERT INTO pgcoord.permit_events (event, actor) VALUES ('phase', 'x')");
	assert_denied(db, "SELECT * FROM pgcoord.sessions");
	assert_denied(db, "CREATE TABLE pgcoord.mine (x int)");
	assert_denied(db, "CREATE FUNCTION pgcoord.now() RETURNS int LANGUAGE sql AS 'SELECT 1'");
	assert_denied(db, "SELECT nextval('pgcoord.token_seq')");
	assert_denied(db, "SELECT pgcoord.grant_runtime(current_user)");
	assert_denied(db, "SELECT pgcoord.secure_functions()");
	assert_allowed(db, "SELECT version FROM pgcoord.schema_migrations");
	assert_allowed(db, "SELECT * FROM pgcoord.permit_status");
	assert_allowed(db, "SELECT * FROM pgcoord.quota_status");
	assert_allowed(db, "SELECT * FROM pgcoord.live_sessions");
	assert_allowed(db, "SELECT * FROM pgcoord.record_status");
	hdb_drop(db);
}

Test(db_roles, agents_run_as_the_runtime_role)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "r1", NULL);
	iwait_janitor(a);

	/* its connections (through PgBouncer too, which logs in as its client;
	 * the owner's are only the test's own) */
	cr_assert(iwait_sql(db, 5000,
			    "SELECT (count(*) >= 1)::int FROM pg_stat_activity WHERE datname = "
			    "current_database() AND usename = '%s'",
			    role()));
	/* and it works: registered, heartbeating, janitor elected */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'r1'"),
		     1);
	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}

Test(db_roles, an_agent_whose_role_was_not_granted_exits_1_naming_the_fix)
{
	struct harness_db *db = hdb_create();
	const char *argv[] = {iagent_bin(), "migrate", "--database-url", hdb_owner_conninfo(db),
			      NULL};
	char *out = NULL;
	cr_assert_eq(hrun(argv, &out), 0, "%s", out);
	free(out);

	char *log = NULL;
	int rc = hagent_start_expect_exit(db, "ungranted", NULL, &log);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "migrate --runtime-role"), "%s", log);
	free(log);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents"), 0);
	hdb_drop(db);
}

/* What a later migration's CREATE OR REPLACE FUNCTION (or a new function)
 * leaves behind, `migrate` puts right on its next run. */
Test(db_roles, migrate_repins_and_regrants_what_a_later_change_reset)
{
	struct harness_db *db = idb_migrated();

	hdb_exec(db, "CREATE OR REPLACE FUNCTION pgcoord.secure_functions_probe() RETURNS int "
		     "LANGUAGE sql AS 'SELECT 1'");
	/* new functions are PUBLIC's by default: this one as if secured, not granted */
	hdb_exec(db, "REVOKE ALL ON FUNCTION pgcoord.secure_functions_probe() FROM PUBLIC");
	hdb_exec(db, "DO $$ DECLARE f regprocedure; BEGIN "
		     "SELECT p.oid::regprocedure INTO f FROM pg_proc p WHERE p.pronamespace = "
		     "'pgcoord'::regnamespace AND p.proname = 'permit_claim'; "
		     "EXECUTE format('ALTER FUNCTION %%s SECURITY INVOKER RESET ALL', f); "
		     "EXECUTE format('GRANT EXECUTE ON FUNCTION %%s TO PUBLIC', f); END $$");
	cr_assert_geq(unpinned(db), 2);
	cr_assert_geq(public_executable(db), 1);
	assert_denied(db, "SELECT pgcoord.secure_functions_probe()");

	hdb_migrate(db);
	cr_assert_eq(unpinned(db), 0);
	cr_assert_eq(public_executable(db), 0);
	assert_allowed(db, "SELECT pgcoord.secure_functions_probe()");
	hdb_drop(db);
}

Test(db_roles, migrate_names_a_runtime_role_that_does_not_exist)
{
	struct harness_db *db = hdb_create();
	const char *argv[] = {
	    iagent_bin(),   "migrate", "--database-url", hdb_owner_conninfo(db), "--runtime-role",
	    "no_such_role", NULL};
	char *out = NULL;
	int rc = hrun(argv, &out);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "no_such_role") && strstr(out, "does not exist"), "%s", out);
	free(out);
	/* the migrations themselves stand; only the grant failed */
	cr_assert_eq(hdb_query_long(db, "SELECT max(version) FROM pgcoord.schema_migrations"),
		     ischema_latest());
	cr_assert_eq(unpinned(db), 0);

	const char *no_value[] = {iagent_bin(),		  "migrate",	    "--database-url",
				  hdb_owner_conninfo(db), "--runtime-role", NULL};
	rc = hrun(no_value, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "--runtime-role needs a role name"), "%s", out);
	free(out);
	hdb_drop(db);
}
