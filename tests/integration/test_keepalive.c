/*
 * test_keepalive.c — application liveness (PROTOCOL.md, "Keepalive"): a
 * session opened with keepalive_ms that stops calling session.keepalive is
 * lost; its leases lapse by their own expiry (never handed back while its
 * client may still believe) and its permits follow on_owner_loss. Real
 * agents, real client processes, assertions on pgcoord.* as well.
 *
 * Beliefs are measured on the clients with CLOCK_MONOTONIC (hnow_ms), the
 * clock the agents use too (same host).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(keepalive, .timeout = 120);

#define CALL_MS 5000
#define KEEPALIVE_MS 2000
#define LEASE_TTL_MS 1500 /* renewed every 500 ms, believed 1000 ms ahead */
#define LEASE "ka-lead"

/* quick session expiry, so the janitor closes a lost session within seconds */
static const char *const agent_args[] = {"--heartbeat-interval-ms",
					 "200",
					 "--session-ttl-ms",
					 "1200",
					 "--session-grace-ms",
					 "300",
					 "--lease-retry-ms",
					 "200",
					 NULL};

/* What the leader process saw, shared with the test through MAP_SHARED. */
struct leader_view {
	_Atomic int64_t session;
	_Atomic int64_t epoch;
	_Atomic int64_t belief_start; /* first moment it believed it leads */
	_Atomic int64_t belief_until; /* the latest deadline it ever believed */
	_Atomic int64_t keepalives;   /* answered ok */
	_Atomic int keepalive_err;    /* the first failing keepalive's pgcoord_err */
	_Atomic int lost;	      /* session.lost received */
	char lost_reason[64];
	_Atomic int failed; /* could not set itself up */
};

static void on_leader_note(void *user, const char *method, const void *params, size_t len)
{
	struct leader_view *v = user;
	msgpack_unpacked u;
	size_t off = 0;
	const char *reason = "";
	size_t rlen = 0;

	if (strcmp(method, "session.lost") != 0)
		return;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, len, &off) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_MAP)
		pgc_obj_str(pgc_map_get(&u.data, "reason"), &reason, &rlen);
	snprintf(v->lost_reason, sizeof(v->lost_reason), "%.*s", (int)rlen, reason);
	msgpack_unpacked_destroy(&u);
	atomic_store(&v->lost, 1);
}

static void claim(pgcoord *c, const char *id, unsigned flags)
{
	const char *keys[1] = {"ka-quota"};
	pgcoord_claim *cl = NULL;
	if (pgcoord_permit_claim(
		c, id,
		&(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					     .keys = keys,
					     .nquotas = 1,
					     .limit = 5,
					     .flags = flags},
		CALL_MS, &cl) != PGCOORD_OK ||
	    pgcoord_claim_get_status(cl) != PGCOORD_CLAIM_ADMITTED)
		_exit(2);
	pgcoord_claim_free(cl);
}

/*
 * The leader: a session with keepalive_ms, two permits (one released on
 * owner loss), a campaign for LEASE; then a loop that records its belief
 * and calls session.keepalive every 400 ms from that same loop, as an
 * application does from its work loop. SIGSTOP hangs it.
 */
static pid_t leader_process(const char *socket, struct leader_view *v)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	pgcoord *c = NULL;
	int64_t id = 0;
	if (pgcoord_connect(socket, CALL_MS, &c) != PGCOORD_OK ||
	    pgcoord_set_session_keepalive(c, KEEPALIVE_MS) != PGCOORD_OK ||
	    pgcoord_session_open(c, "hangs", CALL_MS, &id) != PGCOORD_OK) {
		atomic_store(&v->failed, 1);
		_exit(1);
	}
	pgcoord_set_notify(c, on_leader_note, v);
	atomic_store(&v->session, id);
	claim(c, "ka-remote", 0);
	claim(c, "ka-inproc", PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS);
	if (pgcoord_lease_acquire(c, LEASE, LEASE_TTL_MS, true, CALL_MS, NULL, NULL) !=
	    PGCOORD_OK) {
		atomic_store(&v->failed, 1);
		_exit(1);
	}
	int64_t next_keepalive = hnow_ms() + 400;
	for (;;) {
		(void)pgcoord_poll(c, 20, NULL);
		int64_t now = hnow_ms();
		if (pgcoord_lease_is_leader(c, LEASE)) {
			int64_t until = now + pgcoord_lease_valid_ms(c, LEASE);
			if (!atomic_load(&v->belief_start)) {
				atomic_store(&v->epoch, pgcoord_lease_epoch(c, LEASE));
				atomic_store(&v->belief_start, now);
			}
			if (until > atomic_load(&v->belief_until))
				atomic_store(&v->belief_until, until);
		}
		if (now >= next_keepalive && !atomic_load(&v->keepalive_err)) {
			pgcoord_err err = pgcoord_session_keepalive(c, CALL_MS, NULL);
			if (err == PGCOORD_OK)
				atomic_fetch_add(&v->keepalives, 1);
			else
				atomic_store(&v->keepalive_err, (int)err);
			next_keepalive = hnow_ms() + 400;
		}
	}
}

static bool wait_until(_Atomic int64_t *value, int64_t at_least, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	while (atomic_load(value) < at_least) {
		if (hnow_ms() > deadline)
			return false;
		hsleep_ms(20);
	}
	return true;
}

/* Polls c until it believes it leads LEASE; returns the start of its
 * belief: the moment before the poll that delivered it (no earlier read
 * could have). 0 after timeout_ms. */
static int64_t wait_leading(pgcoord *c, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	while (hnow_ms() < deadline) {
		int64_t before = hnow_ms();
		cr_assert_eq(pgcoord_poll(c, 20, NULL), PGCOORD_OK, "%s", pgcoord_last_message(c));
		if (pgcoord_lease_is_leader(c, LEASE))
			return before;
	}
	return 0;
}

/*
 * The acceptance: a hung client (SIGSTOP) with keepalive_ms 2000
 * loses its lease and another client takes over with a higher epoch, with
 * no overlap of the two clients' belief windows; while it kept alive, it
 * kept its lease. Its session row is closed, its permits followed
 * on_owner_loss, and its lease was never handed back.
 */
Test(keepalive, hung_client_loses_its_lease_without_overlap)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ka-a", agent_args);
	struct hagent *b = hagent_start(db, "ka-b", agent_args);
	struct leader_view *v =
	    mmap(NULL, sizeof(*v), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(v, MAP_FAILED);
	memset(v, 0, sizeof(*v));

	pid_t child = leader_process(hagent_socket(a), v);
	cr_assert_gt(child, 0);
	cr_assert(wait_until(&v->belief_start, 1, 10000), "the leader never led (failed=%d)",
		  atomic_load(&v->failed));
	int64_t hung_session = atomic_load(&v->session);

	/* the successor campaigns through the other agent */
	pgcoord *succ = NULL;
	cr_assert_eq(pgcoord_connect(hagent_socket(b), CALL_MS, &succ), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(succ, "successor", CALL_MS, NULL), PGCOORD_OK);
	bool leader = true;
	cr_assert_eq(pgcoord_lease_acquire(succ, LEASE, LEASE_TTL_MS, true, CALL_MS, &leader, NULL),
		     PGCOORD_OK, "%s", pgcoord_last_message(succ));
	cr_assert_not(leader);

	/* a client that keeps alive keeps its lease, past several keepalive_ms */
	int64_t kept = atomic_load(&v->keepalives);
	cr_assert_eq(wait_leading(succ, 3 * KEEPALIVE_MS), 0,
		     "the lease changed hands while its leader kept alive");
	cr_assert_geq(atomic_load(&v->keepalives), kept + 10);
	cr_assert_eq(atomic_load(&v->keepalive_err), 0);
	cr_assert_eq(hdb_query_long(
			 db, "SELECT holder_session FROM pgcoord.leases WHERE name = '%s'", LEASE),
		     hung_session);

	/* hang it */
	int64_t stopped = hnow_ms();
	cr_assert_eq(kill(child, SIGSTOP), 0);
	int64_t succ_start = wait_leading(succ, 20000);
	cr_assert_gt(succ_start, 0, "nobody took over from the hung leader");
	int64_t hung_until = atomic_load(&v->belief_until);
	cr_assert_lt(
	    hung_until, succ_start,
	    "beliefs overlap: the hung client believed until %lld, the successor from %lld",
	    (long long)hung_until, (long long)succ_start);
	cr_assert_gt(pgcoord_lease_epoch(succ, LEASE), atomic_load(&v->epoch));
	cr_log_info("hung at %+lld ms; its belief ended at %+lld, the successor's began at %+lld",
		    0LL, (long long)(hung_until - stopped), (long long)(succ_start - stopped));
	/* not before keepalive_ms without a keepalive, nor much after the lapse */
	cr_assert_geq(succ_start - stopped, KEEPALIVE_MS - 400, "took over after %lld ms",
		      (long long)(succ_start - stopped));
	cr_assert_lt(succ_start - stopped, KEEPALIVE_MS + LEASE_TTL_MS + 2000,
		     "took over only after %lld ms", (long long)(succ_start - stopped));

	/* the lease lapsed: never handed back by the hung session */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.lease_events WHERE name = '%s' "
				    "AND session = %lld AND event = 'released'",
				    LEASE, (long long)hung_session),
		     0, "the hung client's lease was handed back while it could still believe");
	/* the session expires, the janitor closes it; permits follow on_owner_loss */
	cr_assert(iwait_sql(db, 15000,
			    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND closed_at "
			    "IS NOT NULL",
			    (long long)hung_session),
		  "the lost session was never closed");
	cr_assert(iwait_sql(db, 15000,
			    "SELECT count(*) FROM pgcoord.permits WHERE id = 'ka-remote' AND "
			    "state = 'uncertain'"),
		  "the lost session's permit was not marked uncertain");
	cr_assert(iwait_sql(db, 15000,
			    "SELECT count(*) FROM pgcoord.permits WHERE id = 'ka-inproc' AND "
			    "state = 'released'"),
		  "the lost session's release-on-loss permit was not released");
	const char *log = hagent_log(a);
	cr_assert(strstr(log, "session lost: keepalive missed"), "%s", log);

	/* woken up, the client learns it: no renewal it reads now extends its
	 * belief into the successor's, and its next keepalive is refused */
	cr_assert_eq(kill(child, SIGCONT), 0);
	int64_t deadline = hnow_ms() + 5000;
	while ((!atomic_load(&v->lost) || !atomic_load(&v->keepalive_err)) && hnow_ms() < deadline)
		hsleep_ms(20);
	cr_assert(atomic_load(&v->lost), "the hung client never read session.lost");
	cr_assert_str_eq(v->lost_reason, "keepalive missed");
	cr_assert_eq(atomic_load(&v->keepalive_err), PGCOORD_E_SESSION_EXPIRED);
	cr_assert_lt(atomic_load(&v->belief_until), succ_start,
		     "the woken client believed into the successor's term");
	cr_assert(pgcoord_lease_is_leader(succ, LEASE));

	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	munmap(v, sizeof(*v));
	pgcoord_close(succ);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- the parameter and the replies ---------------------------------------- */

static void open_with(int fd, msgpack_object_type type, int64_t value, struct ireply *r)
{
	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "name", "ka-bad");
	pgc_pack_cstr(pk, "keepalive_ms");
	if (type == MSGPACK_OBJECT_STR)
		pgc_pack_cstr(pk, "2000");
	else if (type == MSGPACK_OBJECT_FLOAT64)
		msgpack_pack_double(pk, 2000.5);
	else
		msgpack_pack_int64(pk, value);
	icall(fd, "session.open", &p, r);
	iparams_destroy(&p);
}

Test(keepalive, bad_keepalive_ms_is_invalid_params_and_opens_nothing)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ka-bad", NULL);
	int fd = iconnect(hagent_socket(a));
	static const int64_t bad[] = {-1, 1, 99, 600001, INT64_MAX};
	const char *const mentions[] = {"keepalive_ms", NULL};
	struct ireply r;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		open_with(fd, MSGPACK_OBJECT_POSITIVE_INTEGER, bad[i], &r);
		ierr(&r, "invalid_params", false, mentions);
		ireply_destroy(&r);
	}
	open_with(fd, MSGPACK_OBJECT_STR, 0, &r);
	ierr(&r, "invalid_params", false, mentions);
	ireply_destroy(&r);
	open_with(fd, MSGPACK_OBJECT_FLOAT64, 0, &r);
	ierr(&r, "invalid_params", false, mentions);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE name = "
					"'ka-bad'"),
		     0, "a refused open left a session");

	/* the same connection still opens one, at the bounds */
	open_with(fd, MSGPACK_OBJECT_POSITIVE_INTEGER, 100, &r);
	const msgpack_object *res = iok(&r, "keepalive_ms 100");
	cr_assert_eq(iint(res, "keepalive_ms"), 100);
	ireply_destroy(&r);
	res = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(res, "keepalive_ms"), 100);
	cr_assert(iint(res, "next_due_ms") > 0 && iint(res, "next_due_ms") <= 100, "%lld",
		  (long long)iint(res, "next_due_ms"));
	ireply_destroy(&r);
	close(fd);

	/* without keepalive_ms: nothing enforced, and the replies say so */
	fd = iconnect(hagent_socket(a));
	isession_open(fd, "ka-none");
	res = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(res, "keepalive_ms"), 0);
	cr_assert_eq(iint(res, "next_due_ms"), 0);
	ireply_destroy(&r);
	close(fd);

	/* the client library checks the bounds before sending */
	pgcoord *c = NULL;
	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_set_session_keepalive(c, 99), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_set_session_keepalive(c, 600001), PGCOORD_E_ARG);
	pgcoord_close(c);

	hagent_destroy(a);
	hdb_drop(db);
}

/* Reads from fd until a session.lost notification; its reason (malloc'd),
 * or NULL after timeout_ms. */
static char *wait_lost(int fd, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	while (hnow_ms() < deadline) {
		msgpack_unpacked u;
		struct pgc_message m;
		char err[128];
		char *reason = NULL;
		msgpack_unpacked_init(&u);
		if (hraw_recv_msg(fd, 100, &u) != HRAW_MSG) {
			msgpack_unpacked_destroy(&u);
			continue;
		}
		if (pgc_parse_message(&u.data, &m, err, sizeof(err)) && m.type == PGC_RPC_NOTIFY &&
		    m.method_len == 12 && memcmp(m.method, "session.lost", 12) == 0 && m.params)
			reason = istr(m.params, "reason");
		msgpack_unpacked_destroy(&u);
		if (reason)
			return reason;
	}
	return NULL;
}

/*
 * A missed keepalive is noticed by the agent's own timer (no call needed),
 * answered session_expired from then on; the clock runs on while the
 * connection is gone, so a resume after the deadline finds nothing.
 */
Test(keepalive, a_missed_keepalive_loses_the_session_attached_or_not)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ka-miss", NULL); /* grace 10 s */
	int fd = iconnect(hagent_socket(a));
	struct iparams p;
	struct ireply r;
	const char *const mentions[] = {NULL};

	msgpack_packer *pk = iparams_begin(&p, 1);
	pgc_pack_kv_int(pk, "keepalive_ms", 300);
	int64_t opened = hnow_ms();
	int64_t id = iint(icall_ok(fd, "session.open", &p, &r), "session");
	ireply_destroy(&r);
	iparams_destroy(&p);
	char *reason = wait_lost(fd, 3000);
	cr_assert_not_null(reason, "no session.lost after a missed keepalive");
	cr_assert_str_eq(reason, "keepalive missed");
	free(reason);
	cr_assert_geq(hnow_ms() - opened, 300);
	icall(fd, "session.keepalive", NULL, &r);
	ierr(&r, "session_expired", false, mentions);
	ireply_destroy(&r);
	close(fd);

	/* detached: the resume within the grace but after the deadline fails */
	fd = iconnect(hagent_socket(a));
	pk = iparams_begin(&p, 1);
	pgc_pack_kv_int(pk, "keepalive_ms", 500);
	int64_t id2 = iint(icall_ok(fd, "session.open", &p, &r), "session");
	ireply_destroy(&r);
	iparams_destroy(&p);
	close(fd);
	hsleep_ms(1000);
	fd = iconnect(hagent_socket(a));
	pk = iparams_begin(&p, 1);
	pgc_pack_kv_int(pk, "resume", id2);
	icall(fd, "session.open", &p, &r);
	ierr(&r, "session_expired", false, mentions);
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* ...while a resume in time keeps the session and its clock */
	pk = iparams_begin(&p, 1);
	pgc_pack_kv_int(pk, "keepalive_ms", 1500);
	int64_t id3 = iint(icall_ok(fd, "session.open", &p, &r), "session");
	ireply_destroy(&r);
	iparams_destroy(&p);
	close(fd);
	hsleep_ms(300);
	fd = iconnect(hagent_socket(a));
	pk = iparams_begin(&p, 1);
	pgc_pack_kv_int(pk, "resume", id3);
	const msgpack_object *res = icall_ok(fd, "session.open", &p, &r);
	cr_assert_eq(iint(res, "keepalive_ms"), 1500);
	ireply_destroy(&r);
	iparams_destroy(&p);
	res = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(res, "session"), id3);
	ireply_destroy(&r);
	close(fd);

	/* both lost sessions stop being renewed: their rows expire */
	cr_assert(
	    iwait_sql(
		db, 30000,
		"SELECT (count(*) = 2)::int FROM pgcoord.session_liveness WHERE id IN (%lld, %lld) "
		"AND (closed_at IS NOT NULL OR expires_at < now())",
		(long long)id, (long long)id2),
	    "a lost session is still renewed");
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND "
			   "closed_at IS NULL AND expires_at > now()",
			   (long long)id3),
	    1);
	/* the missed one lapsed at its pinned expiry: no later than its
	 * keepalive deadline plus one ttl (10 s) and a beat (1 s) */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND "
				    "expires_at IS NOT NULL AND expires_at > opened_at AND "
				    "expires_at <= opened_at + interval '11300 ms'",
				    (long long)id),
		     1, "the session of a missed keepalive was not pinned to its last expiry");
	const char *log = hagent_log(a);
	cr_assert(strstr(log, "no session.keepalive for"), "%s", log);

	hagent_destroy(a);
	hdb_drop(db);
}
