/*
 * test_burst.c — bursts of connections (a fleet restarting its workers at
 * once): 1,000 connects in a burst are each either served or refused with
 * the agent's busy error, none gets EAGAIN under the default listen_backlog
 * (they do under the old fixed 128); listen_backlog is applied on SIGHUP;
 * libpgcoord retries a connect refused with EAGAIN within its timeout, and
 * says ETIMEDOUT when the queue stays full past it.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

TestSuite(burst, .timeout = 120);

#define BURST 1000
#define BURST_OTHER_UID 65534 /* non-admin: held to max_connections_per_uid */
#define BURST_AS_OTHER 600    /* the first 600 connects come from it, the rest from root */
#define BURST_MAX_CONNECTIONS 300
#define BURST_PER_UID 100

/* What became of the connects of a burst. */
struct burst_counts {
	int served;	  /* agent.ping answered */
	int busy_per_uid; /* refused: max_connections_per_uid */
	int busy_max;	  /* refused: max_connections (N) reached */
	int eagain;	  /* connect() failed with EAGAIN: the accept queue was full */
	int other;	  /* anything else: a defect */
	int served_other; /* of served, those of BURST_OTHER_UID */
	char first_other[200];
};

/* Raises the soft fd limit to the hard one when a burst needs more; the
 * agent, started afterwards, inherits it. */
static void need_fds(rlim_t n)
{
	struct rlimit rl;

	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0, "getrlimit: %s", strerror(errno));
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < n) {
		rl.rlim_cur = rl.rlim_max;
		cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0, "setrlimit: %s", strerror(errno));
	}
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < n)
		cr_skip_test("RLIMIT_NOFILE allows %llu descriptors, the burst needs %llu",
			     (unsigned long long)rl.rlim_cur, (unsigned long long)n);
}

static void sockaddr_of(const char *path, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	cr_assert_lt(strlen(path), sizeof(sa->sun_path));
	strcpy(sa->sun_path, path);
}

/* One non-blocking connect: the fd, or -1 with errno. */
static int connect_nb(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
	if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
		return fd;
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}

/* Reads the one answer a burst connection gets to its agent.ping: the pong,
 * or the busy error frame (msgid 0) of a refusal and then the close. */
static void classify(int fd, uint32_t msgid, bool other_uid, struct burst_counts *c)
{
	msgpack_unpacked u;
	struct pgc_message m;
	char err[256] = "";
	const char *text = NULL;
	size_t len = 0;
	bool retryable = false;

	msgpack_unpacked_init(&u);
	enum hraw_result rc = hraw_recv_msg(fd, 10000, &u);
	if (rc != HRAW_MSG || !pgc_parse_message(&u.data, &m, err, sizeof(err))) {
		snprintf(err + strlen(err), sizeof(err) - strlen(err), " (hraw %d)", (int)rc);
	} else if (m.msgid == msgid && !m.error) {
		c->served++;
		c->served_other += other_uid;
		goto done;
	} else if (m.msgid == 0 && m.error &&
		   pgc_obj_str_eq(pgc_map_get(m.error, "code"), "busy") &&
		   pgc_obj_bool(pgc_map_get(m.error, "retryable"), &retryable) && retryable &&
		   pgc_obj_str(pgc_map_get(m.error, "message"), &text, &len)) {
		snprintf(err, sizeof(err), "busy: %.*s", (int)len, text);
		if (!hraw_expect_closed(fd, 5000)) {
			strcat(err, " (and left open)");
		} else if (strstr(err, "max_connections_per_uid")) {
			c->busy_per_uid++;
			goto done;
		} else if (strstr(err, "max_connections (")) {
			c->busy_max++;
			goto done;
		}
	} else {
		snprintf(err, sizeof(err), "an unexpected reply (msgid %u)", (unsigned)m.msgid);
	}
	if (!c->first_other[0])
		snprintf(c->first_other, sizeof(c->first_other), "%s", err);
	c->other++;
done:
	msgpack_unpacked_destroy(&u);
}

/*
 * BURST non-blocking connects as fast as one process can make them, the
 * first BURST_AS_OTHER with the effective uid BURST_OTHER_UID (SO_PEERCRED
 * records the connecting euid), the rest as root (an admin); with
 * stop_agent, the agent is stopped meanwhile, so it accepts nothing before
 * the last. Then agent.ping through every connection that was queued.
 */
static struct burst_counts burst(struct hagent *a, bool stop_agent)
{
	struct burst_counts c = {0};
	struct sockaddr_un sa;
	static int fds[BURST];
	int64_t t0, t1;

	sockaddr_of(hagent_socket(a), &sa);
	if (stop_agent)
		hagent_kill(a, SIGSTOP);
	cr_assert_eq(setresuid((uid_t)-1, BURST_OTHER_UID, (uid_t)-1), 0, "seteuid: %s",
		     strerror(errno));
	t0 = hnow_ms();
	for (int i = 0; i < BURST; i++) {
		if (i == BURST_AS_OTHER)
			cr_assert_eq(setresuid((uid_t)-1, 0, (uid_t)-1), 0, "seteuid 0: %s",
				     strerror(errno));
		fds[i] = connect_nb(&sa);
		if (fds[i] < 0) {
			if (errno == EAGAIN) {
				c.eagain++;
			} else {
				c.other++;
				snprintf(c.first_other, sizeof(c.first_other), "connect: %s",
					 strerror(errno));
			}
		}
	}
	t1 = hnow_ms();
	if (stop_agent)
		hagent_kill(a, SIGCONT);
	for (int i = 0; i < BURST; i++)
		if (fds[i] >= 0)
			(void)hraw_send_request(fds[i], (uint32_t)i + 1, "agent.ping", NULL, 0);
	for (int i = 0; i < BURST; i++)
		if (fds[i] >= 0)
			classify(fds[i], (uint32_t)i + 1, i < BURST_AS_OTHER, &c);
	cr_log_info("burst of %d connects in %lld ms%s: %d served (%d of uid %d), %d refused "
		    "max_connections_per_uid, %d refused max_connections, %d EAGAIN, %d other%s%s",
		    BURST, (long long)(t1 - t0), stop_agent ? " (agent stopped)" : "", c.served,
		    c.served_other, BURST_OTHER_UID, c.busy_per_uid, c.busy_max, c.eagain, c.other,
		    c.first_other[0] ? ": " : "", c.first_other);
	for (int i = 0; i < BURST; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return c;
}

static struct hagent *burst_agent(struct harness_db *db, const char *name, const char *backlog)
{
	const char *const with_backlog[] = {"--max-connections",
					    "300",
					    "--max-connections-per-uid",
					    "100",
					    "--admin-connection-reserve",
					    "0",
					    "--socket-mode",
					    "0666",
					    "--listen-backlog",
					    backlog,
					    NULL};
	const char *const *args = with_backlog;
	const char *const plain[] = {with_backlog[0], with_backlog[1], with_backlog[2],
				     with_backlog[3], with_backlog[4], with_backlog[5],
				     with_backlog[6], with_backlog[7], NULL};

	if (!backlog)
		args = plain; /* the default */
	need_fds(BURST + 256);
	return hagent_start(db, name, args);
}

/* Waits until the agent counts n client connections, ctl (the test's own,
 * held through the burst so the count is exact) included. */
static void wait_connections(int ctl, int64_t n)
{
	int64_t deadline = hnow_ms() + 5000, have;
	struct ireply r;

	for (;;) {
		icall(ctl, "agent.status", NULL, &r);
		have = iint(iok(&r, "status"), "connections");
		ireply_destroy(&r);
		if (have == n)
			return;
		cr_assert_lt(hnow_ms(), deadline, "%lld connections, expected %lld",
			     (long long)have, (long long)n);
		hsleep_ms(20);
	}
}

/* Every connect of the burst is accounted for: served, or refused busy by
 * the limit that applies, the numbers the limits allow. */
static void assert_accounted(const struct burst_counts *c, struct hagent *a)
{
	cr_assert_eq(c->other, 0, "%d connects neither served nor refused busy (first: %s)",
		     c->other, c->first_other);
	cr_assert_eq(c->served + c->busy_per_uid + c->busy_max + c->eagain, BURST);
	cr_assert(hagent_running(a), "%s", hagent_log(a));
}

Test(burst, a_thousand_connects_are_each_served_or_refused_busy_and_none_gets_eagain)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = burst_agent(db, "burst-default", NULL);
	int ctl = iconnect(hagent_socket(a));

	wait_connections(ctl, 1);
	struct burst_counts c = burst(a, false);
	assert_accounted(&c, a);
	cr_assert_eq(c.eagain, 0, "%d connects got EAGAIN under the default listen_backlog",
		     c.eagain);
	/* the other uid: its first 100 served, the rest over its cap; then
	 * root fills max_connections (ctl holds one) and the rest are over it */
	cr_assert_eq(c.served_other, BURST_PER_UID);
	cr_assert_eq(c.busy_per_uid, BURST_AS_OTHER - BURST_PER_UID);
	cr_assert_eq(c.served, BURST_MAX_CONNECTIONS - 1);
	cr_assert_eq(c.busy_max,
		     BURST - BURST_AS_OTHER - (BURST_MAX_CONNECTIONS - 1 - BURST_PER_UID));
	/* the served ones were closed by the burst: their slots are free again */
	wait_connections(ctl, 1);
	close(ctl);
	cr_assert(strstr(hagent_log(a), "refusing a connection"), "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}

Test(burst, a_burst_queued_while_the_agent_is_stopped_is_served_once_it_runs)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = burst_agent(db, "burst-stopped", NULL);
	int ctl = iconnect(hagent_socket(a));

	wait_connections(ctl, 1);
	struct burst_counts c = burst(a, true);
	assert_accounted(&c, a);
	cr_assert_eq(c.eagain, 0, "%d connects got EAGAIN while the agent was stopped", c.eagain);
	cr_assert_eq(c.served_other, BURST_PER_UID);
	cr_assert_eq(c.busy_per_uid, BURST_AS_OTHER - BURST_PER_UID);
	cr_assert_eq(c.served, BURST_MAX_CONNECTIONS - 1);
	cr_assert_eq(c.busy_max,
		     BURST - BURST_AS_OTHER - (BURST_MAX_CONNECTIONS - 1 - BURST_PER_UID));
	close(ctl);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The old fixed backlog of 128: what a burst got before listen_backlog. A
 * stopped agent queues exactly backlog + 1 connects (Linux admits one past
 * the backlog); the rest get EAGAIN before the agent sees them. */
Test(burst, under_the_old_backlog_of_128_a_burst_gets_eagain)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = burst_agent(db, "burst-128", "128");
	int ctl = iconnect(hagent_socket(a));

	wait_connections(ctl, 1);
	struct burst_counts running = burst(a, false);
	assert_accounted(&running, a);
	wait_connections(ctl, 1);
	struct burst_counts stopped = burst(a, true);
	assert_accounted(&stopped, a);
	/* the 129 queued: the other uid's first 100 served, 29 over its cap */
	cr_assert_eq(stopped.eagain, BURST - 129, "%d EAGAIN", stopped.eagain);
	cr_assert_eq(stopped.served, BURST_PER_UID);
	cr_assert_eq(stopped.busy_per_uid, 129 - BURST_PER_UID);
	close(ctl);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- listen_backlog itself and libpgcoord's retry ----------------------- */

/* With the agent stopped, connects until the accept queue is full; returns
 * how many were queued, their fds in fds. */
static int fill_queue(struct hagent *a, int *fds, int max)
{
	struct sockaddr_un sa;
	int n = 0;

	sockaddr_of(hagent_socket(a), &sa);
	while (n < max) {
		int fd = connect_nb(&sa);
		if (fd < 0) {
			cr_assert_eq(errno, EAGAIN, "connect: %s", strerror(errno));
			return n;
		}
		fds[n++] = fd;
	}
	cr_assert_fail("the accept queue took %d connects and was not full", max);
	return n;
}

/* Sends sig to pid after ms, from a child process. */
static pid_t signal_later(pid_t pid, int sig, int ms)
{
	pid_t child = fork();

	cr_assert_geq(child, 0);
	if (child == 0) {
		hsleep_ms(ms);
		_exit(kill(pid, sig) == 0 ? 0 : 1);
	}
	return child;
}

Test(burst, listen_backlog_sets_the_queue_and_a_sighup_changes_it)
{
	struct harness_db *db = idb_migrated();
	char conf[512], *log = NULL;
	FILE *f;
	int fds[64], n;

	snprintf(conf, sizeof(conf), "%s/burst-%d.conf", getenv("PGCOORD_TEST_TMP"), (int)getpid());
	f = fopen(conf, "w");
	cr_assert(f);
	fprintf(f, "listen_backlog = 1\n");
	fclose(f);
	const char *const args[] = {"--config", conf, NULL};
	struct hagent *a = hagent_start(db, "burst-sighup", args);

	hagent_kill(a, SIGSTOP);
	n = fill_queue(a, fds, 64);
	hagent_kill(a, SIGCONT);
	cr_assert_eq(n, 2, "listen_backlog 1 queued %d connects", n);
	for (int i = 0; i < n; i++)
		close(fds[i]);

	f = fopen(conf, "w");
	cr_assert(f);
	fprintf(f, "listen_backlog = 4\n");
	fclose(f);
	hagent_kill(a, SIGHUP);
	int64_t deadline = hnow_ms() + 5000;
	while (!strstr(hagent_log(a), "SIGHUP: listen_backlog = 4 (was 1)")) {
		cr_assert_lt(hnow_ms(), deadline, "no reload: %s", hagent_log(a));
		hsleep_ms(20);
	}
	hagent_kill(a, SIGSTOP);
	n = fill_queue(a, fds, 64);
	hagent_kill(a, SIGCONT);
	cr_assert_eq(n, 5, "listen_backlog 4 after SIGHUP queued %d connects", n);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	cr_assert(hagent_running(a), "%s", hagent_log(a));
	hagent_destroy(a);

	/* out of range: refused at start with the range */
	const char *const zero[] = {"--listen-backlog", "0", NULL};
	int rc = hagent_start_expect_exit(db, "burst-zero", zero, &log);
	cr_assert_eq(rc, 2, "exit %d: %s", rc, log);
	cr_assert(strstr(log, "--listen-backlog: 0 is out of range (expected 1..65535)"), "%s",
		  log);
	free(log);
	hdb_drop(db);
}

Test(burst, libpgcoord_retries_a_full_queue_until_the_agent_accepts)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--listen-backlog", "1", NULL};
	struct hagent *a = hagent_start(db, "burst-lib", args);
	int fds[64], n;
	pgcoord *c = NULL;

	hagent_kill(a, SIGSTOP);
	n = fill_queue(a, fds, 64);
	/* the agent runs again in 300 ms: the connect must wait it out */
	pid_t later = signal_later(hagent_pid(a), SIGCONT, 300);
	int64_t t0 = hnow_ms();
	pgcoord_err err = pgcoord_connect(hagent_socket(a), 5000, &c);
	int64_t took = hnow_ms() - t0;
	int e = errno;
	cr_assert_eq(iwait_pid(later), 0);
	cr_assert_eq(err, PGCOORD_OK, "pgcoord_connect: %s (%s) after %lld ms",
		     pgcoord_strerror(err), strerror(e), (long long)took);
	cr_assert_geq(took, 250, "connected after %lld ms, while the agent was stopped",
		      (long long)took);
	void *result = NULL;
	size_t len = 0;
	err = pgcoord_call(c, "agent.ping", NULL, 0, ICALL_MS, &result, &len);
	cr_assert_eq(err, PGCOORD_OK, "agent.ping: %s", pgcoord_last_message(c));
	free(result);
	pgcoord_close(c);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	cr_assert(hagent_running(a), "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}

Test(burst, libpgcoord_says_timed_out_when_the_queue_stays_full)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--listen-backlog", "1", NULL};
	struct hagent *a = hagent_start(db, "burst-lib-timeout", args);
	int fds[64], n;
	pgcoord *c = NULL;

	hagent_kill(a, SIGSTOP);
	n = fill_queue(a, fds, 64);
	int64_t t0 = hnow_ms();
	pgcoord_err err = pgcoord_connect(hagent_socket(a), 400, &c);
	int e = errno;
	int64_t took = hnow_ms() - t0;
	hagent_kill(a, SIGCONT);
	cr_assert_eq(err, PGCOORD_E_CONNECT, "pgcoord_connect: %s", pgcoord_strerror(err));
	cr_assert_null(c);
	cr_assert_eq(e, ETIMEDOUT, "errno %s, expected ETIMEDOUT", strerror(e));
	cr_assert_geq(took, 400, "gave up after %lld ms of 400", (long long)took);
	cr_assert_lt(took, 1500, "gave up after %lld ms of 400", (long long)took);
	/* a missing socket still fails at once */
	t0 = hnow_ms();
	err = pgcoord_connect("/nonexistent/pgcoord/agent.sock", 5000, &c);
	e = errno;
	cr_assert_eq(err, PGCOORD_E_CONNECT);
	cr_assert_eq(e, ENOENT, "errno %s", strerror(e));
	cr_assert_lt(hnow_ms() - t0, 100);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	cr_assert(hagent_running(a), "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}
