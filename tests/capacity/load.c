/*
 * load.c — the claim/release load of one point: one worker thread per
 * agent, on that agent's first session, claiming one slot of the agent's
 * own quota key and releasing it, back to back. Closed loop on purpose:
 * the cycles it completes are the claim throughput the fleet's background
 * (heartbeats, leases, janitor) leaves for work on this server.
 *
 * Workers run unmeasured for settle_s, then the load window opens for
 * load_s; a cycle counts when it starts inside the window.
 */
#include "capacity.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALL_RETRIES 5	   /* attempts of a claim or release that fails retryably */
#define DRAIN_EVERY 64	   /* cycles between reads of queued lease notifications */
#define MAX_SAMPLES 200000 /* latencies kept per worker */

enum phase { PHASE_SETTLE, PHASE_MEASURE, PHASE_STOP };

struct worker {
	const struct cap_cfg *cfg;
	atomic_int *phase;
	pthread_t thread;
	int agent, point;
	pgcoord *client;
	char key[64];
	double *lat_ms;
	size_t n;
	long cycles, granted, errors;
	char why[400];
};

double cap_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void cap_sleep(double seconds)
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

static bool cycle(struct worker *w, long seq)
{
	const char *keys[1] = {w->key};
	int timeout = w->cfg->call_timeout_ms;
	pgcoord_claim *cl = NULL;
	pgcoord_err e = PGCOORD_OK;
	char id[96];

	snprintf(id, sizeof(id), CAP_PREFIX "p%d-a%d-%ld", w->point, w->agent, seq);
	/* the same id on a retry: an earlier attempt that was admitted is found */
	for (int i = 0; i < CALL_RETRIES; i++) {
		e = pgcoord_permit_claim(
		    w->client, id,
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
			     pgcoord_last_message(w->client));
		return false;
	}
	if (pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_DENIED) {
		worker_error(w, "permit.claim %s on %s denied", id, w->key);
		pgcoord_claim_free(cl);
		return false;
	}
	pgcoord_claim_free(cl);
	w->granted++;
	for (int i = 0; i < CALL_RETRIES; i++) {
		e = pgcoord_permit_release(w->client, id, 0, NULL, timeout, NULL);
		if (e == PGCOORD_OK || !pgcoord_err_retryable(e) || e == PGCOORD_E_IO)
			break;
	}
	if (e != PGCOORD_OK) {
		worker_error(w, "permit.release %s: %s: %s", id, pgcoord_strerror(e),
			     pgcoord_last_message(w->client));
		return false;
	}
	return true;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	long seq = 0;
	int phase;

	while ((phase = atomic_load(w->phase)) != PHASE_STOP) {
		double t0 = cap_now();
		bool ok = cycle(w, seq++);

		/* the lease's renewal notices queue up on this connection */
		if (seq % DRAIN_EVERY == 0)
			pgcoord_poll(w->client, 0, NULL);
		if (!ok) {
			if (w->errors > 20)
				break; /* the why says it; no point hammering on */
			cap_sleep(0.05);
			continue;
		}
		if (phase == PHASE_MEASURE) {
			w->cycles++;
			if (w->n < MAX_SAMPLES)
				w->lat_ms[w->n++] = (cap_now() - t0) * 1000.0;
		}
	}
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v. */
static double percentile(const double *v, size_t n, double p)
{
	size_t rank;

	if (n == 0)
		return 0;
	rank = (size_t)(p / 100.0 * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	return v[rank > n ? n - 1 : rank - 1];
}

void cap_load_run(const struct cap_cfg *cfg, int agents, int point_index, PGconn *monitor,
		  pid_t postmaster, struct point *p)
{
	struct worker *ws = calloc((size_t)agents, sizeof(*ws));
	atomic_int phase = PHASE_SETTLE;
	double *all;
	size_t total = 0;

	if (!ws) {
		snprintf(p->why, sizeof(p->why), "out of memory");
		p->errors++;
		return;
	}
	for (int a = 0; a < agents; a++) {
		struct worker *w = &ws[a];

		*w = (struct worker){.cfg = cfg, .phase = &phase, .agent = a, .point = point_index};
		w->client = cap_session_client(a, 0);
		snprintf(w->key, sizeof(w->key), CAP_PREFIX "a%d", a);
		w->lat_ms = malloc(MAX_SAMPLES * sizeof(double));
		if (!w->client || !w->lat_ms || pthread_create(&w->thread, NULL, work, w) != 0) {
			atomic_store(&phase, PHASE_STOP);
			for (int b = 0; b < a; b++)
				pthread_join(ws[b].thread, NULL);
			for (int b = 0; b <= a; b++)
				free(ws[b].lat_ms);
			free(ws);
			snprintf(p->why, sizeof(p->why), "cannot start the worker of agent %d", a);
			p->errors++;
			return;
		}
	}
	cap_sleep(cfg->settle_s);
	double agent_cpu = cap_agents_cpu_ms(agents);
	cap_window_open(monitor, postmaster, &p->load);
	atomic_store(&phase, PHASE_MEASURE);
	cap_sleep(cfg->load_s);
	atomic_store(&phase, PHASE_STOP);
	cap_window_close(monitor, postmaster, &p->load);
	p->load.agent_cpu_ms = cap_agents_cpu_ms(agents) - agent_cpu;

	for (int a = 0; a < agents; a++) {
		pthread_join(ws[a].thread, NULL);
		total += ws[a].n;
	}
	all = malloc((total ? total : 1) * sizeof(double));
	total = 0;
	for (int a = 0; a < agents; a++) {
		struct worker *w = &ws[a];

		p->cycles += w->cycles;
		p->granted += w->granted;
		p->errors += w->errors;
		if (w->why[0] && !p->why[0])
			snprintf(p->why, sizeof(p->why), "%s", w->why);
		if (all)
			memcpy(all + total, w->lat_ms, w->n * sizeof(double));
		total += w->n;
		free(w->lat_ms);
	}
	if (all) {
		qsort(all, total, sizeof(double), cmp_double);
		p->p50_ms = percentile(all, total, 50);
		p->p99_ms = percentile(all, total, 99);
		free(all);
	}
	free(ws);
}
