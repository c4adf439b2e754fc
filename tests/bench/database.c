/*
 * database.c — the bench database: created fresh beside the private
 * cluster, migrated by the agent's own `migrate`, made durable, optionally
 * filled with history, given the workload's quotas; and, after the run, the
 * conservation check.
 *
 * The direct-SQL cycle has a table of its own, bench.quotas, with the same
 * keys and limits as the agent's: what a replica would run if it kept the
 * counter itself.
 */
#include "bench.h"
#include "pgq.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_DB "bench"

PGconn *bench_db_connect(const struct bench_cfg *cfg, const char *appname)
{
	return pgq_connect(cfg->direct_conninfo, appname);
}

static void conninfo(char *buf, size_t size, const char *dbname)
{
	const char *user = getenv("PGCOORD_TEST_PGUSER");

	snprintf(buf, size, "host='%s' port='%s' user='%s' dbname='%s'",
		 getenv("PGCOORD_TEST_PGHOST"), getenv("PGCOORD_TEST_PGPORT"),
		 user ? user : "postgres", dbname);
}

static void migrate(const struct bench_cfg *cfg)
{
	int status;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		dup2(STDERR_FILENO, STDOUT_FILENO); /* stdout is the table's */
		execl(cfg->agent_bin, cfg->agent_bin, "migrate", "--database-url",
		      cfg->direct_conninfo, (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0)
		pgq_die("`%s migrate` failed", cfg->agent_bin);
}

/*
 * The test cluster trades durability for speed (pg-cluster: fsync off,
 * full_page_writes off); a benchmark of commits must pay what production
 * pays. Both settings take a reload; the values are checked from a new
 * connection, which sees the reloaded configuration.
 */
static void make_durable(const struct bench_cfg *cfg, PGconn *admin)
{
	PGconn *c;

	pgq_exec_or_die(admin, "ALTER SYSTEM SET fsync = on");
	pgq_exec_or_die(admin, "ALTER SYSTEM SET full_page_writes = on");
	pgq_exec_or_die(admin, "ALTER SYSTEM SET synchronous_commit = on");
	pgq_exec_or_die(admin, "SELECT pg_reload_conf()");
	for (int tries = 0;; tries++) {
		PGresult *r;
		bool durable;

		c = bench_db_connect(cfg, "pgcoord-bench-setup");
		r = PQexec(c, "SELECT current_setting('fsync') = 'on' AND "
			      "current_setting('full_page_writes') = 'on' AND "
			      "current_setting('synchronous_commit') = 'on'");
		durable = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
			  !strcmp(PQgetvalue(r, 0, 0), "t");
		PQclear(r);
		PQfinish(c);
		if (durable)
			return;
		if (tries == 50)
			pgq_die(
			    "the server did not take fsync/full_page_writes/synchronous_commit = "
			    "on");
		bench_sleep(0.1);
	}
}

/* Whether this schema keeps a one-quota permit's share in the permit row
 * (migrations/0004_permits.sql); an older agent's keeps every share in
 * permit_quotas. */
static bool inline_shares(PGconn *c)
{
	return pgq_query_ll(c, "SELECT count(*) FROM pg_attribute WHERE attrelid = "
			       "'pgcoord.permits'::regclass AND attname = 'quota_key' "
			       "AND NOT attisdropped") > 0;
}

/* Whether this schema keeps the 'admitted' and 'released' events of a
 * one-quota cycle in the permit row (migrations/0016_ledger_events.sql);
 * its audit table is then permit_events_log, and permit_events a view. */
static bool events_in_rows(PGconn *c)
{
	return pgq_query_ll(c, "SELECT count(*) FROM pg_attribute WHERE attrelid = "
			       "'pgcoord.permits'::regclass AND attname = 'admit_event' "
			       "AND NOT attisdropped") > 0;
}

const char *bench_audit_table(PGconn *c)
{
	return events_in_rows(c) ? "pgcoord.permit_events_log" : "pgcoord.permit_events";
}

/*
 * History as the agent leaves it: released permits (tombstones) on quota
 * keys of their own, each with its share, its 'admitted' and 'released'
 * audit rows and its key's 'limit_set'; every in_flight stays 0, so
 * permits_check() holds over them. Then VACUUM ANALYZE, so that the cells
 * measure the tables' size, not an autovacuum catching up meanwhile.
 */
static void preload_history(const struct bench_cfg *cfg, PGconn *c)
{
	double t0 = bench_now();

	if (cfg->history_permits == 0 && cfg->history_keys == 0)
		return;
	fprintf(stderr, "pgcoord-bench: preloading %ld released permits on %ld quota keys\n",
		cfg->history_permits, cfg->history_keys);
	pgq_exec_or_die(c, "BEGIN");
	pgq_exec_or_die(
	    c,
	    "INSERT INTO pgcoord.quotas (key, \"limit\") "
	    "SELECT 'history-' || lpad(i::text, 7, '0'), 1 FROM generate_series(0, %ld) i",
	    cfg->history_keys - 1);
	pgq_exec_or_die(
	    c,
	    "INSERT INTO %s (key, event, actor, reason) "
	    "SELECT 'history-' || lpad(i::text, 7, '0'), 'limit_set', 'bench-history', "
	    "'limit none -> 1, lapse_after_s off -> off' FROM generate_series(0, %ld) i",
	    bench_audit_table(c), cfg->history_keys - 1);
	if (cfg->history_permits > 0 && events_in_rows(c)) {
		/* and its two events in that row too, as a cycle leaves them */
		pgq_exec_or_die(
		    c,
		    "INSERT INTO pgcoord.permits (id, token, owner_replica, state, phase, "
		    "on_owner_loss, created_at, phase_at, state_at, released_at, quota_key, "
		    "quota_weight, admit_event, admit_actor, release_event) "
		    "SELECT 'history-' || i, nextval('pgcoord.token_seq'), 'bench-history', "
		    "'released', 'reserved', 'uncertain', t, t, t, t, "
		    "'history-' || lpad((i %% %ld)::text, 7, '0'), 1, "
		    "nextval('pgcoord.permit_events_id_seq'), 'agent@bench-history', "
		    "nextval('pgcoord.permit_events_id_seq') "
		    "FROM generate_series(1, %ld) i, LATERAL (SELECT now() - interval "
		    "'1 day' + i * interval '1 ms' AS t) ts",
		    cfg->history_keys, cfg->history_permits);
	} else if (cfg->history_permits > 0 && inline_shares(c)) {
		/* a one-quota permit's share in its own row, as a claim writes it */
		pgq_exec_or_die(
		    c,
		    "INSERT INTO pgcoord.permits (id, token, owner_replica, state, phase, "
		    "on_owner_loss, created_at, phase_at, state_at, released_at, quota_key, "
		    "quota_weight) "
		    "SELECT 'history-' || i, nextval('pgcoord.token_seq'), 'bench-history', "
		    "'released', 'reserved', 'uncertain', t, t, t, t, "
		    "'history-' || lpad((i %% %ld)::text, 7, '0'), 1 "
		    "FROM generate_series(1, %ld) i, LATERAL (SELECT now() - interval "
		    "'1 day' + i * interval '1 ms' AS t) ts",
		    cfg->history_keys, cfg->history_permits);
	} else if (cfg->history_permits > 0) {
		pgq_exec_or_die(
		    c,
		    "INSERT INTO pgcoord.permits (id, token, owner_replica, state, phase, "
		    "on_owner_loss, created_at, phase_at, state_at, released_at) "
		    "SELECT 'history-' || i, nextval('pgcoord.token_seq'), 'bench-history', "
		    "'released', 'reserved', 'uncertain', t, t, t, t "
		    "FROM generate_series(1, %ld) i, LATERAL (SELECT now() - interval "
		    "'1 day' + i * interval '1 ms' AS t) ts",
		    cfg->history_permits);
		pgq_exec_or_die(
		    c,
		    "INSERT INTO pgcoord.permit_quotas (permit_id, key, weight) "
		    "SELECT 'history-' || i, 'history-' || lpad((i %% %ld)::text, 7, '0'), 1 "
		    "FROM generate_series(1, %ld) i",
		    cfg->history_keys, cfg->history_permits);
	}
	if (cfg->history_permits > 0 && !events_in_rows(c)) {
		pgq_exec_or_die(
		    c, "INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, "
		       "state, phase) SELECT permit_id, key, 1, 'admitted', 'agent@bench-history', "
		       "'held', 'reserved' FROM pgcoord.permit_quotas "
		       "WHERE permit_id LIKE 'history-%%' ORDER BY permit_id");
		pgq_exec_or_die(
		    c,
		    "INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, "
		    "state, phase) SELECT permit_id, key, -1, 'released', 'agent@bench-history', "
		    "'released', 'reserved' FROM pgcoord.permit_quotas "
		    "WHERE permit_id LIKE 'history-%%' ORDER BY permit_id");
	}
	pgq_exec_or_die(c, "COMMIT");
	pgq_exec_or_die(c, "VACUUM ANALYZE pgcoord.quotas, pgcoord.permits, %s",
			bench_audit_table(c));
	pgq_exec_or_die(c, inline_shares(c) ? "VACUUM ANALYZE pgcoord.permit_quotas_multi"
					    : "VACUUM ANALYZE pgcoord.permit_quotas");
	/* folded for permit.check as the janitor would long since have folded
	 * it (migrations/0005_permit_audit.sql), so that the cells do not pay for folding at once
	 * a backlog the preload made at once; an agent without 0011 has none */
	if (pgq_query_ll(c, "SELECT (to_regprocedure('pgcoord.janitor_fold_audit(integer)') "
			    "IS NOT NULL)::int")) {
		for (int i = 0;
		     i < 10 && pgq_query_ll(c, "SELECT (folded_upto < (SELECT coalesce(max(id), "
					       "0) FROM pgcoord.permit_events))::int "
					       "FROM pgcoord.permit_audit_horizon");
		     i++)
			pgq_query_ll(c, "SELECT pgcoord.janitor_fold_audit(1000000)");
		pgq_exec_or_die(c, "VACUUM ANALYZE pgcoord.permit_audit_totals");
	}
	fprintf(stderr, "pgcoord-bench: history preloaded in %.1f s\n", bench_now() - t0);
}

void bench_key(const struct bench_cfg *cfg, enum bench_shape shape, int worker, char *buf,
	       size_t size)
{
	if (shape == SHAPE_HOT)
		snprintf(buf, size, "%s", BENCH_HOT_KEY);
	else
		snprintf(buf, size, "bench-spread-%04d", worker % cfg->spread_keys);
}

/* The workload's quotas through quota_set (as quota.set would make them),
 * and the same keys and limits in the direct cycle's own table. */
static void create_quotas(const struct bench_cfg *cfg, PGconn *c)
{
	pgq_exec_or_die(
	    c,
	    "SELECT pgcoord.quota_set('bench-spread-' || lpad(i::text, 4, '0'), %d, NULL, "
	    "'bench') FROM generate_series(0, %d) i",
	    BENCH_SPREAD_LIMIT, cfg->spread_keys - 1);
	pgq_exec_or_die(c, "SELECT pgcoord.quota_set('%s', %d, NULL, 'bench')", BENCH_HOT_KEY,
			BENCH_HOT_LIMIT);
	pgq_exec_or_die(c, "CREATE SCHEMA bench");
	pgq_exec_or_die(c, "CREATE TABLE bench.quotas (key text COLLATE \"C\" PRIMARY KEY, "
			   "\"limit\" integer NOT NULL, in_flight bigint NOT NULL DEFAULT 0 "
			   "CHECK (in_flight >= 0))");
	pgq_exec_or_die(c, "INSERT INTO bench.quotas (key, \"limit\") SELECT key, \"limit\" "
			   "FROM pgcoord.quotas WHERE key LIKE 'bench-%%'");
	pgq_exec_or_die(c, "ANALYZE bench.quotas");
}

void bench_db_setup(struct bench_cfg *cfg)
{
	char admin_info[1024];
	PGconn *admin;

	if (!getenv("PGCOORD_TEST_PGHOST") || !getenv("PGCOORD_TEST_PGPORT"))
		pgq_die(
		    "PGCOORD_TEST_PGHOST/PORT are not set: run under tests/harness/with-postgres "
		    "(scripts/bench does)");
	conninfo(admin_info, sizeof(admin_info), "postgres");
	conninfo(cfg->direct_conninfo, sizeof(cfg->direct_conninfo), BENCH_DB);
	admin = pgq_connect(admin_info, "pgcoord-bench-setup");
	pgq_exec_or_die(admin, "DROP DATABASE IF EXISTS " BENCH_DB " WITH (FORCE)");
	pgq_exec_or_die(admin, "CREATE DATABASE " BENCH_DB);
	make_durable(cfg, admin);
	PQfinish(admin);

	migrate(cfg);
	PGconn *c = bench_db_connect(cfg, "pgcoord-bench-setup");
	preload_history(cfg, c);
	create_quotas(cfg, c);
	PQfinish(c);
}

int64_t bench_wal_lsn(PGconn *c)
{
	PGresult *r = PQexec(c, "SELECT pg_current_wal_insert_lsn()");
	unsigned hi, lo;
	int64_t v = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
	    sscanf(PQgetvalue(r, 0, 0), "%X/%X", &hi, &lo) == 2)
		v = ((int64_t)hi << 32) | lo;
	else
		fprintf(stderr, "pgcoord-bench: reading the WAL position: %s",
			PQresultErrorMessage(r));
	PQclear(r);
	return v;
}

void bench_db_describe(PGconn *c, char *buf, size_t size)
{
	PGresult *r =
	    PQexec(c, "SELECT current_setting('server_version'), "
		      "current_setting('fsync'), current_setting('synchronous_commit'), "
		      "current_setting('full_page_writes'), "
		      "current_setting('shared_buffers'), current_setting('wal_sync_method')");

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		snprintf(buf, size,
			 "PostgreSQL %s, fsync=%s, synchronous_commit=%s, full_page_writes=%s, "
			 "shared_buffers=%s, wal_sync_method=%s",
			 PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2),
			 PQgetvalue(r, 0, 3), PQgetvalue(r, 0, 4), PQgetvalue(r, 0, 5));
	else
		snprintf(buf, size, "(server settings unreadable: %s)", PQresultErrorMessage(r));
	PQclear(r);
}

/* One conservation fact: prints it, and whether it holds. */
static bool expect_ll(const char *what, long long got, long long want)
{
	bool ok = got == want;

	printf("- %s: %lld (expected %lld) %s\n", what, got, want, ok ? "ok" : "VIOLATED");
	return ok;
}

bool bench_db_check(PGconn *c, long granted, bool leaked)
{
	long left = leaked ? 1 : 0;
	bool ok = true;

	printf("\nConservation after the run%s:\n",
	       leaked ? " (one slot left taken on purpose in each path)" : "");
	ok &= expect_ll(
	    "agent quotas of the workload with in_flight <> 0",
	    pgq_query_ll(c, "SELECT count(*) FROM pgcoord.quotas WHERE key LIKE 'bench-%%' "
			    "AND in_flight <> 0"),
	    left);
	ok &= expect_ll("direct-SQL counters not back to 0",
			pgq_query_ll(c, "SELECT count(*) FROM bench.quotas WHERE in_flight <> 0"),
			left);
	ok &= expect_ll("workload permits not released",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.permits WHERE id LIKE '%s%%' "
				     "AND state <> 'released'",
				     BENCH_PERMIT_PREFIX),
			left);
	ok &= expect_ll("workload permits admitted (audit) = claims granted",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id "
				     "LIKE '%s%%' AND event = 'admitted'",
				     BENCH_PERMIT_PREFIX),
			granted);
	ok &= expect_ll("workload permits released (audit) = claims granted, less any left taken",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id "
				     "LIKE '%s%%' AND event = 'released'",
				     BENCH_PERMIT_PREFIX),
			granted - left);
	ok &= expect_ll("quotas whose in_flight differs from their live permits' weights or audit",
			pgq_query_ll(c, "SELECT count(*) FROM pgcoord.permits_check() "
					"WHERE problem <> ''"),
			0);
	return ok;
}
