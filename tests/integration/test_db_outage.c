/*
 * test_db_outage.c — the database goes away under a serving agent and comes
 * back. Meanwhile the agent keeps answering what needs no database, fails
 * closed (retryable `unavailable`) on what does, says so in agent.status and
 * in agent.db_down / agent.db_up notifications, and recovers on its own.
 *
 * These stop the cluster under every test of the executable: it runs with
 * one Criterion job (tests/integration/meson.build).
 *
 * Behind PgBouncer (with-postgres --pgbouncer) the agent's connections go to
 * the pooler, which outlives the server: the agent cannot see the outage as
 * broken connections, only as statements that fail or time out. There the
 * tests hold the agent to what it can know — db-backed calls fail closed and
 * retryably, agent.* keep answering, and it recovers on its own — and leave
 * out db "down" and the agent.db_down/db_up notices.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/sockios.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

/* A test that failed mid-outage must not leave the next one without a
 * server (pg-cluster start is a no-op on a running one). */
static void server_up(void)
{
	hpg_start();
}

TestSuite(db_outage, .init = server_up, .timeout = 90);

#define RECOVERY_MS 15000
/* How long a renewal may take to show after recovery. Heartbeats run every
 * 200 ms; this only bounds a hang, and a loaded machine (or a pooler that
 * reconnects after the calls did) can be seconds late. */
#define RENEWAL_WAIT_MS 15000

/* A session ttl (10 s) longer than the outages here, so sessions ride them
 * out; fast heartbeats so their effect shows quickly; a short query timeout
 * so calls a pooler holds waiting for the server give up quickly. */
static const char *const outage_args[] = {"--heartbeat-interval-ms",
					  "200",
					  "--session-ttl-ms",
					  "10000",
					  "--query-timeout-ms",
					  "1000",
					  NULL};

/* True when the agent's connections break with the server's (no pooler). */
static bool direct(void)
{
	return !hbouncer_enabled();
}

/* What a libpgcoord client heard, in order. */
struct heard {
	char methods[64][32];
	int n;
};

static void on_notify(void *user, const char *method, const void *params, size_t len)
{
	struct heard *h = user;
	(void)params;
	(void)len;
	if (h->n < 64)
		snprintf(h->methods[h->n++], sizeof(h->methods[0]), "%s", method);
}

static int heard_index(const struct heard *h, const char *method)
{
	for (int i = 0; i < h->n; i++)
		if (strcmp(h->methods[i], method) == 0)
			return i;
	return -1;
}

/* Polls c until method was heard; fails the test after timeout_ms. */
static void wait_heard(pgcoord *c, struct heard *h, const char *method, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;

	while (heard_index(h, method) < 0) {
		pgcoord_err err = pgcoord_poll(c, 100, NULL);
		cr_assert_eq(err, PGCOORD_OK, "pgcoord_poll: %s", pgcoord_strerror(err));
		cr_assert_lt(hnow_ms(), deadline, "no %s notification within %d ms (heard %d)",
			     method, timeout_ms, h->n);
	}
}

static char *status_db(int fd)
{
	struct ireply r;
	char *v = istr(icall_ok(fd, "agent.status", NULL, &r), "db");
	ireply_destroy(&r);
	return v;
}

/* Waits until agent.status says db is `want`. */
static void wait_status_db(int fd, const char *want, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;

	for (;;) {
		char *db = status_db(fd);
		bool done = strcmp(db, want) == 0;
		free(db);
		if (done)
			return;
		cr_assert_lt(hnow_ms(), deadline, "agent.status never said db \"%s\"", want);
		hsleep_ms(50);
	}
}

/*
 * A db-backed call during the outage fails closed: `unavailable` at once,
 * without waiting, when the agent saw its connections break; behind a
 * pooler, `unavailable` or `timeout` within query_timeout_ms. Retryable
 * either way.
 */
static void expect_refused(int fd, const char *method, const struct iparams *p)
{
	struct ireply r;
	int64_t t0 = hnow_ms();

	icall(fd, method, p, &r);
	if (direct() || pgc_obj_str_eq(pgc_map_get(r.m.error, "code"), "unavailable"))
		ierr(&r, "unavailable", true, NULL);
	else
		ierr(&r, "timeout", true, NULL);
	ireply_destroy(&r);
	cr_assert_lt(hnow_ms() - t0, direct() ? 500 : 3000,
		     "%s waited for the database instead of failing fast", method);
}

/* Waits until a db-backed call succeeds again; returns how long it took. */
static int64_t wait_recovered(int fd, int timeout_ms)
{
	int64_t t0 = hnow_ms();

	for (;;) {
		struct ireply r;
		bool ok;

		icall(fd, "fleet.agents", NULL, &r);
		ok = r.m.error == NULL;
		if (!ok)
			cr_assert(pgc_obj_str_eq(pgc_map_get(r.m.error, "code"), "unavailable") ||
				      pgc_obj_str_eq(pgc_map_get(r.m.error, "code"), "timeout"),
				  "a failure that is not retryable while the database returns");
		ireply_destroy(&r);
		if (ok)
			return hnow_ms() - t0;
		cr_assert_lt(hnow_ms() - t0, timeout_ms,
			     "db-backed calls still fail %d ms after the database returned",
			     timeout_ms);
		hsleep_ms(100);
	}
}

static int ctl_status(struct hagent *a)
{
	const char *argv[] = {ictl_bin(), "--socket", hagent_socket(a), "status", NULL};
	char *out = NULL;
	int rc = hrun(argv, &out);
	free(out);
	return rc;
}

Test(db_outage, agent_serves_through_a_stopped_database_and_recovers_by_itself)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "outage-stop", outage_args);
	pid_t pid = hagent_pid(a);
	int fd = iconnect(hagent_socket(a));
	int sfd = iconnect(hagent_socket(a));
	int64_t sid = isession_open(sfd, "rides-it-out");
	pgcoord *c = NULL;
	struct heard heard = {0};
	struct iparams p;
	struct ireply r;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), ICALL_MS, &c), PGCOORD_OK);
	pgcoord_set_notify(c, on_notify, &heard);
	cr_assert_eq(pgcoord_ping(c, ICALL_MS), PGCOORD_OK);
	cr_assert_eq(ctl_status(a), 0);

	hpg_stop("immediate");
	if (direct()) {
		wait_status_db(fd, "down", 5000);
		wait_heard(c, &heard, "agent.db_down", 5000);
	}

	/* agent.* never touch the database */
	icall(fd, "agent.ping", NULL, &r);
	cr_assert(ibool(iok(&r, "agent.ping during the outage"), "pong"));
	ireply_destroy(&r);
	cr_assert_eq(pgcoord_ping(c, ICALL_MS), PGCOORD_OK);
	icall(fd, "agent.status", NULL, &r);
	const msgpack_object *st = iok(&r, "agent.status during the outage");
	cr_assert_eq(iint(st, "pid"), pid);
	char *state = istr(st, "state");
	cr_assert_str_eq(state, "serving");
	free(state);
	ireply_destroy(&r);

	/* the rest fails closed and retryably */
	expect_refused(fd, "fleet.agents", NULL);
	expect_refused(fd, "fleet.sessions", NULL);
	pgc_pack_kv_str(iparams_begin(&p, 1), "name", "during-outage");
	expect_refused(fd, "session.open", &p);
	iparams_destroy(&p);
	pgc_pack_kv_str(iparams_begin(&p, 1), "key", "any-quota");
	expect_refused(fd, "quota.get", &p);
	iparams_destroy(&p);
	pgcoord_err err = pgcoord_call(c, "fleet.sessions", NULL, 0, ICALL_MS, NULL, NULL);
	cr_assert(err == PGCOORD_E_UNAVAILABLE || (!direct() && err == PGCOORD_E_TIMEOUT),
		  "libpgcoord got %s", pgcoord_strerror(err));
	cr_assert(pgcoord_err_retryable(err));
	if (direct())
		cr_assert_eq(ctl_status(a), 1, "pgcoordctl status exits 0 with the database down");

	hsleep_ms(1500); /* an outage of a few reconnect attempts */
	hpg_start();
	int64_t took = wait_recovered(fd, RECOVERY_MS);
	wait_status_db(fd, "up", 5000);
	if (direct()) {
		wait_heard(c, &heard, "agent.db_up", 5000);
		cr_assert_lt(heard_index(&heard, "agent.db_down"),
			     heard_index(&heard, "agent.db_up"));
	}
	cr_log_info("db-backed calls recovered %lld ms after the database started",
		    (long long)took);

	/* the same process, heartbeating again, its session still live */
	cr_assert(hagent_running(a));
	cr_assert_eq(istatus_int(a, "pid"), pid);
	if (direct())
		cr_assert_geq(istatus_int(a, "db_reconnects"), 1);
	cr_assert(iwait_sql(db, RENEWAL_WAIT_MS,
			    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = 'outage-stop' "
			    "AND heartbeat_at > now() - interval '1 second'"),
		  "heartbeats did not resume");
	cr_assert(
	    iwait_sql(
		db, RENEWAL_WAIT_MS,
		"SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND closed_at IS "
		"NULL AND expires_at > now() + interval '9 seconds'",
		(long long)sid),
	    "the session was not renewed after the outage");
	const msgpack_object *k = icall_ok(sfd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(k, "session"), sid);
	ireply_destroy(&r);
	int other = iconnect(hagent_socket(a));
	cr_assert_gt(isession_open(other, "after-outage"), sid);
	close(other);
	cr_assert_eq(pgcoord_call(c, "fleet.sessions", NULL, 0, ICALL_MS, NULL, NULL), PGCOORD_OK);
	cr_assert_eq(ctl_status(a), 0);

	pgcoord_close(c);
	close(fd);
	close(sfd);
	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}

static void restart_is_survived(const char *mode)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "outage-restart", outage_args);
	pid_t pid = hagent_pid(a);
	int fd = iconnect(hagent_socket(a));
	int64_t sid = isession_open(fd, "through-restart");
	pgcoord *c = NULL;
	struct heard heard = {0};
	struct ireply r;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), ICALL_MS, &c), PGCOORD_OK);
	pgcoord_set_notify(c, on_notify, &heard);

	hpg_restart(mode);
	int64_t took = wait_recovered(fd, RECOVERY_MS);
	cr_log_info("%s restart: recovered after %lld ms", mode, (long long)took);
	/* every connection broke, so the agent noticed, and says it is back */
	if (direct()) {
		wait_heard(c, &heard, "agent.db_up", 5000);
		cr_assert_geq(heard_index(&heard, "agent.db_down"), 0);
	}
	wait_status_db(fd, "up", 5000);
	cr_assert_eq(istatus_int(a, "pid"), pid);

	cr_assert(
	    iwait_sql(
		db, RENEWAL_WAIT_MS,
		"SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND closed_at IS "
		"NULL AND expires_at > now() + interval '9 seconds'",
		(long long)sid),
	    "the session was not renewed after the restart");
	const msgpack_object *k = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(k, "session"), sid);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'outage-restart' AND stopped_at IS NULL"),
		     1);

	pgcoord_close(c);
	close(fd);
	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}

Test(db_outage, immediate_restart_is_survived_without_restarting_the_agent)
{
	restart_is_survived("immediate");
}

Test(db_outage, fast_restart_is_survived_without_restarting_the_agent)
{
	restart_is_survived("fast");
}

/*
 * A client that stopped reading, its unread replies just under
 * max_output_bytes, when the database goes down: the agent.db_down notice
 * pushes it over, so the agent drops it while telling every client. That
 * must drop only it.
 *
 * Queue arithmetic: a ping reply with a one-byte msgid is 11 bytes and
 * agent.db_down 18, so 5957 queued replies (65527 bytes) fit in 65536 and
 * the notice does not. Replies land in the socket until the kernel stops
 * taking them (the reply we sent no longer shows up in our receive queue);
 * only then do they queue in the agent.
 */
#define PING_REPLY_BYTES 11
#define OUTPUT_LIMIT 65536

static int inq(int fd)
{
	int n = 0;
	cr_assert_eq(ioctl(fd, SIOCINQ, &n), 0);
	return n;
}

static int outq(int fd)
{
	int n = 0;
	cr_assert_eq(ioctl(fd, SIOCOUTQ, &n), 0);
	return n;
}

static const unsigned char ping_msg[] = {0x94, 0x00, 0x01, 0xaa, 'a', 'g', 'e', 'n',
					 't',  '.',  'p',  'i',	 'n', 'g', 0x90};

static void fill_output_queue(int fd, int probe_fd)
{
	int queued = 0;
	struct ireply r;

	/* until a reply stays in the agent: each one that lands grows our queue */
	for (int i = 0; queued == 0; i++) {
		int before = inq(fd);
		int64_t deadline = hnow_ms() + 1000;

		cr_assert_lt(i, 100000, "the socket never filled up");
		cr_assert(hraw_send(fd, ping_msg, sizeof(ping_msg)));
		while (inq(fd) == before && hnow_ms() < deadline)
			hsleep_ms(1);
		if (inq(fd) == before)
			queued = 1;
		else
			cr_assert_eq(inq(fd) - before, PING_REPLY_BYTES);
	}
	/* then exactly as many more as fit under the limit */
	int more = OUTPUT_LIMIT / PING_REPLY_BYTES - queued;
	unsigned char *burst = malloc((size_t)more * sizeof(ping_msg));
	for (int i = 0; i < more; i++)
		memcpy(burst + (size_t)i * sizeof(ping_msg), ping_msg, sizeof(ping_msg));
	cr_assert(hraw_send(fd, burst, (size_t)more * sizeof(ping_msg)));
	free(burst);
	/* the agent read all of it (and so answered it: one callback does both)
	 * once nothing we sent is left unread; a round trip on another
	 * connection orders us after that callback */
	int64_t deadline = hnow_ms() + 5000;
	while (outq(fd) > 0) {
		cr_assert_lt(hnow_ms(), deadline, "the agent stopped reading the flood");
		hsleep_ms(5);
	}
	icall(probe_fd, "agent.ping", NULL, &r);
	iok(&r, "probe");
	ireply_destroy(&r);
}

Test(db_outage, db_down_notice_that_overflows_a_client_drops_only_that_client)
{
	if (!direct())
		cr_skip_test("behind a pooler the server's outage sends no agent.db_down");
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--max-output-bytes", "65536", NULL};
	struct hagent *a = hagent_start(db, "outage-overflow", args);
	int fd = iconnect(hagent_socket(a));
	pgcoord *c = NULL;
	struct heard heard = {0};
	struct ireply r;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), ICALL_MS, &c), PGCOORD_OK);
	pgcoord_set_notify(c, on_notify, &heard);
	int flood = iconnect(hagent_socket(a));
	fill_output_queue(flood, fd);
	icall(fd, "agent.status", NULL, &r);
	cr_assert_eq(iint(iok(&r, "status"), "connections"), 3,
		     "the flooding client was dropped "
		     "before the outage");
	ireply_destroy(&r);

	hpg_stop("immediate");
	hagent_wait(a, 1000);
	cr_assert(hagent_running(a), "the agent died telling its clients:\n%s", hagent_log(a));
	wait_heard(c, &heard, "agent.db_down", 5000);
	cr_assert(hraw_expect_closed(flood, ICALL_MS), "the overflowing client was kept");
	close(flood);
	icall(fd, "agent.status", NULL, &r);
	cr_assert_eq(iint(iok(&r, "status"), "connections"), 2);
	ireply_destroy(&r);

	hpg_start();
	wait_recovered(fd, RECOVERY_MS);
	wait_heard(c, &heard, "agent.db_up", 5000);
	cr_assert(hagent_running(a));
	pgcoord_close(c);
	close(fd);
	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}

/* SIGTERM while the database is away: the agent cannot record its stop,
 * and must not hang on it — exit 0 within shutdown_timeout_ms, socket gone. */
Test(db_outage, sigterm_while_the_database_is_down_exits_0_promptly)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "outage-term", outage_args);
	int fd = iconnect(hagent_socket(a));
	struct stat st;

	isession_open(fd, "at-shutdown");
	hpg_stop("immediate");
	if (direct())
		wait_status_db(fd, "down", 5000);
	int64_t t0 = hnow_ms();
	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	int64_t took = hnow_ms() - t0;
	cr_assert_lt(took, 3000 + 1000, "stopping took %lld ms (shutdown_timeout_ms is 3000)",
		     (long long)took);
	cr_assert_neq(lstat(hagent_socket(a), &st), 0, "the socket file is still there");
	cr_assert(hraw_expect_closed(fd, 1000));
	close(fd);
	hpg_start();
	/* nothing was recorded: the row stays unstopped and lapses by its ttl */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'outage-term' AND stopped_at IS NULL"),
		     1);
	hagent_destroy(a);
	hdb_drop(db);
}
