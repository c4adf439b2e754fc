/*
 * driver.c — pgcoord-soak: several agents on one database, many clients,
 * a seeded schedule of faults, and a history the checker can judge.
 *
 * Runs beside a private cluster (tests/harness/with-postgres, optionally
 * --pgbouncer): creates the database `soak`, applies the migrations (and, in
 * a test build made with -Dsoak_break, one deliberately broken function),
 * sets the quotas, starts N agents (the last under libfaketime, for clock
 * jumps) and N×M client processes, samples the counters every 100 ms, and
 * injects the faults. Everything lands in OUT/history/ (JSON lines); see
 * tests/soak/README.md for the format and tests/soak/run for the whole run.
 */
#include "soak.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <msgpack.h>
#include <pgcoord/pgcoord.h>

#include "proto/codec.h"

#ifdef SOAK_BREAKS
#include "soak_break_sql.h"
#endif

#define AGENT_READY_MS 20000

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pgcoord-soak: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(2);
}

/* --- the fleet ------------------------------------------------------------- */

struct agent_proc {
	pid_t pid;
	bool faketime;
	int starts;
};

struct fleet {
	struct soak_cfg *cfg;
	struct agent_proc agents[SOAK_MAX_AGENTS];
	pid_t *clients; /* agent * clients + index */
	int nclients;
	struct hist *h; /* the driver's history */
	int64_t t_start;
};

static const char *faketime_lib(void)
{
	static const char *const paths[] = {
	    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
	    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
	    "/usr/lib/faketime/libfaketime.so.1",
	    "/usr/local/lib/faketime/libfaketime.so.1",
	};
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		if (access(paths[i], R_OK) == 0)
			return paths[i];
	return NULL;
}

static void setenv_int(const char *name, int v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%d", v);
	setenv(name, buf, 1);
}

/* fork + exec an agent; its output goes to OUT/logs/agent-<i>.log. */
static pid_t spawn_agent(struct fleet *fl, int i)
{
	struct soak_cfg *cfg = fl->cfg;
	char log[768], rid[32];
	pid_t parent = getpid(), pid;
	int fd;

	snprintf(log, sizeof(log), "%s/logs/agent-a%d.log", cfg->out_dir, i);
	snprintf(rid, sizeof(rid), "soak-a%d", i);
	fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		die("cannot write %s: %s", log, strerror(errno));
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(fd, 1);
		dup2(fd, 2);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		setenv("PGCOORD_DATABASE_URL", cfg->agent_conninfo, 1);
		setenv("PGCOORD_REPLICA_ID", rid, 1);
		setenv("PGCOORD_SOCKET_PATH", cfg->sockets[i], 1);
		/* the default (auto) finds out what the path to the server
		 * keeps, directly or through PgBouncer */
		unsetenv("PGCOORD_PREPARED_STATEMENTS");
		setenv_int("PGCOORD_HEARTBEAT_INTERVAL_MS", cfg->heartbeat_ms);
		setenv_int("PGCOORD_SESSION_TTL_MS", cfg->session_ttl_ms);
		setenv_int("PGCOORD_SESSION_GRACE_MS", cfg->session_grace_ms);
		setenv_int("PGCOORD_LEASE_TTL_MS", cfg->lease_ttl_ms);
		setenv_int("PGCOORD_LEASE_RETRY_MS", cfg->lease_retry_ms);
		setenv_int("PGCOORD_JANITOR_INTERVAL_MS", cfg->janitor_ms);
		setenv_int("PGCOORD_QUERY_TIMEOUT_MS", cfg->query_timeout_ms);
		setenv_int("PGCOORD_CONNECT_TIMEOUT_MS", 2000);
		setenv_int("PGCOORD_RECONNECT_MAX_MS", 1000);
		/* small, so the client that stops reading is dropped soon */
		setenv_int("PGCOORD_MAX_OUTPUT_BYTES", 262144);
		if (fl->agents[i].faketime) {
			setenv("LD_PRELOAD", faketime_lib(), 1);
			setenv("FAKETIME_TIMESTAMP_FILE", cfg->faketime_file, 1);
			setenv("FAKETIME_CACHE_DURATION", "1", 1);
			setenv("FAKETIME_DISABLE_SHM", "1", 1);
			if (!cfg->faketime_monotonic)
				setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
			/* an AddressSanitizer build wants its runtime first; libfaketime
			 * only wraps clock calls, so the order does not matter here */
			char asan[512];
			const char *prev = getenv("ASAN_OPTIONS");
			snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0",
				 prev ? prev : "", prev && *prev ? ":" : "");
			setenv("ASAN_OPTIONS", asan, 1);
		}
		execl(cfg->agent_bin, cfg->agent_bin, (char *)NULL);
		fprintf(stderr, "pgcoord-soak: cannot run %s: %s\n", cfg->agent_bin,
			strerror(errno));
		_exit(127);
	}
	close(fd);
	return pid;
}

/* True once the agent at sock answers agent.status with registered=true. */
static bool agent_serving(const char *sock)
{
	pgcoord *c = NULL;
	void *res = NULL;
	size_t len = 0, off = 0;
	bool registered = false;
	msgpack_unpacked u;

	if (pgcoord_connect(sock, 300, &c) != PGCOORD_OK)
		return false;
	if (pgcoord_call(c, "agent.status", NULL, 0, 1000, &res, &len) == PGCOORD_OK) {
		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, res, len, &off) == MSGPACK_UNPACK_SUCCESS)
			pgc_obj_bool(pgc_map_get(&u.data, "registered"), &registered);
		msgpack_unpacked_destroy(&u);
		pgcoord_free(res);
	}
	pgcoord_close(c);
	return registered;
}

pid_t fleet_agent_pid(struct fleet *fl, int agent)
{
	return fl->agents[agent].pid;
}

pid_t fleet_client_pid(struct fleet *fl, int client)
{
	return client >= 0 && client < fl->nclients ? fl->clients[client] : -1;
}

void fleet_agent_signal(struct fleet *fl, int agent, int sig)
{
	if (fl->agents[agent].pid > 0)
		kill(fl->agents[agent].pid, sig);
}

/* Reaps the agent; records its end in the history. */
bool fleet_agent_reap(struct fleet *fl, int agent, int timeout_ms)
{
	struct agent_proc *a = &fl->agents[agent];
	int64_t end = soak_now_us() + (int64_t)timeout_ms * 1000;
	int status;

	if (a->pid <= 0)
		return true;
	for (;;) {
		pid_t r = waitpid(a->pid, &status, WNOHANG);

		if (r == a->pid)
			break;
		if (r < 0 && errno != EINTR)
			return false;
		if (soak_now_us() > end)
			return false;
		soak_sleep_ms(10, NULL);
	}
	hist_begin(fl->h, "agent_exit");
	hist_int(fl->h, "agent", agent);
	hist_int(fl->h, "pid", a->pid);
	hist_int(fl->h, "t", soak_now_us());
	hist_int(fl->h, "code", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	hist_bool(fl->h, "expected", true);
	hist_end(fl->h);
	a->pid = 0;
	return true;
}

bool fleet_agent_start(struct fleet *fl, int agent)
{
	struct agent_proc *a = &fl->agents[agent];
	int64_t t0 = soak_now_us(), end = t0 + AGENT_READY_MS * 1000;
	bool ok = false;

	a->pid = spawn_agent(fl, agent);
	a->starts++;
	while (soak_now_us() < end) {
		int status;

		if (waitpid(a->pid, &status, WNOHANG) == a->pid) {
			a->pid = 0;
			break;
		}
		if (agent_serving(fl->cfg->sockets[agent])) {
			ok = true;
			break;
		}
		soak_sleep_ms(50, NULL);
	}
	hist_begin(fl->h, "agent_start");
	hist_int(fl->h, "agent", agent);
	hist_int(fl->h, "pid", a->pid);
	hist_int(fl->h, "t0", t0);
	hist_int(fl->h, "t1", soak_now_us());
	hist_bool(fl->h, "ok", ok);
	hist_bool(fl->h, "faketime", a->faketime);
	hist_end(fl->h);
	hist_flush(fl->h);
	return ok;
}

int fleet_leader_agent(struct fleet *fl)
{
	PGconn *c = PQconnectdb(fl->cfg->direct_conninfo);
	int agent = -1;

	if (PQstatus(c) == CONNECTION_OK) {
		PGresult *r = PQexec(c, "SELECT holder_replica FROM pgcoord.leases "
					"WHERE name = 'soak-lead-0' AND holder_session IS NOT NULL "
					"AND expires_at > now()");
		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
			sscanf(PQgetvalue(r, 0, 0), "soak-a%d", &agent);
		PQclear(r);
	}
	PQfinish(c);
	return agent >= 0 && agent < fl->cfg->agents ? agent : -1;
}

/* Agents and clients that ended on their own are findings: recorded (the
 * checker fails the run on them); an agent is restarted. */
static void watch_children(struct fleet *fl)
{
	int status;

	for (int i = 0; i < fl->cfg->agents; i++) {
		struct agent_proc *a = &fl->agents[i];

		if (a->pid <= 0 || waitpid(a->pid, &status, WNOHANG) != a->pid)
			continue;
		hist_begin(fl->h, "agent_exit");
		hist_int(fl->h, "agent", i);
		hist_int(fl->h, "pid", a->pid);
		hist_int(fl->h, "t", soak_now_us());
		hist_int(fl->h, "code",
			 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
		hist_bool(fl->h, "expected", false);
		hist_end(fl->h);
		fprintf(stderr,
			"pgcoord-soak: agent a%d (pid %d) ended on its own (status %d); "
			"restarting it\n",
			i, (int)a->pid, status);
		a->pid = 0;
		fleet_agent_start(fl, i);
	}
	for (int i = 0; i < fl->nclients; i++) {
		if (fl->clients[i] <= 0 ||
		    waitpid(fl->clients[i], &status, WNOHANG) != fl->clients[i])
			continue;
		hist_begin(fl->h, "client_exit");
		hist_int(fl->h, "client", i);
		hist_int(fl->h, "t", soak_now_us());
		hist_int(fl->h, "code",
			 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
		/* a client ends by itself at the end of the workload: a fault
		 * that outlasts the end is still being injected then */
		hist_bool(fl->h, "expected",
			  WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
			      soak_now_us() >= fl->t_start + fl->cfg->duration_ms * 1000);
		hist_end(fl->h);
		fl->clients[i] = 0;
	}
}

static void spawn_clients(struct fleet *fl, int64_t end_us)
{
	struct soak_cfg *cfg = fl->cfg;
	pid_t parent = getpid();

	fl->nclients = cfg->agents * cfg->clients;
	fl->clients = calloc((size_t)fl->nclients, sizeof(pid_t));
	if (!fl->clients)
		die("out of memory");
	for (int a = 0; a < cfg->agents; a++)
		for (int j = 0; j < cfg->clients; j++) {
			struct client_spec sp = {
			    .cfg = cfg, .agent = a, .index = j, .end_us = end_us};
			pid_t pid;

			if (j < cfg->lease_workers)
				sp.role = ROLE_LEASE;
			else if (j < cfg->lease_workers + cfg->record_workers)
				sp.role = ROLE_RECORDS;
			else
				sp.role = ROLE_PERMITS;
			snprintf(sp.name, sizeof(sp.name), "a%dc%d", a, j);
			fflush(NULL);
			pid = fork();
			if (pid < 0)
				die("fork: %s", strerror(errno));
			if (pid == 0) {
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				if (getppid() != parent)
					_exit(1);
				_exit(client_main(&sp));
			}
			fl->clients[a * cfg->clients + j] = pid;
		}
}

/* Ends every client: SIGCONT (one may be stopped), SIGTERM, then the
 * patient wait for them to hand back what they hold. */
static void stop_clients(struct fleet *fl)
{
	int64_t end = soak_now_us() + 20000000;
	int left;

	for (int i = 0; i < fl->nclients; i++)
		if (fl->clients[i] > 0) {
			kill(fl->clients[i], SIGCONT);
			kill(fl->clients[i], SIGTERM);
		}
	do {
		left = 0;
		for (int i = 0; i < fl->nclients; i++) {
			int status;

			if (fl->clients[i] <= 0)
				continue;
			if (waitpid(fl->clients[i], &status, WNOHANG) == fl->clients[i]) {
				if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
					hist_begin(fl->h, "client_exit");
					hist_int(fl->h, "client", i);
					hist_int(fl->h, "t", soak_now_us());
					hist_int(fl->h, "code",
						 WIFEXITED(status) ? WEXITSTATUS(status)
								   : 128 + WTERMSIG(status));
					hist_bool(fl->h, "expected", false);
					hist_end(fl->h);
				}
				fl->clients[i] = 0;
			} else {
				left++;
			}
		}
		if (left)
			soak_sleep_ms(50, NULL);
	} while (left && soak_now_us() < end);
	for (int i = 0; i < fl->nclients; i++)
		if (fl->clients[i] > 0) {
			fprintf(stderr, "pgcoord-soak: client #%d did not stop; killing it\n", i);
			kill(fl->clients[i], SIGKILL);
			waitpid(fl->clients[i], NULL, 0);
			fl->clients[i] = 0;
		}
}

static void stop_agents(struct fleet *fl)
{
	for (int i = 0; i < fl->cfg->agents; i++) {
		if (fl->agents[i].pid <= 0)
			continue;
		kill(fl->agents[i].pid, SIGCONT);
		kill(fl->agents[i].pid, SIGTERM);
	}
	for (int i = 0; i < fl->cfg->agents; i++) {
		if (fl->agents[i].pid > 0 && !fleet_agent_reap(fl, i, 15000)) {
			kill(fl->agents[i].pid, SIGKILL);
			fleet_agent_reap(fl, i, 5000);
		}
	}
}

/* --- the database ------------------------------------------------------------ */

static void conninfo(char *buf, size_t size, const char *host, const char *port, const char *dbname,
		     const char *appname)
{
	snprintf(buf, size, "host='%s' port='%s' user='%s' dbname='%s'%s%s%s", host, port,
		 getenv("PGCOORD_TEST_PGUSER") ? getenv("PGCOORD_TEST_PGUSER") : "postgres", dbname,
		 appname ? " application_name='" : "", appname ? appname : "", appname ? "'" : "");
}

/* Server notices (NOTICE, the WARNING of a shutdown) are not ours to print. */
void soak_quiet(PGconn *c)
{
	PQsetNoticeProcessor(c, soak_ignore_notice, NULL);
}

void soak_ignore_notice(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

static void exec_or_die(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);

	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		die("setting up the database: %s\n  statement: %.200s", PQresultErrorMessage(r),
		    sql);
	PQclear(r);
}

static void setup_database(struct soak_cfg *cfg)
{
	const char *host = getenv("PGCOORD_TEST_PGHOST"), *port = getenv("PGCOORD_TEST_PGPORT");
	char admin[1024], sql[512];
	PGconn *c;

	if (!host || !port)
		die("PGCOORD_TEST_PGHOST/PORT are not set: run under tests/harness/with-postgres "
		    "(tests/soak/run does)");
	snprintf(cfg->db_name, sizeof(cfg->db_name), "soak");
	conninfo(admin, sizeof(admin), host, port, "postgres", "soak-setup");
	c = PQconnectdb(admin);
	if (PQstatus(c) != CONNECTION_OK)
		die("cannot connect to %s: %s", admin, PQerrorMessage(c));
	soak_quiet(c);
	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", cfg->db_name);
	exec_or_die(c, sql);
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", cfg->db_name);
	exec_or_die(c, sql);
	PQfinish(c);

	conninfo(cfg->direct_conninfo, sizeof(cfg->direct_conninfo), host, port, cfg->db_name,
		 "soak-sampler");
	if (cfg->pgbouncer) {
		const char *bh = getenv("PGCOORD_TEST_PGBOUNCER_HOST");
		const char *bp = getenv("PGCOORD_TEST_PGBOUNCER_PORT");

		if (!bh || !bp)
			die("--pgbouncer needs tests/harness/with-postgres --pgbouncer");
		conninfo(cfg->agent_conninfo, sizeof(cfg->agent_conninfo), bh, bp, cfg->db_name,
			 NULL);
	} else {
		conninfo(cfg->agent_conninfo, sizeof(cfg->agent_conninfo), host, port, cfg->db_name,
			 NULL);
	}

	/* the schema, by the agent's own migrate */
	char cmd_db[1100];
	conninfo(cmd_db, sizeof(cmd_db), host, port, cfg->db_name, NULL);
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		execl(cfg->agent_bin, cfg->agent_bin, "migrate", "--database-url", cmd_db,
		      (char *)NULL);
		_exit(127);
	}
	int status;
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0)
		die("`%s migrate` failed", cfg->agent_bin);

	c = PQconnectdb(cfg->direct_conninfo);
	if (PQstatus(c) != CONNECTION_OK)
		die("cannot connect to %s: %s", cfg->direct_conninfo, PQerrorMessage(c));
	soak_quiet(c);
	if (cfg->break_name) {
#ifdef SOAK_BREAKS
		const char *sql_break = NULL;

		for (size_t i = 0; i < sizeof(soak_breaks) / sizeof(soak_breaks[0]); i++)
			if (!strcmp(soak_breaks[i].name, cfg->break_name))
				sql_break = soak_breaks[i].sql;
		if (!sql_break)
			die("this build has no broken variant \"%s\"", cfg->break_name);
		fprintf(stderr, "pgcoord-soak: BREAKING the schema on purpose: %s\n",
			cfg->break_name);
		exec_or_die(c, sql_break);
#else
		die("--break needs a test build configured with -Dsoak_break=%s", cfg->break_name);
#endif
	}
	for (int i = 0; i < SOAK_NQUOTAS; i++) {
		snprintf(sql, sizeof(sql), "SELECT pgcoord.quota_set('%s', %d, NULL, 'soak')",
			 soak_quotas[i].key, soak_quotas[i].limit);
		exec_or_die(c, sql);
	}
	PQfinish(c);
}

/* --- configuration ------------------------------------------------------------- */

static int64_t parse_duration(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || v < 0)
		die("bad duration \"%s\" (say 90, 90s, 5m or 1h)", s);
	if (*end == '\0' || !strcmp(end, "s"))
		return (int64_t)(v * 1000);
	if (!strcmp(end, "ms"))
		return (int64_t)v;
	if (!strcmp(end, "m"))
		return (int64_t)(v * 60000);
	if (!strcmp(end, "h"))
		return (int64_t)(v * 3600000);
	die("bad duration \"%s\" (say 90, 90s, 5m or 1h)", s);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: pgcoord-soak --out DIR [--duration 90s] [--agents 4] [--clients 16]\n"
		"                    [--seed N] [--pgbouncer] [--no-faults] [--faults k1,k2]\n"
		"                    [--lease-workers 2] [--record-workers N] [--think-ms 60]\n"
		"                    [--faketime-monotonic] [--break NAME] [--agent-bin PATH]\n"
		"                    [--lease-ttl-ms 7500] [--session-ttl-ms 4000] [--plan-only]\n"
		"Run it under tests/harness/with-postgres; tests/soak/run does all of it.\n");
	exit(2);
}

static void write_config(const struct soak_cfg *cfg, const struct fault *faults, size_t n)
{
	char path[768], esc[1200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/config.json", cfg->out_dir);
	f = fopen(path, "we");
	if (!f)
		die("cannot write %s: %s", path, strerror(errno));
	fprintf(f, "{\n  \"seed\": %" PRIu64 ",\n  \"duration_ms\": %" PRId64 ",\n", cfg->seed,
		cfg->duration_ms);
	fprintf(f, "  \"agents\": %d,\n  \"clients_per_agent\": %d,\n", cfg->agents, cfg->clients);
	fprintf(f, "  \"lease_workers_per_agent\": %d,\n  \"record_workers_per_agent\": %d,\n",
		cfg->lease_workers, cfg->record_workers);
	fprintf(f, "  \"leases\": %d,\n  \"think_ms\": %d,\n", cfg->leases, cfg->think_ms);
	fprintf(f, "  \"pgbouncer\": %s,\n  \"faults\": %s,\n", cfg->pgbouncer ? "true" : "false",
		cfg->faults ? "true" : "false");
	hist_json_escape(esc, sizeof(esc), cfg->break_name ? cfg->break_name : "");
	fprintf(f, "  \"break\": \"%s\",\n", esc);
	fprintf(f, "  \"clock_jump_agent\": %d,\n  \"faketime_monotonic\": %s,\n",
		cfg->faketime_file[0] ? cfg->agents - 1 : -1,
		cfg->faketime_monotonic ? "true" : "false");
	fprintf(f,
		"  \"agent\": {\"heartbeat_interval_ms\": %d, \"session_ttl_ms\": %d, "
		"\"session_grace_ms\": %d, \"lease_ttl_ms\": %d, \"lease_renew_ms\": %d, "
		"\"lease_retry_ms\": %d, \"janitor_interval_ms\": %d, \"query_timeout_ms\": %d, "
		"\"max_output_bytes\": 262144},\n",
		cfg->heartbeat_ms, cfg->session_ttl_ms, cfg->session_grace_ms, cfg->lease_ttl_ms,
		cfg->lease_renew_ms, cfg->lease_retry_ms, cfg->janitor_ms, cfg->query_timeout_ms);
	fprintf(f, "  \"client_call_timeout_ms\": %d,\n", cfg->call_timeout_ms);
	fprintf(f, "  \"quotas\": [");
	for (int i = 0; i < SOAK_NQUOTAS; i++)
		fprintf(f, "%s{\"key\": \"%s\", \"limit\": %d}", i ? ", " : "", soak_quotas[i].key,
			soak_quotas[i].limit);
	fprintf(f, "],\n  \"schedule\": [\n");
	for (size_t i = 0; i < n; i++) {
		char what[256];

		fault_describe(&faults[i], what, sizeof(what));
		hist_json_escape(esc, sizeof(esc), what);
		fprintf(f,
			"    {\"at_ms\": %" PRId64 ", \"kind\": \"%s\", \"target\": %d, "
			"\"hold_ms\": %" PRId64 ", \"param\": %" PRId64 ", \"what\": \"%s\"}%s\n",
			faults[i].at_ms, fault_kind_name(faults[i].kind), faults[i].target,
			faults[i].hold_ms, faults[i].param, esc, i + 1 < n ? "," : "");
	}
	fprintf(f, "  ]\n}\n");
	fclose(f);
}

static void make_dir(const char *path)
{
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		die("cannot create %s: %s", path, strerror(errno));
}

int main(int argc, char **argv)
{
	static struct soak_cfg cfg = {
	    .duration_ms = 90000,
	    .agents = 4,
	    .clients = 16,
	    .lease_workers = 2,
	    .record_workers = 2,
	    .leases = 2,
	    .think_ms = 60,
	    .faults = true,
	    .heartbeat_ms = 500,
	    /* the defaults' proportions (a lease outlives a belief by its renew
	     * interval, a belief can outlive its session's expiry), scaled to
	     * seconds so every fault has consequences quickly */
	    .session_ttl_ms = 4000,
	    .session_grace_ms = 3000,
	    .lease_ttl_ms = 7500,
	    .lease_retry_ms = 250,
	    .janitor_ms = 500,
	    .query_timeout_ms = 2500,
	    .call_timeout_ms = 4000,
	};
	static const struct option opts[] = {
	    {"out", required_argument, NULL, 'o'},
	    {"duration", required_argument, NULL, 'd'},
	    {"agents", required_argument, NULL, 'a'},
	    {"clients", required_argument, NULL, 'c'},
	    {"seed", required_argument, NULL, 's'},
	    {"pgbouncer", no_argument, NULL, 'b'},
	    {"no-faults", no_argument, NULL, 'n'},
	    {"faults", required_argument, NULL, 'f'},
	    {"lease-workers", required_argument, NULL, 'l'},
	    {"record-workers", required_argument, NULL, 'r'},
	    {"think-ms", required_argument, NULL, 't'},
	    {"faketime-monotonic", no_argument, NULL, 'm'},
	    {"break", required_argument, NULL, 'x'},
	    {"agent-bin", required_argument, NULL, 'A'},
	    {"lease-ttl-ms", required_argument, NULL, 'L'},
	    {"session-ttl-ms", required_argument, NULL, 'S'},
	    {"plan-only", no_argument, NULL, 'P'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct fleet fl;
	struct hist h;
	struct fault *faults = NULL;
	size_t nfaults;
	bool seeded = false, plan_only = false;
	int opt;
	char path[768];

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'o':
			cfg.out_dir = optarg;
			break;
		case 'd':
			cfg.duration_ms = parse_duration(optarg);
			break;
		case 'a':
			cfg.agents = atoi(optarg);
			break;
		case 'c':
			cfg.clients = atoi(optarg);
			break;
		case 's':
			cfg.seed = strtoull(optarg, NULL, 0);
			seeded = true;
			break;
		case 'b':
			cfg.pgbouncer = true;
			break;
		case 'n':
			cfg.faults = false;
			break;
		case 'f':
			cfg.only_faults = optarg;
			break;
		case 'l':
			cfg.lease_workers = atoi(optarg);
			break;
		case 'r':
			cfg.record_workers = atoi(optarg);
			break;
		case 't':
			cfg.think_ms = atoi(optarg);
			break;
		case 'm':
			cfg.faketime_monotonic = true;
			break;
		case 'x':
			cfg.break_name = optarg;
			break;
		case 'A':
			cfg.agent_bin = optarg;
			break;
		case 'L':
			cfg.lease_ttl_ms = atoi(optarg);
			break;
		case 'S':
			cfg.session_ttl_ms = atoi(optarg);
			break;
		case 'P':
			plan_only = true;
			break;
		default:
			usage();
		}
	}
	if (!cfg.out_dir || optind != argc)
		usage();
	if (!cfg.agent_bin)
		cfg.agent_bin = getenv("PGCOORD_SOAK_AGENT_BIN");
	if (!cfg.agent_bin)
		die("no agent binary: give --agent-bin or PGCOORD_SOAK_AGENT_BIN");
	if (cfg.agents < 1 || cfg.agents > SOAK_MAX_AGENTS || cfg.clients < 1 ||
	    cfg.clients > SOAK_MAX_CLIENTS)
		die("--agents must be 1..%d and --clients 1..%d", SOAK_MAX_AGENTS,
		    SOAK_MAX_CLIENTS);
	if (cfg.lease_workers + cfg.record_workers > cfg.clients)
		die("--lease-workers + --record-workers exceed --clients");
	if (cfg.only_faults) {
		char *copy = strdup(cfg.only_faults), *save = NULL;
		enum fault_kind k;

		for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
			if (!fault_kind_parse(t, &k))
				die("unknown fault kind \"%s\"", t);
		free(copy);
	}
	if (!seeded) {
		FILE *r = fopen("/dev/urandom", "re");

		if (!r || fread(&cfg.seed, sizeof(cfg.seed), 1, r) != 1)
			cfg.seed = (uint64_t)soak_now_us() ^ (uint64_t)getpid();
		if (r)
			fclose(r);
		cfg.seed &= 0xffffffffffffull; /* short enough to type back in */
	}
	if (cfg.lease_ttl_ms < 1000 || cfg.session_ttl_ms < 1000)
		die("--lease-ttl-ms and --session-ttl-ms must be at least 1000");
	cfg.lease_renew_ms = cfg.lease_ttl_ms / 3;

	const char *tmp = getenv("PGCOORD_TEST_TMP");
	if (!tmp && plan_only)
		tmp = "/tmp";
	if (!tmp)
		die("PGCOORD_TEST_TMP is not set: run under tests/harness/with-postgres");
	for (int i = 0; i < cfg.agents; i++)
		snprintf(cfg.sockets[i], sizeof(cfg.sockets[i]), "%s/soak-a%d.sock", tmp, i);
	if (faketime_lib() && cfg.agents > 1)
		snprintf(cfg.faketime_file, sizeof(cfg.faketime_file), "%s/faketime.rc", tmp);
	else
		fprintf(stderr,
			"pgcoord-soak: libfaketime not found (or one agent): no clock jumps\n");

	make_dir(cfg.out_dir);
	snprintf(path, sizeof(path), "%s/history", cfg.out_dir);
	make_dir(path);
	snprintf(path, sizeof(path), "%s/logs", cfg.out_dir);
	make_dir(path);

	nfaults = faults_plan(&cfg, &faults);
	write_config(&cfg, faults, nfaults);
	fprintf(stderr,
		"pgcoord-soak: seed %" PRIu64 " (replay with --seed %" PRIu64 "), %d agents x %d "
		"clients, %.0f s%s%s%s\n",
		cfg.seed, cfg.seed, cfg.agents, cfg.clients, cfg.duration_ms / 1000.0,
		cfg.pgbouncer ? ", through PgBouncer (transaction pooling)" : "",
		cfg.break_name ? ", BROKEN: " : "", cfg.break_name ? cfg.break_name : "");
	fprintf(stderr, "pgcoord-soak: fault schedule (%zu):\n", nfaults);
	for (size_t i = 0; i < nfaults; i++) {
		char what[256];

		fault_describe(&faults[i], what, sizeof(what));
		fprintf(stderr, "  %8.1f s  %-14s %s\n", faults[i].at_ms / 1000.0,
			fault_kind_name(faults[i].kind), what);
	}

	if (plan_only)
		return 0;
	if (cfg.faketime_file[0]) {
		FILE *f = fopen(cfg.faketime_file, "we");

		if (!f || fprintf(f, "+0s\n") < 0 || fclose(f) != 0)
			die("cannot write %s", cfg.faketime_file);
	}
	setup_database(&cfg);

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	snprintf(path, sizeof(path), "%s/history/driver.jsonl", cfg.out_dir);
	if (!hist_open(&h, path))
		die("cannot write %s: %s", path, strerror(errno));
	memset(&fl, 0, sizeof(fl));
	fl.cfg = &cfg;
	fl.h = &h;
	for (int i = 0; i < cfg.agents; i++) {
		fl.agents[i].faketime = cfg.faketime_file[0] && i == cfg.agents - 1;
		if (!fleet_agent_start(&fl, i))
			die("agent a%d did not start serving (log: %s/logs/agent-a%d.log)", i,
			    cfg.out_dir, i);
	}

	/* clients first: fork before the sampler thread exists */
	fl.t_start = soak_now_us();
	int64_t end_us = fl.t_start + cfg.duration_ms * 1000;
	hist_begin(&h, "phase");
	hist_str(&h, "name", "start");
	hist_int(&h, "t", fl.t_start);
	hist_int(&h, "end", end_us);
	hist_end(&h);
	hist_flush(&h);
	spawn_clients(&fl, end_us);
	struct sampler *sampler = sampler_start(&cfg);
	if (!sampler)
		die("cannot start the sampler");

	for (size_t i = 0; i < nfaults && !stop_flag; i++) {
		int64_t at = fl.t_start + faults[i].at_ms * 1000;

		while (soak_now_us() < at && !stop_flag) {
			watch_children(&fl);
			soak_sleep_ms(100, &stop_flag);
		}
		if (stop_flag)
			break;
		char what[256];
		fault_describe(&faults[i], what, sizeof(what));
		fprintf(stderr, "pgcoord-soak: [%7.1f s] %s\n", (soak_now_us() - fl.t_start) / 1e6,
			what);
		fault_inject(&fl, &cfg, &h, &faults[i], &stop_flag);
		watch_children(&fl);
	}
	while (soak_now_us() < end_us && !stop_flag) {
		watch_children(&fl);
		soak_sleep_ms(100, &stop_flag);
	}
	hist_begin(&h, "phase");
	hist_str(&h, "name", "end");
	hist_int(&h, "t", soak_now_us());
	hist_bool(&h, "interrupted", stop_flag);
	hist_end(&h);
	hist_flush(&h);
	fprintf(stderr, "pgcoord-soak: stopping the clients\n");
	stop_clients(&fl);
	/* the final state settles a little before the last snapshot */
	soak_sleep_ms(500, NULL);
	sampler_stop(sampler);
	fprintf(stderr, "pgcoord-soak: stopping the agents\n");
	stop_agents(&fl);
	hist_begin(&h, "phase");
	hist_str(&h, "name", "done");
	hist_int(&h, "t", soak_now_us());
	hist_end(&h);
	hist_close(&h);
	free(faults);
	free(fl.clients);
	return stop_flag ? 130 : 0;
}
