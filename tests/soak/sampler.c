/*
 * sampler.c — the checker's eye on the database during the run: every
 * 100 ms, one REPEATABLE READ snapshot of every quota's limit, in_flight,
 * the weights of its open permits (and how much of that is uncertain), the
 * uncertain permits' count and oldest age, and every lease's holder and
 * epoch. One line per snapshot in history/samples.jsonl, dated on
 * CLOCK_MONOTONIC before and after, with the database clock of the
 * snapshot, so the checker can also place audit rows (dated by now()) on
 * the run's time line.
 *
 * The sampler connects to the server directly, never through PgBouncer: it
 * is an instrument, not part of the system under test.
 */
#include "soak.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#define SAMPLE_EVERY_MS 100

struct sampler {
	const struct soak_cfg *cfg;
	pthread_t thread;
	volatile sig_atomic_t stop;
	struct hist h;
	PGconn *conn;
	int64_t samples, failures;
};

/* One statement: everything the checker compares, in the snapshot. Open
 * permits are found through the partial index on unreleased rows, so the
 * cost does not grow with the tombstones of a long run. */
static const char sample_sql[] =
    "SELECT json_build_object("
    " 'db_ms', pgcoord.ms(clock_timestamp()),"
    " 'q', (SELECT coalesce(json_agg(json_build_array(q.key, q.\"limit\", q.in_flight,"
    "        coalesce(w.held, 0), coalesce(w.unc, 0)) ORDER BY q.key), '[]')"
    "       FROM pgcoord.quotas q LEFT JOIN ("
    "        SELECT pq.key, sum(pq.weight) AS held,"
    "               sum(pq.weight) FILTER (WHERE p.state = 'uncertain' OR"
    "                 (p.owner_session IS NOT NULL"
    "                  AND NOT pgcoord.session_is_live(p.owner_session))) AS unc"
    "        FROM pgcoord.permits p JOIN pgcoord.permit_quotas pq ON pq.permit_id = p.id"
    "        WHERE p.state <> 'released' GROUP BY pq.key) w ON w.key = q.key),"
    " 'unc', (SELECT json_build_array(count(*),"
    "          coalesce(max(pgcoord.ms(now()) - pgcoord.ms(p.state_at)), 0))"
    "        FROM pgcoord.permits p WHERE p.state <> 'released' AND (p.state = 'uncertain'"
    "         OR (p.owner_session IS NOT NULL"
    "             AND NOT pgcoord.session_is_live(p.owner_session)))),"
    " 'l', (SELECT coalesce(json_agg(json_build_array(l.name, l.holder_session, l.epoch,"
    "        l.holder_replica, pgcoord.ms(l.expires_at) - pgcoord.ms(now())) ORDER BY l.name),"
    "        '[]') FROM pgcoord.leases l WHERE l.name NOT LIKE 'pgcoord.%'),"
    " 'live', (SELECT count(*) FROM pgcoord.live_sessions))::text";

static bool connected(struct sampler *s)
{
	if (s->conn && PQstatus(s->conn) == CONNECTION_OK)
		return true;
	PQfinish(s->conn);
	s->conn = PQconnectdb(s->cfg->direct_conninfo);
	soak_quiet(s->conn);
	return PQstatus(s->conn) == CONNECTION_OK;
}

static bool exec_ok(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;

	PQclear(r);
	return ok;
}

static void sample_once(struct sampler *s)
{
	int64_t t0 = soak_now_us();
	PGresult *r = NULL;
	const char *why = NULL;

	if (!connected(s)) {
		why = "connect";
	} else if (!exec_ok(s->conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")) {
		why = "begin";
	} else {
		r = PQexec(s->conn, sample_sql);
		if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
			why = "select";
		if (!exec_ok(s->conn, "COMMIT") && !why)
			why = "commit";
	}
	if (why) {
		s->failures++;
		hist_begin(&s->h, "sample_error");
		hist_int(&s->h, "t0", t0);
		hist_int(&s->h, "t1", soak_now_us());
		hist_str(&s->h, "step", why);
		hist_str(&s->h, "msg", s->conn ? PQerrorMessage(s->conn) : "no connection");
		hist_end(&s->h);
		/* a broken connection is replaced at the next turn */
		if (s->conn && PQstatus(s->conn) != CONNECTION_OK) {
			PQfinish(s->conn);
			s->conn = NULL;
		} else if (s->conn) {
			PQclear(PQexec(s->conn, "ROLLBACK"));
		}
	} else {
		s->samples++;
		hist_begin(&s->h, "sample");
		hist_int(&s->h, "t0", t0);
		hist_int(&s->h, "t1", soak_now_us());
		hist_raw(&s->h, "v", PQgetvalue(r, 0, 0));
		hist_end(&s->h);
	}
	PQclear(r);
}

static void *run(void *arg)
{
	struct sampler *s = arg;
	int64_t next = soak_now_us();

	while (!s->stop) {
		sample_once(s);
		next += SAMPLE_EVERY_MS * 1000;
		int64_t now = soak_now_us();
		if (next < now)
			next = now; /* a slow snapshot: no burst to catch up */
		soak_sleep_ms((next - now) / 1000, NULL);
	}
	return NULL;
}

struct sampler *sampler_start(const struct soak_cfg *cfg)
{
	struct sampler *s = calloc(1, sizeof(*s));
	char path[768];

	if (!s)
		return NULL;
	s->cfg = cfg;
	snprintf(path, sizeof(path), "%s/history/samples.jsonl", cfg->out_dir);
	if (!hist_open(&s->h, path)) {
		fprintf(stderr, "soak: cannot write %s: %s\n", path, strerror(errno));
		free(s);
		return NULL;
	}
	if (pthread_create(&s->thread, NULL, run, s) != 0) {
		hist_close(&s->h);
		free(s);
		return NULL;
	}
	return s;
}

void sampler_stop(struct sampler *s)
{
	if (!s)
		return;
	s->stop = 1;
	pthread_join(s->thread, NULL);
	fprintf(stderr, "soak: sampler took %lld snapshots (%lld failed)\n", (long long)s->samples,
		(long long)s->failures);
	PQfinish(s->conn);
	hist_close(&s->h);
	free(s);
}
