/*
 * test_watches.c — quota.watch, permit.watch, record.watch and
 * watch.cancel against a real Postgres and several real agents: the
 * watcher sits on another agent than the one that changes things, hears
 * the change within a poll interval (plus slack), and the tests check the
 * database agrees with what it heard. Also: one poll statement per interval
 * whatever the number of watchers, the per-session cap, bad input.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(watches, .timeout = 60);

#define POLL_MS 200
/* a poll interval, the statement and the socket, on a busy CI machine */
#define HEAR_MS (POLL_MS + 1300)

static const char *const watcher_args[] = {"--watch-poll-ms", "200", NULL};
static const char *const http_args[] = {"--watch-poll-ms", "200", "--metrics-listen", "127.0.0.1:0",
					NULL};
/* an agent whose sessions lapse soon after it is killed */
static const char *const mortal_args[] = {
    "--heartbeat-interval-ms", "200", "--session-ttl-ms", "1200", "--watch-poll-ms", "200", NULL};

/* --- helpers ------------------------------------------------------------ */

/* params {key: str} */
static void p_str(struct iparams *p, const char *key, const char *value)
{
	pgc_pack_kv_str(iparams_begin(p, 1), key, value);
}

/* Calls method {key: value} and returns the watch id it answered. */
static int64_t watch(int fd, const char *method, const char *key, const char *value)
{
	struct iparams p;
	struct ireply r;
	p_str(&p, key, value);
	const msgpack_object *res = icall_ok(fd, method, &p, &r);
	int64_t id = iint(res, "watch");
	cr_assert_gt(id, 0);
	cr_assert_eq(iint(res, "poll_ms"), POLL_MS);
	ireply_destroy(&r);
	iparams_destroy(&p);
	return id;
}

/* Fails when any message arrives on fd within ms. */
static void hear_nothing(int fd, int ms, const char *why)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	enum hraw_result got = hraw_recv_msg(fd, ms, &u);
	msgpack_unpacked_destroy(&u);
	cr_assert_eq(got, HRAW_TIMEOUT, "%s: a message arrived (%d)", why, got);
}

static void claim(int fd, const char *id, const char *key)
{
	struct iparams p;
	struct ireply r;
	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "id", id);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	pgc_pack_kv_str(pk, "key", key);
	const msgpack_object *res = icall_ok(fd, "permit.claim", &p, &r);
	cr_assert(istr_is(res, "status", "admitted"), "permit %s was not admitted", id);
	ireply_destroy(&r);
	iparams_destroy(&p);
}

static void call_ok(int fd, const char *method, struct iparams *p)
{
	struct ireply r;
	icall_ok(fd, method, p, &r);
	ireply_destroy(&r);
	iparams_destroy(p);
}

/* --- quotas -------------------------------------------------------------- */

/* The watcher is on agent b; the quota changes through agent a. */
Test(watches, a_watcher_on_another_agent_hears_a_quota_free_up_within_a_poll)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-qa", watcher_args);
	struct hagent *b = hagent_start(db, "watch-qb", http_args);
	int fa = iconnect(hagent_socket(a)), fb = iconnect(hagent_socket(b));
	struct ireply n;
	struct iparams p;
	char *page;

	isession_open(fa, "worker");
	isession_open(fb, "dashboard");
	/* an unknown key is fine: the first notification says it is absent */
	int64_t w = watch(fb, "quota.watch", "key", "gpu");
	ihear(fb, "quota.changed", HEAR_MS, &n);
	cr_assert_eq(iint(n.m.params, "watch"), w);
	cr_assert(istr_is(n.m.params, "key", "gpu"));
	cr_assert_not(ibool(n.m.params, "exists"));
	cr_assert_eq(iint(n.m.params, "room"), 0);
	ireply_destroy(&n);
	hear_nothing(fb, 3 * POLL_MS, "nothing changed");

	iquota_set(fa, "gpu", 1);
	ihear(fb, "quota.changed", HEAR_MS, &n);
	cr_assert(ibool(n.m.params, "exists"));
	cr_assert_eq(iint(n.m.params, "limit"), 1);
	cr_assert_eq(iint(n.m.params, "in_flight"), 0);
	cr_assert_eq(iint(n.m.params, "room"), 1);
	ireply_destroy(&n);

	claim(fa, "job-1", "gpu");
	ihear(fb, "quota.changed", HEAR_MS, &n);
	cr_assert_eq(iint(n.m.params, "in_flight"), 1);
	cr_assert_eq(iint(n.m.params, "held"), 1);
	cr_assert_eq(iint(n.m.params, "uncertain"), 0);
	cr_assert_eq(iint(n.m.params, "room"), 0);
	ireply_destroy(&n);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'gpu'"),
		     1);
	/* the status page shows what is watched here, as the last poll read it */
	page = ihttp_get(b, "/status");
	cr_assert(strstr(page, "<table id=\"watched\">") &&
		      strstr(page, "<td>gpu</td><td>1</td><td>1</td><td>1</td>"),
		  "%s", page);
	free(page);
	page = ihttp_get(b, "/metrics");
	cr_assert(strstr(page, "\npgcoord_watches 1\n") &&
		      strstr(page, "pgcoord_watch_polls_total "),
		  "%s", page);
	free(page);

	/* the slot frees up: heard within one poll interval, plus slack */
	p_str(&p, "id", "job-1");
	int64_t freed_at = hnow_ms();
	call_ok(fa, "permit.release", &p);
	ihear(fb, "quota.changed", HEAR_MS, &n);
	int64_t took = hnow_ms() - freed_at;
	cr_assert_eq(iint(n.m.params, "in_flight"), 0);
	cr_assert_eq(iint(n.m.params, "room"), 1);
	ireply_destroy(&n);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'gpu'"),
		     0);
	cr_log_info("room heard %lld ms after the release (poll every %d ms)", (long long)took,
		    POLL_MS);
	hear_nothing(fb, 3 * POLL_MS, "only changes are pushed");

	/* cancelled: nothing more, though the quota changes */
	struct iparams c;
	pgc_pack_kv_int(iparams_begin(&c, 1), "watch", w);
	struct ireply r;
	cr_assert(ibool(icall_ok(fb, "watch.cancel", &c, &r), "cancelled"));
	ireply_destroy(&r);
	cr_assert_not(ibool(icall_ok(fb, "watch.cancel", &c, &r), "cancelled"),
		      "a second cancel finds nothing");
	ireply_destroy(&r);
	iparams_destroy(&c);
	iquota_set(fa, "gpu", 2);
	hear_nothing(fb, 3 * POLL_MS, "the watch was cancelled");
	cr_assert_eq(istatus_int(b, "watches"), 0);

	close(fa);
	close(fb);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- permits ------------------------------------------------------------- */

Test(watches, permit_watch_hears_held_then_uncertain_then_released)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-pa", watcher_args);
	struct hagent *b = hagent_start(db, "watch-pb", watcher_args);
	int fa = iconnect(hagent_socket(a)), fb = iconnect(hagent_socket(b));
	int fu = iconnect(hagent_socket(b));
	struct ireply n;
	struct iparams p;

	int64_t sa = isession_open(fa, "worker");
	isession_open(fb, "scheduler");
	isession_open(fu, "curious");
	iquota_set(fa, "slots", 3);
	claim(fa, "p1", "slots");

	int64_t w = watch(fb, "permit.watch", "id", "p1");
	ihear(fb, "permit.changed", HEAR_MS, &n);
	cr_assert_eq(iint(n.m.params, "watch"), w);
	cr_assert(istr_is(n.m.params, "id", "p1"));
	cr_assert(ibool(n.m.params, "exists"));
	cr_assert(istr_is(n.m.params, "state", "held"));
	cr_assert(istr_is(n.m.params, "phase", "reserved"));
	cr_assert_eq(iint(n.m.params, "owner_session"), sa);
	int64_t token = iint(n.m.params, "token");
	cr_assert_eq(token,
		     hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'p1'"));
	cr_assert_null(pgc_map_get(n.m.params, "intent"), "no intent is ever pushed");
	ireply_destroy(&n);

	/* an id nobody claimed: watched all the same, reported absent */
	watch(fu, "permit.watch", "id", "no-such-permit");
	ihear(fu, "permit.changed", HEAR_MS, &n);
	cr_assert_not(ibool(n.m.params, "exists"));
	cr_assert(iis_nil(n.m.params, "state"));
	ireply_destroy(&n);

	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "id", "p1");
	pgc_pack_kv_str(pk, "phase", "running");
	call_ok(fa, "permit.update", &p);
	ihear(fb, "permit.changed", HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "state", "held"));
	cr_assert(istr_is(n.m.params, "phase", "running"));
	ireply_destroy(&n);

	pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "id", "p1");
	pgc_pack_kv_str(pk, "reason", "connector dropped");
	call_ok(fa, "permit.mark_uncertain", &p);
	ihear(fb, "permit.changed", HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "state", "uncertain"));
	cr_assert(istr_is(n.m.params, "uncertain_reason", "connector dropped"));
	ireply_destroy(&n);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'p1' "
					"AND state = 'uncertain'"),
		     1);

	pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "id", "p1");
	pgc_pack_kv_str(pk, "outcome", "gone");
	pgc_pack_kv_str(pk, "evidence", "no such process");
	call_ok(fa, "permit.resolve", &p);
	ihear(fb, "permit.changed", HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "state", "released"));
	cr_assert_gt(iint(n.m.params, "released_at"), 0);
	ireply_destroy(&n);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'p1' "
					"AND state = 'released'"),
		     1);
	hear_nothing(fb, 3 * POLL_MS, "a released permit stays released");
	hear_nothing(fu, POLL_MS, "the absent permit is still absent");

	close(fa);
	close(fb);
	close(fu);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- records ------------------------------------------------------------- */

/* Waits until the file at path contains needle; fails after timeout_ms. */
static char *wait_for_output(const char *path, const char *needle, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	for (;;) {
		char *text = hread_file(path);
		if (text && strstr(text, needle))
			return text;
		cr_assert_lt(hnow_ms(), deadline, "no \"%s\" within %d ms in:\n%s", needle,
			     timeout_ms, text ? text : "(nothing)");
		free(text);
		hsleep_ms(50);
	}
}

static void put_record(int fd, const char *kind, const char *key)
{
	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, 4);
	pgc_pack_kv_str(pk, "kind", kind);
	pgc_pack_kv_str(pk, "key", key);
	pgc_pack_kv_str(pk, "state", "running");
	pgc_pack_kv_str(pk, "data", "secret");
	call_ok(fd, "record.put", &p);
}

/* Records of a session that was closed, and of an agent that was killed,
 * are heard of as they become orphans; live owners' records are not. */
Test(watches, record_watch_hears_records_of_a_dead_owner_appear)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-ra", watcher_args);
	struct hagent *m = hagent_start(db, "watch-rm", mortal_args);
	struct hagent *b = hagent_start(db, "watch-rb", watcher_args);
	int fa = iconnect(hagent_socket(a)), fm = iconnect(hagent_socket(m));
	int fb = iconnect(hagent_socket(b));
	struct ireply n;

	int64_t sa = isession_open(fa, "closer");
	int64_t sm = isession_open(fm, "doomed");
	isession_open(fb, "recoverer");
	put_record(fa, "job", "a-1");
	put_record(fa, "job", "a-2");
	put_record(fm, "job", "m-1");
	put_record(fm, "other", "m-2");

	watch(fb, "record.watch", "kind", "job");
	/* and pgcoordctl, one JSON object per event */
	char *ctl_log = htmp_path("watch-records.out");
	const char *const ctl[] = {
	    ictl_bin(), "--socket", hagent_socket(b), "--json", "watch", "records", "job", NULL};
	pid_t ctl_pid = ispawn(ctl, ctl_log);
	int64_t until = hnow_ms() + 5000;
	while (istatus_int(b, "watches") != 2 && hnow_ms() < until)
		hsleep_ms(50);
	hear_nothing(fb, 3 * POLL_MS, "every owner is live");

	/* a closed session: both its records, once each */
	struct ireply r;
	icall_ok(fa, "session.close", NULL, &r);
	ireply_destroy(&r);
	int seen = 0;
	for (int i = 0; i < 2; i++) {
		ihear(fb, "record.orphaned", HEAR_MS, &n);
		cr_assert(istr_is(n.m.params, "kind", "job"));
		char *key = istr(n.m.params, "key");
		seen |= strcmp(key, "a-1") == 0 ? 1 : strcmp(key, "a-2") == 0 ? 2 : 4;
		free(key);
		cr_assert_eq(iint(n.m.params, "owner_session"), sa);
		cr_assert(istr_is(n.m.params, "owner_replica", "watch-ra"));
		cr_assert_eq(iint(n.m.params, "owner_uid"), (int64_t)getuid());
		cr_assert_null(pgc_map_get(n.m.params, "data"), "no record data is ever pushed");
		ireply_destroy(&n);
	}
	cr_assert_eq(seen, 3, "heard a-1 and a-2 (%d)", seen);
	hear_nothing(fb, 3 * POLL_MS, "each orphan is told once");
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.records r JOIN pgcoord.sessions s "
			   "ON s.id = r.owner_session WHERE r.kind = 'job' AND "
			   "s.closed_at IS NOT NULL AND s.id = %lld",
			   (long long)sa),
	    2);

	/* a killed agent: its session lapses after its ttl */
	hagent_kill(m, SIGKILL);
	hagent_wait(m, 5000);
	ihear(fb, "record.orphaned", 1200 + 2000 + HEAR_MS, &n);
	cr_assert(istr_is(n.m.params, "key", "m-1"));
	cr_assert_eq(iint(n.m.params, "owner_session"), sm);
	ireply_destroy(&n);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld "
				    "AND (closed_at IS NOT NULL OR expires_at <= now())",
				    (long long)sm),
		     1);
	hear_nothing(fb, 3 * POLL_MS, "m-2 is of another kind");
	char *text = wait_for_output(ctl_log, "\"key\":\"m-1\"", 5000);
	cr_assert(strstr(text, "{\"event\":\"record.orphaned\",\"kind\":\"job\",\"key\":\"a-1\"") &&
		      strstr(text, "\"key\":\"a-2\"") && !strstr(text, "m-2"),
		  "%s", text);
	free(text);
	kill(ctl_pid, SIGTERM);
	cr_assert_eq(iwait_pid(ctl_pid), 0, "%s", hread_file(ctl_log));
	free(ctl_log);

	close(fa);
	close(fm);
	close(fb);
	hagent_destroy(a);
	hagent_destroy(m);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- one statement per interval ------------------------------------------ */

#define WATCHERS 8

Test(watches, many_watchers_are_served_by_one_poll_statement_per_interval)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-many", watcher_args);
	int fds[WATCHERS];
	char name[32];

	for (int i = 0; i < WATCHERS; i++) {
		fds[i] = iconnect(hagent_socket(a));
		isession_open(fds[i], "watcher");
		/* the same quota for all, plus keys, ids and kinds of their own */
		watch(fds[i], "quota.watch", "key", "shared");
		snprintf(name, sizeof(name), "q%d", i);
		watch(fds[i], "quota.watch", "key", name);
		snprintf(name, sizeof(name), "p%d", i);
		watch(fds[i], "permit.watch", "id", name);
		snprintf(name, sizeof(name), "k%d", i);
		watch(fds[i], "record.watch", "kind", name);
	}
	cr_assert_eq(istatus_int(a, "watches"), 4 * WATCHERS);
	hsleep_ms(2 * POLL_MS);
	int64_t polls0 = istatus_int(a, "watch_polls"), queries0 = istatus_int(a, "db_queries");
	int64_t t0 = hnow_ms();
	hsleep_ms(3000);
	int64_t polls = istatus_int(a, "watch_polls") - polls0;
	int64_t queries = istatus_int(a, "db_queries") - queries0;
	int64_t elapsed = hnow_ms() - t0, intervals = elapsed / POLL_MS;

	cr_log_info("%d watches: %lld polls and %lld statements in %lld ms", 4 * WATCHERS,
		    (long long)polls, (long long)queries, (long long)elapsed);
	cr_assert_leq(polls, intervals + 1, "%lld polls in %lld intervals", (long long)polls,
		      (long long)intervals);
	cr_assert_geq(polls, intervals / 2, "the poll stalled: %lld in %lld intervals",
		      (long long)polls, (long long)intervals);
	/* every statement the agent sent: the polls, heartbeats (one a second)
	 * and the janitor's sweeps — not one per watch */
	cr_assert_lt(queries, polls + 4 * (elapsed / 1000 + 1) + 4,
		     "%lld statements for %lld polls", (long long)queries, (long long)polls);
	for (int i = 0; i < WATCHERS; i++)
		close(fds[i]);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- limits and bad input ------------------------------------------------ */

Test(watches, the_per_session_cap_answers_busy_and_bad_input_is_refused)
{
	const char *const args[] = {"--watch-poll-ms", "200", "--max-watches-per-session", "3",
				    NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-cap", args);
	int fd = iconnect(hagent_socket(a)), other = iconnect(hagent_socket(a));
	int nosession = iconnect(hagent_socket(a));
	struct iparams p;
	struct ireply r;

	isession_open(fd, "greedy");
	isession_open(other, "modest");
	int64_t w1 = watch(fd, "quota.watch", "key", "a");
	watch(fd, "permit.watch", "id", "a");
	watch(fd, "record.watch", "kind", "a");
	cr_assert_eq(watch(fd, "quota.watch", "key", "a"), w1, "watching again is the same watch");

	p_str(&p, "key", "b");
	icall(fd, "quota.watch", &p, &r);
	ierr(&r, "busy", true, (const char *const[]){"max_watches_per_session", NULL});
	ireply_destroy(&r);
	/* the cap is per session */
	icall_ok(other, "quota.watch", &p, &r);
	ireply_destroy(&r);
	icall(nosession, "quota.watch", &p, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* a cancel makes room; another session's watch id cancels nothing */
	pgc_pack_kv_int(iparams_begin(&p, 1), "watch", w1);
	cr_assert_not(ibool(icall_ok(other, "watch.cancel", &p, &r), "cancelled"));
	ireply_destroy(&r);
	cr_assert(ibool(icall_ok(fd, "watch.cancel", &p, &r), "cancelled"));
	ireply_destroy(&r);
	iparams_destroy(&p);
	watch(fd, "quota.watch", "key", "b");

	p_str(&p, "key", "");
	icall(other, "quota.watch", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"key", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	pgc_pack_kv_int(iparams_begin(&p, 1), "kind", 7);
	icall(other, "record.watch", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"kind", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	icall(other, "permit.watch", NULL, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"id", NULL});
	ireply_destroy(&r);
	p_str(&p, "watch", "1");
	icall(other, "watch.cancel", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"watch", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* a closed session's watches end with it; a detached one's stay */
	icall_ok(other, "session.close", NULL, &r);
	ireply_destroy(&r);
	close(fd);
	int64_t deadline = hnow_ms() + 5000;
	while (istatus_int(a, "watches") != 3 && hnow_ms() < deadline)
		hsleep_ms(50);
	cr_assert_eq(istatus_int(a, "watches"), 3,
		     "the closed session's watch is gone, the detached one's 3 stay");
	cr_assert(hagent_running(a));
	close(other);
	close(nosession);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- pgcoordctl watch and wait ------------------------------------------- */

Test(watches, pgcoordctl_wait_returns_once_there_is_room_and_watch_prints_each_change)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-ctl", watcher_args);
	const char *sock = hagent_socket(a);
	int fd = iconnect(sock);
	char *out = NULL;
	struct iparams p;

	isession_open(fd, "worker");
	iquota_set(fd, "gpu", 1);
	claim(fd, "job-1", "gpu");

	/* full: --timeout ends the wait with 5 */
	const char *const full[] = {ictl_bin(), "--socket", sock,	 "wait", "quota", "gpu",
				    "--room",	"1",	    "--timeout", "600",	 NULL};
	int64_t t0 = hnow_ms();
	cr_assert_eq(hrun(full, &out), 5, "%s", out);
	int64_t took = hnow_ms() - t0;
	cr_assert_geq(took, 600);
	cr_assert_lt(took, 600 + 4000);
	cr_assert(strstr(out, "no room"), "%s", out);
	free(out);

	char *wait_log = htmp_path("wait.out"), *watch_log = htmp_path("watch.out");
	const char *const waiter[] = {ictl_bin(), "--socket", sock,	   "wait",  "quota", "gpu",
				      "--room",	  "1",	      "--timeout", "20000", NULL};
	const char *const watcher[] = {ictl_bin(), "--socket", sock, "watch",
				       "permit",   "job-1",    NULL};
	pid_t wait_pid = ispawn(waiter, wait_log);
	pid_t watch_pid = ispawn(watcher, watch_log);
	free(wait_for_output(watch_log, "state=held", 5000));
	/* the waiter watches too before the slot frees up */
	int64_t until = hnow_ms() + 5000;
	while (istatus_int(a, "watches") != 2 && hnow_ms() < until)
		hsleep_ms(50);
	cr_assert_eq(istatus_int(a, "watches"), 2);
	hsleep_ms(2 * POLL_MS); /* and has heard there is no room */
	cr_assert_eq(waitpid(wait_pid, NULL, WNOHANG), 0, "wait returned while the quota was full");

	p_str(&p, "id", "job-1");
	call_ok(fd, "permit.release", &p);
	cr_assert_eq(iwait_pid(wait_pid), 0, "%s", hread_file(wait_log));
	out = hread_file(wait_log);
	cr_assert(strstr(out, "quota.changed") && strstr(out, "room=1"), "%s", out);
	free(out);
	out = wait_for_output(watch_log, "state=released", 5000);
	cr_assert(strstr(out, "permit.changed id=job-1 exists=true state=held"), "%s", out);
	free(out);
	kill(watch_pid, SIGINT);
	cr_assert_eq(iwait_pid(watch_pid), 0, "%s", hread_file(watch_log));
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'gpu'"),
		     0);
	/* both closed their sessions: their watches are gone at the next poll */
	int64_t deadline = hnow_ms() + 3000;
	while (istatus_int(a, "watches") != 0 && hnow_ms() < deadline)
		hsleep_ms(50);
	cr_assert_eq(istatus_int(a, "watches"), 0);

	/* usage errors */
	const char *const bad[][8] = {
	    {ictl_bin(), "--socket", sock, "wait", "permit", "job-1", NULL},
	    {ictl_bin(), "--socket", sock, "wait", "quota", "gpu", NULL},
	    {ictl_bin(), "--socket", sock, "wait", "quota", "gpu", "--room", "0"},
	    {ictl_bin(), "--socket", sock, "watch", "leases", "x", NULL},
	    {ictl_bin(), "--socket", sock, "watch", "quota", NULL},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *argv[9] = {0};
		memcpy(argv, bad[i], sizeof(bad[i]));
		cr_assert_eq(hrun(argv, &out), 2, "case %zu: %s", i, out);
		free(out);
	}
	free(wait_log);
	free(watch_log);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- libpgcoord ---------------------------------------------------------- */

struct heard {
	int quota_changed;
	int64_t watch, room;
};

static void on_note(void *user, const char *method, const void *params, size_t len)
{
	struct heard *h = user;
	msgpack_unpacked u;
	size_t off = 0;
	if (strcmp(method, "quota.changed") != 0)
		return;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, len, &off) == MSGPACK_UNPACK_SUCCESS) {
		h->quota_changed++;
		pgc_obj_int64(pgc_map_get(&u.data, "watch"), &h->watch);
		pgc_obj_int64(pgc_map_get(&u.data, "room"), &h->room);
	}
	msgpack_unpacked_destroy(&u);
}

Test(watches, libpgcoord_watch_calls_and_their_notifications)
{
	const char *const args[] = {"--watch-poll-ms", "200", "--max-watches-per-session", "2",
				    NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "watch-lib", args);
	pgcoord *c = NULL;
	struct heard h = {0};
	int64_t qw = 0, rw = 0, other = 0;
	bool cancelled = true;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), 5000, &c), PGCOORD_OK);
	pgcoord_set_notify(c, on_note, &h);
	cr_assert_eq(pgcoord_quota_watch(c, "gpu", 5000, &qw), PGCOORD_E_NO_SESSION);
	cr_assert_eq(pgcoord_session_open(c, "lib", 5000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_watch(c, "", 5000, &qw), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_quota_watch(c, "gpu", 5000, &qw), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_record_watch(c, "job", 5000, &rw), PGCOORD_OK);
	cr_assert(qw > 0 && rw > 0 && qw != rw);
	cr_assert_eq(pgcoord_permit_watch(c, "p1", 5000, &other), PGCOORD_E_BUSY);
	cr_assert(strstr(pgcoord_last_message(c), "max_watches_per_session"), "%s",
		  pgcoord_last_message(c));

	int64_t deadline = hnow_ms() + HEAR_MS;
	while (h.quota_changed == 0 && hnow_ms() < deadline)
		cr_assert_eq(pgcoord_poll(c, 100, NULL), PGCOORD_OK);
	cr_assert_eq(h.quota_changed, 1, "the first read pushes the (absent) quota");
	cr_assert_eq(h.watch, qw);
	cr_assert_eq(h.room, 0);

	cr_assert_eq(pgcoord_watch_cancel(c, rw, 5000, &cancelled), PGCOORD_OK);
	cr_assert(cancelled);
	cr_assert_eq(pgcoord_watch_cancel(c, rw, 5000, &cancelled), PGCOORD_OK);
	cr_assert_not(cancelled);
	cr_assert_eq(pgcoord_permit_watch(c, "p1", 5000, &other), PGCOORD_OK,
		     "room after a cancel");
	cr_assert_eq(istatus_int(a, "watches"), 2);
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}
