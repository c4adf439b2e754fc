/*
 * procstat.c — CPU time and memory of processes from /proc: the agents'
 * and, through the postmaster's children, the Postgres server's.
 */
#include "bench.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fields of /proc/<pid>/stat after the command name, which may hold
 * spaces and parentheses: everything after the last ')'. */
bool proc_read_stat(pid_t pid, pid_t *ppid, unsigned long long *ticks)
{
	char path[64], buf[1024], *p;
	unsigned long long utime, stime;
	int parent;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p)
		return false;
	/* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
	 * utime stime (fields 3..15 of proc(5)) */
	if (sscanf(p + 1, " %*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &parent, &utime,
		   &stime) != 3)
		return false;
	if (ppid)
		*ppid = parent;
	if (ticks)
		*ticks = utime + stime;
	return true;
}

static double ticks_to_ms(unsigned long long ticks)
{
	static long hz;

	if (!hz)
		hz = sysconf(_SC_CLK_TCK);
	return (double)ticks * 1000.0 / (double)(hz > 0 ? hz : 100);
}

double proc_cpu_ms(pid_t pid)
{
	unsigned long long ticks;

	return proc_read_stat(pid, NULL, &ticks) ? ticks_to_ms(ticks) : -1;
}

pid_t proc_parent(pid_t pid)
{
	pid_t ppid;

	return proc_read_stat(pid, &ppid, NULL) ? ppid : -1;
}

long proc_rss_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

double proc_children_cpu_ms(pid_t parent)
{
	unsigned long long sum = 0, ticks;
	struct dirent *e;
	DIR *d = opendir("/proc");
	pid_t ppid;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		if (proc_read_stat((pid_t)atoi(e->d_name), &ppid, &ticks) && ppid == parent)
			sum += ticks;
	}
	closedir(d);
	return ticks_to_ms(sum);
}
