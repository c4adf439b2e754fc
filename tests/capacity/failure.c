/*
 * failure.c — failure detection, measured (--failure): how long, by the
 * database clock, a fleet takes to notice that one of its agents died.
 *
 * M agents serve S sessions each. Before each run every session of the
 * victim agent puts one record and claims two permits of its own quota:
 * one that turns uncertain when its owner dies (the default) and one
 * claimed with release on owner loss. The tool reads the database clock,
 * signals the victim (SIGKILL, or SIGSTOP: a frozen host), and from then
 * on polls, every POLL_MS, until:
 *
 *   (a) none of the victim's sessions is in pgcoord.live_sessions;
 *   (b) record.recover through a surviving agent would adopt every one of
 *       the victim's records (a dry run, read at each poll; a real
 *       recovery must then adopt them all);
 *   (c) owner loss was applied to every permit: the default ones are
 *       uncertain, the release ones released (the time is the latest
 *       state_at among them).
 *
 * (a) and (b) are the clock_timestamp() of the first poll that saw them,
 * so late by at most one poll cycle (POLL_MS, the poll and the dry run's
 * round trip: the longest is printed); (c) is the database's own timestamp of the
 * janitor's transaction that did it. Every time is measured from the
 * database clock read just before the signal. A recovery that
 * adopts a record while one of the victim's sessions is still live breaks
 * guarantee 8 and fails the run.
 *
 * Three scenarios, each --failure-runs times on a fresh victim: kill -9 of
 * an agent that is not the janitor, SIGSTOP of one, and kill -9 of the
 * janitor itself (its successor must first win the janitor lease before
 * anyone applies owner loss). A victim is killed and reaped after its run.
 */
#include "capacity.h"
#include "pgq.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POLL_MS 20
#define RUN_TIMEOUT_S 120.0
#define FD_QUOTA "fd-victims"
#define JANITOR_LEASE_NAME "pgcoord.janitor"

struct scenario {
	const char *name;
	int signal;
	bool janitor; /* the victim is the janitor */
};

static const struct scenario scenarios[] = {
    {"kill -9", SIGKILL, false},
    {"SIGSTOP", SIGSTOP, false},
    {"kill -9 the janitor", SIGKILL, true},
};
#define SCENARIO_COUNT (sizeof(scenarios) / sizeof(scenarios[0]))

/* One run's outcome: ms after the signal, by the database clock; < 0 not
 * reached within RUN_TIMEOUT_S. */
struct fd_run {
	int victim;
	double not_live_ms, recovered_ms, owner_loss_ms;
	double poll_max_ms;  /* the longest poll cycle: the resolution of (a), (b) */
	bool early_recovery; /* a record recoverable while its owner was live */
	char why[300];
};

static bool dead[CAP_MAX_AGENTS];

static double db_clock(PGconn *c)
{
	PGresult *r = PQexec(c, "SELECT extract(epoch FROM clock_timestamp())");
	double t = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		t = strtod(PQgetvalue(r, 0, 0), NULL);
	PQclear(r);
	return t;
}

/* The agent holding the janitor lease now, or -1. */
static int janitor_agent(PGconn *c)
{
	PGresult *r =
	    PQexec(c, "SELECT holder_replica FROM pgcoord.leases WHERE name = '" JANITOR_LEASE_NAME
		      "' AND expires_at > now()");
	int a = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
	    sscanf(PQgetvalue(r, 0, 0), "cap-a%d", &a) != 1)
		a = -1;
	PQclear(r);
	return a;
}

/* A victim for the scenario: the janitor, or the highest living agent that
 * is not the janitor; -1 when none is left beside a survivor. */
static int pick_victim(PGconn *c, int agents, bool janitor)
{
	int j = -1;
	double end = cap_now() + RUN_TIMEOUT_S;

	/* after the janitor's death its successor needs the lease's ttl */
	while (((j = janitor_agent(c)) < 0 || dead[j]) && cap_now() < end)
		cap_sleep(0.2);
	if (janitor)
		return j >= 0 && !dead[j] ? j : -1;
	for (int a = agents - 1; a > 0; a--)
		if (!dead[a] && a != j)
			return a;
	return -1;
}

/* Who recovers: the lowest living agent that is not the victim. */
static int pick_survivor(int agents, int victim)
{
	for (int a = 0; a < agents; a++)
		if (!dead[a] && a != victim)
			return a;
	return -1;
}

/* Each session of the victim: one record, a permit that turns uncertain and
 * one released on owner loss. Fills ids with the session ids. */
static bool prepare(int victim, int sessions, int run, int64_t *ids, char *why, size_t whylen)
{
	const char *keys[1] = {FD_QUOTA};

	for (int s = 0; s < sessions; s++) {
		pgcoord *c = cap_session_client(victim, s);
		char kind[32], key[32], id[64];
		pgcoord_claim *cl = NULL;
		pgcoord_err e;

		if (!c) {
			snprintf(why, whylen, "agent %d has no session %d", victim, s);
			return false;
		}
		ids[s] = pgcoord_session_id(c);
		snprintf(kind, sizeof(kind), "fd-%d", run);
		snprintf(key, sizeof(key), "s%d", s);
		e = pgcoord_record_put(c, kind, key, "running", NULL, 0, NULL, 10000, NULL, NULL);
		for (int k = 0; k < 2 && e == PGCOORD_OK; k++) {
			struct pgcoord_claim_opts o = PGCOORD_CLAIM_OPTS_INIT;

			o.keys = keys;
			o.nquotas = 1;
			o.flags = k ? PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS : 0;
			snprintf(id, sizeof(id), "fd-%d-s%d-%s", run, s, k ? "r" : "u");
			e = pgcoord_permit_claim(c, id, &o, 10000, &cl);
			if (e == PGCOORD_OK && pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_DENIED)
				e = PGCOORD_E_BUSY;
			pgcoord_claim_free(cl);
			cl = NULL;
		}
		if (e != PGCOORD_OK) {
			snprintf(why, whylen, "agent %d, session %d: %s: %s", victim, s,
				 pgcoord_strerror(e), pgcoord_last_message(c));
			return false;
		}
	}
	return true;
}

static char *id_array(const int64_t *ids, int n)
{
	char *buf = malloc((size_t)n * 22 + 4);
	size_t off = 0;

	if (!buf)
		return NULL;
	buf[off++] = '{';
	for (int i = 0; i < n; i++)
		off += (size_t)sprintf(buf + off, "%s%lld", i ? "," : "", (long long)ids[i]);
	buf[off++] = '}';
	buf[off] = '\0';
	return buf;
}

/* One poll of (a) and (c): 1 when done, 0 not yet, -1 a failed read. */
static int poll_db(PGconn *c, const char *ids, int run, int sessions, double t0, struct fd_run *out,
		   bool *still_live)
{
	char sql[1024], uncertain[48], released[48];
	PGresult *r;
	int done = 0;

	snprintf(uncertain, sizeof(uncertain), "fd-%d-s%%-u", run);
	snprintf(released, sizeof(released), "fd-%d-s%%-r", run);
	snprintf(sql, sizeof(sql),
		 "SELECT extract(epoch FROM clock_timestamp()), "
		 "(SELECT count(*) FROM pgcoord.live_sessions WHERE id = ANY ('%s'::bigint[])), "
		 "(SELECT count(*) FROM pgcoord.permits WHERE id LIKE '%s' AND state = "
		 "'uncertain') + (SELECT count(*) FROM pgcoord.permits WHERE id LIKE '%s' AND "
		 "state = 'released'), "
		 "(SELECT extract(epoch FROM max(state_at)) FROM pgcoord.permits "
		 "WHERE id LIKE '%s' OR id LIKE '%s')",
		 ids, uncertain, released, uncertain, released);
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		snprintf(out->why, sizeof(out->why), "poll: %s", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	double now = strtod(PQgetvalue(r, 0, 0), NULL);
	long live = atol(PQgetvalue(r, 0, 1)), lost = atol(PQgetvalue(r, 0, 2));

	*still_live = live > 0;
	if (live == 0 && out->not_live_ms < 0)
		out->not_live_ms = (now - t0) * 1000.0;
	if (lost == 2L * sessions && out->owner_loss_ms < 0)
		out->owner_loss_ms = (strtod(PQgetvalue(r, 0, 3), NULL) - t0) * 1000.0;
	done = out->not_live_ms >= 0 && out->owner_loss_ms >= 0;
	PQclear(r);
	return done;
}

/* One record.recover of the run's records through the survivor: the number
 * it adopted, or with dry_run would adopt now; -1 on an error. */
static long recover_once(pgcoord *survivor, int run, bool dry_run, char *why, size_t whylen)
{
	char kind[32];
	const char *kinds[1] = {kind};
	pgcoord_recovery *rv = NULL;
	pgcoord_err e;
	long n;

	snprintf(kind, sizeof(kind), "fd-%d", run);
	e = pgcoord_record_recover(survivor, kinds, 1, 0, dry_run ? PGCOORD_RECOVER_DRY_RUN : 0,
				   10000, &rv);
	if (e != PGCOORD_OK) {
		snprintf(why, whylen, "record.recover: %s: %s", pgcoord_strerror(e),
			 pgcoord_last_message(survivor));
		return -1;
	}
	n = pgcoord_recovery_liveness_read(rv) ? (long)pgcoord_recovery_count(rv) : 0;
	pgcoord_recovery_free(rv);
	return n;
}

/*
 * Polls (a) and (c) and asks for (b) with a dry run, so that the recovery
 * does not itself end the dead sessions (a real one applies their owner
 * loss in its transaction) and (c) stays the janitor's; once all three are
 * reached, a real record.recover must adopt every record.
 */
static void measure(PGconn *c, const struct scenario *sc, int victim, int sessions, int run,
		    pgcoord *survivor, const int64_t *session_ids, struct fd_run *out)
{
	char *ids = id_array(session_ids, sessions);
	double t0, end;

	out->not_live_ms = out->recovered_ms = out->owner_loss_ms = -1;
	if (!ids) {
		snprintf(out->why, sizeof(out->why), "out of memory");
		return;
	}
	t0 = db_clock(c);
	kill(cap_agent_pid(victim), sc->signal);
	end = cap_now() + RUN_TIMEOUT_S;
	for (double last = cap_now(); cap_now() < end;) {
		bool still_live = true;
		int polled = poll_db(c, ids, run, sessions, t0, out, &still_live);
		double now = cap_now();

		if ((now - last) * 1000.0 > out->poll_max_ms)
			out->poll_max_ms = (now - last) * 1000.0;
		last = now;
		if (polled < 0)
			break;
		if (out->recovered_ms < 0) {
			long n = recover_once(survivor, run, true, out->why, sizeof(out->why));

			if (n < 0)
				break;
			/* liveness never comes back: a session still live after
			 * the answer was live while it was read */
			if (n > 0 && still_live &&
			    poll_db(c, ids, run, sessions, t0, out, &still_live) >= 0 && still_live)
				out->early_recovery = true;
			if (n >= sessions)
				out->recovered_ms = (db_clock(c) - t0) * 1000.0;
		}
		if (polled == 1 && out->recovered_ms >= 0)
			break;
		cap_sleep(POLL_MS / 1000.0);
	}
	if (out->recovered_ms >= 0) {
		long n = recover_once(survivor, run, false, out->why, sizeof(out->why));

		if (n != sessions) {
			if (n >= 0)
				snprintf(out->why, sizeof(out->why),
					 "record.recover adopted %ld of %d records", n, sessions);
			out->recovered_ms = -1;
		}
	}
	free(ids);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* "min / median / max" of one column over a scenario's runs. */
static void summary(const struct fd_run *runs, int n, size_t field, char *buf, size_t len)
{
	double v[64];
	int k = 0;

	for (int i = 0; i < n && k < 64; i++) {
		double x = *(const double *)((const char *)&runs[i] + field);

		if (x < 0) {
			snprintf(buf, len, "not reached");
			return;
		}
		v[k++] = x;
	}
	if (k == 0) {
		snprintf(buf, len, "-");
		return;
	}
	qsort(v, (size_t)k, sizeof(v[0]), cmp_double);
	snprintf(buf, len, "%.0f / %.0f / %.0f", v[0], v[k / 2], v[k - 1]);
}

int cap_failure_run(struct cap_cfg *cfg)
{
	int agents = cfg->agents[cfg->nagents - 1], sessions = cfg->sessions[cfg->nsessions - 1];
	int runs = cfg->failure_runs, run = 0;
	struct fd_run results[SCENARIO_COUNT][16];
	int64_t *session_ids = calloc((size_t)sessions, sizeof(int64_t));
	bool ok = true;
	char why[400];
	PGconn *c;

	if (!session_ids)
		pgq_die("out of memory");
	if (agents < (int)SCENARIO_COUNT * runs + 2)
		pgq_die("--failure needs at least %d agents for %d runs of each scenario "
			"(a survivor, a janitor and a victim per run)",
			(int)SCENARIO_COUNT * runs + 2, runs);
	cap_db_setup(cfg);
	c = cap_db_connect(cfg, "pgcoord-capacity-failure");
	pgq_exec_or_die(c, "SELECT pgcoord.quota_set('" FD_QUOTA "', 1000000, NULL, "
			   "'pgcoord-capacity')");
	fprintf(stderr, "pgcoord-capacity: starting %d agents\n", agents);
	cap_agents_start(cfg, agents);
	if (!cap_sessions_grow(cfg, agents, sessions, why, sizeof(why)))
		pgq_die("opening sessions: %s", why);
	cap_sleep(cfg->settle_s);
	printf("pgcoord-capacity: failure detection, %d agents x %d sessions, %d runs per "
	       "scenario; agent %s\n",
	       agents, sessions, runs, cfg->agent_bin);
	printf(
	    "\n| scenario | run | victim | (a) sessions not live ms | (b) records recoverable ms | "
	    "(c) owner loss applied ms |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
	fflush(stdout);
	for (size_t k = 0; k < SCENARIO_COUNT; k++) {
		const struct scenario *sc = &scenarios[k];

		for (int i = 0; i < runs; i++, run++) {
			struct fd_run *out = &results[k][i];

			int survivor;

			memset(out, 0, sizeof(*out));
			out->victim = pick_victim(c, agents, sc->janitor);
			survivor = pick_survivor(agents, out->victim);
			if (out->victim < 0 || survivor < 0)
				pgq_die("no victim left for \"%s\"", sc->name);
			if (!prepare(out->victim, sessions, run, session_ids, why, sizeof(why)))
				pgq_die("preparing the victim: %s", why);
			measure(c, sc, out->victim, sessions, run, cap_session_client(survivor, 0),
				session_ids, out);
			cap_agent_reap(out->victim);
			cap_sessions_abandon(out->victim);
			dead[out->victim] = true;
			printf("| %s | %d | %d | %.0f | %.0f | %.0f |\n", sc->name, i + 1,
			       out->victim, out->not_live_ms, out->recovered_ms,
			       out->owner_loss_ms);
			fflush(stdout);
			if (out->early_recovery) {
				printf("- run %d: a record was adopted while a victim session was "
				       "live: guarantee 8 broken\n",
				       run);
				ok = false;
			}
			if (out->not_live_ms < 0 || out->recovered_ms < 0 ||
			    out->owner_loss_ms < 0) {
				printf("- run %d not finished within %.0f s%s%s\n", run,
				       RUN_TIMEOUT_S, out->why[0] ? ": " : "", out->why);
				ok = false;
			}
		}
	}
	double poll_max = 0;

	for (size_t k = 0; k < SCENARIO_COUNT; k++)
		for (int i = 0; i < runs; i++)
			if (results[k][i].poll_max_ms > poll_max)
				poll_max = results[k][i].poll_max_ms;
	printf("\nmin / median / max over the runs (ms after the signal, database clock; "
	       "(a) and (b) late by at most one poll cycle: a %d ms pause and the "
	       "poll's round trips, at most %.0f ms "
	       "here):\n\n"
	       "| scenario | (a) sessions not live | (b) records recoverable | (c) owner loss "
	       "applied |\n| --- | ---: | ---: | ---: |\n",
	       POLL_MS, poll_max);
	for (size_t k = 0; k < SCENARIO_COUNT; k++) {
		char a[64], b[64], d[64];

		summary(results[k], runs, offsetof(struct fd_run, not_live_ms), a, sizeof(a));
		summary(results[k], runs, offsetof(struct fd_run, recovered_ms), b, sizeof(b));
		summary(results[k], runs, offsetof(struct fd_run, owner_loss_ms), d, sizeof(d));
		printf("| %s | %s | %s | %s |\n", scenarios[k].name, a, b, d);
	}
	long problems =
	    pgq_query_ll(c, "SELECT count(*) FROM pgcoord.permits_check() WHERE problem <> ''");
	printf("\n- permits_check() problems after the runs: %ld (expected 0) %s\n", problems,
	       problems == 0 ? "ok" : "FAILED");
	ok &= problems == 0;
	cap_sessions_close(agents);
	cap_agents_stop();
	PQfinish(c);
	free(session_ids);
	printf("\npgcoord-capacity: %s\n",
	       ok ? "every failure was detected and its records recovered" : "FAILED (see above)");
	return ok ? 0 : 1;
}
