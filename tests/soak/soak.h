/*
 * soak.h — what the soak driver's parts share: the run's configuration, a
 * seeded PRNG, CLOCK_MONOTONIC time, the JSON-lines history writer, and the
 * entry points of the client workloads, the sampler and the fault injector.
 *
 * Every process writes its own history file (one writer per file, no
 * locking); the checker (tests/soak/check) merges them on the shared
 * CLOCK_MONOTONIC time base, which all processes of one host agree on.
 */
#ifndef PGCOORD_TESTS_SOAK_H
#define PGCOORD_TESTS_SOAK_H

#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define SOAK_MAX_AGENTS 16
#define SOAK_MAX_CLIENTS 64 /* per agent */
#define SOAK_NQUOTAS 3

/* --- the run ------------------------------------------------------------ */

struct soak_cfg {
	const char *out_dir;
	const char *agent_bin;
	int64_t duration_ms;
	int agents;
	int clients;	    /* per agent */
	int lease_workers;  /* of the clients, per agent */
	int record_workers; /* of the clients, per agent (0 while records do not exist) */
	int leases;	    /* lease names contended for */
	int think_ms;	    /* mean pause between a client's operations */
	uint64_t seed;
	bool pgbouncer;
	bool faults;
	bool faketime_monotonic; /* the clock-jump agent also sees CLOCK_MONOTONIC jump */
	const char *only_faults; /* comma list of fault kinds, NULL = all */
	const char *break_name;	 /* a broken variant applied to the schema (test builds) */

	/* timing of the agents (and what the workload derives from it) */
	int heartbeat_ms, session_ttl_ms, session_grace_ms, lease_ttl_ms, lease_renew_ms;
	int lease_retry_ms, janitor_ms, query_timeout_ms, call_timeout_ms;

	/* filled in by the driver */
	char db_name[64];
	char direct_conninfo[1024]; /* the checker's and sampler's path: the server itself */
	char agent_conninfo[1024];  /* the agents' path: the server, or PgBouncer */
	char faketime_file[512];
	char sockets[SOAK_MAX_AGENTS][256];
};

/* The quotas the workload claims against: one hot key, two roomier ones. */
struct soak_quota {
	const char *key;
	int limit;
};
extern const struct soak_quota soak_quotas[SOAK_NQUOTAS];

/* The name of lease i ("soak-lead-<i>"). */
void soak_lease_name(int i, char *buf, size_t size);

/* --- time and randomness -------------------------------------------------- */

/* CLOCK_MONOTONIC in microseconds: every time in the history. */
int64_t soak_now_us(void);
/* Sleeps ms milliseconds, restarting on EINTR unless *stop (may be NULL) is set. */
void soak_sleep_ms(int64_t ms, volatile sig_atomic_t *stop);

/* splitmix64: small, seedable, good enough to drive a workload. */
struct soak_rng {
	uint64_t s;
};
uint64_t soak_rand(struct soak_rng *r);
/* Uniform in [lo, hi]. */
int64_t soak_rand_range(struct soak_rng *r, int64_t lo, int64_t hi);
/* True with probability p. */
bool soak_chance(struct soak_rng *r, double p);
/* Exponentially distributed with the given mean (at least 0). */
int64_t soak_rand_exp(struct soak_rng *r, double mean);
/* A seed for one participant of the run, derived from the run's seed. */
uint64_t soak_derive_seed(uint64_t seed, uint64_t who);

/* --- history -------------------------------------------------------------- */

/*
 * One JSON object per line. hist_begin starts a line ({"k":kind), the
 * field helpers append ,"name":value, hist_end closes and writes it. Not
 * thread-safe: one writer per thread.
 */
struct hist {
	FILE *f;
	char *buf;
	size_t len, cap;
	bool failed;
};

bool hist_open(struct hist *h, const char *path) __attribute__((warn_unused_result));
void hist_close(struct hist *h);
void hist_flush(struct hist *h);
void hist_begin(struct hist *h, const char *kind);
void hist_str(struct hist *h, const char *name, const char *value); /* NULL: null */
void hist_int(struct hist *h, const char *name, int64_t value);
void hist_bool(struct hist *h, const char *name, bool value);
/* Appends ,"name": followed by raw JSON text (an array built by the caller). */
void hist_raw(struct hist *h, const char *name, const char *json);
void hist_end(struct hist *h);
/* JSON-escapes s into the growable buffer (used for raw arrays). */
void hist_json_escape(char *out, size_t size, const char *s);

/* Silences server notices on a libpq connection (takes the opaque PGconn). */
struct pg_conn;
void soak_quiet(struct pg_conn *c);
void soak_ignore_notice(void *arg, const char *message);

/* --- the participants ------------------------------------------------------ */

enum client_role {
	ROLE_PERMITS = 0,
	ROLE_LEASE = 1,
	ROLE_RECORDS = 2,
};

struct client_spec {
	const struct soak_cfg *cfg;
	int agent; /* index of its agent */
	int index; /* among the clients of its agent */
	enum client_role role;
	char name[32]; /* "a<agent>c<index>" */
	int64_t end_us;
};

/* Runs one client in this (forked) process until SIGTERM or its end time;
 * returns the process's exit code. */
int client_main(const struct client_spec *spec);

/* The sampler: a thread reading counters in one REPEATABLE READ snapshot
 * every 100 ms into history/samples.jsonl. */
struct sampler;
struct sampler *sampler_start(const struct soak_cfg *cfg);
void sampler_stop(struct sampler *s);

/* --- faults ----------------------------------------------------------------- */

enum fault_kind {
	FAULT_AGENT_KILL,    /* kill -9 an agent, restart it */
	FAULT_AGENT_STOP,    /* SIGSTOP an agent for longer than the lease ttl */
	FAULT_CLIENT_STOP,   /* SIGSTOP a client process */
	FAULT_BACKEND_KILL,  /* pg_terminate_backend of agent connections, some mid-statement */
	FAULT_PG_RESTART,    /* Postgres immediate-mode restart (a crash) */
	FAULT_BOUNCER_KILL,  /* kill -9 PgBouncer, restart it (with --pgbouncer) */
	FAULT_CLIENT_NOREAD, /* a client that stops reading its socket */
	FAULT_CLOCK_JUMP,    /* the wall clock of one agent jumps (libfaketime) */
	FAULT_PG_FAILOVER,   /* the primary crashes, its synchronous standby is promoted (--standby)
			      */
	FAULT__COUNT
};

const char *fault_kind_name(enum fault_kind k);
bool fault_kind_parse(const char *name, enum fault_kind *out);

struct fault {
	int64_t at_ms; /* after the start of the workload */
	enum fault_kind kind;
	int target;	 /* agent index, or client number (agent * clients + index) */
	int64_t hold_ms; /* how long the fault lasts (stop, down time) */
	int64_t param;	 /* kind-specific: clock offset in s, victims, leader-targeted */
};

/* The seeded schedule for cfg: every enabled kind at least once (when the
 * run is long enough), then more at random gaps. Caller frees *out. */
size_t faults_plan(const struct soak_cfg *cfg, struct fault **out);
void fault_describe(const struct fault *f, char *buf, size_t size);

/* The driver's side of a running fleet, for the injector. */
struct fleet;
pid_t fleet_agent_pid(struct fleet *fl, int agent);
/* kill -9 (sig SIGKILL) or SIGTERM the agent, reap it; restart: start it
 * again and wait until it serves. */
void fleet_agent_signal(struct fleet *fl, int agent, int sig);
bool fleet_agent_reap(struct fleet *fl, int agent, int timeout_ms);
bool fleet_agent_start(struct fleet *fl, int agent);
pid_t fleet_client_pid(struct fleet *fl, int client);
/* The agent whose session holds lease 0 now (by the database), or -1. */
int fleet_leader_agent(struct fleet *fl);

/* Runs f, recording it (start, end, what happened) in the driver's history. */
void fault_inject(struct fleet *fl, const struct soak_cfg *cfg, struct hist *h,
		  const struct fault *f, volatile sig_atomic_t *stop);

#endif
