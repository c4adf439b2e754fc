/*
 * test_transport.c — the agent's input path under attack (issue 11): peers
 * dribbling bytes into large partial frames must not slow a good client,
 * begun frames and idle connections have deadlines, one uid cannot take
 * every connection slot, a message of many small objects cannot make the
 * decoder allocate far more than its bytes, two agents started at once on
 * one socket path leave exactly one serving, and the HTTP listener serves
 * only loopback Host names and builds /status at most once a second.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"

TestSuite(transport, .timeout = 120);

/* --- helpers ------------------------------------------------------------ */

/* Waits until the agent counts exactly n client connections (fd's own
 * included); start-up probes and closed sockets take a moment to go. */
static void wait_connections(int fd, int64_t n)
{
	int64_t deadline = hnow_ms() + 5000, have;
	struct ireply r;

	for (;;) {
		icall(fd, "agent.status", NULL, &r);
		have = iint(iok(&r, "status"), "connections");
		ireply_destroy(&r);
		if (have == n)
			return;
		cr_assert_lt(hnow_ms(), deadline, "%lld connections, expected %lld",
			     (long long)have, (long long)n);
		hsleep_ms(20);
	}
}

static void send_all(int fd, const void *bytes, size_t n)
{
	cr_assert(hraw_send(fd, bytes, n), "send: %s", strerror(errno));
}

static void ping_ok(int fd, const char *when)
{
	struct ireply r;

	icall(fd, "agent.ping", NULL, &r);
	cr_assert(ibool(iok(&r, when), "pong"), "ping %s", when);
	ireply_destroy(&r);
}

/* Reads the one error frame (msgid 0) a refused or dropped connection gets,
 * checks its code and that its message mentions `mention`, then that the
 * agent hangs up. */
static void expect_error_then_close(int fd, const char *code, bool retryable, const char *mention)
{
	struct ireply r;
	char err[256];
	const char *const mentions[] = {mention, NULL};

	msgpack_unpacked_init(&r.u);
	cr_assert_eq(hraw_recv_msg(fd, ICALL_MS, &r.u), HRAW_MSG, "no %s error frame", code);
	memset(&r.m, 0, sizeof(r.m));
	cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
	cr_assert_eq(r.m.msgid, 0);
	ierr(&r, code, retryable, mentions);
	ireply_destroy(&r);
	cr_assert(hraw_expect_closed(fd, ICALL_MS), "the agent kept the connection open");
}

/* CPU time (user + system) the process has used, in milliseconds. */
static long cpu_ms(pid_t pid)
{
	char path[64];
	char *stat, *p;
	unsigned long utime = 0, stime = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	stat = hread_file(path);
	/* fields after the command name, which may hold spaces: state is 3rd,
	 * utime the 14th and stime the 15th */
	p = strrchr(stat, ')');
	cr_assert_not_null(p);
	cr_assert_eq(
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime),
	    2);
	free(stat);
	return (long)((utime + stime) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/*
 * Connects to path as uid (and gid) in a forked child and hands the
 * connected socket back: SO_PEERCRED records who called connect(), so the
 * agent sees that uid however the fd is used afterwards.
 */
static int connect_as(uid_t uid, const char *path)
{
	int sv[2];
	pid_t pid;
	char byte = 0;
	struct msghdr mh = {0};
	struct iovec iov = {&byte, 1};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct cmsghdr *cm;
	int fd = -1;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int c;
		if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid(uid) != 0)
			_exit(2);
		c = hraw_connect(path);
		if (c < 0)
			_exit(3);
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &c, sizeof(int));
		_exit(sendmsg(sv[1], &mh, 0) == 1 ? 0 : 4);
	}
	close(sv[1]);
	memset(&ctl, 0, sizeof(ctl));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = ctl.buf;
	mh.msg_controllen = sizeof(ctl.buf);
	if (recvmsg(sv[0], &mh, 0) == 1 && (cm = CMSG_FIRSTHDR(&mh)) != NULL &&
	    cm->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	close(sv[0]);
	int rc = iwait_pid(pid);
	cr_assert_eq(rc, 0, "the child connecting as uid %u failed (%d)", (unsigned)uid, rc);
	cr_assert_geq(fd, 0);
	return fd;
}

static int count_lines_with(const char *text, const char *needle)
{
	int n = 0;
	for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

static int cmp_long(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return (x > y) - (x < y);
}

/* --- slow dribble ------------------------------------------------------- */

#define DRIBBLERS 100
#define DRIBBLE_ELEMS 60000 /* 8-byte strs: a 480 KiB partial frame each */
#define DRIBBLE_BYTES 3000
#define PING_EVERY 3 /* dribbled bytes per agent.ping of the good client */
/* Sanitizers slow every step several times over; the bound is about the
 * shape (no stall behind the dribblers), not their speed. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define PING_P99_US 60000
#else
#define PING_P99_US 20000
#endif

struct dribble {
	int fds[DRIBBLERS];
	long cpu_ms, wall_ms;
	long lat_us[DRIBBLE_BYTES / PING_EVERY];
	int nlat;
};

/*
 * Opens DRIBBLERS connections that each send the start of an array of
 * DRIBBLE_ELEMS + DRIBBLE_BYTES elements: `elems` 8-byte strs of it. Room
 * is left for every dribbled nil, so no frame ever completes.
 */
static void dribblers_open(struct hagent *a, struct dribble *d, size_t elems)
{
	size_t len = 5 + elems * 8;
	unsigned char *frame = malloc(len);
	uint32_t count = DRIBBLE_ELEMS + DRIBBLE_BYTES;

	cr_assert_not_null(frame);
	frame[0] = 0xdd;
	frame[1] = (unsigned char)(count >> 24);
	frame[2] = (unsigned char)(count >> 16);
	frame[3] = (unsigned char)(count >> 8);
	frame[4] = (unsigned char)count;
	for (size_t i = 0; i < elems; i++) {
		frame[5 + i * 8] = 0xa7;
		memset(frame + 6 + i * 8, 'a' + (int)(i % 26), 7);
	}
	for (int i = 0; i < DRIBBLERS; i++) {
		d->fds[i] = iconnect(hagent_socket(a));
		send_all(d->fds[i], frame, len);
	}
	free(frame);
	/* the agent has read every byte of them (none is left in our send
	 * queues), so the dribble's CPU is the dribble's alone */
	int64_t deadline = hnow_ms() + 30000;
	for (int i = 0; i < DRIBBLERS; i++) {
		for (;;) {
			int unread = 0;
			cr_assert_eq(ioctl(d->fds[i], SIOCOUTQ, &unread), 0);
			if (unread == 0)
				break;
			cr_assert_lt(hnow_ms(), deadline, "the agent stopped reading the frames");
			hsleep_ms(5);
		}
	}
}

/* Sends DRIBBLE_BYTES single nils round-robin over the dribblers, timing an
 * agent.ping of the good client every PING_EVERY bytes, and the agent's CPU. */
static void dribble_run(struct hagent *a, int good, struct dribble *d)
{
	static const unsigned char nil = 0xc0;
	long cpu_before = cpu_ms(hagent_pid(a));
	int64_t t0 = hnow_ms();

	d->nlat = 0;
	for (int i = 0; i < DRIBBLE_BYTES; i++) {
		send_all(d->fds[i % DRIBBLERS], &nil, 1);
		if (i % PING_EVERY == PING_EVERY - 1) {
			struct ireply r;
			struct timespec ts0, ts1;
			clock_gettime(CLOCK_MONOTONIC, &ts0);
			icall(good, "agent.ping", NULL, &r);
			clock_gettime(CLOCK_MONOTONIC, &ts1);
			cr_assert(ibool(iok(&r, "ping during the dribble"), "pong"));
			ireply_destroy(&r);
			d->lat_us[d->nlat++] = (ts1.tv_sec - ts0.tv_sec) * 1000000L +
					       (ts1.tv_nsec - ts0.tv_nsec) / 1000;
		}
	}
	d->cpu_ms = cpu_ms(hagent_pid(a)) - cpu_before;
	d->wall_ms = (long)(hnow_ms() - t0);
	qsort(d->lat_us, (size_t)d->nlat, sizeof(long), cmp_long);
}

Test(transport, dribbling_partial_frames_cost_little_and_do_not_slow_a_good_client)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--partial-frame-timeout-ms", "120000", NULL};
	struct hagent *a = hagent_start(db, "tr-dribble", args);
	int good = iconnect(hagent_socket(a));
	static struct dribble small, large;

	wait_connections(good, 1);
	/* the same dribble twice: into 5-byte partial frames, then into 480 KiB
	 * ones; scanning each byte once, the second costs no more */
	dribblers_open(a, &small, 0);
	wait_connections(good, DRIBBLERS + 1);
	dribble_run(a, good, &small);
	dribblers_open(a, &large, DRIBBLE_ELEMS);
	wait_connections(good, 2 * DRIBBLERS + 1);
	ping_ok(good, "with every dribbler holding a partial frame");
	dribble_run(a, good, &large);

	long p50 = large.lat_us[large.nlat / 2], p99 = large.lat_us[(large.nlat * 99) / 100];
	printf("dribble: %d connections x %d-byte partial frames, %d one-byte sends in %ld ms; "
	       "agent CPU %ld ms (%ld ms into 5-byte frames); agent.ping p50 %.2f ms, p99 %.2f "
	       "ms (%d pings)\n",
	       DRIBBLERS, 5 + DRIBBLE_ELEMS * 8, DRIBBLE_BYTES, large.wall_ms, large.cpu_ms,
	       small.cpu_ms, p50 / 1000.0, p99 / 1000.0, large.nlat);
	fflush(stdout);
	cr_assert_lt(p99, PING_P99_US, "agent.ping p99 %.2f ms during the dribble", p99 / 1000.0);
	/* rescanning a partial frame from its start would cost 60,000 headers
	 * per byte: ten times the small dribble's CPU and more */
	cr_assert_leq(large.cpu_ms, 2 * small.cpu_ms + 100,
		      "the agent spent %ld ms of CPU dribbling into large partial frames, %ld ms "
		      "into small ones",
		      large.cpu_ms, small.cpu_ms);
	cr_assert_lt(large.cpu_ms, 1000, "the agent spent %ld ms of CPU on %d one-byte sends",
		     large.cpu_ms, DRIBBLE_BYTES);

	/* the dribblers are still connected, nothing was refused */
	wait_connections(good, 2 * DRIBBLERS + 1);
	for (int i = 0; i < DRIBBLERS; i++) {
		close(small.fds[i]);
		close(large.fds[i]);
	}
	wait_connections(good, 1);
	ping_ok(good, "after the dribblers left");
	close(good);
	cr_assert(hagent_running(a));
	hagent_destroy(a);
	hdb_drop(db);
}

/* Requests pipelined in one write are all answered: the bytes the last
 * read finds are scanned even when the bytes held before them were moved
 * to the front of the buffer to make room, and no later byte comes to
 * wake the agent up. */
Test(transport, a_burst_of_pipelined_requests_is_answered_in_full)
{
	enum { BURST = 6000 };
	static const unsigned char ping[] = {0x94, 0x00, 0x01, 0xaa, 'a', 'g', 'e', 'n',
					     't',  '.',	 'p',  'i',  'n', 'g', 0x90};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "tr-burst", NULL);
	int fd = iconnect(hagent_socket(a));
	unsigned char *burst = malloc(BURST * sizeof(ping));

	cr_assert_not_null(burst);
	for (int i = 0; i < BURST; i++)
		memcpy(burst + (size_t)i * sizeof(ping), ping, sizeof(ping));
	/* one write, larger than the socket holds: the agent reads it in
	 * pieces as it arrives, and nothing comes after it */
	send_all(fd, burst, BURST * sizeof(ping));
	free(burst);
	for (int i = 0; i < BURST; i++) {
		msgpack_unpacked u;

		msgpack_unpacked_init(&u);
		cr_assert_eq(hraw_recv_msg(fd, ICALL_MS, &u), HRAW_MSG, "reply %d of %d never came",
			     i + 1, BURST);
		msgpack_unpacked_destroy(&u);
	}
	ping_ok(fd, "after the burst");
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- deadlines ---------------------------------------------------------- */

Test(transport, a_frame_not_completed_in_time_gets_an_error_and_is_closed)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--partial-frame-timeout-ms", "600", NULL};
	struct hagent *a = hagent_start(db, "tr-partial", args);
	int good = iconnect(hagent_socket(a)), slow = iconnect(hagent_socket(a));
	int dawdler = iconnect(hagent_socket(a));
	/* [0, 9, "agent.ping", []] */
	static const unsigned char ping[] = {0x94, 0x00, 0x09, 0xaa, 'a', 'g', 'e', 'n',
					     't',  '.',	 'p',  'i',  'n', 'g', 0x90};
	msgpack_unpacked u;

	/* a frame sent in pieces within the deadline is served */
	send_all(slow, ping, 5);
	hsleep_ms(300);
	send_all(slow, ping + 5, 5);
	hsleep_ms(200);
	send_all(slow, ping + 10, sizeof(ping) - 10);
	msgpack_unpacked_init(&u);
	cr_assert_eq(hraw_recv_msg(slow, ICALL_MS, &u), HRAW_MSG, "the slow but timely frame");
	msgpack_unpacked_destroy(&u);

	/* a frame begun and left unfinished is not */
	int64_t t0 = hnow_ms();
	send_all(dawdler, ping, 7);
	expect_error_then_close(dawdler, "invalid_request", false, "partial_frame_timeout_ms");
	int64_t took = hnow_ms() - t0;
	cr_assert_geq(took, 500, "closed after %lld ms, before the deadline", (long long)took);
	cr_assert_lt(took, 3000, "closed after %lld ms", (long long)took);
	close(dawdler);

	/* a connection that sends nothing has no frame begun: still open */
	ping_ok(slow, "after the dawdler was dropped");
	ping_ok(good, "after the dawdler was dropped");
	cr_assert(strstr(hagent_log(a), "request incomplete after 600 ms"), "%s", hagent_log(a));
	close(slow);
	close(good);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(transport, idle_connections_without_a_session_are_closed_and_ones_with_a_session_are_not)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--idle-timeout-ms", "700", "--session-grace-ms", "60000",
				    NULL};
	struct hagent *a = hagent_start(db, "tr-idle", args);
	int idle = iconnect(hagent_socket(a)), busy = iconnect(hagent_socket(a));
	int holder = iconnect(hagent_socket(a));
	int64_t session = isession_open(holder, "long-lived");
	int64_t t0 = hnow_ms();

	ping_ok(idle, "before idling");
	/* activity keeps a sessionless connection open */
	for (int i = 0; i < 8; i++) {
		hsleep_ms(200);
		ping_ok(busy, "while it keeps talking");
	}
	cr_assert(hraw_expect_closed(idle, ICALL_MS), "the idle connection was not closed");
	int64_t took = hnow_ms() - t0;
	cr_assert_geq(took, 600, "closed after %lld ms, before idle_timeout_ms", (long long)took);
	close(idle);

	/* the one holding a session is never closed for idling */
	hsleep_ms(1500);
	struct ireply r;
	icall(holder, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(iok(&r, "keepalive after idling"), "session"), session);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND "
				    "closed_at IS NULL",
				    (long long)session),
		     1, "the idle session holder's session was closed");
	cr_assert(strstr(hagent_log(a), "idle_timeout_ms"), "%s", hagent_log(a));
	close(busy);
	close(holder);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- connection caps ---------------------------------------------------- */

#define UID_A 65534
#define UID_B 65533

Test(transport, one_uid_cannot_take_every_slot_and_admins_keep_a_reserve)
{
	struct harness_db *db = idb_migrated();
	/* 7 slots, the last 2 for admins; 3 per non-admin uid */
	const char *const args[] = {"--max-connections",
				    "7",
				    "--admin-connection-reserve",
				    "2",
				    "--max-connections-per-uid",
				    "3",
				    "--socket-mode",
				    "0666",
				    NULL};
	struct hagent *a = hagent_start(db, "tr-caps", args);
	const char *path = hagent_socket(a);
	int admin1 = iconnect(path), a_fd[3], b1;

	wait_connections(admin1, 1);
	for (int i = 0; i < 3; i++) {
		a_fd[i] = connect_as(UID_A, path);
		ping_ok(a_fd[i], "uid A within its cap");
	}
	/* uid A's fourth: refused with a clear error, then closed */
	int a4 = connect_as(UID_A, path);
	expect_error_then_close(a4, "busy", true, "max_connections_per_uid");
	close(a4);
	/* uid B may have one, the 5th slot; the 6th and 7th are the admins' */
	b1 = connect_as(UID_B, path);
	ping_ok(b1, "uid B within the shared slots");
	wait_connections(admin1, 5);
	int b2 = connect_as(UID_B, path);
	expect_error_then_close(b2, "busy", true, "admin_connection_reserve");
	close(b2);
	/* an admin (root) still gets in: the reserve is there for it */
	int admin2 = iconnect(path), admin3 = iconnect(path);
	ping_ok(admin2, "an admin in the reserve");
	ping_ok(admin3, "an admin in the reserve");
	wait_connections(admin1, 7);
	/* and max_connections is the ceiling for everyone */
	int admin4 = iconnect(path);
	expect_error_then_close(admin4, "busy", true, "max_connections (7) reached");
	close(admin4);

	/* three refusals within a few seconds: logged once */
	const char *log = hagent_log(a);
	cr_assert_eq(count_lines_with(log, "refusing a connection"), 1, "%s", log);
	cr_assert(strstr(log, "uid 65534"), "%s", log);

	/* a slot given back is a slot again */
	close(a_fd[0]);
	close(admin2);
	close(admin3);
	wait_connections(admin1, 4);
	int a5 = connect_as(UID_A, path);
	ping_ok(a5, "uid A after one of its connections closed");
	close(a5);
	for (int i = 1; i < 3; i++)
		close(a_fd[i]);
	close(b1);
	close(admin1);
	cr_assert(hagent_running(a));
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- decoded objects ---------------------------------------------------- */

Test(transport, a_frame_of_nils_is_refused_before_decoding_and_memory_stays_small)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "tr-nils", NULL);
	int good = iconnect(hagent_socket(a));
	size_t n = 1024 * 1024 - 64, len;
	unsigned char *frame = malloc(n + 32);
	/* [0, 3, "agent.ping", [{"x": [nil * k]}]]: a valid request */
	static const unsigned char head[] = {0x94, 0x00, 0x03, 0xaa, 'a', 'g',	'e',  'n',  't',
					     '.',  'p',	 'i',  'n',  'g', 0x91, 0x81, 0xa1, 'x'};

	cr_assert_not_null(frame);
	ping_ok(good, "at start");
	long rss_start = irss_kib(hagent_pid(a));

	/* a 1 MiB frame of nils: refused at its array header */
	for (int i = 0; i < 20; i++) {
		int fd = iconnect(hagent_socket(a));
		len = sizeof(head);
		memcpy(frame, head, len);
		frame[len++] = 0xdd;
		frame[len++] = (unsigned char)(n >> 24);
		frame[len++] = (unsigned char)(n >> 16);
		frame[len++] = (unsigned char)(n >> 8);
		frame[len++] = (unsigned char)n;
		memset(frame + len, 0xc0, n - len);
		/* the agent may hang up before it all arrives */
		(void)hraw_send(fd, frame, n);
		expect_error_then_close(fd, "too_large", false, "max_message_objects");
		close(fd);
	}
	long rss_refused = irss_kib(hagent_pid(a));

	/* within max_message_objects: decoded and answered, many times over */
	size_t k = 60000;
	memcpy(frame, head, sizeof(head));
	len = sizeof(head);
	frame[len++] = 0xdc;
	frame[len++] = (unsigned char)(k >> 8);
	frame[len++] = (unsigned char)k;
	memset(frame + len, 0xc0, k);
	len += k;
	for (int i = 0; i < 20; i++) {
		int fd = iconnect(hagent_socket(a));
		msgpack_unpacked u;
		send_all(fd, frame, len);
		msgpack_unpacked_init(&u);
		cr_assert_eq(hraw_recv_msg(fd, ICALL_MS, &u), HRAW_MSG,
			     "a request of %zu objects was not answered", k);
		msgpack_unpacked_destroy(&u);
		close(fd);
	}
	long rss_decoded = irss_kib(hagent_pid(a));
	printf("nils: agent VmRSS %ld KiB at start, %ld KiB after 20 refused 1 MiB frames of "
	       "nils, %ld KiB after 20 decoded 60,000-object requests\n",
	       rss_start, rss_refused, rss_decoded);
	fflush(stdout);
	/* decoding 1 MiB of nils took 32 MiB at a time before the cap; refused
	 * at the header, it takes next to nothing */
	cr_assert_lt(rss_refused - rss_start, 4 * 1024, "VmRSS grew from %ld to %ld KiB", rss_start,
		     rss_refused);
#ifndef __SANITIZE_ADDRESS__
	/* a decoded message is freed with its request (AddressSanitizer keeps
	 * freed memory in quarantine, so only a plain build can tell) */
	cr_assert_lt(rss_decoded - rss_refused, 16 * 1024, "VmRSS grew from %ld to %ld KiB",
		     rss_refused, rss_decoded);
#endif
	ping_ok(good, "after the frames of nils");
	cr_assert(strstr(hagent_log(a), "max_message_objects"), "%s", hagent_log(a));
	free(frame);
	close(good);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- two agents on one path --------------------------------------------- */

Test(transport, two_agents_started_at_once_on_one_path_leave_exactly_one_serving)
{
	struct harness_db *db = idb_migrated();

	for (int round = 0; round < 3; round++) {
		char *path = htmp_path("race.sock");
		char *logs[2];
		pid_t pids[2];
		char rid[2][32];

		for (int i = 0; i < 2; i++) {
			snprintf(rid[i], sizeof(rid[i]), "tr-race-%d-%d", round, i);
			logs[i] = htmp_path("race-agent.log");
		}
		for (int i = 0; i < 2; i++) {
			const char *argv[] = {iagent_bin(),
					      "--database-url",
					      hdb_agent_conninfo(db),
					      "--replica-id",
					      rid[i],
					      "--socket-path",
					      path,
					      NULL};
			pids[i] = ispawn(argv, logs[i]);
		}
		/* one of them exits 1 naming the path; the other keeps serving */
		int exited = -1, rc = 0;
		int64_t deadline = hnow_ms() + 10000;
		while (exited < 0) {
			for (int i = 0; i < 2 && exited < 0; i++) {
				int status;
				if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
					exited = i;
					rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
				}
			}
			cr_assert_lt(hnow_ms(), deadline, "neither agent gave way (round %d)",
				     round);
			hsleep_ms(10);
		}
		int winner = 1 - exited;
		char *loser_log = hread_file(logs[exited]);
		cr_assert_eq(rc, 1, "round %d: the loser exited %d:\n%s", round, rc, loser_log);
		cr_assert(strstr(loser_log, "another agent is serving on"), "%s", loser_log);
		cr_assert(strstr(loser_log, path), "%s", loser_log);
		free(loser_log);

		/* the winner's socket is there and answers; it is the winner */
		deadline = hnow_ms() + 10000;
		for (;;) {
			int fd = hraw_connect(path);
			if (fd >= 0) {
				struct ireply r;
				icall(fd, "agent.status", NULL, &r);
				int64_t pid = iint(iok(&r, "status"), "pid");
				ireply_destroy(&r);
				close(fd);
				cr_assert_eq(pid, pids[winner]);
				break;
			}
			cr_assert_lt(hnow_ms(), deadline, "round %d: the winner never served",
				     round);
			cr_assert_eq(waitpid(pids[winner], NULL, WNOHANG), 0,
				     "round %d: the winner exited too", round);
			hsleep_ms(20);
		}
		kill(pids[winner], SIGTERM);
		cr_assert_eq(iwait_pid(pids[winner]), 0);
		for (int i = 0; i < 2; i++)
			free(logs[i]);
		free(path);
	}
	hdb_drop(db);
}

Test(transport, socket_mode_is_exact_without_a_chmod_by_path)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--socket-mode", "0640", NULL};
	struct hagent *a = hagent_start(db, "tr-mode", args);
	struct stat st;
	char lock[256];

	cr_assert_eq(lstat(hagent_socket(a), &st), 0);
	cr_assert(S_ISSOCK(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0640, "mode %04o", (unsigned)(st.st_mode & 07777));
	/* the lock beside it names the holder */
	snprintf(lock, sizeof(lock), "%s.lock", hagent_socket(a));
	char *pid = hread_file(lock);
	cr_assert_eq(atol(pid), (long)hagent_pid(a), "lock file holds \"%s\"", pid);
	free(pid);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- the HTTP listener -------------------------------------------------- */

/* The port of an agent started with --metrics-listen 127.0.0.1:0. */
static int http_port(struct hagent *a)
{
	static const char key[] = "metrics_listen=127.0.0.1:";
	int64_t deadline = hnow_ms() + 5000;
	const char *at;

	while (!(at = strstr(hagent_log(a), key))) {
		cr_assert_lt(hnow_ms(), deadline, "no %s in the log:\n%s", key, hagent_log(a));
		hsleep_ms(20);
	}
	return atoi(at + strlen(key));
}

static int http_connect(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct timeval tv = {10, 0};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect :%d: %s", port,
		     strerror(errno));
	return fd;
}

/* Sends GET path with the given Host line (NULL: none, as HTTP/1.0 may). */
static void http_send(int fd, const char *path, const char *host)
{
	char req[512];

	if (host)
		snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
	else
		snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
	send_all(fd, req, strlen(req));
}

/* Reads the whole response; returns the status, *body the body. */
static int http_read(int fd, char **body)
{
	char *resp = NULL, *sep, buf[8192];
	size_t len = 0;
	ssize_t n;
	int status = 0;

	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		resp = realloc(resp, len + (size_t)n + 1);
		cr_assert_not_null(resp);
		memcpy(resp + len, buf, (size_t)n);
		len += (size_t)n;
	}
	close(fd);
	cr_assert_not_null(resp, "no HTTP response");
	resp[len] = '\0';
	sscanf(resp, "HTTP/1.%*d %d", &status);
	sep = strstr(resp, "\r\n\r\n");
	*body = strdup(sep ? sep + 4 : "");
	free(resp);
	return status;
}

static int http_get(int port, const char *path, const char *host, char **body)
{
	int fd = http_connect(port);
	http_send(fd, path, host);
	return http_read(fd, body);
}

static long queries_total(int port)
{
	char *body;
	const char *p;
	long n = -1;

	cr_assert_eq(http_get(port, "/metrics", "127.0.0.1", &body), 200, "%s", body);
	p = strstr(body, "\npgcoord_db_queries_total ");
	cr_assert_not_null(p, "%s", body);
	n = atol(p + strlen("\npgcoord_db_queries_total "));
	free(body);
	return n;
}

Test(transport, http_serves_only_loopback_host_names)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "tr-host", args);
	int port = http_port(a);
	char hostport[64], *body;
	static const char *const good[] = {"127.0.0.1", "localhost", "LOCALHOST", "127.0.0.1:9",
					   "[::1]",	"[::1]:80",  "127.1.2.3", NULL};
	static const char *const bad[] = {"evil.example",
					  "evil.example:9187",
					  "127.0.0.1.evil.example",
					  "localhost.evil.example",
					  "[::2]",
					  "[::1",
					  "",
					  "10.0.0.1",
					  NULL};

	snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);
	cr_assert_eq(http_get(port, "/healthz", hostport, &body), 200, "%s", body);
	free(body);
	for (const char *const *h = good; *h; h++) {
		cr_assert_eq(http_get(port, "/healthz", *h, &body), 200, "Host %s: %s", *h, body);
		free(body);
	}
	/* a page of a rebinding name reaches 127.0.0.1 but says its own name */
	for (const char *const *h = bad; *h; h++) {
		for (int i = 0; i < 3; i++) {
			const char *path = i == 0 ? "/status" : i == 1 ? "/metrics" : "/healthz";
			int st = http_get(port, path, *h, &body);
			cr_assert_eq(st, 421, "Host \"%s\" %s: %d %s", *h, path, st, body);
			cr_assert(strstr(body, "is not this agent"), "%s", body);
			free(body);
		}
	}
	/* HTTP/1.0 without Host (no browser sends that) */
	cr_assert_eq(http_get(port, "/healthz", NULL, &body), 200, "%s", body);
	free(body);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(transport, status_is_built_at_most_once_a_second_and_shared)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "tr-status", args);
	int port = http_port(a), fds[20];
	char *body, *first = NULL;

	iwait_janitor(a);
	long before = queries_total(port);
	int64_t t0 = hnow_ms();
	/* 20 at once: one build, every hit gets its page */
	for (int i = 0; i < 20; i++) {
		fds[i] = http_connect(port);
		http_send(fds[i], "/status", "localhost");
	}
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(http_read(fds[i], &body), 200, "%s", body);
		cr_assert(strstr(body, "<table id=\"agents\">"), "%s", body);
		if (!first)
			first = body;
		else {
			cr_assert_str_eq(body, first, "concurrent hits got different pages");
			free(body);
		}
	}
	/* then 40 one after another */
	for (int i = 0; i < 40; i++) {
		cr_assert_eq(http_get(port, "/status", "localhost", &body), 200);
		free(body);
	}
	int64_t took = hnow_ms() - t0;
	long delta = queries_total(port) - before;
	/* 60 uncached hits would be 300 queries; each second adds a rebuild
	 * (5) and a few heartbeat and janitor statements */
	long allowed = 5 * (took / 1000 + 1) + 10 * (took / 1000 + 1);
	printf("status: 60 hits in %lld ms cost %ld database statements (allowed %ld)\n",
	       (long long)took, delta, allowed);
	fflush(stdout);
	cr_assert_leq(delta, allowed, "60 /status hits in %lld ms ran %ld statements",
		      (long long)took, delta);

	/* a page older than a second is built again: a new session shows up */
	int fd = iconnect(hagent_socket(a));
	isession_open(fd, "appears-later");
	hsleep_ms(1100);
	cr_assert_eq(http_get(port, "/status", "localhost", &body), 200);
	cr_assert(strstr(body, "appears-later"), "%s", body);
	cr_assert(!strstr(first, "appears-later"));
	free(body);
	free(first);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}
