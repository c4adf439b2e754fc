/*
 * main.c — pgcoord-bench: the direct-SQL cycle and the same cycle through
 * pgcoord-agent, side by side, in one table (docs/PERFORMANCE.md).
 *
 * Runs beside a private cluster (tests/harness/with-postgres; scripts/bench
 * sets it all up). For each agent count (agents start once and serve every
 * cell of their count), each shape and each worker count it measures the
 * agent cell; the direct cell of a shape and worker count is measured once,
 * beside the first agent count's. Then it checks conservation and exits 0
 * only when every cycle succeeded and every check holds.
 */
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pgcoord/pgcoord.h>

__attribute__((noreturn, format(printf, 1, 2))) static void usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pgcoord-bench: ");
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
	    "usage: pgcoord-bench [--quick] [--duration S] [--warmup S] [--workers 1,8,32]\n"
	    "                     [--agents 1,4] [--shapes spread,hot] [--history N,K]\n"
	    "                     [--pool-size N] [--agent-bin PATH] [--expect-leak]\n"
	    "                     [--wal-records]\n"
	    "Runs beside tests/harness/with-postgres; scripts/bench does all of it.\n"
	    "  --quick         tiny cells (0.3 s, 0.1 s warmup) and a small history\n"
	    "                  (1000 permits on 50 keys): the default suite's smoke run\n"
	    "  --duration S    measured seconds per cell (default 5)\n"
	    "  --warmup S      unmeasured seconds before each cell (default 1)\n"
	    "  --workers LIST  worker counts (default 1,8,32)\n"
	    "  --agents LIST   agent counts on the one database (default 1,4)\n"
	    "  --shapes LIST   spread (each worker its own key of 1000) and/or hot (every\n"
	    "                  worker on one key with room for all); default both\n"
	    "  --history N,K   preload N released permits on K quota keys (e.g. 1000000,100000)\n"
	    "  --pool-size N   the agents' pool_size (default: the agent's default)\n"
	    "  --agent-bin P   pgcoord-agent (default $PGCOORD_BENCH_AGENT_BIN)\n"
	    "  --expect-leak   testing the check: the last cell of each path leaves one\n"
	    "                  slot taken; the run succeeds only when the check finds\n"
	    "                  exactly that\n"
	    "  --wal-records   after each cell, its WAL by record type per cycle\n"
	    "                  (pg_waldump --stats=record over the measured window), to\n"
	    "                  stderr\n");
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
	if (errno || end == s || (*end && strcmp(end, "s") != 0) || !(v >= lo) || v > 86400)
		usage_error("%s: \"%s\" is not a number of seconds (at least %g)", opt, s, lo);
	return v;
}

/* "1,8,32" into v (ascending, distinct). */
static int parse_list(const char *opt, const char *s, int *v, long lo, long hi)
{
	char *copy = strdup(s), *save = NULL;
	int n = 0;

	if (!copy)
		exit(2);
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == BENCH_MAX_COUNTS)
			usage_error("%s: at most %d entries", opt, BENCH_MAX_COUNTS);
		v[n] = (int)parse_long(opt, t, lo, hi);
		if (n > 0 && v[n] <= v[n - 1])
			usage_error("%s: give the counts in ascending order, each once", opt);
		n++;
	}
	free(copy);
	if (n == 0)
		usage_error("%s: empty list", opt);
	return n;
}

static void parse_shapes(const char *s, bool *shapes)
{
	char *copy = strdup(s), *save = NULL;

	if (!copy)
		exit(2);
	shapes[SHAPE_SPREAD] = shapes[SHAPE_HOT] = false;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (!strcmp(t, "spread"))
			shapes[SHAPE_SPREAD] = true;
		else if (!strcmp(t, "hot"))
			shapes[SHAPE_HOT] = true;
		else
			usage_error("--shapes: unknown shape \"%s\" (spread, hot)", t);
	}
	free(copy);
	if (!shapes[SHAPE_SPREAD] && !shapes[SHAPE_HOT])
		usage_error("--shapes: empty list");
}

static void parse_history(const char *s, struct bench_cfg *cfg)
{
	char n[32], k[32];
	const char *comma = strchr(s, ',');

	if (!comma || (size_t)(comma - s) >= sizeof(n) || strlen(comma + 1) >= sizeof(k))
		usage_error("--history: say N,K (released permits, quota keys)");
	memcpy(n, s, (size_t)(comma - s));
	n[comma - s] = '\0';
	strcpy(k, comma + 1);
	cfg->history_permits = parse_long("--history", n, 0, 100000000);
	cfg->history_keys = parse_long("--history", k, 0, 10000000);
	if (cfg->history_permits > 0 && cfg->history_keys == 0)
		usage_error("--history: released permits need at least one quota key");
}

static void parse_args(int argc, char **argv, struct bench_cfg *cfg)
{
	static const struct option opts[] = {
	    {"quick", no_argument, NULL, 'q'},
	    {"duration", required_argument, NULL, 'd'},
	    {"warmup", required_argument, NULL, 'w'},
	    {"workers", required_argument, NULL, 'W'},
	    {"agents", required_argument, NULL, 'a'},
	    {"shapes", required_argument, NULL, 's'},
	    {"history", required_argument, NULL, 'H'},
	    {"pool-size", required_argument, NULL, 'p'},
	    {"agent-bin", required_argument, NULL, 'A'},
	    {"expect-leak", no_argument, NULL, 'L'},
	    {"wal-records", no_argument, NULL, 'R'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool duration_set = false, warmup_set = false, history_set = false;
	int opt;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'q':
			if (!duration_set)
				cfg->duration_s = 0.3;
			if (!warmup_set)
				cfg->warmup_s = 0.1;
			if (!history_set) {
				cfg->history_permits = 1000;
				cfg->history_keys = 50;
			}
			break;
		case 'd':
			cfg->duration_s = parse_seconds("--duration", optarg, 0.05);
			duration_set = true;
			break;
		case 'w':
			cfg->warmup_s = parse_seconds("--warmup", optarg, 0);
			warmup_set = true;
			break;
		case 'W':
			cfg->nworkers =
			    parse_list("--workers", optarg, cfg->workers, 1, BENCH_MAX_WORKERS);
			break;
		case 'a':
			cfg->nagents =
			    parse_list("--agents", optarg, cfg->agents, 1, BENCH_MAX_AGENTS);
			break;
		case 's':
			parse_shapes(optarg, cfg->shapes);
			break;
		case 'H':
			parse_history(optarg, cfg);
			history_set = true;
			break;
		case 'p':
			cfg->pool_size = (int)parse_long("--pool-size", optarg, 1, 64);
			break;
		case 'A':
			cfg->agent_bin = optarg;
			break;
		case 'L':
			cfg->expect_leak = true;
			break;
		case 'R':
			cfg->wal_records = true;
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
	if (!cfg->agent_bin)
		cfg->agent_bin = getenv("PGCOORD_BENCH_AGENT_BIN");
	if (!cfg->agent_bin || access(cfg->agent_bin, X_OK) != 0)
		usage_error("no pgcoord-agent to run: give --agent-bin or PGCOORD_BENCH_AGENT_BIN");
	if (cfg->workers[cfg->nworkers - 1] > cfg->spread_keys)
		usage_error("--workers: at most %d (the spread shape's keys)", cfg->spread_keys);
}

/* --- the table ----------------------------------------------------------------- */

struct row {
	enum bench_shape shape;
	int workers, agents;
	struct cell_result direct, agent; /* direct: shared by the rows of every agent count */
};

static const char *shape_name(enum bench_shape s)
{
	return s == SHAPE_HOT ? "hot" : "spread";
}

static double rate(const struct cell_result *r)
{
	return r->seconds > 0 ? (double)r->cycles / r->seconds : 0;
}

/* value per cycle, or a dash when there is nothing to divide */
static void per_cycle(char *buf, size_t size, double total, long cycles, int decimals)
{
	if (total < 0 || cycles <= 0)
		snprintf(buf, size, "-");
	else
		snprintf(buf, size, "%.*f", decimals, total / (double)cycles);
}

static void print_table(const struct row *rows, int n)
{
	printf("\n| shape | workers | agents | direct cycles/s | direct p50/p99 ms | "
	       "agent cycles/s | agent p50/p99 ms | ratio agent/direct | "
	       "PG CPU ms/cycle direct | PG CPU ms/cycle agent | WAL B/cycle direct | "
	       "WAL B/cycle agent | agent CPU ms/cycle | agent RSS MiB |\n");
	printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
	       "| ---: | ---: |\n");
	for (int i = 0; i < n; i++) {
		const struct row *r = &rows[i];
		char pgd[32], pga[32], wald[32], wala[32], acpu[32];
		double rd = rate(&r->direct), ra = rate(&r->agent);

		per_cycle(pgd, sizeof(pgd), r->direct.pg_cpu_ms, r->direct.cycles, 3);
		per_cycle(pga, sizeof(pga), r->agent.pg_cpu_ms, r->agent.cycles, 3);
		per_cycle(wald, sizeof(wald), (double)r->direct.wal_bytes, r->direct.cycles, 0);
		per_cycle(wala, sizeof(wala), (double)r->agent.wal_bytes, r->agent.cycles, 0);
		per_cycle(acpu, sizeof(acpu), r->agent.agent_cpu_ms, r->agent.cycles, 3);
		printf(
		    "| %s | %d | %d | %.0f | %.2f / %.2f | %.0f | %.2f / %.2f | %.2f | %s | %s | "
		    "%s | %s | %s | %.1f |\n",
		    shape_name(r->shape), r->workers, r->agents, rd, r->direct.p50_ms,
		    r->direct.p99_ms, ra, r->agent.p50_ms, r->agent.p99_ms, rd > 0 ? ra / rd : 0,
		    pgd, pga, wald, wala, acpu, (double)r->agent.agent_rss_kb / 1024.0);
	}
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

static void print_conditions(const struct bench_cfg *cfg, PGconn *monitor)
{
	char settings[512], load[128], pool[32] = "the agent's default";

	load_average(load, sizeof(load));
	bench_db_describe(monitor, settings, sizeof(settings));
	if (cfg->pool_size)
		snprintf(pool, sizeof(pool), "%d", cfg->pool_size);
	printf("pgcoord-bench: %ld online CPUs, load average %s\n", sysconf(_SC_NPROCESSORS_ONLN),
	       load);
	printf("pgcoord-bench: %s\n", settings);
	printf("pgcoord-bench: %.2f s per cell after %.2f s warmup; agents' pool_size %s; "
	       "history %ld released permits on %ld keys; spread over %d keys\n",
	       cfg->duration_s, cfg->warmup_s, pool, cfg->history_permits, cfg->history_keys,
	       cfg->spread_keys);
	fflush(stdout);
}

static void progress(const struct cell_spec *s, const struct cell_result *r)
{
	fprintf(stderr,
		"pgcoord-bench: %-6s %-6s x%-3d agents %d: %7.0f cycles/s, p50 %.2f ms, p99 %.2f "
		"ms%s%s\n",
		s->path == PATH_AGENT ? "agent" : "direct", shape_name(s->shape), s->workers,
		s->agents, rate(r), r->p50_ms, r->p99_ms,
		r->ok ? "" : ", FAILED: ", r->ok ? "" : r->why);
}

/*
 * permit.check through an agent: the agent's own view of conservation. It
 * runs the same permits_check() as bench_db_check, inside the agent's
 * query_timeout_ms; over a large history it may not finish in time, which
 * is reported but is no violation (the direct run of it above judged).
 */
static bool agent_check(const struct bench_cfg *cfg)
{
	pgcoord *c = NULL;
	pgcoord_err e;
	bool ok = false;

	double t0 = bench_now();

	e = pgcoord_connect(cfg->sockets[0], 5000, &c);
	if (e == PGCOORD_OK)
		e = pgcoord_permit_check(c, 60000, &ok, NULL, NULL);
	/* how long the check took matters with a long history (0005_permit_audit.sql) */
	double ms = (bench_now() - t0) * 1000;
	if (e == PGCOORD_E_TIMEOUT) {
		printf("- permit.check through agent 0: not answered within the agent's "
		       "query_timeout_ms (%s); permits_check() above is the verdict\n",
		       pgcoord_last_message(c));
		ok = true;
	} else {
		printf("- permit.check through agent 0: %s (%.1f ms)\n",
		       e != PGCOORD_OK ? pgcoord_strerror(e)
		       : ok	       ? "ok"
				       : "VIOLATED",
		       ms);
		ok &= e == PGCOORD_OK;
	}
	pgcoord_close(c);
	return ok;
}

int main(int argc, char **argv)
{
	static struct bench_cfg cfg = {
	    .duration_s = 5,
	    .warmup_s = 1,
	    .workers = {1, 8, 32},
	    .nworkers = 3,
	    .agents = {1, 4},
	    .nagents = 2,
	    .shapes = {true, true},
	    .spread_keys = 1000,
	    .call_timeout_ms = 30000,
	};
	struct row rows[2 * BENCH_MAX_COUNTS * BENCH_MAX_COUNTS];
	struct cell_result direct[2][BENCH_MAX_COUNTS];
	int nrows = 0, cell = 0, started = 0;
	long granted = 0;
	bool ok = true;
	const char *tmp;
	PGconn *monitor;
	pid_t postmaster;

	parse_args(argc, argv, &cfg);
	int last_shape = cfg.shapes[SHAPE_HOT] ? SHAPE_HOT : SHAPE_SPREAD;
	tmp = getenv("PGCOORD_TEST_TMP");
	if (!tmp)
		usage_error("PGCOORD_TEST_TMP is not set: run under tests/harness/with-postgres "
			    "(scripts/bench does)");
	snprintf(cfg.tmp_dir, sizeof(cfg.tmp_dir), "%s", tmp);
	for (int i = 0; i < BENCH_MAX_AGENTS; i++)
		snprintf(cfg.sockets[i], sizeof(cfg.sockets[i]), "%s/bench-a%d.sock", tmp, i);
	signal(SIGPIPE, SIG_IGN);

	bench_db_setup(&cfg);
	monitor = bench_db_connect(&cfg, "pgcoord-bench-monitor");
	/* the postmaster is the parent of our own backend */
	postmaster = proc_parent(PQbackendPID(monitor));
	if (postmaster <= 1)
		fprintf(stderr, "pgcoord-bench: cannot find the postmaster: no Postgres CPU\n");
	print_conditions(&cfg, monitor);

	for (int a = 0; a < cfg.nagents; a++) {
		while (started < cfg.agents[a])
			bench_agent_start(&cfg, started++);
		for (int s = 0; s < 2; s++) {
			if (!cfg.shapes[s])
				continue;
			for (int wi = 0; wi < cfg.nworkers; wi++) {
				struct cell_spec spec = {.shape = (enum bench_shape)s,
							 .workers = cfg.workers[wi],
							 .agents = cfg.agents[a]};
				struct row *r = &rows[nrows++];

				if (a == 0) {
					spec.path = PATH_DIRECT;
					spec.index = cell++;
					spec.agents = 0;
					spec.leak = cfg.expect_leak && s == last_shape &&
						    wi == cfg.nworkers - 1;
					bench_run_cell(&cfg, &spec, monitor, postmaster,
						       &direct[s][wi]);
					progress(&spec, &direct[s][wi]);
					ok &= direct[s][wi].ok;
					spec.agents = cfg.agents[a];
				}
				spec.path = PATH_AGENT;
				spec.index = cell++;
				spec.leak = cfg.expect_leak && a == cfg.nagents - 1 &&
					    s == last_shape && wi == cfg.nworkers - 1;
				r->shape = spec.shape;
				r->workers = spec.workers;
				r->agents = spec.agents;
				r->direct = direct[s][wi];
				bench_run_cell(&cfg, &spec, monitor, postmaster, &r->agent);
				progress(&spec, &r->agent);
				granted += r->agent.granted;
				ok &= r->agent.ok;
			}
		}
	}
	print_table(rows, nrows);
	char load[128];
	load_average(load, sizeof(load));
	printf("\npgcoord-bench: load average after the last cell %s\n", load);
	ok &= bench_db_check(monitor, granted, cfg.expect_leak);
	/* a slot left taken on purpose is still counted: permit.check holds */
	ok &= agent_check(&cfg);
	bench_agents_stop();
	PQfinish(monitor);
	if (cfg.expect_leak)
		printf(
		    "\npgcoord-bench: %s\n",
		    ok ? "the check found exactly the slots left taken on purpose"
		       : "FAILED: the check did not find exactly the slots left taken (see above)");
	else
		printf("\npgcoord-bench: %s\n",
		       ok ? "every cycle succeeded and conservation holds" : "FAILED (see above)");
	return ok ? 0 : 1;
}
