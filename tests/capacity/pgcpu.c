/*
 * pgcpu.c — Postgres CPU over a window, process by process.
 *
 * Summing the postmaster's children before and after (as pgcoord-bench
 * does) goes wrong behind PgBouncer: a server connection it closes takes
 * its backend's whole CPU time out of the second sum. Here each child's
 * CPU is taken from its own reading at the start (or from zero, when it
 * started inside the window); what a backend spent between the start and
 * its exit is lost, which undercounts a little, never goes negative.
 */
#include "capacity.h"
#include "bench.h" /* proc_read_stat */

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CHILDREN 4096

struct pg_cpu_snap {
	int n;
	pid_t pid[MAX_CHILDREN];
	unsigned long long ticks[MAX_CHILDREN];
};

/* Calls fn for every child of parent with its CPU ticks. */
static void each_child(pid_t parent, void (*fn)(void *, pid_t, unsigned long long), void *arg)
{
	DIR *d = opendir("/proc");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		unsigned long long ticks;
		pid_t pid, ppid;

		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		pid = (pid_t)atoi(e->d_name);
		if (proc_read_stat(pid, &ppid, &ticks) && ppid == parent)
			fn(arg, pid, ticks);
	}
	closedir(d);
}

static void remember(void *arg, pid_t pid, unsigned long long ticks)
{
	struct pg_cpu_snap *s = arg;

	if (s->n < MAX_CHILDREN) {
		s->pid[s->n] = pid;
		s->ticks[s->n++] = ticks;
	}
}

struct pg_cpu_snap *pg_cpu_snapshot(pid_t postmaster)
{
	struct pg_cpu_snap *s = calloc(1, sizeof(*s));

	if (s)
		each_child(postmaster, remember, s);
	return s;
}

struct since {
	const struct pg_cpu_snap *snap;
	unsigned long long ticks;
};

static void add_since(void *arg, pid_t pid, unsigned long long ticks)
{
	struct since *acc = arg;
	unsigned long long then = 0;

	for (int i = 0; i < acc->snap->n; i++)
		if (acc->snap->pid[i] == pid) {
			then = acc->snap->ticks[i];
			break;
		}
	if (ticks > then)
		acc->ticks += ticks - then;
}

double pg_cpu_since_ms(const struct pg_cpu_snap *s, pid_t postmaster)
{
	struct since acc = {s, 0};
	long hz = sysconf(_SC_CLK_TCK);

	if (!s)
		return -1;
	each_child(postmaster, add_since, &acc);
	return (double)acc.ticks * 1000.0 / (double)(hz > 0 ? hz : 100);
}
