/*
 * capacity.h — what the parts of pgcoord-capacity share: the run's
 * configuration, one measured point (agents × sessions per agent) and its
 * result, and the entry points of the database, fleet, load and model
 * parts.
 *
 * The tool runs beside a private cluster and a PgBouncer in transaction
 * mode (tests/harness/with-postgres --pgbouncer) and measures what a fleet
 * of agents costs the one Postgres: connections, statements and CPU at idle
 * by kind, and the claim throughput left for work (docs/CAPACITY.md); or,
 * with --failure, how fast a dead or frozen agent is noticed.
 */
#ifndef PGCOORD_TESTS_CAPACITY_H
#define PGCOORD_TESTS_CAPACITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <libpq-fe.h>
#include <pgcoord/pgcoord.h>

#define CAP_MAX_AGENTS 128
#define CAP_MAX_SESSIONS 1000 /* per agent */
#define CAP_MAX_COUNTS 8      /* entries of --agents and --sessions */
#define CAP_DB "capacity"
/* Permit ids and quota keys of the workload start with this. */
#define CAP_PREFIX "cap-"

struct cap_cfg {
	const char *agent_bin;
	double idle_s;	 /* measured idle seconds per point */
	double load_s;	 /* measured claim/release seconds per point */
	double settle_s; /* unmeasured seconds after sessions opened or load stopped */
	int agents[CAP_MAX_COUNTS], nagents;
	int sessions[CAP_MAX_COUNTS], nsessions;
	int pool_size;		   /* 0: the agent's default */
	int heartbeat_interval_ms; /* 0: the agent's default */
	int lease_retry_ms;	   /* 0: the agent's default */
	int bouncer_pool_size;	   /* PgBouncer's default_pool_size; 0: as set up */
	long closed_sessions;	   /* closed sessions preloaded: a long past */
	int call_timeout_ms;
	bool direct;		   /* agents connect to the server, not through PgBouncer */
	bool failure;		   /* measure failure detection instead (failure.c) */
	int failure_runs;	   /* runs of each failure scenario */
	bool waldump;		   /* print each idle window's WAL by record type */
	char owner_conninfo[1024]; /* the server, as the owner: setup and observation */
	char agent_conninfo[1024]; /* what agents use: PgBouncer, the runtime role */
	char bouncer_admin[1024];  /* PgBouncer's console; "" with direct */
	char runtime_role[64];
	char tmp_dir[512];
};

/* Statement kinds, told apart by their text in pg_stat_statements. */
enum stmt_kind {
	KIND_HEARTBEAT,
	KIND_LEASE,
	KIND_JANITOR,
	KIND_SESSION,
	KIND_CLAIM,
	KIND_RELEASE,
	KIND_BOUNDS, /* the set_config() before every agent statement */
	KIND_OTHER,
	KIND_COUNT
};

extern const char *const stmt_kind_names[KIND_COUNT];

struct pg_cpu_snap;

/* Postgres processes by kind (pgcpu.c): the connections' backends, and the
 * server's own. */
enum pg_proc_kind {
	PG_PROC_BACKEND,
	PG_PROC_AUTOVACUUM,
	PG_PROC_WALWRITER,
	PG_PROC_CHECKPOINTER,
	PG_PROC_BGWRITER,
	PG_PROC_OTHER,
	PG_PROC_KIND_COUNT
};

extern const char *const pg_proc_kind_names[PG_PROC_KIND_COUNT];

/* What the server did over one window. */
struct window {
	double seconds;
	double calls[KIND_COUNT];   /* statements of the runtime role by kind */
	double exec_ms[KIND_COUNT]; /* their execution time */
	/* lease_acquire calls by outcome: won (acquired or renewed), lost */
	double lease_won, lease_lost;
	double pg_cpu_ms;			      /* every postmaster child, from /proc */
	double pg_cpu_by_kind_ms[PG_PROC_KIND_COUNT]; /* the same by process kind */
	double agent_cpu_ms;			      /* every agent */
	int64_t wal_bytes;
	char wal_from[32], wal_to[32]; /* its LSNs, as Postgres prints them */
	struct pg_cpu_snap *cpu_start; /* while the window is open */
};

struct point {
	int agents, sessions; /* sessions per agent */
	struct window idle, load;
	int server_conns;  /* backends of the runtime role at idle */
	int bouncer_conns; /* agents' connections to PgBouncer (or to the server) */
	long cycles;	   /* claim + release cycles in the load window */
	long granted;	   /* claims admitted, settle included */
	long errors;
	double p50_ms, p99_ms;
	long agent_rss_kb; /* the largest agent's */
	char why[400];	   /* the first failure */
};

/* --- database.c --------------------------------------------------------- */

/* Loads pg_stat_statements (restarting the server), creates the database,
 * migrates it as the owner with the runtime role granted, and makes the
 * workload's quotas. Exits on failure. */
void cap_db_setup(struct cap_cfg *cfg);
PGconn *cap_db_connect(const struct cap_cfg *cfg, const char *appname);
/* Starts a window: resets pg_stat_statements, reads CPU and WAL. */
void cap_window_open(PGconn *c, pid_t postmaster, struct window *w);
/* Ends it: the statements since the reset by kind, CPU, WAL, seconds. */
void cap_window_close(PGconn *c, pid_t postmaster, struct window *w);
/* pg_waldump --stats=record of p's idle window, to stdout (--waldump). */
void cap_waldump_print(PGconn *c, const struct point *p);
/* Backends of the runtime role; and the agents' connections to PgBouncer. */
int cap_server_conns(PGconn *c);
int cap_bouncer_conns(const struct cap_cfg *cfg);
/* PgBouncer's default_pool_size, or -1. */
int cap_bouncer_pool_size(const struct cap_cfg *cfg);
void cap_db_describe(PGconn *c, char *buf, size_t size);
/* Conservation after the run; prints what it checked. */
bool cap_db_check(PGconn *c, long granted);

/* --- pgcpu.c -------------------------------------------------------------- */

/* The CPU time of each child of the postmaster now (NULL when out of memory). */
struct pg_cpu_snap *pg_cpu_snapshot(pid_t postmaster);
/* Their CPU since the snapshot, in ms, counting children started since;
 * by_kind_ms gets the same split by process kind. */
double pg_cpu_since_ms(const struct pg_cpu_snap *s, pid_t postmaster,
		       double by_kind_ms[PG_PROC_KIND_COUNT]);

/* --- fleet.c -------------------------------------------------------------- */

/* Starts agents 0..n-1 and waits until each serves. Exits when one does not. */
void cap_agents_start(const struct cap_cfg *cfg, int n);
void cap_agents_stop(void);
pid_t cap_agent_pid(int i);
/* SIGKILLs agent i (stopped or not) and waits for it. */
void cap_agent_reap(int i);
const char *cap_agent_socket(int i);
double cap_agents_cpu_ms(int n);
long cap_agents_max_rss_kb(int n);

/* Grows every agent's open sessions to per_agent (one client connection
 * each); the first session of each agent also holds a lease. False, with a
 * message, when one could not be opened. */
bool cap_sessions_grow(const struct cap_cfg *cfg, int agents, int per_agent, char *why,
		       size_t whylen);
/* Closes them all (session.close, then the connection). */
void cap_sessions_close(int agents);
/* Drops agent a's client connections without a word to the agent (it is
 * dead or frozen). */
void cap_sessions_abandon(int a);
/* The client of session s of agent a (owned by the fleet). */
pgcoord *cap_session_client(int a, int s);

/* --- load.c --------------------------------------------------------------- */

/* One claim/release worker per agent, on that agent's first session, back to
 * back for load_s after settle_s: fills the point's cycles, granted, errors
 * and latencies; opens and closes the load window around the measured part. */
void cap_load_run(const struct cap_cfg *cfg, int agents, int point_index, PGconn *monitor,
		  pid_t postmaster, struct point *p);

double cap_now(void);
void cap_sleep(double seconds);

/* --- failure.c ------------------------------------------------------------ */

/* The failure-detection measurement (--failure): sets up the database and
 * the fleet itself, prints its tables; the exit status. */
int cap_failure_run(struct cap_cfg *cfg);

/* --- model.c -------------------------------------------------------------- */

/* Fits and prints the per-fleet, per-agent and per-session idle costs and
 * the per-claim cost from the points, and what a fleet of the given size
 * would need. */
void cap_model_print(const struct point *pts, int n, const struct cap_cfg *cfg);

#endif
