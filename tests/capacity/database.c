/*
 * database.c — the capacity database and what the server tells about it:
 * set up with pg_stat_statements loaded, migrated by the agent's own
 * `migrate` as the owner (granting the runtime role the agents log in as),
 * observed over measured windows (statements by kind, CPU, WAL,
 * connections), and checked for conservation after the run.
 */
#include "capacity.h"
#include "pgq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *const stmt_kind_names[KIND_COUNT] = {
    "heartbeat", "lease", "janitor", "session", "claim", "release", "bounds", "other",
};

/* The kind of a statement from its normalised text; the order of
 * enum stmt_kind. The agent's statements each call one pgcoord function;
 * pg_stat_statements replaces their constants with $n. */
static const char kind_sql[] =
    "SELECT CASE "
    "WHEN query LIKE '%%agent_heartbeat(%%' OR query LIKE '%%agent_beat(%%' THEN 0 "
    "WHEN query LIKE '%%lease_%%' THEN 1 "
    "WHEN query LIKE '%%janitor_%%' THEN 2 "
    "WHEN query LIKE '%%session_%%' OR query LIKE '%%agent_register(%%' "
    "  OR query LIKE '%%agent_stop(%%' THEN 3 "
    "WHEN query LIKE '%%permit_claim%%' THEN 4 "
    "WHEN query LIKE '%%permit_release%%' THEN 5 "
    "WHEN query LIKE 'SELECT set_config(%%' THEN 6 "
    "ELSE 7 END, sum(calls), sum(total_exec_time) "
    "FROM pg_stat_statements "
    "WHERE userid = %s::regrole AND toplevel "
    "  AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "GROUP BY 1";

/* lease_acquire's two outcomes, told apart by the statements it runs inside
 * (pg_stat_statements.track = all): a win (an acquisition or a renewal)
 * writes the row; a lost campaign reads the holder's expiry instead (the
 * locked path's read, or since 0017 the read before any lock). Renewals a
 * heartbeat carries (agent_beat) are wins too, one per row renewed: an
 * UPDATE of the row (0017; since 0019 the first time only, which attaches
 * the lease to its agent's row) or the read that confirms an attached one.
 * The functions run as their owner (SECURITY DEFINER), so the statements
 * inside are the owner's, not the runtime role's; only the agents call
 * them. */
static const char lease_split_sql[] =
    "SELECT coalesce(sum(calls) FILTER (WHERE query LIKE 'INSERT INTO pgcoord.leases %' "
    "                                  OR query LIKE 'INSERT INTO pgcoord.lease_rows %'), 0) "
    "     + coalesce(sum(rows) FILTER (WHERE query LIKE 'UPDATE pgcoord.lease%s l SET "
    "renewed_at%' OR query LIKE 'SELECT t.i%'), 0), "
    "       coalesce(sum(calls) FILTER (WHERE query LIKE 'SELECT l.epoch, l.holder_session, "
    "l.holder_replica,%greatest%' OR query LIKE 'SELECT false, l.epoch, "
    "l.holder_session,%'), 0) "
    "FROM pg_stat_statements "
    "WHERE NOT toplevel "
    "  AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())";

/* The runtime role as an SQL literal: only its statements are the agents'. */
static char runtime_role_literal[160];

PGconn *cap_db_connect(const struct cap_cfg *cfg, const char *appname)
{
	return pgq_connect(cfg->owner_conninfo, appname);
}

/* Runs argv to completion with stdout on stderr (stdout is the table's). */
static bool run(const char *const *argv)
{
	int status;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		dup2(STDERR_FILENO, STDOUT_FILENO);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "pgcoord-capacity: cannot run %s\n", argv[0]);
		_exit(127);
	}
	return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
	       WEXITSTATUS(status) == 0;
}

/* pg_stat_statements needs shared_preload_libraries, which takes a restart
 * of the throwaway server; PgBouncer reconnects by itself. track = all
 * also counts the statements inside functions (toplevel false), which
 * split the lease kind; every kind counts top-level statements only. */
static void load_pg_stat_statements(PGconn **admin, const char *admin_info)
{
	const char *cluster = getenv("PGCOORD_TEST_CLUSTER");
	const char *pgdata = getenv("PGCOORD_TEST_PGDATA");

	if (!cluster || !pgdata)
		pgq_die("PGCOORD_TEST_CLUSTER/PGDATA are not set: run under "
			"tests/harness/with-postgres (scripts/capacity does)");
	pgq_exec_or_die(*admin, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
	PQfinish(*admin);
	const char *argv[] = {cluster, "restart", pgdata, NULL};
	if (!run(argv))
		pgq_die("restarting the server with pg_stat_statements failed");
	*admin = pgq_connect(admin_info, "pgcoord-capacity-setup");
	/* known only once the library is loaded; a reload applies it */
	pgq_exec_or_die(*admin, "ALTER SYSTEM SET pg_stat_statements.track = 'all'");
	pgq_exec_or_die(*admin, "SELECT pg_reload_conf()");
}

static void conninfo(char *buf, size_t size, const char *host, const char *port, const char *user,
		     const char *dbname)
{
	snprintf(buf, size, "host='%s' port='%s' user='%s' dbname='%s'", host, port, user, dbname);
}

static const char *need_env(const char *name)
{
	const char *v = getenv(name);

	if (!v || !*v)
		pgq_die("%s is not set: run under tests/harness/with-postgres --pgbouncer "
			"(scripts/capacity does)",
			name);
	return v;
}

/* Runs one command on PgBouncer's console (simple protocol only). */
static PGresult *bouncer_console(const struct cap_cfg *cfg, const char *sql)
{
	PGconn *c = PQconnectdb(cfg->bouncer_admin);
	PGresult *r = NULL;

	if (PQstatus(c) == CONNECTION_OK)
		r = PQexec(c, sql);
	else
		fprintf(stderr, "pgcoord-capacity: PgBouncer's console: %s", PQerrorMessage(c));
	PQfinish(c);
	return r;
}

/*
 * The test PgBouncer closes server connections idle for 10 s, so that the
 * pools of dropped test databases go; a fleet's pooler keeps them (600 s is
 * PgBouncer's default), and the churn would blur what the fleet costs.
 * --bouncer-pool sets the pool's size. Both before any agent connects.
 */
static void tune_bouncer(const struct cap_cfg *cfg)
{
	char sql[64];
	PGresult *r = bouncer_console(cfg, "SET server_idle_timeout = 600");

	if (!r || PQresultStatus(r) != PGRES_COMMAND_OK)
		pgq_die("PgBouncer refused SET server_idle_timeout: %s",
			r ? PQresultErrorMessage(r) : "no console");
	PQclear(r);
	if (cfg->bouncer_pool_size > 0) {
		snprintf(sql, sizeof(sql), "SET default_pool_size = %d", cfg->bouncer_pool_size);
		r = bouncer_console(cfg, sql);
		if (!r || PQresultStatus(r) != PGRES_COMMAND_OK)
			pgq_die("PgBouncer refused %s: %s", sql,
				r ? PQresultErrorMessage(r) : "no console");
		PQclear(r);
	}
}

int cap_bouncer_pool_size(const struct cap_cfg *cfg)
{
	PGresult *r;
	int n = -1;

	if (!cfg->bouncer_admin[0])
		return -1;
	r = bouncer_console(cfg, "SHOW CONFIG");
	if (r && PQresultStatus(r) == PGRES_TUPLES_OK) {
		int key = PQfnumber(r, "key"), value = PQfnumber(r, "value");

		for (int i = 0; key >= 0 && value >= 0 && i < PQntuples(r); i++)
			if (!strcmp(PQgetvalue(r, i, key), "default_pool_size"))
				n = atoi(PQgetvalue(r, i, value));
	}
	PQclear(r);
	return n;
}

/*
 * A long past: sessions that were opened and closed (rows the agent never
 * deletes), owned by an agent that stopped long ago. Then VACUUM ANALYZE, so
 * the points measure the table's size, not an autovacuum catching up.
 */
static void preload_closed_sessions(const struct cap_cfg *cfg, PGconn *c)
{
	double t0 = cap_now();

	if (cfg->closed_sessions == 0)
		return;
	fprintf(stderr, "pgcoord-capacity: preloading %ld closed sessions\n", cfg->closed_sessions);
	pgq_exec_or_die(c,
			"INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
			"started_at, heartbeat_at, expires_at, stopped_at) VALUES ('" CAP_PREFIX
			"past', 1, 'past', 1, 'past', now() - interval '2 days', "
			"now() - interval '1 day', now() - interval '1 day', now() - interval "
			"'1 day')");
	pgq_exec_or_die(c,
			"INSERT INTO pgcoord.sessions (replica_id, incarnation, name, opened_at, "
			"expires_at, closed_at, close_reason) SELECT '" CAP_PREFIX "past', 1, "
			"'past-' || i, now() - interval '2 days', now() - interval '1 day', "
			"now() - interval '1 day', 'agent stopped' FROM generate_series(1, %ld) i",
			cfg->closed_sessions);
	pgq_exec_or_die(c, "VACUUM ANALYZE pgcoord.sessions, pgcoord.agents");
	fprintf(stderr, "pgcoord-capacity: preloaded in %.1f s\n", cap_now() - t0);
}

void cap_db_setup(struct cap_cfg *cfg)
{
	const char *host = need_env("PGCOORD_TEST_PGHOST"), *port = need_env("PGCOORD_TEST_PGPORT");
	const char *owner = need_env("PGCOORD_TEST_PGUSER");
	char admin_info[1024];
	PGconn *admin;

	snprintf(cfg->runtime_role, sizeof(cfg->runtime_role), "%s",
		 need_env("PGCOORD_TEST_RUNTIME_ROLE"));
	conninfo(admin_info, sizeof(admin_info), host, port, owner, "postgres");
	conninfo(cfg->owner_conninfo, sizeof(cfg->owner_conninfo), host, port, owner, CAP_DB);
	if (cfg->direct) {
		conninfo(cfg->agent_conninfo, sizeof(cfg->agent_conninfo), host, port,
			 cfg->runtime_role, CAP_DB);
		cfg->bouncer_admin[0] = '\0';
	} else {
		const char *bhost = need_env("PGCOORD_TEST_PGBOUNCER_HOST");
		const char *bport = need_env("PGCOORD_TEST_PGBOUNCER_PORT");

		conninfo(cfg->agent_conninfo, sizeof(cfg->agent_conninfo), bhost, bport,
			 cfg->runtime_role, CAP_DB);
		conninfo(cfg->bouncer_admin, sizeof(cfg->bouncer_admin), bhost, bport, owner,
			 "pgbouncer");
	}

	if (!cfg->direct)
		tune_bouncer(cfg);
	admin = pgq_connect(admin_info, "pgcoord-capacity-setup");
	if (pgq_query_ll(admin, "SELECT count(*) FROM pg_available_extensions "
				"WHERE name = 'pg_stat_statements'") != 1)
		pgq_die("pg_stat_statements is not available in this PostgreSQL installation");
	load_pg_stat_statements(&admin, admin_info);
	pgq_exec_or_die(admin, "DROP DATABASE IF EXISTS " CAP_DB " WITH (FORCE)");
	pgq_exec_or_die(admin, "CREATE DATABASE " CAP_DB);
	PQfinish(admin);

	const char *argv[] = {
	    cfg->agent_bin,    "migrate", "--database-url", cfg->owner_conninfo, "--runtime-role",
	    cfg->runtime_role, NULL};
	if (!run(argv))
		pgq_die("`%s migrate` failed", cfg->agent_bin);

	PGconn *c = cap_db_connect(cfg, "pgcoord-capacity-setup");
	char *role = PQescapeLiteral(c, cfg->runtime_role, strlen(cfg->runtime_role));
	if (!role)
		pgq_die("quoting the runtime role: %s", PQerrorMessage(c));
	snprintf(runtime_role_literal, sizeof(runtime_role_literal), "%s", role);
	PQfreemem(role);
	pgq_exec_or_die(c, "CREATE EXTENSION pg_stat_statements");
	/* one key per agent, room for every claim its worker makes */
	pgq_exec_or_die(c,
			"SELECT pgcoord.quota_set('" CAP_PREFIX "a' || i, 1000000, NULL, "
			"'pgcoord-capacity') FROM generate_series(0, %d) i",
			CAP_MAX_AGENTS - 1);
	preload_closed_sessions(cfg, c);
	PQfinish(c);
}

/* The WAL insert position; text (for pg_waldump) into lsn. */
static int64_t wal_lsn(PGconn *c, char lsn[32])
{
	PGresult *r = PQexec(c, "SELECT pg_current_wal_insert_lsn()");
	unsigned hi, lo;
	int64_t v = -1;

	lsn[0] = '\0';
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
	    sscanf(PQgetvalue(r, 0, 0), "%X/%X", &hi, &lo) == 2) {
		v = ((int64_t)hi << 32) | lo;
		snprintf(lsn, 32, "%s", PQgetvalue(r, 0, 0));
	}
	PQclear(r);
	return v;
}

/* The directory of the server's own pg_waldump, as a shell word: PG_BINDIR,
 * else pg_config's, else the newest under /usr/lib/postgresql (as
 * scripts/wal-cycle finds it). */
#define WALDUMP_BIN                                                                                \
	"d=${PG_BINDIR:-$(pg_config --bindir 2>/dev/null)}; "                                      \
	"[ -x \"$d/pg_waldump\" ] || d=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1); "

void cap_waldump_print(PGconn *c, const struct point *p)
{
	const char *pgdata = getenv("PGCOORD_TEST_PGDATA");
	char cmd[2048], line[256];
	FILE *f;

	printf("\n#### WAL by record type: %d agents x %d sessions, idle %.1f s (%s..%s)\n\n```\n",
	       p->agents, p->sessions, p->idle.seconds, p->idle.wal_from, p->idle.wal_to);
	fflush(stdout);
	if (!pgdata || !p->idle.wal_from[0] || !p->idle.wal_to[0]) {
		printf("(no LSNs or no PGCOORD_TEST_PGDATA)\n```\n");
		return;
	}
	snprintf(cmd, sizeof(cmd),
		 WALDUMP_BIN "\"$d/pg_waldump\" --stats=record --path='%s/pg_wal' --start=%s "
			     "--end=%s 2>&1",
		 pgdata, p->idle.wal_from, p->idle.wal_to);
	if (system(cmd) != 0)
		printf("(pg_waldump failed)\n");
	fflush(stdout);
	printf("```\n\nBy relation (each record counted whole at its first block):\n\n"
	       "| relation | records | bytes |\n| --- | ---: | ---: |\n");
	/* relfilenode, records, bytes of every record that names a block */
	snprintf(cmd, sizeof(cmd),
		 WALDUMP_BIN "\"$d/pg_waldump\" --path='%s/pg_wal' --start=%s --end=%s 2>/dev/null "
			     "| sed -n 's|.*len (rec/tot): *[0-9]*/ *\\([0-9]*\\),.*blkref #0: rel "
			     "[0-9]*/[0-9]*/\\([0-9]*\\).*|\\2 \\1|p' "
			     "| awk '{n[$1]++; b[$1]+=$2} END {for (r in b) print r, n[r], b[r]}' "
			     "| sort -k3 -nr",
		 pgdata, p->idle.wal_from, p->idle.wal_to);
	if (!(f = popen(cmd, "r")))
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned long rel, n, bytes;
		char q[160];
		PGresult *r;
		if (sscanf(line, "%lu %lu %lu", &rel, &n, &bytes) != 3)
			continue;
		snprintf(q, sizeof(q),
			 "SELECT coalesce((SELECT relname FROM pg_class WHERE relfilenode = %lu "
			 "LIMIT 1), '%lu')",
			 rel, rel);
		r = PQexec(c, q);
		printf("| %s | %lu | %lu |\n",
		       PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "?", n, bytes);
		PQclear(r);
	}
	pclose(f);
	fflush(stdout);
}

void cap_window_open(PGconn *c, pid_t postmaster, struct window *w)
{
	PGresult *r = PQexec(c, "SELECT pg_stat_statements_reset()");

	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		fprintf(stderr, "pgcoord-capacity: pg_stat_statements_reset: %s",
			PQresultErrorMessage(r));
	PQclear(r);
	memset(w, 0, sizeof(*w));
	w->wal_bytes = wal_lsn(c, w->wal_from);
	w->cpu_start = pg_cpu_snapshot(postmaster);
	w->seconds = cap_now();
}

void cap_window_close(PGconn *c, pid_t postmaster, struct window *w)
{
	char sql[2048];
	PGresult *r;

	w->seconds = cap_now() - w->seconds;
	w->pg_cpu_ms = pg_cpu_since_ms(w->cpu_start, postmaster, w->pg_cpu_by_kind_ms);
	free(w->cpu_start);
	w->cpu_start = NULL;
	w->wal_bytes = wal_lsn(c, w->wal_to) - w->wal_bytes;
	snprintf(sql, sizeof(sql), kind_sql, runtime_role_literal);
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgcoord-capacity: reading pg_stat_statements: %s",
			PQresultErrorMessage(r));
	} else {
		for (int i = 0; i < PQntuples(r); i++) {
			int k = atoi(PQgetvalue(r, i, 0));

			if (k < 0 || k >= KIND_COUNT)
				continue;
			w->calls[k] += strtod(PQgetvalue(r, i, 1), NULL);
			w->exec_ms[k] += strtod(PQgetvalue(r, i, 2), NULL);
		}
	}
	PQclear(r);
	r = PQexec(c, lease_split_sql);
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		w->lease_won = strtod(PQgetvalue(r, 0, 0), NULL);
		w->lease_lost = strtod(PQgetvalue(r, 0, 1), NULL);
	} else {
		fprintf(stderr, "pgcoord-capacity: reading lease outcomes: %s",
			PQresultErrorMessage(r));
	}
	PQclear(r);
}

int cap_server_conns(PGconn *c)
{
	return (int)pgq_query_ll(c,
				 "SELECT count(*) FROM pg_stat_activity WHERE usename = %s "
				 "AND backend_type = 'client backend'",
				 runtime_role_literal);
}

/* The clients PgBouncer holds for the runtime role in the capacity
 * database: SHOW POOLS on its console (simple protocol only). */
int cap_bouncer_conns(const struct cap_cfg *cfg)
{
	PGresult *r;
	int n = 0;

	if (!cfg->bouncer_admin[0])
		return -1;
	r = bouncer_console(cfg, "SHOW POOLS");
	if (r && PQresultStatus(r) == PGRES_TUPLES_OK) {
		int db = PQfnumber(r, "database"), user = PQfnumber(r, "user");
		int active = PQfnumber(r, "cl_active"), waiting = PQfnumber(r, "cl_waiting");

		for (int i = 0; i < PQntuples(r) && db >= 0 && user >= 0; i++) {
			if (strcmp(PQgetvalue(r, i, db), CAP_DB) != 0 ||
			    strcmp(PQgetvalue(r, i, user), cfg->runtime_role) != 0)
				continue;
			if (active >= 0)
				n += atoi(PQgetvalue(r, i, active));
			if (waiting >= 0)
				n += atoi(PQgetvalue(r, i, waiting));
		}
	} else {
		fprintf(stderr, "pgcoord-capacity: SHOW POOLS: %s",
			r ? PQresultErrorMessage(r) : "no console\n");
		n = -1;
	}
	PQclear(r);
	return n;
}

void cap_db_describe(PGconn *c, char *buf, size_t size)
{
	PGresult *r = PQexec(c, "SELECT current_setting('server_version'), "
				"current_setting('fsync'), current_setting('synchronous_commit'), "
				"current_setting('shared_buffers'), "
				"current_setting('max_connections')");

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		snprintf(buf, size,
			 "PostgreSQL %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s, "
			 "max_connections=%s",
			 PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2),
			 PQgetvalue(r, 0, 3), PQgetvalue(r, 0, 4));
	else
		snprintf(buf, size, "(server settings unreadable: %s)", PQresultErrorMessage(r));
	PQclear(r);
}

static bool expect_ll(const char *what, long long got, long long want)
{
	bool ok = got == want;

	printf("- %s: %lld (expected %lld) %s\n", what, got, want, ok ? "ok" : "VIOLATED");
	return ok;
}

bool cap_db_check(PGconn *c, long granted)
{
	bool ok = true;

	printf("\nConservation after the run:\n");
	ok &= expect_ll("workload quotas with in_flight <> 0",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.quotas WHERE key LIKE '%s%%' "
				     "AND in_flight <> 0",
				     CAP_PREFIX),
			0);
	ok &= expect_ll("workload permits not released",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.permits WHERE id LIKE '%s%%' "
				     "AND state <> 'released'",
				     CAP_PREFIX),
			0);
	ok &= expect_ll("workload permits admitted (audit) = claims granted",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id "
				     "LIKE '%s%%' AND event = 'admitted'",
				     CAP_PREFIX),
			granted);
	ok &= expect_ll("workload permits released (audit) = claims granted",
			pgq_query_ll(c,
				     "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id "
				     "LIKE '%s%%' AND event = 'released'",
				     CAP_PREFIX),
			granted);
	ok &= expect_ll("quotas whose in_flight differs from their live permits' weights or audit",
			pgq_query_ll(c, "SELECT count(*) FROM pgcoord.permits_check() "
					"WHERE problem <> ''"),
			0);
	return ok;
}
