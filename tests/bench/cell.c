/*
 * cell.c — one measured cell: N worker threads, each on its own connection
 * (a libpq connection with prepared statements for the direct path, a
 * libpgcoord handle with its own session for the agent path), all doing the
 * same cycle back to back: take one slot of a quota, give it back.
 *
 * The workers connect first, then run unmeasured for the warmup; the
 * measured window opens and closes at phase changes, where the main thread
 * also reads Postgres' and the agents' CPU time and the WAL position. A
 * cycle counts when it starts inside the window.
 */
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pgcoord/pgcoord.h>

#define CALL_RETRIES 5 /* attempts of a claim or release that fails retryably */

enum phase { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

struct cell_run {
	const struct bench_cfg *cfg;
	const struct cell_spec *spec;
	atomic_int phase;
	pthread_barrier_t connected;
};

struct worker {
	struct cell_run *run;
	pthread_t thread;
	int index;
	char key[64];
	double *lat_ms; /* measured cycles' latencies */
	size_t n, cap;
	long granted; /* agent path: ids that got a permit, warmup included */
	long errors;
	char why[400]; /* the first error */
	PGconn *pg;
	pgcoord *agent;
};

double bench_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void bench_sleep(double seconds)
{
	struct timespec ts = {.tv_sec = (time_t)seconds,
			      .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

__attribute__((format(printf, 2, 3))) static void worker_error(struct worker *w, const char *fmt,
							       ...)
{
	va_list ap;

	w->errors++;
	if (w->why[0])
		return;
	va_start(ap, fmt);
	vsnprintf(w->why, sizeof(w->why), fmt, ap);
	va_end(ap);
}

static bool record(struct worker *w, double ms)
{
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 4096;
		double *bigger = realloc(w->lat_ms, cap * sizeof(*bigger));

		if (!bigger)
			return false;
		w->lat_ms = bigger;
		w->cap = cap;
	}
	w->lat_ms[w->n++] = ms;
	return true;
}

/* --- the direct path ------------------------------------------------------ */

static const char claim_sql[] = "UPDATE bench.quotas SET in_flight = in_flight + 1 "
				"WHERE key = $1 AND in_flight + 1 <= \"limit\"";
static const char release_sql[] = "UPDATE bench.quotas SET in_flight = in_flight - 1 "
				  "WHERE key = $1";

static bool prepare(struct worker *w, const char *name, const char *sql)
{
	PGresult *r = PQprepare(w->pg, name, sql, 1, NULL);
	bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;

	if (!ok)
		worker_error(w, "prepare %s: %s", name, PQresultErrorMessage(r));
	PQclear(r);
	return ok;
}

static bool direct_connect(struct worker *w)
{
	w->pg = PQconnectdb(w->run->cfg->direct_conninfo);
	if (PQstatus(w->pg) != CONNECTION_OK) {
		worker_error(w, "connect: %s", PQerrorMessage(w->pg));
		return false;
	}
	return prepare(w, "claim", claim_sql) && prepare(w, "release", release_sql);
}

/* One autocommitted UPDATE that must change exactly one row. */
static bool direct_step(struct worker *w, const char *stmt)
{
	const char *params[1] = {w->key};
	PGresult *r = PQexecPrepared(w->pg, stmt, 1, params, NULL, NULL, 0);
	bool ok = false;

	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		worker_error(w, "%s: %s", stmt, PQresultErrorMessage(r));
	else if (strcmp(PQcmdTuples(r), "1") != 0)
		worker_error(w, "%s of %s changed %s rows (no room?)", stmt, w->key,
			     PQcmdTuples(r));
	else
		ok = true;
	PQclear(r);
	return ok;
}

static bool direct_cycle(struct worker *w)
{
	if (!direct_step(w, "claim"))
		return false;
	/* a release that fails leaves the counter up: the check will say so */
	return direct_step(w, "release");
}

/* --- the agent path ------------------------------------------------------- */

static bool agent_connect(struct worker *w)
{
	const struct cell_spec *spec = w->run->spec;
	const char *sock = w->run->cfg->sockets[w->index % spec->agents];
	char name[64];
	pgcoord_err e;

	e = pgcoord_connect(sock, 5000, &w->agent);
	if (e != PGCOORD_OK) {
		worker_error(w, "connect to %s: %s (%s)", sock, pgcoord_strerror(e),
			     strerror(errno));
		return false;
	}
	snprintf(name, sizeof(name), "bench-c%d-w%d", spec->index, w->index);
	e = pgcoord_session_open(w->agent, name, w->run->cfg->call_timeout_ms, NULL);
	if (e != PGCOORD_OK) {
		worker_error(w, "session.open: %s: %s", pgcoord_strerror(e),
			     pgcoord_last_message(w->agent));
		return false;
	}
	return true;
}

static bool agent_cycle(struct worker *w, long seq)
{
	const char *keys[1] = {w->key};
	int timeout = w->run->cfg->call_timeout_ms;
	pgcoord_claim *cl = NULL;
	pgcoord_err e = PGCOORD_OK;
	char id[96];
	bool released = false;

	snprintf(id, sizeof(id), "%sc%d-w%d-%ld", BENCH_PERMIT_PREFIX, w->run->spec->index,
		 w->index, seq);
	/* the same id on a retry: an earlier attempt that was admitted is found */
	for (int i = 0; i < CALL_RETRIES; i++) {
		e = pgcoord_permit_claim(
		    w->agent, id,
		    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						 .keys = keys,
						 .nquotas = 1,
						 .limit = PGCOORD_NO_LIMIT},
		    timeout, &cl);
		if (e == PGCOORD_OK || !pgcoord_err_retryable(e) || e == PGCOORD_E_IO)
			break;
	}
	if (e != PGCOORD_OK) {
		worker_error(w, "permit.claim %s: %s: %s", id, pgcoord_strerror(e),
			     pgcoord_last_message(w->agent));
		return false;
	}
	if (pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_DENIED) {
		worker_error(
		    w, "permit.claim %s on %s denied (in_flight %" PRId64 " of %" PRId64 ")", id,
		    w->key, pgcoord_claim_denied_in_flight(cl), pgcoord_claim_denied_limit(cl));
		pgcoord_claim_free(cl);
		return false;
	}
	pgcoord_claim_free(cl);
	w->granted++;
	for (int i = 0; i < CALL_RETRIES; i++) {
		e = pgcoord_permit_release(w->agent, id, 0, NULL, timeout, &released);
		if (e == PGCOORD_OK || !pgcoord_err_retryable(e) || e == PGCOORD_E_IO)
			break;
	}
	if (e != PGCOORD_OK) {
		worker_error(w, "permit.release %s: %s: %s", id, pgcoord_strerror(e),
			     pgcoord_last_message(w->agent));
		return false;
	}
	return true;
}

/*
 * --expect-leak: one more claim, never released, so that the conservation
 * check has something real to find: the state a client leaves when it
 * forgets a release (the permit stays counted after its session closes).
 */
static bool leave_one_taken(struct worker *w, long seq)
{
	const char *keys[1] = {w->key};
	pgcoord_claim *cl = NULL;
	char id[96];
	bool ok;

	if (!w->agent)
		return direct_step(w, "claim");
	snprintf(id, sizeof(id), "%sc%d-w%d-%ld-kept", BENCH_PERMIT_PREFIX, w->run->spec->index,
		 w->index, seq);
	if (pgcoord_permit_claim(
		w->agent, id,
		&(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					     .keys = keys,
					     .nquotas = 1,
					     .limit = PGCOORD_NO_LIMIT},
		w->run->cfg->call_timeout_ms, &cl) != PGCOORD_OK)
		return false;
	ok = pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_ADMITTED;
	pgcoord_claim_free(cl);
	if (ok)
		w->granted++;
	return ok;
}

/* --- the worker ------------------------------------------------------------- */

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct cell_run *run = w->run;
	bool agent = run->spec->path == PATH_AGENT;
	bool up = agent ? agent_connect(w) : direct_connect(w);
	long seq = 0;

	pthread_barrier_wait(&run->connected);
	while (up) {
		int phase = atomic_load(&run->phase);
		double t0, t1;
		bool ok;

		if (phase == PHASE_STOP)
			break;
		t0 = bench_now();
		ok = agent ? agent_cycle(w, seq++) : direct_cycle(w);
		t1 = bench_now();
		if (!ok)
			break; /* a failed cycle may leave a slot taken: stop, the check tells */
		if (phase == PHASE_MEASURE && !record(w, (t1 - t0) * 1000.0)) {
			worker_error(w, "out of memory");
			break;
		}
	}
	if (up && w->index == 0 && run->spec->leak && !leave_one_taken(w, seq))
		worker_error(w, "could not take the slot to leave taken");
	if (w->agent) {
		pgcoord_session_close(w->agent, run->cfg->call_timeout_ms);
		pgcoord_close(w->agent);
	}
	PQfinish(w->pg);
	return NULL;
}

/* --- the cell ------------------------------------------------------------------- */

struct snapshot {
	double t;
	double pg_cpu_ms;
	double agent_cpu_ms;
	int64_t wal;
};

static void take(const struct cell_spec *spec, PGconn *monitor, pid_t postmaster,
		 struct snapshot *s)
{
	s->t = bench_now();
	s->pg_cpu_ms = postmaster > 0 ? proc_children_cpu_ms(postmaster) : -1;
	s->agent_cpu_ms = 0;
	for (int i = 0; i < spec->agents; i++)
		if (bench_agent_pid(i) > 0)
			s->agent_cpu_ms += proc_cpu_ms(bench_agent_pid(i));
	s->wal = bench_wal_lsn(monitor);
}

/*
 * Each cell starts from vacuumed tables. The Postgres CPU of a cell counts
 * every server process, autovacuum's too, and a x32 cell leaves thousands
 * of dead permit rows: the x1 cell after it paid for vacuuming them, which
 * made hot x1 (run after spread x32) look twice as costly as spread x1
 * (docs/PERFORMANCE.md). The cell's own dead rows still count in it.
 */
static void settle(PGconn *monitor)
{
	char sql[256];
	snprintf(sql, sizeof(sql),
		 "VACUUM pgcoord.quotas, pgcoord.permits, pgcoord.permit_quotas, %s, bench.quotas",
		 bench_audit_table(monitor));
	PGresult *r = PQexec(monitor, sql);

	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		fprintf(stderr, "pgcoord-bench: vacuum before the cell: %s",
			PQresultErrorMessage(r));
	PQclear(r);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The nearest-rank percentile of sorted v. */
static double percentile(const double *v, size_t n, double p)
{
	size_t rank;

	if (n == 0)
		return 0;
	rank = (size_t)(p * (double)n + 0.999999);
	return v[(rank ? rank : 1) - 1];
}

void bench_run_cell(const struct bench_cfg *cfg, const struct cell_spec *spec, PGconn *monitor,
		    pid_t postmaster, struct cell_result *out)
{
	struct cell_run run = {.cfg = cfg, .spec = spec};
	struct worker *w = calloc((size_t)spec->workers, sizeof(*w));
	struct snapshot before, after;
	double *all;
	size_t n = 0;

	memset(out, 0, sizeof(*out));
	if (!w) {
		snprintf(out->why, sizeof(out->why), "out of memory");
		return;
	}
	settle(monitor);
	atomic_init(&run.phase, PHASE_WARMUP);
	pthread_barrier_init(&run.connected, NULL, (unsigned)spec->workers + 1);
	for (int i = 0; i < spec->workers; i++) {
		w[i].run = &run;
		w[i].index = i;
		bench_key(cfg, spec->shape, i, w[i].key, sizeof(w[i].key));
		if (pthread_create(&w[i].thread, NULL, worker_main, &w[i]) != 0) {
			fprintf(stderr, "pgcoord-bench: cannot start worker threads\n");
			exit(2);
		}
	}
	pthread_barrier_wait(&run.connected);
	bench_sleep(cfg->warmup_s);
	take(spec, monitor, postmaster, &before);
	atomic_store(&run.phase, PHASE_MEASURE);
	bench_sleep(cfg->duration_s);
	atomic_store(&run.phase, PHASE_STOP);
	take(spec, monitor, postmaster, &after);
	for (int i = 0; i < spec->workers; i++) {
		pthread_join(w[i].thread, NULL);
		n += w[i].n;
	}
	pthread_barrier_destroy(&run.connected);

	out->ok = true;
	all = malloc((n ? n : 1) * sizeof(*all));
	if (!all) {
		out->ok = false;
		snprintf(out->why, sizeof(out->why), "out of memory for %zu latencies", n);
	}
	n = 0;
	for (int i = 0; i < spec->workers; i++) {
		if (all && w[i].n) {
			memcpy(all + n, w[i].lat_ms, w[i].n * sizeof(*all));
			n += w[i].n;
		}
		out->granted += w[i].granted;
		out->errors += w[i].errors;
		if (w[i].errors && out->ok) {
			out->ok = false;
			snprintf(out->why, sizeof(out->why), "worker %d: %s", i, w[i].why);
		}
		free(w[i].lat_ms);
	}
	if (all) {
		qsort(all, n, sizeof(*all), cmp_double);
		out->p50_ms = percentile(all, n, 0.50);
		out->p99_ms = percentile(all, n, 0.99);
		free(all);
	}
	out->cycles = (long)n;
	out->seconds = after.t - before.t;
	out->pg_cpu_ms =
	    before.pg_cpu_ms >= 0 && after.pg_cpu_ms >= 0 ? after.pg_cpu_ms - before.pg_cpu_ms : -1;
	out->wal_bytes = before.wal >= 0 && after.wal >= 0 ? after.wal - before.wal : -1;
	out->agent_cpu_ms = after.agent_cpu_ms - before.agent_cpu_ms;
	if (cfg->wal_records) {
		char name[96];
		snprintf(name, sizeof(name), "%s x%d, %d agent(s), %s",
			 spec->shape == SHAPE_HOT ? "hot" : "spread", spec->workers, spec->agents,
			 spec->path == PATH_AGENT ? "through the agent" : "direct SQL");
		bench_wal_records(name, before.wal, after.wal, out->cycles);
	}
	out->agent_rss_kb = 0;
	for (int i = 0; spec->path == PATH_AGENT && i < spec->agents; i++) {
		long rss = bench_agent_pid(i) > 0 ? proc_rss_kb(bench_agent_pid(i)) : -1;

		if (rss > out->agent_rss_kb)
			out->agent_rss_kb = rss;
	}
	free(w);
}
