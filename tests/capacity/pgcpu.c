/*
 * pgcpu.c — Postgres CPU over a window, process by process.
 *
 * Summing the postmaster's children before and after (as pgcoord-bench
 * does) goes wrong behind PgBouncer: a server connection it closes takes
 * its backend's whole CPU time out of the second sum. Here each child's
 * CPU is taken from its own reading at the start (or from zero, when it
 * started inside the window); what a backend spent between the start and
 * its exit is lost, which undercounts a little, never goes negative.
 *
 * The sum is also split by the process's title: the connections' backends
 * (the work the agents ask for) apart from the server's own processes,
 * which cost about the same whatever the agents do.
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

const char *const pg_proc_kind_names[PG_PROC_KIND_COUNT] = {
    "backends", "autovacuum", "walwriter", "checkpointer", "bgwriter", "other",
};

/* A child's kind from its title ("postgres: [cluster: ]checkpointer", or
 * "postgres: user db [local] idle" for a connection's backend). */
static enum pg_proc_kind kind_of(pid_t pid)
{
	static const struct {
		const char *title;
		enum pg_proc_kind kind;
	} server_own[] = {
	    {"autovacuum", PG_PROC_AUTOVACUUM},	    {"walwriter", PG_PROC_WALWRITER},
	    {"checkpointer", PG_PROC_CHECKPOINTER}, {"background writer", PG_PROC_BGWRITER},
	    {"logical replication", PG_PROC_OTHER}, {"archiver", PG_PROC_OTHER},
	    {"stats collector", PG_PROC_OTHER},	    {"walsender", PG_PROC_OTHER},
	    {"walreceiver", PG_PROC_OTHER},	    {"startup", PG_PROC_OTHER},
	};
	char path[64], title[256];
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return PG_PROC_OTHER;
	n = fread(title, 1, sizeof(title) - 1, f);
	fclose(f);
	title[n] = '\0';
	for (size_t i = 0; i < sizeof(server_own) / sizeof(server_own[0]); i++) {
		const char *at = strstr(title, server_own[i].title);

		/* the name that follows "postgres: " or "postgres: cluster: " */
		if (at && at > title && at[-1] == ' ' && at[-2] == ':')
			return server_own[i].kind;
	}
	return PG_PROC_BACKEND;
}

struct since {
	const struct pg_cpu_snap *snap;
	unsigned long long ticks[PG_PROC_KIND_COUNT];
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
		acc->ticks[kind_of(pid)] += ticks - then;
}

double pg_cpu_since_ms(const struct pg_cpu_snap *s, pid_t postmaster,
		       double by_kind_ms[PG_PROC_KIND_COUNT])
{
	struct since acc = {.snap = s};
	long hz = sysconf(_SC_CLK_TCK);
	double ms_per_tick = 1000.0 / (double)(hz > 0 ? hz : 100), all = 0;

	if (!s)
		return -1;
	each_child(postmaster, add_since, &acc);
	for (int k = 0; k < PG_PROC_KIND_COUNT; k++) {
		by_kind_ms[k] = (double)acc.ticks[k] * ms_per_tick;
		all += by_kind_ms[k];
	}
	return all;
}
