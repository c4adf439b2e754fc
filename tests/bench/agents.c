/*
 * agents.c — the pgcoord-agent processes of the run: started with the
 * bench's socket and database, logging into the temp dir, stopped at the
 * end. An agent that dies with the bench (PR_SET_PDEATHSIG) leaves nothing
 * behind; with-postgres removes the logs with the cluster.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <msgpack.h>
#include <pgcoord/pgcoord.h>

#include "proto/codec.h"

#define AGENT_READY_S 20.0
#define AGENT_STOP_S 15.0

static pid_t agent_pids[BENCH_MAX_AGENTS];
static char agent_logs[BENCH_MAX_AGENTS][600];

pid_t bench_agent_pid(int i)
{
	return agent_pids[i];
}

static void setenv_int(const char *name, int v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%d", v);
	setenv(name, buf, 1);
}

static pid_t spawn(const struct bench_cfg *cfg, int i)
{
	char rid[32];
	pid_t parent = getpid(), pid;
	int fd;

	snprintf(agent_logs[i], sizeof(agent_logs[i]), "%s/bench-agent-%d.log", cfg->tmp_dir, i);
	snprintf(rid, sizeof(rid), "bench-a%d", i);
	fd = open(agent_logs[i], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "pgcoord-bench: cannot write %s: %s\n", agent_logs[i],
			strerror(errno));
		exit(2);
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "pgcoord-bench: fork: %s\n", strerror(errno));
		exit(2);
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, STDIN_FILENO);
		setenv("PGCOORD_DATABASE_URL", cfg->direct_conninfo, 1);
		setenv("PGCOORD_REPLICA_ID", rid, 1);
		setenv("PGCOORD_SOCKET_PATH", cfg->sockets[i], 1);
		setenv("PGCOORD_LOG_LEVEL", "warn", 1);
		if (cfg->pool_size > 0)
			setenv_int("PGCOORD_POOL_SIZE", cfg->pool_size);
		execl(cfg->agent_bin, cfg->agent_bin, (char *)NULL);
		fprintf(stderr, "pgcoord-bench: cannot run %s: %s\n", cfg->agent_bin,
			strerror(errno));
		_exit(127);
	}
	close(fd);
	return pid;
}

/* True once the agent at sock answers agent.status with registered=true. */
static bool serving(const char *sock)
{
	pgcoord *c = NULL;
	void *res = NULL;
	size_t len = 0, off = 0;
	bool registered = false;
	msgpack_unpacked u;

	if (pgcoord_connect(sock, 300, &c) != PGCOORD_OK)
		return false;
	if (pgcoord_call(c, "agent.status", NULL, 0, 1000, &res, &len) == PGCOORD_OK) {
		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, res, len, &off) == MSGPACK_UNPACK_SUCCESS)
			pgc_obj_bool(pgc_map_get(&u.data, "registered"), &registered);
		msgpack_unpacked_destroy(&u);
		pgcoord_free(res);
	}
	pgcoord_close(c);
	return registered;
}

static void print_log(int i)
{
	char buf[4096];
	FILE *f = fopen(agent_logs[i], "re");
	size_t n;

	if (!f)
		return;
	fprintf(stderr, "--- %s ---\n", agent_logs[i]);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, stderr);
	fclose(f);
}

void bench_agent_start(const struct bench_cfg *cfg, int i)
{
	double end = bench_now() + AGENT_READY_S;
	int status;

	agent_pids[i] = spawn(cfg, i);
	while (bench_now() < end) {
		if (waitpid(agent_pids[i], &status, WNOHANG) == agent_pids[i]) {
			agent_pids[i] = 0;
			fprintf(stderr, "pgcoord-bench: agent %d exited at start (status %d)\n", i,
				status);
			print_log(i);
			exit(2);
		}
		if (serving(cfg->sockets[i]))
			return;
		bench_sleep(0.05);
	}
	fprintf(stderr, "pgcoord-bench: agent %d did not serve within %.0f s\n", i, AGENT_READY_S);
	print_log(i);
	exit(2);
}

void bench_agents_stop(void)
{
	double end = bench_now() + AGENT_STOP_S;

	for (int i = 0; i < BENCH_MAX_AGENTS; i++)
		if (agent_pids[i] > 0)
			kill(agent_pids[i], SIGTERM);
	for (int i = 0; i < BENCH_MAX_AGENTS; i++) {
		int status;

		while (agent_pids[i] > 0) {
			pid_t r = waitpid(agent_pids[i], &status, WNOHANG);

			if (r == agent_pids[i] || (r < 0 && errno != EINTR)) {
				agent_pids[i] = 0;
			} else if (bench_now() > end) {
				fprintf(stderr,
					"pgcoord-bench: agent %d did not stop; killing it\n", i);
				kill(agent_pids[i], SIGKILL);
				waitpid(agent_pids[i], &status, 0);
				agent_pids[i] = 0;
			} else {
				bench_sleep(0.02);
			}
		}
	}
}
