/*
 * test_run_lease.c — `pgcoordctl run --lease` on real agents and a real
 * Postgres: CMD runs only while its host leads, and is stopped before any
 * other host can lead, whether the leader's agent crashes (SIGKILL), freezes
 * (SIGSTOP) or shuts down (SIGTERM).
 *
 * Every CMD is the same shell loop: it appends "start", then "tick" every
 * 20 ms, and "end" on SIGTERM — each line "<what> <epoch> <pid> <ns>" with
 * the wall clock in ns (one host, so one clock) — to a file all runs share.
 * The file is the evidence: the intervals of different runs (start to last
 * line) must never overlap, and each takeover draws a higher epoch.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

TestSuite(run_lease, .timeout = 120);

/* ttl 3000: the agent renews every 1000 ms, its belief ends 1000 ms before
 * the row can expire (the margin), and run's default kill grace is 500 ms. */
#define TTL "3000"

static const char cmd_script[] =
    "e=$PGCOORD_LEASE_EPOCH\n"
    "echo \"start $e $$ $(date +%s%N)\" >> \"$RUN_FILE\"\n"
    "trap 'echo \"end $e $$ $(date +%s%N)\" >> \"$RUN_FILE\"; exit 0' TERM\n"
    "while :; do echo \"tick $e $$ $(date +%s%N)\" >> \"$RUN_FILE\"; sleep 0.02; done\n";

/* A `pgcoordctl run` started by the test; its output goes to a log file. */
struct run {
	pid_t pid;
	char *log;
	int code; /* exit status once reaped, 128+N for signal N; -1 before */
};

/*
 * Starts `pgcoordctl --socket S --timeout 2000 run --lease job <flags> --
 * sh -c <script>` with RUN_FILE=file. It dies with the test (PDEATHSIG).
 */
static struct run *run_start(struct hagent *a, const char *file, const char *const *flags,
			     const char *script)
{
	const char *argv[32];
	int n = 0;
	struct run *r = calloc(1, sizeof(*r));

	cr_assert_not_null(r);
	r->code = -1;
	r->log = htmp_path("run.log");
	argv[n++] = henv("PGCOORD_TEST_CTL_BIN");
	argv[n++] = "--socket";
	argv[n++] = hagent_socket(a);
	argv[n++] = "--timeout";
	argv[n++] = "2000";
	argv[n++] = "run";
	argv[n++] = "--lease";
	argv[n++] = "job";
	for (int i = 0; flags && flags[i]; i++)
		argv[n++] = flags[i];
	argv[n++] = "--";
	argv[n++] = "sh";
	argv[n++] = "-c";
	argv[n++] = script ? script : cmd_script;
	argv[n] = NULL;

	r->pid = fork();
	cr_assert_geq(r->pid, 0);
	if (r->pid == 0) {
		int fd = open(r->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		int null = open("/dev/null", O_RDONLY);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd < 0 || null < 0)
			_exit(99);
		dup2(null, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		setenv("RUN_FILE", file, 1);
		execv(argv[0], (char *const *)argv);
		_exit(98);
	}
	return r;
}

/* Waits up to timeout_ms for the run to exit; its exit status or -1. */
static int run_wait(struct run *r, int timeout_ms)
{
	int64_t until = hnow_ms() + timeout_ms;
	int st;

	while (r->code < 0) {
		pid_t p = waitpid(r->pid, &st, WNOHANG);
		if (p == r->pid)
			r->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		else if (hnow_ms() >= until)
			break;
		else
			hsleep_ms(10);
	}
	return r->code;
}

/* Fails the test, with the run's output, unless it exits `want` in time. */
static void run_expect_exit(struct run *r, int timeout_ms, int want, const char *what)
{
	int code = run_wait(r, timeout_ms);
	if (code != want)
		cr_assert_fail("%s: exit status %d, expected %d; its output:\n%s", what, code, want,
			       hread_file(r->log));
}

/* Its output contains text, or the test fails. */
static void run_expect_said(struct run *r, const char *text)
{
	char *log = hread_file(r->log);
	cr_assert(strstr(log, text), "\"%s\" not in its output:\n%s", text, log);
	free(log);
}

static void run_free(struct run *r)
{
	if (r->code < 0) {
		kill(r->pid, SIGKILL);
		run_wait(r, 5000);
	}
	free(r->log);
	free(r);
}

/* --- the evidence ----------------------------------------------------------- */

#define MAX_INTERVALS 16

/* One CMD's life as its lines tell it. */
struct interval {
	long long epoch;
	long pid;
	long long start_ns, last_ns;
	bool ended; /* wrote "end" (it got SIGTERM) */
};

/* Reads the shared file into intervals ordered by start; returns how many. */
static int intervals_read(const char *file, struct interval *iv)
{
	char *text = hread_file(file);
	int n = 0;

	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char what[8];
		long long epoch, ns;
		long pid;
		/* a tick cut short by SIGTERM may lack its time: skip it */
		if (sscanf(line, "%7s %lld %ld %lld", what, &epoch, &pid, &ns) != 4)
			continue;
		int i = 0;
		while (i < n && iv[i].pid != pid)
			i++;
		if (i == n) {
			cr_assert_lt(n, MAX_INTERVALS);
			iv[n++] = (struct interval){epoch, pid, ns, ns, false};
		}
		cr_assert_eq(iv[i].epoch, epoch, "one CMD, one epoch:\n%s", line);
		if (ns < iv[i].start_ns)
			iv[i].start_ns = ns;
		if (ns > iv[i].last_ns)
			iv[i].last_ns = ns;
		if (strcmp(what, "end") == 0)
			iv[i].ended = true;
	}
	free(text);
	for (int i = 1; i < n; i++) /* insertion sort by start */
		for (int j = i; j > 0 && iv[j].start_ns < iv[j - 1].start_ns; j--) {
			struct interval t = iv[j];
			iv[j] = iv[j - 1];
			iv[j - 1] = t;
		}
	return n;
}

/*
 * The safety property: no two CMDs ever ran at once, and every new leader
 * holds a higher epoch. Returns the number of intervals.
 */
static int assert_no_overlap(const char *file)
{
	struct interval iv[MAX_INTERVALS];
	int n = intervals_read(file, iv);
	char *text = hread_file(file);

	for (int i = 0; i < n; i++)
		cr_assert_gt(iv[i].epoch, 0, "CMD got no PGCOORD_LEASE_EPOCH");
	for (int i = 1; i < n; i++) {
		cr_assert_gt(iv[i].start_ns, iv[i - 1].last_ns,
			     "CMD %ld (epoch %lld) started %lld ms before CMD %ld (epoch %lld) "
			     "stopped",
			     iv[i].pid, iv[i].epoch, (iv[i - 1].last_ns - iv[i].start_ns) / 1000000,
			     iv[i - 1].pid, iv[i - 1].epoch);
		cr_assert_gt(iv[i].epoch, iv[i - 1].epoch, "a takeover must draw a new epoch");
	}
	free(text);
	return n;
}

/* Waits until the file shows `want` CMDs started (failing the test after
 * timeout_ms), then 200 ms more: a CMD that wrongly still runs has ticked
 * after the newcomer's start by then, so assert_no_overlap sees it. */
static void wait_for_starts(const char *file, int want, int timeout_ms)
{
	int64_t until = hnow_ms() + timeout_ms;
	struct interval iv[MAX_INTERVALS];

	while (intervals_read(file, iv) < want) {
		char *text = hread_file(file);
		cr_assert_lt(hnow_ms(), until,
			     "%d CMD(s) expected to have started within %d ms:\n%s", want,
			     timeout_ms, text);
		free(text);
		hsleep_ms(20);
	}
	hsleep_ms(200);
}

static struct harness_db *fresh_db(void)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	return db;
}

/* run_a leads on agent a, run_b campaigns on agent b. */
static void lead_and_campaign(struct hagent *a, struct hagent *b, const char *file,
			      struct run **run_a, struct run **run_b)
{
	static const char *const flags[] = {"--ttl", TTL, NULL};
	*run_a = run_start(a, file, flags, NULL);
	wait_for_starts(file, 1, 10000);
	*run_b = run_start(b, file, flags, NULL);
	/* b campaigns (it retries every second) and must not start */
	hsleep_ms(1500);
	cr_assert_eq(assert_no_overlap(file), 1, "the campaigner started while a leader ran");
}

/* --- takeovers ---------------------------------------------------------------- */

Test(run_lease, crashed_leader_agent_stops_cmd_and_the_other_takes_over)
{
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	struct hagent *b = hagent_start(db, "b", NULL);
	char *file = htmp_path("runs");
	struct run *run_a, *run_b;

	lead_and_campaign(a, b, file, &run_a, &run_b);
	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);
	char *log = NULL;
	run_expect_exit(run_a, 5000, 5, "run on the crashed agent");
	/* the row lapses by its ttl, then b's campaign wins */
	wait_for_starts(file, 2, 10000);
	cr_assert_eq(assert_no_overlap(file), 2);

	struct interval iv[MAX_INTERVALS];
	intervals_read(file, iv);
	cr_assert(iv[0].ended, "the first CMD got SIGTERM, not only SIGKILL");
	cr_assert_eq(hdb_query_long(db, "SELECT epoch FROM pgcoord.leases WHERE name = 'job' AND "
					"holder_replica = 'b' AND expires_at > now()"),
		     iv[1].epoch, "the database holds b's epoch");

	/* the operator's view */
	const char *const leases[] = {henv("PGCOORD_TEST_CTL_BIN"), "--socket", hagent_socket(b),
				      "leases", NULL};
	cr_assert_eq(hrun(leases, &log), 0, "%s", log);
	cr_assert(strstr(log, "job") && strstr(log, "@b"), "leases:\n%s", log);
	free(log);
	const char *const status[] = {henv("PGCOORD_TEST_CTL_BIN"),
				      "--socket",
				      hagent_socket(b),
				      "--json",
				      "lease",
				      "status",
				      "job",
				      NULL};
	cr_assert_eq(hrun(status, &log), 0, "%s", log);
	cr_assert(strstr(log, "\"epoch\"") && strstr(log, "\"replica_id\": \"b\""), "%s", log);
	free(log);

	/* SIGTERM to pgcoordctl: CMD's trap exits 0, so does run, and the
	 * lease is handed back */
	kill(run_b->pid, SIGTERM);
	run_expect_exit(run_b, 5000, 0, "run told to stop");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = 'job' "
					"AND holder_session IS NULL"),
		     1, "run hands the lease back when it stops");

	run_free(run_a);
	run_free(run_b);
	hagent_destroy(a);
	hagent_destroy(b);
	free(file);
	hdb_drop(db);
}

Test(run_lease, frozen_leader_agent_stops_cmd_before_the_other_can_lead)
{
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	struct hagent *b = hagent_start(db, "b", NULL);
	char *file = htmp_path("runs");
	struct run *run_a, *run_b;

	lead_and_campaign(a, b, file, &run_a, &run_b);
	/* a says nothing more: only run_a's own clock can stop its CMD */
	hagent_kill(a, SIGSTOP);
	int64_t frozen = hnow_ms();
	/* the row lapses 3000 ms after the last renewal, then b wins */
	wait_for_starts(file, 2, 10000);
	cr_assert_eq(assert_no_overlap(file), 2);
	/* belief ended at most ttl - ttl/3 after the last renewal; then the
	 * grace at most, and a farewell call the frozen agent cannot answer */
	run_expect_exit(run_a, 8000, 5, "run on the frozen agent");
	run_expect_said(run_a, "local deadline passed");
	cr_assert_lt(hnow_ms() - frozen, 2000 + 500 + 1000 + 1000, "run stopped late");
	struct interval iv[MAX_INTERVALS];
	intervals_read(file, iv);
	cr_assert(iv[0].ended, "the first CMD got SIGTERM");
	cr_log_info("frozen agent: CMD stopped, %lld ms later the other CMD started",
		    (iv[1].start_ns - iv[0].last_ns) / 1000000);

	hagent_kill(a, SIGCONT);
	run_free(run_a);
	run_free(run_b);
	hagent_destroy(a);
	hagent_destroy(b);
	free(file);
	hdb_drop(db);
}

/*
 * run --keepalive keeps its session alive from its own loop: while it runs
 * it keeps the lease; once it hangs (here with its CMD, as a frozen host
 * would), the agent loses the session, the lease lapses and the other host
 * leads with no overlap. Woken, the hung run learns why and exits 5.
 */
Test(run_lease, hung_run_with_keepalive_loses_the_lease_to_the_other_host)
{
	static const char *const flags_a[] = {"--ttl", TTL, "--keepalive", "1000", NULL};
	static const char *const flags_b[] = {"--ttl", TTL, NULL};
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	struct hagent *b = hagent_start(db, "b", NULL);
	char *file = htmp_path("runs");
	struct interval iv[MAX_INTERVALS];

	struct run *run_a = run_start(a, file, flags_a, NULL);
	wait_for_starts(file, 1, 10000);
	struct run *run_b = run_start(b, file, flags_b, NULL);
	/* several keepalive_ms pass: the keepalives from run's loop hold it */
	hsleep_ms(3500);
	cr_assert_eq(assert_no_overlap(file), 1, "the campaigner started while a leader ran");
	intervals_read(file, iv);
	pid_t cmd_group = (pid_t)iv[0].pid;

	cr_assert_eq(kill(run_a->pid, SIGSTOP), 0);
	cr_assert_eq(kill(-cmd_group, SIGSTOP), 0);
	int64_t hung = hnow_ms();
	/* keepalive_ms, then the lease's own expiry, then b's next retry */
	wait_for_starts(file, 2, 15000);
	cr_assert_eq(assert_no_overlap(file), 2);
	cr_log_info("hung run: the other host's CMD started %lld ms later",
		    (long long)(hnow_ms() - 200 - hung));
	cr_assert(strstr(hagent_log(a), "session lost: keepalive missed"), "%s", hagent_log(a));

	/* the hung run could not stop its CMD: that is what the epoch fences */
	kill(-cmd_group, SIGKILL);
	cr_assert_eq(kill(run_a->pid, SIGCONT), 0);
	run_expect_exit(run_a, 5000, 5, "the hung run, woken");
	run_expect_said(run_a, "keepalive missed");

	run_free(run_a);
	run_free(run_b);
	hagent_destroy(a);
	hagent_destroy(b);
	free(file);
	hdb_drop(db);
}

/* A bad --keepalive is a usage error before anything is opened. */
Test(run_lease, bad_keepalive_is_a_usage_error)
{
	static const char *const bad[] = {"--keepalive", "99", NULL};
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	char *file = htmp_path("runs");

	struct run *r = run_start(a, file, bad, NULL);
	run_expect_exit(r, 5000, 2, "run --keepalive 99");
	run_expect_said(r, "--keepalive needs milliseconds between 100 and 600000");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE name LIKE "
					"'pgcoordctl run%%'"),
		     0);

	run_free(r);
	hagent_destroy(a);
	free(file);
	hdb_drop(db);
}

/* True once `pgcoordctl status --json` on a says it is the janitor. */
static bool is_janitor(struct hagent *a)
{
	const char *const argv[] = {
	    henv("PGCOORD_TEST_CTL_BIN"), "--socket", hagent_socket(a), "--json", "status", NULL};
	char *out = NULL;
	hrun(argv, &out);
	bool yes = strstr(out, "\"janitor\": true") != NULL;
	free(out);
	return yes;
}

/*
 * The leader's session can expire in the database before its lease does:
 * here session_ttl_ms is 2000 and the lease ttl 12000, so a frozen agent's
 * session is swept by the other agent's janitor within about 3 s, while
 * run's belief (8 s after the last renewal) still holds. The session's end
 * must not hand the lease to anyone before the lease itself lapses.
 */
Test(run_lease, session_expiring_before_the_lease_does_not_cut_belief_short)
{
	static const char *const fast[] = {"--session-ttl-ms", "2000", "--heartbeat-interval-ms",
					   "250", NULL};
	static const char *const flags[] = {"--ttl", "12000", NULL};
	struct harness_db *db = fresh_db();
	/* b first, and janitor, so a's session is swept while a is frozen */
	struct hagent *b = hagent_start(db, "b", fast);
	int64_t until = hnow_ms() + 10000;
	while (!is_janitor(b)) {
		cr_assert_lt(hnow_ms(), until, "agent b never became the janitor");
		hsleep_ms(50);
	}
	struct hagent *a = hagent_start(db, "a", fast);
	char *file = htmp_path("runs");
	struct run *run_a = run_start(a, file, flags, NULL);
	wait_for_starts(file, 1, 10000);
	struct run *run_b = run_start(b, file, flags, NULL);
	hsleep_ms(1000);

	hagent_kill(a, SIGSTOP);
	wait_for_starts(file, 2, 20000);
	cr_assert_eq(assert_no_overlap(file), 2);
	run_expect_exit(run_a, 5000, 5, "run on the frozen agent");

	hagent_kill(a, SIGCONT);
	run_free(run_a);
	run_free(run_b);
	hagent_destroy(a);
	hagent_destroy(b);
	free(file);
	hdb_drop(db);
}

Test(run_lease, leader_agent_sigterm_hands_over_within_a_retry_interval)
{
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	struct hagent *b = hagent_start(db, "b", NULL);
	char *file = htmp_path("runs");
	struct run *run_a, *run_b;
	struct interval iv[MAX_INTERVALS];

	lead_and_campaign(a, b, file, &run_a, &run_b);
	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	run_expect_exit(run_a, 5000, 5, "run on the stopping agent");
	run_expect_said(run_a, "shutting down");
	wait_for_starts(file, 2, 5000);
	cr_assert_eq(assert_no_overlap(file), 2);
	intervals_read(file, iv);
	cr_assert(iv[0].ended);
	/* hand-back is immediate; b's campaign retries every 1000 ms */
	long long gap_ms = (iv[1].start_ns - iv[0].last_ns) / 1000000;
	cr_assert_lt(gap_ms, 2000, "b started %lld ms after a's CMD stopped", gap_ms);
	cr_log_info("agent SIGTERM: the other CMD started %lld ms after the first stopped", gap_ms);

	run_free(run_a);
	run_free(run_b);
	hagent_destroy(a);
	hagent_destroy(b);
	free(file);
	hdb_drop(db);
}

/* --- CMD's own end, and refusals ---------------------------------------------- */

Test(run_lease, cmd_exit_status_is_passed_on_and_the_lease_released)
{
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	char *file = htmp_path("runs");
	static const char *const flags[] = {"--ttl", TTL, NULL};

	struct run *r = run_start(a, file, flags,
				  "echo \"start $PGCOORD_LEASE_EPOCH $$ $(date +%s%N)\" >> "
				  "\"$RUN_FILE\"; [ \"$PGCOORD_LEASE\" = job ] && exit 7");
	run_expect_exit(r, 10000, 7, "run of `exit 7`");
	/* it names the command it started, not a placeholder */
	run_expect_said(r, "started sh as pid ");
	cr_assert_eq(assert_no_overlap(file), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = 'job' "
					"AND holder_session IS NULL"),
		     1, "the lease was handed back");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_events WHERE "
					"name = 'job' AND event = 'released'"),
		     1);

	/* killed by a signal: 128+n */
	run_free(r);
	r = run_start(a, file, flags, "kill -USR1 $$");
	run_expect_exit(r, 10000, 128 + SIGUSR1, "run of a CMD killed by SIGUSR1");
	run_free(r);

	hagent_destroy(a);
	free(file);
	hdb_drop(db);
}

Test(run_lease, kill_grace_that_does_not_fit_the_margin_is_refused)
{
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	char *file = htmp_path("runs");
	char *log = NULL;

	/* with --ttl the margin is known before anything is asked */
	static const char *const too_long[] = {"--ttl", TTL, "--kill-grace", "1000", NULL};
	struct run *r = run_start(a, file, too_long, NULL);
	run_expect_exit(r, 5000, 2, "run with --kill-grace 1000 --ttl 3000");
	run_expect_said(r, "margin");
	run_free(r);

	/* without, the agent's default ttl (15000: margin 5000) decides */
	static const char *const default_ttl[] = {"--kill-grace", "5000", NULL};
	r = run_start(a, file, default_ttl, NULL);
	run_expect_exit(r, 5000, 2, "run with --kill-grace 5000 and the default ttl");
	run_expect_said(r, "margin");
	run_free(r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE "
					"holder_session IS NOT NULL AND name = 'job'"),
		     0, "a refused run leaves no lease behind");
	cr_assert_eq(assert_no_overlap(file), 0, "CMD must not have started");

	const char *const argv[] = {
	    henv("PGCOORD_TEST_CTL_BIN"), "--socket", hagent_socket(a), "run", "--", "true", NULL};
	cr_assert_eq(hrun(argv, &log), 2, "run without --lease:\n%s", log);
	free(log);

	hagent_destroy(a);
	free(file);
	hdb_drop(db);
}

/* --- the library against a real agent ------------------------------------------ */

TestSuite(lease_api, .timeout = 60);

static pgcoord *open_session(struct hagent *a)
{
	pgcoord *c = NULL;
	cr_assert_eq(pgcoord_connect(hagent_socket(a), 5000, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "lease_api", 5000, NULL), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	return c;
}

/*
 * A session that watches the lease it wins hears of it twice: from its own
 * belief (lease.changed with valid_ms), and from the watch poll that sees
 * the holder change. The second must not end the first.
 */
Test(lease_api, watching_the_lease_you_lead_keeps_your_belief)
{
	struct harness_db *db = fresh_db();
	struct hagent *a = hagent_start(db, "a", NULL);
	pgcoord *x = open_session(a), *y = open_session(a);
	bool leader = false;
	msgpack_sbuffer sb;
	msgpack_packer pk;

	cr_assert_eq(pgcoord_lease_acquire(x, "job", 3000, false, 5000, &leader, NULL), PGCOORD_OK);
	cr_assert(leader);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	pgc_pack_kv_str(&pk, "name", "job");
	pgc_pack_kv_bool(&pk, "watch", true);
	cr_assert_eq(pgcoord_call(y, "lease.status", sb.data, sb.size, 5000, NULL, NULL),
		     PGCOORD_OK, "%s", pgcoord_last_message(y));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(pgcoord_lease_acquire(y, "job", 3000, true, 5000, &leader, NULL), PGCOORD_OK);
	cr_assert_not(leader);
	hsleep_ms(1500); /* the watch poll (every lease_retry_ms) has seen x hold it */

	cr_assert_eq(pgcoord_lease_release(x, "job", 5000, NULL), PGCOORD_OK);
	int64_t until = hnow_ms() + 5000;
	while (!pgcoord_lease_is_leader(y, "job")) {
		cr_assert_eq(pgcoord_poll(y, 20, NULL), PGCOORD_OK);
		cr_assert_lt(hnow_ms(), until, "y never won the released lease");
	}
	/* past the next watch poll, y must lead without a gap */
	until = hnow_ms() + 2500;
	while (hnow_ms() < until) {
		cr_assert_eq(pgcoord_poll(y, 10, NULL), PGCOORD_OK);
		cr_assert(pgcoord_lease_is_leader(y, "job"),
			  "y stopped believing while it held the lease");
	}
	pgcoord_close(x);
	pgcoord_close(y);
	hagent_destroy(a);
	hdb_drop(db);
}
