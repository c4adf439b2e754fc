/*
 * bench.h — what the parts of pgcoord-bench share: the run's configuration,
 * one measured cell (a path, a shape, a number of workers and of agents) and
 * its result, and the entry points of the database, agent, /proc and worker
 * parts.
 *
 * The benchmark runs beside a private cluster (tests/harness/with-postgres)
 * and compares, cell by cell, the direct-SQL cycle a replica would run
 * itself with the same cycle through the agent (docs/PERFORMANCE.md).
 */
#ifndef PGCOORD_TESTS_BENCH_H
#define PGCOORD_TESTS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <libpq-fe.h>

#define BENCH_MAX_AGENTS 16
#define BENCH_MAX_WORKERS 256
#define BENCH_MAX_COUNTS 8 /* entries of --workers and --agents */

/* Quota keys of the workload, in the agent's tables and the direct one. */
#define BENCH_HOT_KEY "bench-hot"
#define BENCH_HOT_LIMIT 100000 /* room for every worker */
#define BENCH_SPREAD_LIMIT 1   /* each worker its own key, one slot */
/* Permit ids of the workload start with this; history ids do not. */
#define BENCH_PERMIT_PREFIX "bench-"

enum bench_path { PATH_DIRECT, PATH_AGENT };
enum bench_shape { SHAPE_SPREAD, SHAPE_HOT };

struct bench_cfg {
	const char *agent_bin;
	double duration_s; /* measured time per cell */
	double warmup_s;   /* unmeasured time before it */
	int workers[BENCH_MAX_COUNTS], nworkers;
	int agents[BENCH_MAX_COUNTS], nagents;
	bool shapes[2];	      /* by enum bench_shape */
	int spread_keys;      /* quota keys of the spread shape */
	long history_permits; /* released permits preloaded */
	long history_keys;    /* quota keys they are spread over */
	int pool_size;	      /* 0: the agent's default */
	int call_timeout_ms;  /* of each claim and release */
	bool expect_leak;     /* testing the check: leave one slot taken per path */
	bool wal_records;     /* --wal-records: each cell's WAL by record type */
	char direct_conninfo[1024];
	char sockets[BENCH_MAX_AGENTS][256];
	char tmp_dir[512]; /* sockets and agent logs */
};

struct cell_spec {
	enum bench_path path;
	enum bench_shape shape;
	int workers;
	int agents; /* agents the workers spread over (PATH_AGENT) */
	int index;  /* of the cell in the run, part of its permit ids */
	bool leak;  /* --expect-leak: worker 0 ends by taking a slot it keeps */
};

struct cell_result {
	bool ok;	/* every cycle succeeded */
	char why[512];	/* the first failure, when !ok */
	long cycles;	/* measured */
	long granted;	/* claims granted through the agent, warmup and leak included */
	long errors;	/* cycles that failed */
	double seconds; /* measured wall time */
	double p50_ms, p99_ms;
	double pg_cpu_ms;    /* Postgres CPU over the measured time */
	int64_t wal_bytes;   /* WAL written over the measured time */
	double agent_cpu_ms; /* all agents' CPU over the measured time */
	long agent_rss_kb;   /* the largest agent's RSS at the end */
};

/* --- database.c ----------------------------------------------------------- */

/* Creates the database, applies the migrations with the agent's own
 * `migrate`, turns durable commits on, preloads the history and creates the
 * workload's quotas (in pgcoord and in the direct table). Exits on failure. */
void bench_db_setup(struct bench_cfg *cfg);

/* The table of the audit rows: permit_events, or since 0016 its log. */
const char *bench_audit_table(PGconn *c);

/* A connection to the bench database (exits on failure). */
PGconn *bench_db_connect(const struct bench_cfg *cfg, const char *appname);

/* The quota key worker w uses in the given shape, in buf. */
void bench_key(const struct bench_cfg *cfg, enum bench_shape shape, int worker, char *buf,
	       size_t size);

/* --wal-records: the WAL between two positions by record type, per
 * cycle, to stderr (walstats.c). */
void bench_wal_records(const char *cell, int64_t from, int64_t to, long cycles);

/* pg_current_wal_insert_lsn() in bytes, or -1 (with a message) on failure. */
int64_t bench_wal_lsn(PGconn *c);

/* One line of the server's settings that matter for the numbers, in buf. */
void bench_db_describe(PGconn *c, char *buf, size_t size);

/*
 * Conservation after the run: every workload quota (agent and direct) back
 * to 0, no workload permit left unreleased, as many admissions and releases
 * in the audit as the workers were granted, and permits_check() clean on
 * every quota (history included). Prints what it checked; false when
 * something does not hold.
 *
 * With leaked (--expect-leak), the run kept one slot on purpose in each
 * path: the check then expects exactly that — one agent quota and one
 * direct counter at 1, one permit unreleased, one release fewer than
 * grants — which proves it reads the state it claims to.
 */
bool bench_db_check(PGconn *c, long granted, bool leaked);

/* --- agents.c --------------------------------------------------------------- */

/* Starts agent i (socket cfg->sockets[i]) and waits until it serves.
 * Exits, printing its log, when it does not. */
void bench_agent_start(const struct bench_cfg *cfg, int i);
/* SIGTERM to every running agent, then waits for them. */
void bench_agents_stop(void);
pid_t bench_agent_pid(int i);

/* --- procstat.c -------------------------------------------------------------- */

/* CPU time (user + system) of one process in ms; -1 when it is gone. */
double proc_cpu_ms(pid_t pid);
/* Resident set size of one process in KiB; -1 when it is gone. */
long proc_rss_kb(pid_t pid);
/* CPU time of every child of parent (the postmaster's backends and
 * auxiliary processes) in ms. */
double proc_children_cpu_ms(pid_t parent);
/* The parent of pid, or -1. */
pid_t proc_parent(pid_t pid);
/* ppid and CPU ticks (utime + stime) of pid from /proc/<pid>/stat; either
 * pointer may be NULL. False when pid is gone. */
bool proc_read_stat(pid_t pid, pid_t *ppid, unsigned long long *ticks);

/* --- cell.c ------------------------------------------------------------------- */

/* Runs one cell: connects the workers, warms up, measures, stops them. */
void bench_run_cell(const struct bench_cfg *cfg, const struct cell_spec *spec, PGconn *monitor,
		    pid_t postmaster, struct cell_result *out);

/* Monotonic seconds. */
double bench_now(void);
void bench_sleep(double seconds);

#endif
