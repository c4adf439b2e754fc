/*
 * test_migrate.c — `pgcoord-agent migrate` and `pgcoordctl migrate`: every
 * migration applied once, reruns and concurrent runs apply nothing twice,
 * an agent refuses a database whose schema is behind, and a schema made by
 * other migration texts (a changed checksum, the old series) is refused by
 * both, with nothing applied.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(migrate, .timeout = 60);

/* Every migration row, in order, with its time: equal strings mean no run
 * recorded or re-recorded anything. */
static char *migrations_snapshot(struct harness_db *db)
{
	return hdb_query_value(db, "SELECT string_agg(version || ':' || name || ':' || checksum || "
				   "':' || applied_at, ', ' ORDER BY version) "
				   "FROM pgcoord.schema_migrations");
}

/* How many migrations the series has: its versions rise from 1 and may skip
 * a number, so the count is not the latest version. */
static int series_count(void)
{
	const char *v = getenv("PGCOORD_TEST_MIGRATIONS");
	int n = v ? atoi(v) : 0;

	cr_assert(n > 0, "PGCOORD_TEST_MIGRATIONS is not set (tests/integration/meson.build)");
	return n;
}

static void assert_each_version_once(struct harness_db *db, int latest)
{
	int count = series_count();

	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.schema_migrations"), count);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(DISTINCT version) FROM pgcoord.schema_migrations"),
	    count);
	cr_assert_eq(hdb_query_long(db, "SELECT min(version) FROM pgcoord.schema_migrations"), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT max(version) FROM pgcoord.schema_migrations"),
		     latest);
	/* one sha256 per migration, each its own text's */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(DISTINCT checksum) FROM "
				    "pgcoord.schema_migrations WHERE checksum ~ '^[0-9a-f]{64}$'"),
		     count);
}

static int agent_migrate(struct harness_db *db, char **out)
{
	const char *argv[] = {iagent_bin(), "migrate", "--database-url", hdb_owner_conninfo(db),
			      NULL};
	return hrun(argv, out);
}

Test(migrate, migrate_applies_all_then_a_second_run_applies_nothing)
{
	struct harness_db *db = hdb_create();
	int latest = ischema_latest();
	char expect[128], *out = NULL;

	cr_assert_eq(agent_migrate(db, &out), 0, "first run failed:\n%s", out);
	snprintf(expect, sizeof(expect), "applied %d migration(s); schema at version %d",
		 series_count(), latest);
	cr_assert(strstr(out, expect), "expected \"%s\", got:\n%s", expect, out);
	free(out);
	assert_each_version_once(db, latest);
	/* the schema really exists: the tables the agent needs are there */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_tables WHERE schemaname = "
					"'pgcoord' AND tablename IN ('agents', 'sessions')"),
		     2);

	char *before = migrations_snapshot(db);
	cr_assert_eq(agent_migrate(db, &out), 0, "second run failed:\n%s", out);
	snprintf(expect, sizeof(expect), "applied 0 migration(s); schema at version %d", latest);
	cr_assert(strstr(out, expect), "expected \"%s\", got:\n%s", expect, out);
	free(out);
	char *after = migrations_snapshot(db);
	cr_assert_str_eq(after, before, "a rerun changed schema_migrations");
	free(before);
	free(after);
	hdb_drop(db);
}

/* Both processes are started before either is waited for, several times on
 * fresh databases, so their transactions really meet at the advisory lock. */
Test(migrate, concurrent_migrate_runs_both_succeed_and_record_each_version_once)
{
	int latest = ischema_latest();

	for (int round = 0; round < 3; round++) {
		struct harness_db *db = hdb_create();
		const char *argv[] = {iagent_bin(), "migrate", "--database-url",
				      hdb_owner_conninfo(db), NULL};
		char *path[2], *out[2];
		pid_t pid[2];
		int total = 0;

		for (int i = 0; i < 2; i++)
			path[i] = htmp_path("migrate.out");
		for (int i = 0; i < 2; i++)
			pid[i] = ispawn(argv, path[i]);
		for (int i = 0; i < 2; i++) {
			int rc = iwait_pid(pid[i]);
			int applied = -1;
			const char *p;

			out[i] = hread_file(path[i]);
			cr_assert_eq(rc, 0, "round %d: run %d exited %d:\n%s", round, i, rc,
				     out[i]);
			p = strstr(out[i], "applied ");
			cr_assert_not_null(p, "round %d: no count in:\n%s", round, out[i]);
			applied = atoi(p + strlen("applied "));
			cr_assert(applied >= 0 && applied <= series_count());
			total += applied;
		}
		cr_assert_eq(total, series_count(),
			     "round %d: the two runs applied %d migrations between them, not "
			     "%d:\n%s\n%s",
			     round, total, series_count(), out[0], out[1]);
		assert_each_version_once(db, latest);
		for (int i = 0; i < 2; i++) {
			free(out[i]);
			free(path[i]);
		}
		hdb_drop(db);
	}
}

Test(migrate, agent_on_an_empty_database_exits_1_naming_the_migrate_command)
{
	struct harness_db *db = hdb_create();
	char *log = NULL;

	int rc = hagent_start_expect_exit(db, "mig-empty", NULL, &log);
	cr_assert_eq(rc, 1, "exit %d, log:\n%s", rc, log);
	cr_assert(strstr(log, "pgcoord-agent migrate"), "the log does not name the command:\n%s",
		  log);
	free(log);
	/* it refused before creating anything */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_namespace WHERE nspname = "
					"'pgcoord'"),
		     0);
	hdb_drop(db);
}

Test(migrate, agent_on_a_schema_behind_exits_1_naming_the_migrate_command)
{
	struct harness_db *db = idb_migrated();
	int latest = ischema_latest();
	char *log = NULL;

	hdb_exec(db, "DELETE FROM pgcoord.schema_migrations WHERE version = %d", latest);
	int rc = hagent_start_expect_exit(db, "mig-behind", NULL, &log);
	cr_assert_eq(rc, 1, "exit %d, log:\n%s", rc, log);
	cr_assert(strstr(log, "pgcoord-agent migrate"), "the log does not name the command:\n%s",
		  log);
	free(log);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents"), 0,
		     "an agent that refused registered anyway");
	hdb_drop(db);
}

Test(migrate, ctl_migrate_applies_the_schema_then_reports_it_up_to_date)
{
	struct harness_db *db = hdb_create();
	int latest = ischema_latest();
	const char *argv[] = {ictl_bin(), "migrate", "--database-url", hdb_owner_conninfo(db),
			      NULL};
	/* the last run also grants the runtime role the agent below runs as */
	const char *json_argv[] = {ictl_bin(),
				   "--json",
				   "migrate",
				   "--database-url",
				   hdb_owner_conninfo(db),
				   "--runtime-role",
				   henv("PGCOORD_TEST_RUNTIME_ROLE"),
				   NULL};
	char expect[128], *out = NULL;

	cr_assert_eq(hrun(argv, &out), 0, "pgcoordctl migrate failed:\n%s", out);
	snprintf(expect, sizeof(expect), "applied %d migrations; schema version %d", series_count(),
		 latest);
	cr_assert(strstr(out, expect), "expected \"%s\", got:\n%s", expect, out);
	free(out);
	assert_each_version_once(db, latest);

	char *before = migrations_snapshot(db);
	cr_assert_eq(hrun(argv, &out), 0, "second run failed:\n%s", out);
	snprintf(expect, sizeof(expect), "schema is up to date (version %d)", latest);
	cr_assert(strstr(out, expect), "expected \"%s\", got:\n%s", expect, out);
	free(out);
	cr_assert_eq(hrun(json_argv, &out), 0, "--json run failed:\n%s", out);
	cr_assert(strstr(out, "\"applied\": 0"), "%s", out);
	snprintf(expect, sizeof(expect), "\"version\": %d", latest);
	cr_assert(strstr(out, expect), "%s", out);
	free(out);
	char *after = migrations_snapshot(db);
	cr_assert_str_eq(after, before);
	free(before);
	free(after);

	/* what pgcoordctl applied is what the agent needs */
	struct hagent *a = hagent_start(db, "mig-ctl", NULL);
	cr_assert_eq(istatus_int(a, "schema_version"), latest);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A changed migration text: `migrate` and the agent both refuse, naming the
 * version and both checksums, and change nothing. */
Test(migrate, a_tampered_checksum_is_refused_by_migrate_and_agent_and_nothing_changes)
{
	struct harness_db *db = idb_migrated();
	char *out = NULL, *log = NULL;

	char *real = hdb_query_value(db, "SELECT checksum FROM pgcoord.schema_migrations "
					 "WHERE version = 3");
	hdb_exec(db, "UPDATE pgcoord.schema_migrations SET checksum = repeat('0', 64) "
		     "WHERE version = 3");
	char *before = migrations_snapshot(db);
	long functions = hdb_query_long(db, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n "
					    "ON n.oid = p.pronamespace WHERE nspname = 'pgcoord'");

	int rc = agent_migrate(db, &out);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "migration 0003_"), "the version is not named:\n%s", out);
	cr_assert(strstr(out, real), "the embedded checksum is not named:\n%s", out);
	cr_assert(strstr(out, "0000000000000000000000000000000000000000000000000000000000000000"),
		  "the recorded checksum is not named:\n%s", out);
	free(out);

	rc = hagent_start_expect_exit(db, "mig-tampered", NULL, &log);
	cr_assert_eq(rc, 1, "exit %d, log:\n%s", rc, log);
	cr_assert(strstr(log, "migration 0003_") && strstr(log, real),
		  "the log does not name the version and checksum:\n%s", log);
	free(log);

	char *after = migrations_snapshot(db);
	cr_assert_str_eq(after, before, "a refused run changed schema_migrations");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n "
					"ON n.oid = p.pronamespace WHERE nspname = 'pgcoord'"),
		     functions);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents"), 0,
		     "an agent that refused registered anyway");
	free(before);
	free(after);
	free(real);
	hdb_drop(db);
}

/* A database of the old, unreleased series (schema_migrations without
 * checksums) is refused with what it is and what to do; nothing is added. */
Test(migrate, an_old_series_database_is_refused_with_what_to_do)
{
	struct harness_db *db = hdb_create();
	char *out = NULL, *log = NULL;

	hdb_exec(db,
		 "CREATE SCHEMA pgcoord; "
		 "CREATE TABLE pgcoord.schema_migrations (version integer PRIMARY KEY, "
		 " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()); "
		 "INSERT INTO pgcoord.schema_migrations (version, name) "
		 "SELECT v, 'old_' || v FROM generate_series(1, 13) v; "
		 "GRANT USAGE ON SCHEMA pgcoord TO %s; "
		 "GRANT SELECT ON pgcoord.schema_migrations TO %s",
		 henv("PGCOORD_TEST_RUNTIME_ROLE"), henv("PGCOORD_TEST_RUNTIME_ROLE"));

	int rc = agent_migrate(db, &out);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "earlier, unreleased migration series") &&
		      strstr(out, "re-create the database"),
		  "%s", out);
	free(out);

	rc = hagent_start_expect_exit(db, "mig-old", NULL, &log);
	cr_assert_eq(rc, 1, "exit %d, log:\n%s", rc, log);
	cr_assert(strstr(log, "earlier, unreleased migration series"), "%s", log);
	free(log);

	/* nothing applied: still only the old table, still 13 rows */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_class c JOIN pg_namespace n "
					"ON n.oid = c.relnamespace WHERE nspname = 'pgcoord' "
					"AND c.relkind = 'r'"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.schema_migrations"), 13);
	hdb_drop(db);
}

Test(migrate, migrate_against_an_unreachable_database_exits_nonzero_with_the_reason)
{
	const char *argv[] = {iagent_bin(), "migrate", "--database-url",
			      "host=/nonexistent-dir port=1 dbname=x connect_timeout=2", NULL};
	char *out = NULL;

	int rc = hrun(argv, &out);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "cannot connect"), "%s", out);
	free(out);
}

/* pgcoordctl migrate runs the agent binary: without one it says which it
 * looked for and how to point it elsewhere, and touches no database. */
Test(migrate, ctl_migrate_without_the_agent_binary_names_it_and_fails)
{
	struct harness_db *db = hdb_create();
	const char *argv[] = {ictl_bin(), "migrate", "--database-url", hdb_owner_conninfo(db),
			      NULL};
	char *out = NULL;

	cr_assert_eq(setenv("PGCOORD_AGENT_BIN", "/nonexistent/pgcoord-agent", 1), 0);
	cr_assert_eq(hrun(argv, &out), 1, "%s", out);
	cr_assert(strstr(out, "cannot run /nonexistent/pgcoord-agent"), "%s", out);
	cr_assert(strstr(out, "PGCOORD_AGENT_BIN"), "%s", out);
	free(out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_namespace WHERE nspname = "
					"'pgcoord'"),
		     0, "the schema was created without the agent");
	hdb_drop(db);
}
