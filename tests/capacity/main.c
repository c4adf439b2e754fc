/*
 * main.c — pgcoord-capacity: what a fleet of agents costs one Postgres
 * (docs/CAPACITY.md).
 *
 * Runs beside a private cluster and a PgBouncer in transaction mode
 * (tests/harness/with-postgres --pgbouncer; scripts/capacity sets it all
 * up). For each agent count (agents start once and stay for the larger
 * counts) and each number of sessions per agent (opened on top of the
 * previous ones), it measures an idle window — statements by kind,
 * Postgres CPU and WAL, connections — and then a load window of claim and
 * release cycles. Then it fits the model, checks conservation and exits 0
 * only when every cycle succeeded and every check holds. With --failure it
 * measures failure detection instead (failure.c).
 */
#include "capacity.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h" /* proc_parent */

__attribute__((noreturn, format(printf, 1, 2))) static void usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pgcoord-capacity: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see --help)\n");
	exit(2);
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: pgcoord-capacity [--quick] [--agents 1,8,32,64] [--sessions 1,10,100]\n"
	    "                        [--idle S] [--load S] [--settle S] [--pool-size N]\n"
	    "                        [--heartbeat-ms N] [--lease-retry-ms N] [--bouncer-pool N]\n"
	    "                        [--closed-sessions N] [--direct] [--agent-bin PATH]\n"
	    "                        [--waldump]\n"
	    "       pgcoord-capacity --failure [--failure-runs N] [--agents M] [--sessions S]\n"
	    "                        [--heartbeat-ms N] [--lease-retry-ms N] [--agent-bin PATH]\n"
	    "Runs beside tests/harness/with-postgres --pgbouncer; scripts/capacity does all "
	    "of it.\n"
	    "  --quick          4 agents x 10 sessions, 3 s windows: the smoke run\n"
	    "  --agents LIST    agent counts, ascending (default 1,8,32,64; at most %d)\n"
	    "  --sessions LIST  sessions per agent, ascending (default 1,10,100; at most %d)\n"
	    "  --idle S         measured idle seconds per point (default 10)\n"
	    "  --load S         measured claim/release seconds per point (default 8)\n"
	    "  --settle S       unmeasured seconds before each window (default 2)\n"
	    "  --pool-size N    the agents' pool_size (default: the agent's default)\n"
	    "  --heartbeat-ms N the agents' heartbeat_interval_ms (default: the agent's)\n"
	    "  --lease-retry-ms N\n"
	    "                   the agents' lease_retry_ms (default: the agent's)\n"
	    "  --bouncer-pool N PgBouncer's default_pool_size (default: the test setup's 20)\n"
	    "  --closed-sessions N\n"
	    "                   preload N closed sessions, a long past (default 0)\n"
	    "  --direct         agents connect to the server, not through PgBouncer\n"
	    "  --agent-bin P    pgcoord-agent (default $PGCOORD_CAPACITY_AGENT_BIN)\n"
	    "  --waldump        after the tables, pg_waldump --stats=record of each idle window\n"
	    "  --failure        measure failure detection instead: kill -9, SIGSTOP and kill -9\n"
	    "                   of the janitor, each --failure-runs times, on M agents x S\n"
	    "                   sessions (the last of --agents and --sessions; default 11 x 10)\n"
	    "  --failure-runs N runs of each failure scenario (default 3, at most 16)\n",
	    CAP_MAX_AGENTS, CAP_MAX_SESSIONS);
}

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		usage_error("%s: \"%s\" is not a whole number in %ld..%ld", opt, s, lo, hi);
	return v;
}

static double parse_seconds(const char *opt, const char *s, double lo)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || (*end && strcmp(end, "s") != 0) || !(v >= lo) || v > 3600)
		usage_error("%s: \"%s\" is not a number of seconds (%g..3600)", opt, s, lo);
	return v;
}

/* "1,8,32" into v (ascending, distinct). */
static int parse_list(const char *opt, const char *s, int *v, long hi)
{
	char *copy = strdup(s), *save = NULL;
	int n = 0;

	if (!copy)
		exit(2);
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == CAP_MAX_COUNTS)
			usage_error("%s: at most %d entries", opt, CAP_MAX_COUNTS);
		v[n] = (int)parse_long(opt, t, 1, hi);
		if (n > 0 && v[n] <= v[n - 1])
			usage_error("%s: give the counts in ascending order, each once", opt);
		n++;
	}
	free(copy);
	if (n == 0)
		usage_error("%s: empty list", opt);
	return n;
}

static void parse_args(int argc, char **argv, struct cap_cfg *cfg)
{
	static const struct option opts[] = {
	    {"quick", no_argument, NULL, 'q'},
	    {"agents", required_argument, NULL, 'a'},
	    {"sessions", required_argument, NULL, 's'},
	    {"idle", required_argument, NULL, 'i'},
	    {"load", required_argument, NULL, 'l'},
	    {"settle", required_argument, NULL, 'S'},
	    {"pool-size", required_argument, NULL, 'p'},
	    {"heartbeat-ms", required_argument, NULL, 'b'},
	    {"lease-retry-ms", required_argument, NULL, 'r'},
	    {"bouncer-pool", required_argument, NULL, 'P'},
	    {"closed-sessions", required_argument, NULL, 'C'},
	    {"direct", no_argument, NULL, 'D'},
	    {"agent-bin", required_argument, NULL, 'A'},
	    {"failure", no_argument, NULL, 'F'},
	    {"failure-runs", required_argument, NULL, 'R'},
	    {"waldump", no_argument, NULL, 'W'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool agents_given = false, sessions_given = false;
	int opt;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'q':
			cfg->agents[0] = 4;
			cfg->nagents = 1;
			cfg->sessions[0] = 10;
			cfg->nsessions = 1;
			cfg->idle_s = cfg->load_s = 3;
			cfg->settle_s = 1;
			break;
		case 'a':
			cfg->nagents = parse_list("--agents", optarg, cfg->agents, CAP_MAX_AGENTS);
			agents_given = true;
			break;
		case 's':
			cfg->nsessions =
			    parse_list("--sessions", optarg, cfg->sessions, CAP_MAX_SESSIONS);
			sessions_given = true;
			break;
		case 'i':
			cfg->idle_s = parse_seconds("--idle", optarg, 0.5);
			break;
		case 'l':
			cfg->load_s = parse_seconds("--load", optarg, 0.5);
			break;
		case 'S':
			cfg->settle_s = parse_seconds("--settle", optarg, 0);
			break;
		case 'p':
			cfg->pool_size = (int)parse_long("--pool-size", optarg, 1, 64);
			break;
		case 'b':
			cfg->heartbeat_interval_ms =
			    (int)parse_long("--heartbeat-ms", optarg, 50, 60000);
			break;
		case 'r':
			cfg->lease_retry_ms =
			    (int)parse_long("--lease-retry-ms", optarg, 50, 60000);
			break;
		case 'P':
			cfg->bouncer_pool_size = (int)parse_long("--bouncer-pool", optarg, 1, 250);
			break;
		case 'C':
			cfg->closed_sessions =
			    parse_long("--closed-sessions", optarg, 0, 100000000);
			break;
		case 'D':
			cfg->direct = true;
			break;
		case 'A':
			cfg->agent_bin = optarg;
			break;
		case 'F':
			cfg->failure = true;
			break;
		case 'R':
			cfg->failure_runs = (int)parse_long("--failure-runs", optarg, 1, 16);
			break;
		case 'W':
			cfg->waldump = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
	if (optind != argc)
		usage_error("unexpected argument \"%s\"", argv[optind]);
	/* a survivor, a janitor and one victim per run: 11 for 3 runs */
	if (cfg->failure && !agents_given) {
		cfg->agents[0] = 3 * cfg->failure_runs + 2;
		cfg->nagents = 1;
	}
	if (cfg->failure && !sessions_given) {
		cfg->sessions[0] = 10;
		cfg->nsessions = 1;
	}
	if (!cfg->agent_bin)
		cfg->agent_bin = getenv("PGCOORD_CAPACITY_AGENT_BIN");
	if (!cfg->agent_bin || access(cfg->agent_bin, X_OK) != 0)
		usage_error(
		    "no pgcoord-agent to run: give --agent-bin or PGCOORD_CAPACITY_AGENT_BIN");
}

/* Every session is a socket here and one in its agent: lift the soft limit. */
static void raise_fd_limit(const struct cap_cfg *cfg)
{
	long need = (long)cfg->agents[cfg->nagents - 1] * cfg->sessions[cfg->nsessions - 1] + 256;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if ((long)rl.rlim_cur < need)
		usage_error("%ld sessions need about %ld file descriptors; the limit is %ld",
			    need - 256, need, (long)rl.rlim_cur);
}

/* /proc/loadavg's line: how busy the machine was, to judge the numbers by. */
static void load_average(char *buf, size_t size)
{
	FILE *f = fopen("/proc/loadavg", "re");

	snprintf(buf, size, "?");
	if (f) {
		if (!fgets(buf, (int)size, f))
			snprintf(buf, size, "?");
		fclose(f);
	}
	buf[strcspn(buf, "\n")] = '\0';
}

static double per_s(double v, double seconds)
{
	return seconds > 0 ? v / seconds : 0;
}

static void print_table(const struct point *pts, int n)
{
	printf("\n| agents | sessions/agent | sessions | PG backends | PgBouncer clients | "
	       "idle stmts/s | heartbeat/s | lease/s | janitor/s | other/s | "
	       "idle exec ms/s | idle PG CPU ms/s | idle WAL kB/s | agent CPU ms/s | "
	       "claims/s | p50 / p99 ms | PG CPU ms/claim | agent RSS MiB |\n");
	printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
	       "---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
	for (int i = 0; i < n; i++) {
		const struct point *p = &pts[i];
		const struct window *w = &p->idle;
		double all = 0, exec = 0;

		for (int k = 0; k < KIND_COUNT; k++) {
			if (k != KIND_BOUNDS)
				all += w->calls[k];
			exec += w->exec_ms[k];
		}
		double claims = per_s((double)p->cycles, p->load.seconds);
		double cpu_claim =
		    p->cycles > 0
			? (p->load.pg_cpu_ms - per_s(w->pg_cpu_ms, w->seconds) * p->load.seconds) /
			      (double)p->cycles
			: 0;
		printf(
		    "| %d | %d | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | "
		    "%.1f | %.1f | %.0f | %.2f / %.2f | %.3f | %.1f |\n",
		    p->agents, p->sessions, p->agents * p->sessions, p->server_conns,
		    p->bouncer_conns, per_s(all, w->seconds),
		    per_s(w->calls[KIND_HEARTBEAT], w->seconds),
		    per_s(w->calls[KIND_LEASE], w->seconds),
		    per_s(w->calls[KIND_JANITOR], w->seconds),
		    per_s(w->calls[KIND_SESSION] + w->calls[KIND_OTHER] + w->calls[KIND_CLAIM] +
			      w->calls[KIND_RELEASE],
			  w->seconds),
		    per_s(exec, w->seconds), per_s(w->pg_cpu_ms, w->seconds),
		    per_s((double)w->wal_bytes / 1024.0, w->seconds),
		    per_s(w->agent_cpu_ms, w->seconds), claims, p->p50_ms, p->p99_ms, cpu_claim,
		    (double)p->agent_rss_kb / 1024.0);
	}
}

/* Where the idle time went: execution ms/s of each statement kind. */
static void print_kinds(const struct point *pts, int n)
{
	printf("\nIdle execution time by statement kind (ms/s, pg_stat_statements):\n\n"
	       "| agents | sessions/agent |");
	for (int k = 0; k < KIND_COUNT; k++)
		printf(" %s |", stmt_kind_names[k]);
	printf("\n| ---: | ---: |");
	for (int k = 0; k < KIND_COUNT; k++)
		printf(" ---: |");
	printf("\n");
	for (int i = 0; i < n; i++) {
		printf("| %d | %d |", pts[i].agents, pts[i].sessions);
		for (int k = 0; k < KIND_COUNT; k++)
			printf(" %.2f |", per_s(pts[i].idle.exec_ms[k], pts[i].idle.seconds));
		printf("\n");
	}
}

/* Where the idle CPU went: the connections' backends (what the agents' statements
 * cost, commits and wake-ups included) apart from the server's own processes. */
static void print_cpu_by_process(const struct point *pts, int n)
{
	printf("\nIdle Postgres CPU by process kind (ms/s, /proc; 10 ms ticks):\n\n"
	       "| agents | sessions/agent |");
	for (int k = 0; k < PG_PROC_KIND_COUNT; k++)
		printf(" %s |", pg_proc_kind_names[k]);
	printf(" all |\n| ---: | ---: |");
	for (int k = 0; k <= PG_PROC_KIND_COUNT; k++)
		printf(" ---: |");
	printf("\n");
	for (int i = 0; i < n; i++) {
		const struct window *w = &pts[i].idle;

		printf("| %d | %d |", pts[i].agents, pts[i].sessions);
		for (int k = 0; k < PG_PROC_KIND_COUNT; k++)
			printf(" %.1f |", per_s(w->pg_cpu_by_kind_ms[k], w->seconds));
		printf(" %.1f |\n", per_s(w->pg_cpu_ms, w->seconds));
	}
}

/*
 * What the lease statements were: wins (each agent's first session renews
 * its lease, the janitor renews the janitor lease, every lease_ttl_ms / 3
 * at the default renew interval) and lost campaigns (every other agent
 * campaigning for the janitor lease at its holder's expiry).
 */
static void print_lease_split(const struct point *pts, int n)
{
	printf("\nIdle lease statements by outcome (pg_stat_statements, statements inside "
	       "lease_acquire):\n\n"
	       "| agents | sessions/agent | lease/s | won (renewals)/s | held leases | "
	       "lost campaigns/s | janitor candidates | s between a candidate's campaigns |\n"
	       "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
	for (int i = 0; i < n; i++) {
		const struct window *w = &pts[i].idle;
		int candidates = pts[i].agents - 1;
		double lost = per_s(w->lease_lost, w->seconds);

		printf("| %d | %d | %.1f | %.1f | %d | %.1f | %d | %s%.1f |\n", pts[i].agents,
		       pts[i].sessions, per_s(w->calls[KIND_LEASE], w->seconds),
		       per_s(w->lease_won, w->seconds), pts[i].agents + 1, lost, candidates,
		       candidates > 0 && lost > 0 ? "" : "- ",
		       candidates > 0 && lost > 0 ? candidates / lost : 0.0);
	}
}

static void progress(const struct point *p)
{
	double all = 0;

	for (int k = 0; k < KIND_COUNT; k++)
		if (k != KIND_BOUNDS)
			all += p->idle.calls[k];
	fprintf(stderr,
		"pgcoord-capacity: %3d agents x %3d sessions: idle %.1f stmts/s, %.1f PG CPU "
		"ms/s; load %.0f claims/s%s%s\n",
		p->agents, p->sessions, per_s(all, p->idle.seconds),
		per_s(p->idle.pg_cpu_ms, p->idle.seconds),
		per_s((double)p->cycles, p->load.seconds), p->errors ? ", FAILED: " : "",
		p->errors ? p->why : "");
}

/* permit.check through an agent: the agent's own view of conservation. */
static bool agent_check(void)
{
	pgcoord *c = NULL;
	pgcoord_err e;
	bool ok = false;

	e = pgcoord_connect(cap_agent_socket(0), 5000, &c);
	if (e == PGCOORD_OK)
		e = pgcoord_permit_check(c, 60000, &ok, NULL, NULL);
	printf("- permit.check through agent 0: %s\n", e != PGCOORD_OK ? pgcoord_strerror(e)
						       : ok	       ? "ok"
								       : "VIOLATED");
	pgcoord_close(c);
	return e == PGCOORD_OK && ok;
}

int main(int argc, char **argv)
{
	static struct cap_cfg cfg = {
	    .idle_s = 10,
	    .load_s = 8,
	    .settle_s = 2,
	    .agents = {1, 8, 32, 64},
	    .nagents = 4,
	    .sessions = {1, 10, 100},
	    .nsessions = 3,
	    .call_timeout_ms = 30000,
	    .failure_runs = 3,
	};
	static struct point pts[CAP_MAX_COUNTS * CAP_MAX_COUNTS];
	char load[128], settings[512];
	long granted = 0;
	int npts = 0;
	bool ok = true;
	const char *tmp;
	PGconn *monitor;
	pid_t postmaster;

	parse_args(argc, argv, &cfg);
	raise_fd_limit(&cfg);
	tmp = getenv("PGCOORD_TEST_TMP");
	if (!tmp)
		usage_error("PGCOORD_TEST_TMP is not set: run under tests/harness/with-postgres "
			    "--pgbouncer (scripts/capacity does)");
	snprintf(cfg.tmp_dir, sizeof(cfg.tmp_dir), "%s", tmp);
	signal(SIGPIPE, SIG_IGN);
	if (cfg.failure)
		return cap_failure_run(&cfg);

	cap_db_setup(&cfg);
	monitor = cap_db_connect(&cfg, "pgcoord-capacity-monitor");
	/* the postmaster is the parent of our own backend */
	postmaster = proc_parent(PQbackendPID(monitor));
	load_average(load, sizeof(load));
	cap_db_describe(monitor, settings, sizeof(settings));
	printf("pgcoord-capacity: %ld online CPUs, load average %s\n",
	       sysconf(_SC_NPROCESSORS_ONLN), load);
	printf("pgcoord-capacity: %s\n", settings);
	printf("pgcoord-capacity: agents %s as %s; idle %.1f s, load %.1f s, settle %.1f s per "
	       "point; pool_size %d%s; heartbeat_interval_ms %d%s\n",
	       cfg.direct ? "connect directly" : "connect through PgBouncer (transaction mode)",
	       cfg.runtime_role, cfg.idle_s, cfg.load_s, cfg.settle_s,
	       cfg.pool_size ? cfg.pool_size : 8, cfg.pool_size ? "" : " (default)",
	       cfg.heartbeat_interval_ms ? cfg.heartbeat_interval_ms : 1000,
	       cfg.heartbeat_interval_ms ? "" : " (default)");
	printf("pgcoord-capacity: lease_retry_ms %d%s\n",
	       cfg.lease_retry_ms ? cfg.lease_retry_ms : 1000,
	       cfg.lease_retry_ms ? "" : " (default)");
	if (!cfg.direct)
		printf(
		    "pgcoord-capacity: PgBouncer default_pool_size %d, server_idle_timeout 600\n",
		    cap_bouncer_pool_size(&cfg));
	printf("pgcoord-capacity: %ld closed sessions preloaded\n", cfg.closed_sessions);
	fflush(stdout);

	for (int a = 0; a < cfg.nagents; a++) {
		int agents = cfg.agents[a];

		/* the previous count's sessions go; the agents stay */
		if (a > 0)
			cap_sessions_close(cfg.agents[a - 1]);
		fprintf(stderr, "pgcoord-capacity: starting %d agents\n", agents);
		cap_agents_start(&cfg, agents);
		for (int s = 0; s < cfg.nsessions; s++) {
			struct point *p = &pts[npts];

			p->agents = agents;
			p->sessions = cfg.sessions[s];
			if (!cap_sessions_grow(&cfg, agents, p->sessions, p->why, sizeof(p->why))) {
				p->errors++;
				progress(p);
				ok = false;
				break;
			}
			cap_sleep(cfg.settle_s);
			double agent_cpu = cap_agents_cpu_ms(agents);
			cap_window_open(monitor, postmaster, &p->idle);
			cap_sleep(cfg.idle_s);
			cap_window_close(monitor, postmaster, &p->idle);
			p->idle.agent_cpu_ms = cap_agents_cpu_ms(agents) - agent_cpu;
			p->server_conns = cap_server_conns(monitor);
			p->bouncer_conns = cfg.direct ? p->server_conns : cap_bouncer_conns(&cfg);
			cap_load_run(&cfg, agents, npts, monitor, postmaster, p);
			p->agent_rss_kb = cap_agents_max_rss_kb(agents);
			granted += p->granted;
			ok &= p->errors == 0;
			progress(p);
			npts++;
		}
	}
	print_table(pts, npts);
	print_kinds(pts, npts);
	print_cpu_by_process(pts, npts);
	print_lease_split(pts, npts);
	if (cfg.waldump)
		for (int i = 0; i < npts; i++)
			cap_waldump_print(monitor, &pts[i]);
	cap_model_print(pts, npts, &cfg);
	load_average(load, sizeof(load));
	printf("\npgcoord-capacity: load average after the last point %s\n", load);
	ok &= cap_db_check(monitor, granted);
	ok &= agent_check();
	cap_sessions_close(cfg.agents[cfg.nagents - 1]);
	cap_agents_stop();
	PQfinish(monitor);
	printf("\npgcoord-capacity: %s\n",
	       ok ? "every cycle succeeded and conservation holds" : "FAILED (see above)");
	return ok ? 0 : 1;
}
