/*
 * faults.c — the seeded fault schedule and the injection of each fault. The
 * schedule is a pure function of the configuration and the seed, printed
 * at start, so `--seed` replays the same faults at the same offsets.
 */
#include "soak.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <msgpack.h>

#include "proto/codec.h"

static const char *const kind_names[FAULT__COUNT] = {
    [FAULT_AGENT_KILL] = "agent_kill",	     [FAULT_AGENT_STOP] = "agent_stop",
    [FAULT_CLIENT_STOP] = "client_stop",     [FAULT_BACKEND_KILL] = "backend_kill",
    [FAULT_PG_RESTART] = "pg_restart",	     [FAULT_BOUNCER_KILL] = "pgbouncer_kill",
    [FAULT_CLIENT_NOREAD] = "client_noread", [FAULT_CLOCK_JUMP] = "clock_jump",
    [FAULT_PG_FAILOVER] = "pg_failover",
};

const char *fault_kind_name(enum fault_kind k)
{
	return k < FAULT__COUNT ? kind_names[k] : "?";
}

bool fault_kind_parse(const char *name, enum fault_kind *out)
{
	for (int k = 0; k < FAULT__COUNT; k++)
		if (!strcmp(name, kind_names[k])) {
			*out = (enum fault_kind)k;
			return true;
		}
	return false;
}

static bool kind_enabled(const struct soak_cfg *cfg, enum fault_kind k)
{
	if (k == FAULT_BOUNCER_KILL && !cfg->pgbouncer)
		return false;
	/* tests/soak/run --standby made one and says where */
	if (k == FAULT_PG_FAILOVER && !getenv("PGCOORD_SOAK_STANDBY"))
		return false;
	if (k == FAULT_CLOCK_JUMP && !cfg->faketime_file[0])
		return false;
	if (k == FAULT_CLIENT_STOP || k == FAULT_CLIENT_NOREAD) {
		if (cfg->clients < 1)
			return false;
	}
	if (cfg->only_faults) {
		const char *p = cfg->only_faults, *name = kind_names[k];
		size_t n = strlen(name);

		while (*p) {
			if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0'))
				return true;
			p = strchr(p, ',');
			if (!p)
				break;
			p++;
		}
		return false;
	}
	return true;
}

/* Offsets the clock-jump agent's wall clock may be moved to, in seconds. */
static const int64_t clock_offsets[] = {7200, -3600, 300, -600, 86400, -45, 0};

static void plan_one(const struct soak_cfg *cfg, struct soak_rng *r, struct fault *f)
{
	int nclients = cfg->agents * cfg->clients;

	f->target = (int)soak_rand_range(r, 0, cfg->agents - 1);
	f->hold_ms = 0;
	f->param = 0;
	switch (f->kind) {
	case FAULT_AGENT_KILL:
		f->hold_ms = soak_rand_range(r, 300, 2000); /* down time */
		f->param = soak_chance(r, 0.5);		    /* aim at lease 0's leader */
		break;
	case FAULT_AGENT_STOP:
		/* past the lease ttl always; past the session ttl sometimes */
		f->hold_ms =
		    soak_rand_range(r, cfg->lease_ttl_ms + 500,
				    (cfg->session_ttl_ms > cfg->lease_ttl_ms ? cfg->session_ttl_ms
									     : cfg->lease_ttl_ms) +
					2500);
		f->param = soak_chance(r, 0.5); /* aim at lease 0's leader */
		break;
	case FAULT_CLIENT_STOP:
		f->target = (int)soak_rand_range(r, 0, nclients - 1);
		f->hold_ms = soak_rand_range(r, 1000, 6000);
		break;
	case FAULT_BACKEND_KILL:
		f->param = soak_rand_range(r, 1, 4); /* random victims, then a burst */
		f->hold_ms = 1500;		     /* of active statements */
		break;
	case FAULT_PG_RESTART:
		break;
	case FAULT_BOUNCER_KILL:
		f->hold_ms = soak_rand_range(r, 300, 2000);
		break;
	case FAULT_CLIENT_NOREAD:
		f->hold_ms = 8000; /* at most: until the agent drops it */
		break;
	case FAULT_PG_FAILOVER:
		/* not a hold: room in the schedule for the stop, the promotion
		 * and rebuilding the old primary as the new standby */
		f->hold_ms = 20000;
		break;
	case FAULT_CLOCK_JUMP:
		f->target = cfg->agents - 1;
		f->param = clock_offsets[soak_rand_range(
		    r, 0, (int64_t)(sizeof(clock_offsets) / sizeof(clock_offsets[0])) - 2)];
		break;
	case FAULT__COUNT:
		break;
	}
}

size_t faults_plan(const struct soak_cfg *cfg, struct fault **out)
{
	struct soak_rng r = {soak_derive_seed(cfg->seed, 7)};
	enum fault_kind kinds[FAULT__COUNT];
	int nkinds = 0;
	size_t n = 0, cap = 16;
	struct fault *list;
	int64_t warmup = cfg->duration_ms / 10 < 8000 ? cfg->duration_ms / 10 : 8000;
	int64_t cooldown = cfg->duration_ms / 8 < 12000 ? cfg->duration_ms / 8 : 12000;
	int64_t span = cfg->duration_ms - warmup - cooldown, gap, t;

	*out = NULL;
	if (!cfg->faults || span <= 0)
		return 0;
	for (int k = 0; k < FAULT__COUNT; k++)
		if (kind_enabled(cfg, (enum fault_kind)k))
			kinds[nkinds++] = (enum fault_kind)k;
	if (nkinds == 0)
		return 0;
	list = malloc(cap * sizeof(*list));
	if (!list)
		return 0;
	/* one of each kind per round, in a fresh order every round. The first
	 * round always happens, its gaps shrunk to fit the run (a short run
	 * still sees every kind); later rounds only while they fit, with gaps
	 * that spread a long run out. */
	t = warmup;
	for (int round = 0;; round++) {
		struct fault f[FAULT__COUNT];
		int64_t holds = 0;

		for (int i = nkinds - 1; i > 0; i--) {
			int j = (int)soak_rand_range(&r, 0, i);
			enum fault_kind tmp = kinds[i];

			kinds[i] = kinds[j];
			kinds[j] = tmp;
		}
		for (int i = 0; i < nkinds; i++) {
			f[i] = (struct fault){.kind = kinds[i]};
			plan_one(cfg, &r, &f[i]);
			holds += f[i].hold_ms;
		}
		gap = span / nkinds;
		if (gap > 30000)
			gap = 30000;
		if (gap > 8000 * nkinds) /* a run of one or two kinds still sees many */
			gap = 8000 * nkinds;
		if (round == 0 && gap > (span - holds) / nkinds)
			gap = (span - holds) / nkinds; /* the first round fits */
		if (gap < 1500)
			gap = 1500;
		for (int i = 0; i < nkinds; i++) {
			if (round > 0 && t + f[i].hold_ms > warmup + span)
				goto done;
			if (n == cap) {
				struct fault *bigger = realloc(list, 2 * cap * sizeof(*list));
				if (!bigger)
					goto done;
				list = bigger;
				cap *= 2;
			}
			f[i].at_ms = t;
			if (f[i].kind == FAULT_CLOCK_JUMP) {
				/* a jump, not a stay: never the offset already in force */
				for (size_t k = n; k-- > 0;)
					if (list[k].kind == FAULT_CLOCK_JUMP) {
						if (list[k].param == f[i].param)
							f[i].param = f[i].param == 0 ? 7200 : 0;
						break;
					}
			}
			list[n++] = f[i];
			t += f[i].hold_ms + soak_rand_range(&r, gap * 6 / 10, gap * 14 / 10);
		}
	}
done:
	*out = list;
	return n;
}

void fault_describe(const struct fault *f, char *buf, size_t size)
{
	switch (f->kind) {
	case FAULT_AGENT_KILL:
		if (f->param)
			snprintf(buf, size,
				 "kill -9 the agent of lease 0's leader (else a%d), restart after "
				 "%" PRId64 " ms",
				 f->target, f->hold_ms);
		else
			snprintf(buf, size, "kill -9 agent a%d, restart after %" PRId64 " ms",
				 f->target, f->hold_ms);
		break;
	case FAULT_AGENT_STOP:
		if (f->param)
			snprintf(buf, size,
				 "SIGSTOP the agent of lease 0's leader (else a%d) for %" PRId64
				 " ms",
				 f->target, f->hold_ms);
		else
			snprintf(buf, size, "SIGSTOP agent a%d for %" PRId64 " ms", f->target,
				 f->hold_ms);
		break;
	case FAULT_CLIENT_STOP:
		snprintf(buf, size, "SIGSTOP client #%d for %" PRId64 " ms", f->target, f->hold_ms);
		break;
	case FAULT_BACKEND_KILL:
		snprintf(buf, size,
			 "pg_terminate_backend of %" PRId64 " random agent connections, then of "
			 "active statements for %" PRId64 " ms",
			 f->param, f->hold_ms);
		break;
	case FAULT_PG_RESTART:
		snprintf(buf, size, "restart Postgres in immediate mode (a crash)");
		break;
	case FAULT_PG_FAILOVER:
		snprintf(buf, size,
			 "stop the primary in immediate mode (a crash), promote its synchronous "
			 "standby");
		break;
	case FAULT_BOUNCER_KILL:
		snprintf(buf, size, "kill -9 PgBouncer, restart after %" PRId64 " ms", f->hold_ms);
		break;
	case FAULT_CLIENT_NOREAD:
		snprintf(buf, size, "a client of a%d that stops reading its socket", f->target);
		break;
	case FAULT_CLOCK_JUMP:
		snprintf(buf, size, "wall clock of a%d jumps to %+" PRId64 " s", f->target,
			 f->param);
		break;
	case FAULT__COUNT:
		snprintf(buf, size, "?");
		break;
	}
}

/* --- injection ------------------------------------------------------------ */

static int run_cmd(const char *const argv[])
{
	pid_t pid;
	int status;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDWR);

		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
		}
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/*
 * The primary crashes (immediate stop) and its synchronous standby is
 * promoted; then the old primary's directory is made a standby of the new
 * one, so the next failover goes back. Both servers are named in every
 * conninfo (tests/soak/run --standby), with target_session_attrs=read-write.
 * Until the new standby attaches, commits wait for it (synchronous_standby_
 * names names both): that is part of the outage.
 */
static bool pg_failover(char *detail, size_t len)
{
	static char primary[256], standby[256];
	const char *cl = getenv("PGCOORD_TEST_CLUSTER");

	if (!primary[0]) {
		snprintf(primary, sizeof(primary), "%s", getenv("PGCOORD_TEST_PGDATA"));
		snprintf(standby, sizeof(standby), "%s", getenv("PGCOORD_SOAK_STANDBY"));
	}
	const char *stop_argv[] = {cl, "shutdown", primary, "immediate", NULL};
	const char *promote_argv[] = {cl, "promote", standby, NULL};
	const char *remove_argv[] = {cl, "stop", primary, NULL};
	const char *rebuild_argv[] = {cl, "standby", primary, standby, NULL};
	int64_t t0 = soak_now_us();
	int rc1 = run_cmd(stop_argv);
	int rc2 = rc1 == 0 ? run_cmd(promote_argv) : -1;
	int64_t promoted = soak_now_us();
	int rc3 = rc2 == 0 ? run_cmd(remove_argv) : -1;
	int rc4 = rc3 == 0 ? run_cmd(rebuild_argv) : -1;
	int64_t rebuilt = soak_now_us();

	snprintf(
	    detail, len,
	    "%.60s crashed, %.60s promoted after %lld ms, the old primary a standby again after "
	    "%lld ms (exits %d %d %d %d)",
	    strrchr(primary, '/') ? strrchr(primary, '/') + 1 : primary,
	    strrchr(standby, '/') ? strrchr(standby, '/') + 1 : standby,
	    (long long)((promoted - t0) / 1000), (long long)((rebuilt - t0) / 1000), rc1, rc2, rc3,
	    rc4);
	if (rc4 != 0)
		return false;
	char tmp[256];
	memcpy(tmp, primary, sizeof(tmp));
	memcpy(primary, standby, sizeof(primary));
	memcpy(standby, tmp, sizeof(standby));
	return true;
}

/* Runs sql (one statement, one integer column) and returns the sum of the
 * column, -1 on failure. */
static int64_t admin_sum(const struct soak_cfg *cfg, const char *sql, char *err, size_t errlen)
{
	PGconn *c = PQconnectdb(cfg->direct_conninfo);
	int64_t sum = -1;

	soak_quiet(c);
	if (PQstatus(c) == CONNECTION_OK) {
		PGresult *r = PQexec(c, sql);

		if (PQresultStatus(r) == PGRES_TUPLES_OK) {
			sum = 0;
			for (int i = 0; i < PQntuples(r); i++)
				sum += strtoll(PQgetvalue(r, i, 0), NULL, 10);
		} else {
			snprintf(err, errlen, "%s", PQresultErrorMessage(r));
		}
		PQclear(r);
	} else {
		snprintf(err, errlen, "%s", PQerrorMessage(c));
	}
	PQfinish(c);
	return sum;
}

/* The agents' backends (and PgBouncer's server connections): everything on
 * the soak database but our own instruments. */
#define AGENT_BACKENDS                                                                             \
	"FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "    \
	"AND backend_type = 'client backend' AND application_name NOT LIKE 'soak-%%'"

static void backend_kill(const struct soak_cfg *cfg, const struct fault *f, char *detail,
			 size_t size, volatile sig_atomic_t *stop)
{
	char sql[512], err[256] = "";
	int64_t random_killed, burst = 0, end;

	snprintf(sql, sizeof(sql),
		 "SELECT pg_terminate_backend(pid)::int FROM (SELECT pid " AGENT_BACKENDS
		 " ORDER BY random() LIMIT %" PRId64 ") v",
		 f->param);
	random_killed = admin_sum(cfg, sql, err, sizeof(err));
	/* then whatever is executing pgcoord's functions, again and again: some
	 * of these die mid-statement, a few while committing */
	snprintf(
	    sql, sizeof(sql),
	    "SELECT pg_terminate_backend(pid)::int FROM (SELECT pid " AGENT_BACKENDS
	    " AND state = 'active' AND query LIKE '%%pgcoord.%%' ORDER BY random() LIMIT 1) v");
	PGconn *c = PQconnectdb(cfg->direct_conninfo);
	soak_quiet(c);
	end = soak_now_us() + f->hold_ms * 1000;
	while (PQstatus(c) == CONNECTION_OK && soak_now_us() < end && !*stop) {
		PGresult *r = PQexec(c, sql);

		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
			burst += strtoll(PQgetvalue(r, 0, 0), NULL, 10);
		PQclear(r);
		soak_sleep_ms(soak_now_us() % 7 + 3, NULL);
	}
	PQfinish(c);
	snprintf(detail, size, "terminated %" PRId64 " random and %" PRId64 " active backends%s%s",
		 random_killed < 0 ? 0 : random_killed, burst, err[0] ? ": " : "", err);
}

/* Connects to the agent's socket, opens nothing, and floods it with
 * requests whose answers it never reads, until the agent drops it. */
static void noread(const struct soak_cfg *cfg, const struct fault *f, char *detail, size_t size,
		   volatile sig_atomic_t *stop)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int64_t start = soak_now_us(), end = start + f->hold_ms * 1000, sent = 0;
	const char *how = "still connected when the fault ended";

	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", cfg->sockets[f->target]);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		snprintf(detail, size, "could not connect: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	/* agent.status answers from memory: the flood costs the database nothing */
	for (uint32_t id = 1; id <= 64; id++) {
		pgc_pack_request_begin(&pk, id, "agent.status");
		msgpack_pack_map(&pk, 0);
	}
	while (soak_now_us() < end && !*stop) {
		ssize_t n = send(fd, sb.data, sb.size, MSG_NOSIGNAL);

		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			/* our send buffer is full too: is the agent still there? */
			char b;
			ssize_t r = recv(fd, &b, 0, MSG_DONTWAIT | MSG_PEEK);

			(void)r;
			soak_sleep_ms(20, NULL);
			continue;
		}
		if (n < 0) {
			how = errno == EPIPE || errno == ECONNRESET ? "dropped by the agent"
								    : strerror(errno);
			break;
		}
		sent += n;
		soak_sleep_ms(2, NULL);
	}
	snprintf(detail, size, "%s after %" PRId64 " ms, %" PRId64 " bytes of requests sent", how,
		 (soak_now_us() - start) / 1000, sent);
	msgpack_sbuffer_destroy(&sb);
	close(fd);
}

static void write_clock(const struct soak_cfg *cfg, int64_t offset_s, char *detail, size_t size)
{
	char tmp[600];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.new", cfg->faketime_file);
	f = fopen(tmp, "we");
	if (!f || fprintf(f, "%+" PRId64 "s\n", offset_s) < 0 || fclose(f) != 0 ||
	    rename(tmp, cfg->faketime_file) != 0) {
		snprintf(detail, size, "could not write the faketime file: %s", strerror(errno));
		return;
	}
	snprintf(detail, size, "wall clock offset now %+" PRId64 " s (%s)", offset_s,
		 cfg->faketime_monotonic ? "CLOCK_MONOTONIC jumps with it"
					 : "CLOCK_MONOTONIC left alone");
}

void fault_inject(struct fleet *fl, const struct soak_cfg *cfg, struct hist *h,
		  const struct fault *f, volatile sig_atomic_t *stop)
{
	char detail[512] = "", what[256];
	int64_t t0 = soak_now_us();
	int target = f->target;
	pid_t pid;
	bool ok = true;

	fault_describe(f, what, sizeof(what));
	switch (f->kind) {
	case FAULT_AGENT_KILL:
		if (f->param) {
			int leader = fleet_leader_agent(fl);

			if (leader >= 0)
				target = leader;
			snprintf(detail, sizeof(detail), "%s; ",
				 leader >= 0 ? "aimed at the leader's agent" : "no leader found");
		}
		fleet_agent_signal(fl, target, SIGKILL);
		ok = fleet_agent_reap(fl, target, 5000);
		soak_sleep_ms(f->hold_ms, stop);
		ok = fleet_agent_start(fl, target) && ok;
		snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
			 "a%d killed and restarted%s", target, ok ? "" : " (restart failed)");
		break;
	case FAULT_AGENT_STOP:
		if (f->param) {
			int leader = fleet_leader_agent(fl);

			if (leader >= 0)
				target = leader;
		}
		pid = fleet_agent_pid(fl, target);
		ok = pid > 0 && kill(pid, SIGSTOP) == 0;
		soak_sleep_ms(f->hold_ms, NULL);
		if (pid > 0)
			kill(pid, SIGCONT);
		snprintf(detail, sizeof(detail), "a%d (pid %d) stopped and continued", target,
			 (int)pid);
		break;
	case FAULT_CLIENT_STOP:
		pid = fleet_client_pid(fl, target);
		ok = pid > 0 && kill(pid, SIGSTOP) == 0;
		soak_sleep_ms(f->hold_ms, NULL);
		if (pid > 0)
			kill(pid, SIGCONT);
		snprintf(detail, sizeof(detail), "client a%dc%d (pid %d) stopped and continued",
			 target / cfg->clients, target % cfg->clients, (int)pid);
		break;
	case FAULT_BACKEND_KILL:
		backend_kill(cfg, f, detail, sizeof(detail), stop);
		break;
	case FAULT_PG_RESTART: {
		const char *cl = getenv("PGCOORD_TEST_CLUSTER"),
			   *data = getenv("PGCOORD_TEST_PGDATA");
		const char *argv[] = {cl, "restart", data, "immediate", NULL};
		int rc = cl && data ? run_cmd(argv) : -1;

		ok = rc == 0;
		snprintf(detail, sizeof(detail), "pg-cluster restart immediate exited %d", rc);
		break;
	}
	case FAULT_BOUNCER_KILL: {
		const char *b = getenv("PGCOORD_TEST_PGBOUNCER");
		const char *dir = getenv("PGCOORD_TEST_PGBOUNCER_HOST");
		const char *kill_argv[] = {b, "kill", dir, NULL};
		const char *start_argv[] = {b, "start", dir, NULL};
		int rc1 = b && dir ? run_cmd(kill_argv) : -1, rc2;

		soak_sleep_ms(f->hold_ms, stop);
		rc2 = b && dir ? run_cmd(start_argv) : -1;
		ok = rc1 == 0 && rc2 == 0;
		snprintf(detail, sizeof(detail), "pg-bouncer kill exited %d, start exited %d", rc1,
			 rc2);
		break;
	}
	case FAULT_CLIENT_NOREAD:
		noread(cfg, f, detail, sizeof(detail), stop);
		break;
	case FAULT_CLOCK_JUMP:
		write_clock(cfg, f->param, detail, sizeof(detail));
		break;
	case FAULT_PG_FAILOVER:
		ok = pg_failover(detail, sizeof(detail));
		break;
	case FAULT__COUNT:
		break;
	}
	hist_begin(h, "fault");
	hist_str(h, "kind", fault_kind_name(f->kind));
	hist_int(h, "target", target);
	hist_int(h, "t0", t0);
	hist_int(h, "t1", soak_now_us());
	hist_int(h, "planned_ms", f->at_ms);
	hist_int(h, "hold_ms", f->hold_ms);
	hist_int(h, "param", f->param);
	hist_bool(h, "ok", ok);
	hist_str(h, "what", what);
	hist_str(h, "detail", detail);
	hist_end(h);
	hist_flush(h);
	fprintf(stderr, "soak:   -> %s%s\n", detail, ok ? "" : " [FAILED]");
}
