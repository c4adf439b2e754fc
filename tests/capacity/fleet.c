/*
 * fleet.c — the agents of the run and their clients' sessions.
 *
 * Agents log in as the runtime role through PgBouncer (or directly with
 * --direct), log into the temp dir and die with the tool
 * (PR_SET_PDEATHSIG); with-postgres removes the logs with the cluster.
 * Every session is one client connection holding one open session; the
 * first session of each agent also holds a lease, which its agent renews.
 * Sessions are opened by one thread per agent, since a 64-agent fleet with
 * 100 sessions each is 6,400 round trips.
 */
#include "capacity.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <msgpack.h>

#include "bench.h" /* proc_cpu_ms, proc_rss_kb */
#include "proto/codec.h"

#define AGENT_READY_S 60.0 /* all of them: 64 agents start on two cores */
#define AGENT_STOP_S 20.0

static pid_t agent_pids[CAP_MAX_AGENTS];
static char agent_logs[CAP_MAX_AGENTS][600];
static char agent_sockets[CAP_MAX_AGENTS][600];

struct agent_sessions {
	pgcoord **clients;
	int n;
};
static struct agent_sessions fleet_sessions[CAP_MAX_AGENTS];

pid_t cap_agent_pid(int i)
{
	return agent_pids[i];
}

void cap_agent_reap(int i)
{
	int status;

	if (agent_pids[i] <= 0)
		return;
	kill(agent_pids[i], SIGKILL);
	while (waitpid(agent_pids[i], &status, 0) < 0 && errno == EINTR)
		;
	agent_pids[i] = 0;
}

const char *cap_agent_socket(int i)
{
	return agent_sockets[i];
}

static void setenv_int(const char *name, int v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%d", v);
	setenv(name, buf, 1);
}

static pid_t spawn(const struct cap_cfg *cfg, int i)
{
	char rid[32];
	pid_t parent = getpid(), pid;
	int fd;

	snprintf(agent_logs[i], sizeof(agent_logs[i]), "%s/capacity-agent-%d.log", cfg->tmp_dir, i);
	snprintf(agent_sockets[i], sizeof(agent_sockets[i]), "%s/cap-a%d.sock", cfg->tmp_dir, i);
	snprintf(rid, sizeof(rid), "cap-a%d", i);
	fd = open(agent_logs[i], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "pgcoord-capacity: cannot write %s: %s\n", agent_logs[i],
			strerror(errno));
		exit(2);
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "pgcoord-capacity: fork: %s\n", strerror(errno));
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
		setenv("PGCOORD_DATABASE_URL", cfg->agent_conninfo, 1);
		setenv("PGCOORD_REPLICA_ID", rid, 1);
		setenv("PGCOORD_SOCKET_PATH", agent_sockets[i], 1);
		/* the default (auto) finds out what the path to the server
		 * keeps, directly or through PgBouncer */
		unsetenv("PGCOORD_PREPARED_STATEMENTS");
		setenv("PGCOORD_LOG_LEVEL", "warn", 1);
		/* every session is a connection of the tool's one uid */
		setenv_int("PGCOORD_MAX_CONNECTIONS_PER_UID", CAP_MAX_SESSIONS + 16);
		setenv_int("PGCOORD_MAX_CONNECTIONS", CAP_MAX_SESSIONS + 32);
		if (cfg->pool_size > 0)
			setenv_int("PGCOORD_POOL_SIZE", cfg->pool_size);
		if (cfg->heartbeat_interval_ms > 0)
			setenv_int("PGCOORD_HEARTBEAT_INTERVAL_MS", cfg->heartbeat_interval_ms);
		if (cfg->lease_retry_ms > 0)
			setenv_int("PGCOORD_LEASE_RETRY_MS", cfg->lease_retry_ms);
		execl(cfg->agent_bin, cfg->agent_bin, (char *)NULL);
		fprintf(stderr, "pgcoord-capacity: cannot run %s: %s\n", cfg->agent_bin,
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
	if (pgcoord_call(c, "agent.status", NULL, 0, 2000, &res, &len) == PGCOORD_OK) {
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

void cap_agents_start(const struct cap_cfg *cfg, int n)
{
	double end = cap_now() + AGENT_READY_S;
	int first = 0, status;

	while (first < n && agent_pids[first] > 0)
		first++;
	for (int i = first; i < n; i++)
		agent_pids[i] = spawn(cfg, i);
	for (int i = first; i < n; i++) {
		for (;;) {
			if (waitpid(agent_pids[i], &status, WNOHANG) == agent_pids[i]) {
				agent_pids[i] = 0;
				fprintf(stderr,
					"pgcoord-capacity: agent %d exited at start (status %d)\n",
					i, status);
				print_log(i);
				exit(2);
			}
			if (serving(agent_sockets[i]))
				break;
			if (cap_now() > end) {
				fprintf(stderr,
					"pgcoord-capacity: agent %d did not serve within %.0f s\n",
					i, AGENT_READY_S);
				print_log(i);
				exit(2);
			}
			cap_sleep(0.05);
		}
	}
}

void cap_agents_stop(void)
{
	double end = cap_now() + AGENT_STOP_S;

	for (int i = 0; i < CAP_MAX_AGENTS; i++)
		if (agent_pids[i] > 0)
			kill(agent_pids[i], SIGTERM);
	for (int i = 0; i < CAP_MAX_AGENTS; i++) {
		int status;

		while (agent_pids[i] > 0) {
			pid_t r = waitpid(agent_pids[i], &status, WNOHANG);

			if (r == agent_pids[i] || (r < 0 && errno != EINTR)) {
				agent_pids[i] = 0;
			} else if (cap_now() > end) {
				fprintf(stderr,
					"pgcoord-capacity: agent %d did not stop; killing it\n", i);
				kill(agent_pids[i], SIGKILL);
				waitpid(agent_pids[i], &status, 0);
				agent_pids[i] = 0;
			} else {
				cap_sleep(0.02);
			}
		}
	}
}

double cap_agents_cpu_ms(int n)
{
	double sum = 0;

	for (int i = 0; i < n; i++) {
		double ms = agent_pids[i] > 0 ? proc_cpu_ms(agent_pids[i]) : -1;

		if (ms > 0)
			sum += ms;
	}
	return sum;
}

long cap_agents_max_rss_kb(int n)
{
	long max = 0;

	for (int i = 0; i < n; i++) {
		long kb = agent_pids[i] > 0 ? proc_rss_kb(agent_pids[i]) : -1;

		if (kb > max)
			max = kb;
	}
	return max;
}

/* --- sessions --------------------------------------------------------------- */

struct grow_job {
	const struct cap_cfg *cfg;
	int agent, target;
	pthread_t thread;
	char why[300];
};

static bool open_one(struct grow_job *j, int s)
{
	struct agent_sessions *as = &fleet_sessions[j->agent];
	char name[64];
	pgcoord *c = NULL;
	pgcoord_err e;

	e = pgcoord_connect(agent_sockets[j->agent], 5000, &c);
	if (e != PGCOORD_OK) {
		snprintf(j->why, sizeof(j->why), "agent %d: connect: %s (%s)", j->agent,
			 pgcoord_strerror(e), strerror(errno));
		return false;
	}
	snprintf(name, sizeof(name), "cap-a%d-s%d", j->agent, s);
	e = pgcoord_session_open(c, name, j->cfg->call_timeout_ms, NULL);
	if (e == PGCOORD_OK && s == 0) {
		bool leader = false;

		snprintf(name, sizeof(name), "cap-lease-a%d", j->agent);
		e = pgcoord_lease_acquire(c, name, 0, false, j->cfg->call_timeout_ms, &leader,
					  NULL);
		if (e == PGCOORD_OK && !leader) {
			snprintf(j->why, sizeof(j->why), "agent %d: lease %s is held by another",
				 j->agent, name);
			pgcoord_close(c);
			return false;
		}
	}
	if (e != PGCOORD_OK) {
		snprintf(j->why, sizeof(j->why), "agent %d, session %d: %s: %s", j->agent, s,
			 pgcoord_strerror(e), pgcoord_last_message(c));
		pgcoord_close(c);
		return false;
	}
	as->clients[as->n++] = c;
	return true;
}

static void *grow(void *arg)
{
	struct grow_job *j = arg;
	struct agent_sessions *as = &fleet_sessions[j->agent];

	if (!as->clients) {
		as->clients = calloc(CAP_MAX_SESSIONS, sizeof(*as->clients));
		if (!as->clients) {
			snprintf(j->why, sizeof(j->why), "out of memory");
			return NULL;
		}
	}
	while (as->n < j->target)
		if (!open_one(j, as->n))
			break;
	return NULL;
}

bool cap_sessions_grow(const struct cap_cfg *cfg, int agents, int per_agent, char *why,
		       size_t whylen)
{
	struct grow_job *jobs = calloc((size_t)agents, sizeof(*jobs));
	bool ok = true;

	if (!jobs) {
		snprintf(why, whylen, "out of memory");
		return false;
	}
	for (int a = 0; a < agents; a++) {
		jobs[a] = (struct grow_job){.cfg = cfg, .agent = a, .target = per_agent};
		if (pthread_create(&jobs[a].thread, NULL, grow, &jobs[a]) != 0) {
			grow(&jobs[a]);
			jobs[a].thread = 0;
		}
	}
	for (int a = 0; a < agents; a++) {
		if (jobs[a].thread)
			pthread_join(jobs[a].thread, NULL);
		if (jobs[a].why[0] && ok) {
			snprintf(why, whylen, "%s", jobs[a].why);
			ok = false;
		}
	}
	free(jobs);
	return ok;
}

static void *close_all(void *arg)
{
	struct agent_sessions *as = arg;

	for (int s = 0; s < as->n; s++) {
		pgcoord_session_close(as->clients[s], 5000);
		pgcoord_close(as->clients[s]);
	}
	as->n = 0;
	free(as->clients);
	as->clients = NULL;
	return NULL;
}

void cap_sessions_close(int agents)
{
	pthread_t threads[CAP_MAX_AGENTS];
	bool started[CAP_MAX_AGENTS] = {false};

	for (int a = 0; a < agents; a++)
		started[a] = pthread_create(&threads[a], NULL, close_all, &fleet_sessions[a]) == 0;
	for (int a = 0; a < agents; a++) {
		if (started[a])
			pthread_join(threads[a], NULL);
		else
			close_all(&fleet_sessions[a]);
	}
}

void cap_sessions_abandon(int a)
{
	struct agent_sessions *as = &fleet_sessions[a];

	for (int s = 0; s < as->n; s++)
		pgcoord_close(as->clients[s]);
	as->n = 0;
	free(as->clients);
	as->clients = NULL;
}

pgcoord *cap_session_client(int a, int s)
{
	return s < fleet_sessions[a].n ? fleet_sessions[a].clients[s] : NULL;
}
