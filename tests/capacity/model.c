/*
 * model.c — the capacity model fitted to the measured points.
 *
 * At idle, what the server does is taken as linear in the fleet's shape:
 *
 *     cost = fleet + per_agent × agents + per_session × sessions
 *
 * (fleet: the one janitor's sweep; per agent: its heartbeat, its janitor
 * campaign, the leases it holds; per session: the rows its heartbeat
 * renews). It is fitted by least squares, separately for statements/s and
 * for Postgres CPU ms/s. Claims are costed per claim + release cycle from
 * the load windows, less the idle cost of the same point.
 */
#include "capacity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define FLEET_HOSTS 1000
#define FLEET_SESSIONS 10

struct fit {
	bool ok;
	double fleet, per_agent, per_session;
};

/* Agent statements at idle per second: every kind but the set_config()
 * that travels with each (counted apart, one per statement). */
static double idle_statements(const struct point *p)
{
	double n = 0;

	for (int k = 0; k < KIND_COUNT; k++)
		if (k != KIND_BOUNDS)
			n += p->idle.calls[k];
	return p->idle.seconds > 0 ? n / p->idle.seconds : 0;
}

static double idle_cpu(const struct point *p)
{
	return p->idle.seconds > 0 ? p->idle.pg_cpu_ms / p->idle.seconds : 0;
}

static double idle_wal_kb(const struct point *p)
{
	return p->idle.seconds > 0 ? (double)p->idle.wal_bytes / 1024.0 / p->idle.seconds : 0;
}

/* Solves the 3×3 system m·x = v by Gaussian elimination with pivoting. */
static bool solve3(double m[3][3], double v[3], double x[3])
{
	for (int c = 0; c < 3; c++) {
		int best = c;

		for (int r = c + 1; r < 3; r++)
			if (fabs(m[r][c]) > fabs(m[best][c]))
				best = r;
		if (fabs(m[best][c]) < 1e-9)
			return false;
		for (int k = 0; k < 3; k++) {
			double t = m[c][k];

			m[c][k] = m[best][k];
			m[best][k] = t;
		}
		double t = v[c];
		v[c] = v[best];
		v[best] = t;
		for (int r = c + 1; r < 3; r++) {
			double f = m[r][c] / m[c][c];

			for (int k = c; k < 3; k++)
				m[r][k] -= f * m[c][k];
			v[r] -= f * v[c];
		}
	}
	for (int r = 2; r >= 0; r--) {
		double s = v[r];

		for (int k = r + 1; k < 3; k++)
			s -= m[r][k] * x[k];
		x[r] = s / m[r][r];
	}
	return true;
}

static struct fit fit_points(const struct point *pts, int n, double (*y)(const struct point *))
{
	double m[3][3] = {{0}}, v[3] = {0}, x[3] = {0};
	struct fit f = {0};

	for (int i = 0; i < n; i++) {
		double row[3] = {1, pts[i].agents, (double)pts[i].agents * pts[i].sessions};

		for (int r = 0; r < 3; r++) {
			for (int c = 0; c < 3; c++)
				m[r][c] += row[r] * row[c];
			v[r] += row[r] * y(&pts[i]);
		}
	}
	if (n >= 3 && solve3(m, v, x)) {
		f.ok = true;
		f.fleet = x[0];
		f.per_agent = x[1];
		f.per_session = x[2];
	}
	return f;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	if (n == 0)
		return NAN;
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void cap_model_print(const struct point *pts, int n, const struct cap_cfg *cfg)
{
	struct fit st = fit_points(pts, n, idle_statements);
	struct fit cpu = fit_points(pts, n, idle_cpu);
	struct fit wal = fit_points(pts, n, idle_wal_kb);
	double *stmt_per_cycle = calloc((size_t)n + 1, sizeof(double));
	double *cpu_per_cycle = calloc((size_t)n + 1, sizeof(double));
	int m = 0;

	printf("\nThe model (least squares over %d points; idle cost = fleet + per agent x "
	       "agents + per session x sessions):\n",
	       n);
	if (!st.ok || !cpu.ok || !wal.ok) {
		printf("- not enough distinct points to fit (vary --agents and --sessions)\n");
	} else {
		printf("- statements/s: %.2f per fleet + %.3f per agent + %.4f per session\n",
		       st.fleet, st.per_agent, st.per_session);
		printf("- Postgres CPU ms/s: %.2f per fleet + %.3f per agent + %.4f per session\n",
		       cpu.fleet, cpu.per_agent, cpu.per_session);
		printf("- WAL kB/s: %.2f per fleet + %.3f per agent + %.4f per session\n",
		       wal.fleet, wal.per_agent, wal.per_session);
	}
	for (int i = 0; stmt_per_cycle && cpu_per_cycle && i < n; i++) {
		const struct point *p = &pts[i];
		double calls = 0;

		if (p->cycles <= 0 || p->load.seconds <= 0)
			continue;
		for (int k = 0; k < KIND_COUNT; k++)
			if (k != KIND_BOUNDS)
				calls += p->load.calls[k];
		stmt_per_cycle[m] =
		    (calls - idle_statements(p) * p->load.seconds) / (double)p->cycles;
		cpu_per_cycle[m] =
		    (p->load.pg_cpu_ms - idle_cpu(p) * p->load.seconds) / (double)p->cycles;
		m++;
	}
	double spc = m ? median(stmt_per_cycle, m) : NAN, cpc = m ? median(cpu_per_cycle, m) : NAN;
	printf("- per claim + release cycle (median over the points' load windows, less their "
	       "idle): %.2f statements, %.3f Postgres CPU ms\n",
	       spc, cpc);
	free(stmt_per_cycle);
	free(cpu_per_cycle);
	if (!st.ok || !cpu.ok || !wal.ok)
		return;

	double agents = FLEET_HOSTS, sessions = (double)FLEET_HOSTS * FLEET_SESSIONS;
	double s = st.fleet + st.per_agent * agents + st.per_session * sessions;
	double c = cpu.fleet + cpu.per_agent * agents + cpu.per_session * sessions;
	double w = wal.fleet + wal.per_agent * agents + wal.per_session * sessions;
	int pool = cfg->pool_size > 0 ? cfg->pool_size : 8;

	printf("- a fleet of %d hosts x %d sessions at idle: %.0f statements/s (%.0f with the "
	       "set_config each carries), %.0f Postgres CPU ms/s (%.2f cores), %.0f kB/s of WAL; "
	       "%d agent connections to PgBouncer at pool_size %d (+1 heartbeat each)\n",
	       FLEET_HOSTS, FLEET_SESSIONS, s, 2 * s, c, c / 1000.0, w, FLEET_HOSTS * (pool + 1),
	       pool);
	if (cpc > 0 && c < 1000.0)
		printf("- claims/s one such server core would have left: %.0f "
		       "(1000 - idle CPU ms/s) / CPU ms per cycle\n",
		       (1000.0 - c) / cpc);
}
