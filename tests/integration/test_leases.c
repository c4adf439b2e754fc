/*
 * test_leases.c — leadership leases (DESIGN.md guarantee 7), the janitor
 * election and failover, with real agents, asserting on pgcoord.leases and
 * pgcoord.lease_events as well as on replies and notifications. The tests
 * that stop the database are in test_leases_outage.c (one Criterion job).
 *
 * Beliefs are judged from the client's side: a client believes it leads
 * from the lease.changed leader=true it receives until the earlier of
 * lease.changed leader=false and its own deadline, the receipt time of the
 * last lease.changed/lease.renewed plus its valid_ms, on this process's
 * monotonic clock (the agents' clock too: same host).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "lease_client.h"
#include "proto/codec.h"

TestSuite(leases, .timeout = 240);

#define TTL_MS 1500   /* client leases: renewed every 500 ms, believed 1000 ms ahead */
#define RETRY_MS 1000 /* the agents' default lease_retry_ms */

static struct harness_db *lease_db(void)
{
	struct harness_db *db = hdb_create();

	hdb_migrate(db);
	return db;
}

static void lc_init(struct lclient *lc, const char *label)
{
	memset(lc, 0, sizeof(*lc));
	snprintf(lc->label, sizeof(lc->label), "%s", label);
}

static long row_holder(struct harness_db *db, const char *name)
{
	return hdb_query_long(db,
			      "SELECT coalesce(holder_session, 0) FROM pgcoord.leases "
			      "WHERE name = '%s'",
			      name);
}

static long row_epoch(struct harness_db *db, const char *name)
{
	return hdb_query_long(db, "SELECT epoch FROM pgcoord.leases WHERE name = '%s'", name);
}

static long events(struct harness_db *db, const char *name, const char *event, int64_t session,
		   int64_t epoch)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pgcoord.lease_events WHERE name = '%s' "
			      "AND event = '%s' AND session = %lld AND epoch = %lld",
			      name, event, (long long)session, (long long)epoch);
}

/* Every acquired epoch of name is unique and they increase with the event
 * id (the order of the commits that wrote them). */
static void assert_events_consistent(struct harness_db *db, const char *name)
{
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) - count(DISTINCT epoch) FROM pgcoord.lease_events "
			   "WHERE name = '%s' AND event = 'acquired'",
			   name),
	    0, "an epoch of %s was acquired twice", name);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM (SELECT epoch, lag(epoch) OVER (ORDER BY "
				    "id) AS prev FROM pgcoord.lease_events WHERE name = '%s' AND "
				    "event = 'acquired') e WHERE e.prev >= e.epoch",
				    name),
		     0, "acquired epochs of %s do not increase with the event id", name);
	/* the row carries the newest epoch */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.leases l WHERE l.name = '%s' AND "
				    "l.epoch <> (SELECT max(epoch) FROM pgcoord.lease_events e "
				    "WHERE e.name = l.name AND e.event = 'acquired')",
				    name),
		     0, "the row of %s does not carry the newest acquired epoch", name);
}

/* --- calls and their replies ------------------------------------------- */

Test(leases, status_describes_a_lease_the_caller_does_not_hold)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "status-a", NULL);
	struct hagent *b = hagent_start(db, "status-b", NULL);
	struct lclient holder, other;
	struct lreply r;

	lc_init(&holder, "holder");
	lc_init(&other, "other");
	lc_open_ok(&holder, a, "holder");
	lc_open_ok(&other, b, "other");

	lc_acquire_ok(&holder, "status-me", 5000, false, &r);
	cr_assert(r.leader);
	cr_assert_eq(r.ttl_ms, 5000);
	int64_t epoch = r.epoch;

	lc_status_ok(&other, "status-me", false, &r);
	cr_assert_eq(r.epoch, epoch);
	cr_assert(r.has_holder);
	cr_assert_eq(r.holder_session, holder.session);
	cr_assert_str_eq(r.holder_replica, "status-a");
	cr_assert_not(r.leader, "a caller that does not hold the lease is told it leads");
	cr_assert_eq(r.valid_ms, 0);
	cr_assert_eq(r.ttl_ms, 5000);
	cr_assert(r.expires_in_ms > 0 && r.expires_in_ms <= 5000, "expires_in_ms %lld",
		  (long long)r.expires_in_ms);

	/* the holder's own view carries its belief */
	lc_status_ok(&holder, "status-me", false, &r);
	cr_assert(r.leader);
	cr_assert(r.valid_ms > 0 && r.valid_ms <= 5000 - 5000 / 3, "valid_ms %lld",
		  (long long)r.valid_ms);

	/* one attempt without wait changes nothing */
	lc_acquire_ok(&other, "status-me", 5000, false, &r);
	cr_assert_not(r.leader);
	cr_assert_not(r.campaigning);
	cr_assert_eq(r.holder_session, holder.session);
	cr_assert_eq(row_holder(db, "status-me"), holder.session);
	cr_assert_eq(row_epoch(db, "status-me"), epoch);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.lease_events WHERE session "
				    "= %lld",
				    (long long)other.session),
		     0);

	cr_assert_eq(lc_status(&other, "never-acquired", false, NULL), PGCOORD_E_NOT_FOUND);

	lc_close(&holder);
	lc_close(&other);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

Test(leases, watch_tells_the_watcher_when_the_holder_changes)
{
	const char *const fast[] = {"--lease-retry-ms", "200", NULL};
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "watch-a", fast);
	struct hagent *b = hagent_start(db, "watch-b", fast);
	struct lclient first, second, watcher;
	struct lreply r;
	struct lnote n;

	lc_init(&first, "first");
	lc_init(&second, "second");
	lc_init(&watcher, "watcher");
	lc_open_ok(&first, a, "first");
	lc_open_ok(&second, b, "second");
	lc_open_ok(&watcher, b, "watcher");

	lc_acquire_ok(&first, "watched", TTL_MS, true, &r);
	cr_assert(r.leader);
	int64_t first_epoch = r.epoch;
	lc_status_ok(&watcher, "watched", true, &r);
	cr_assert_eq(r.holder_session, first.session);
	lc_acquire_ok(&second, "watched", TTL_MS, true, &r);
	cr_assert_not(r.leader);
	cr_assert(r.campaigning);

	/* let the watch poll prime itself on the current holder */
	cr_assert_not(lc_wait(&watcher, "lease.changed", -1, 500, NULL),
		      "a watch reported a change that did not happen");

	cr_assert(lc_release_ok(&first, "watched"));
	n = lc_expect(&second, "lease.changed", 1, 3000, "the campaigner takes the free lease");
	int64_t second_epoch = n.epoch;
	cr_assert_gt(second_epoch, first_epoch);

	/* the watcher may first see the lease free; then it sees the new holder */
	bool seen = false;
	int64_t until = hnow_ms() + 3000;
	while (!seen && hnow_ms() < until) {
		if (!lc_wait(&watcher, "lease.changed", -1, 200, &n))
			continue;
		cr_assert_str_eq(n.name, "watched");
		cr_assert_not(n.leader, "the watcher does not lead");
		cr_assert_eq(n.session, watcher.session);
		seen = n.has_holder && n.holder_session == second.session;
		if (seen) {
			cr_assert_eq(n.epoch, second_epoch);
			cr_assert_str_eq(n.holder_replica, "watch-b");
		}
	}
	cr_assert(seen, "the watcher never heard of the new holder");
	cr_assert_eq(row_holder(db, "watched"), second.session);
	cr_assert_eq(events(db, "watched", "acquired", second.session, second_epoch), 1);

	lc_close(&first);
	lc_close(&second);
	lc_close(&watcher);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

Test(leases, release_hands_the_lease_back_at_once)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "release-a", NULL);
	struct lclient holder, next;
	struct lreply r;

	lc_init(&holder, "holder");
	lc_init(&next, "next");
	lc_open_ok(&holder, a, "holder");
	lc_open_ok(&next, a, "next");

	lc_acquire_ok(&holder, "handed-back", 10000, false, &r);
	cr_assert(r.leader);
	int64_t epoch = r.epoch;
	lc_expect(&holder, "lease.changed", 1, 1000, "belief starts");

	cr_assert(lc_release_ok(&holder, "handed-back"));
	/* no waiting: the row is free the moment the reply arrives */
	cr_assert_eq(row_holder(db, "handed-back"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = "
					"'handed-back' AND expires_at <= now()"),
		     1);
	char *last = hdb_query_value(db, "SELECT event || ' ' || session || ' ' || epoch FROM "
					 "pgcoord.lease_events WHERE name = 'handed-back' ORDER BY "
					 "id DESC LIMIT 1");
	char want[96];
	snprintf(want, sizeof(want), "released %lld %lld", (long long)holder.session,
		 (long long)epoch);
	cr_assert_str_eq(last, want);
	free(last);
	struct lnote n = lc_expect(&holder, "lease.changed", 0, 1000, "belief ends on release");
	cr_assert_eq(n.epoch, epoch);

	cr_assert_not(lc_release_ok(&holder, "handed-back"), "a second release released again");

	/* a ttl of 10 s did not have to run out */
	lc_acquire_ok(&next, "handed-back", 10000, false, &r);
	cr_assert(r.leader);
	cr_assert_gt(r.epoch, epoch);
	cr_assert_eq(events(db, "handed-back", "acquired", next.session, r.epoch), 1);
	assert_events_consistent(db, "handed-back");

	lc_close(&holder);
	lc_close(&next);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(leases, closing_a_session_hands_its_leases_back)
{
	const char *const fast[] = {"--lease-retry-ms", "200", NULL};
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "close-a", fast);
	struct hagent *b = hagent_start(db, "close-b", fast);
	struct lclient holder, waiter;
	struct lreply r;

	lc_init(&holder, "holder");
	lc_init(&waiter, "waiter");
	lc_open_ok(&holder, a, "holder");
	lc_open_ok(&waiter, b, "waiter");

	lc_acquire_ok(&holder, "close-one", 10000, false, &r);
	int64_t epoch_one = r.epoch;
	lc_acquire_ok(&holder, "close-two", 10000, false, &r);
	int64_t epoch_two = r.epoch;
	cr_assert(r.leader);
	lc_acquire_ok(&waiter, "close-one", 10000, true, &r);
	cr_assert(r.campaigning);

	int64_t session = holder.session;
	cr_assert_eq(lc_session_close(&holder), PGCOORD_OK, "%s", pgcoord_last_message(holder.c));
	cr_assert_eq(events(db, "close-one", "released", session, epoch_one), 1);
	cr_assert_eq(events(db, "close-two", "released", session, epoch_two), 1);
	cr_assert_eq(row_holder(db, "close-two"), 0);
	char *reason = hdb_query_value(db,
				       "SELECT close_reason FROM pgcoord.sessions WHERE id = %lld "
				       "AND closed_at IS NOT NULL",
				       (long long)session);
	cr_assert_str_eq(reason ? reason : "(open)", "closed by client");
	free(reason);
	/* both beliefs ended before the close was answered */
	cr_assert(lc_wait(&holder, "lease.changed", 0, 0, NULL));
	cr_assert(lc_wait(&holder, "lease.changed", 0, 0, NULL));

	/* the campaigner wins on its next try, not after the 10 s ttl */
	struct lnote n = lc_expect(&waiter, "lease.changed", 1, 2000, "the waiter takes over");
	cr_assert_gt(n.epoch, epoch_one);
	cr_assert_eq(row_holder(db, "close-one"), waiter.session);
	assert_events_consistent(db, "close-one");

	lc_close(&holder);
	lc_close(&waiter);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* Guarantee 7: a session that lapsed (nobody renewed it: its agent stopped
 * heartbeating, so nobody told its client) keeps its lease row until the
 * lease's own expires_at; the schema decides that by how the session ended
 * (pgcoord.session_end), not by its reason text. */
Test(leases, a_lapsed_session_keeps_its_lease_until_the_lease_expires)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "lapse-a", NULL);
	struct lclient holder;
	struct lreply r;

	lc_init(&holder, "holder");
	lc_open_ok(&holder, a, "holder");
	lc_acquire_ok(&holder, "lapse-one", 10000, false, &r);
	int64_t session = holder.session, epoch = r.epoch;

	/* the session lapses in the database, as when its agent froze */
	hdb_exec(db,
		 "UPDATE pgcoord.sessions SET expires_at = now() - interval '1 second' "
		 "WHERE id = %lld",
		 (long long)session);
	hdb_exec(db, "SELECT pgcoord.janitor_expire_sessions(100)");
	char *reason = hdb_query_value(db,
				       "SELECT close_reason FROM pgcoord.sessions WHERE id = %lld "
				       "AND closed_at IS NOT NULL",
				       (long long)session);
	cr_assert_str_eq(reason ? reason : "(open)", "expired");
	free(reason);
	cr_assert_eq(row_holder(db, "lapse-one"), session,
		     "the lapsed holder's lease was released");
	cr_assert_eq(events(db, "lapse-one", "released", session, epoch), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = "
					"'lapse-one' AND expires_at > now()"),
		     1, "the lease no longer runs to its own expiry");

	lc_close(&holder);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(leases, reserved_names_are_refused)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "reserved-a", NULL);
	struct lclient c;

	lc_init(&c, "client");
	lc_open_ok(&c, a, "client");
	const char *names[] = {"pgcoord.x", "pgcoord.janitor"};
	for (size_t i = 0; i < 2; i++) {
		cr_assert_eq(lc_acquire(&c, names[i], 5000, true, NULL), PGCOORD_E_INVALID_PARAMS,
			     "%s was not refused", names[i]);
		cr_assert(strstr(pgcoord_last_message(c.c), "reserved"), "message: %s",
			  pgcoord_last_message(c.c));
	}
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = "
					"'pgcoord.x'"),
		     0);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.lease_events WHERE session "
				    "= %lld",
				    (long long)c.session),
		     0);
	lc_close(&c);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * A renewal the agent sent before the client let go must not take the lease
 * back once the hand-back committed. The window is the renewal's round
 * trip; the test widens it by making pgcoord.session_lock_live, which
 * lease_acquire calls before it locks the lease row, sleep for the
 * holder's session (its own database: nothing else sees the change).
 */
static void slow_renewals_of(struct harness_db *db, int64_t session)
{
	hdb_exec(db,
		 "CREATE OR REPLACE FUNCTION pgcoord.session_lock_live(p_session bigint) "
		 "RETURNS boolean LANGUAGE plpgsql AS $$ "
		 "DECLARE v boolean; BEGIN "
		 "IF p_session = %lld THEN PERFORM pg_sleep(0.4); END IF; "
		 "PERFORM 1 FROM pgcoord.sessions s WHERE s.id = p_session AND "
		 "s.closed_at IS NULL AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv "
		 "WHERE lv.id = s.id) FOR SHARE OF s; "
		 "v := FOUND; RETURN v; END $$",
		 (long long)session);
}

static long renewals_sleeping(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
				  "current_database() AND state = 'active' AND wait_event = "
				  "'PgSleep' AND query LIKE '%%lease_acquire%%'");
}

/* Returns once a renewal of the holder is inside the widened window. */
static void await_renewal_in_flight(struct harness_db *db)
{
	int64_t until = hnow_ms() + 5000;

	while (renewals_sleeping(db) == 0 && hnow_ms() < until)
		hsleep_ms(5);
	cr_assert_gt(renewals_sleeping(db), 0, "no renewal came");
}

static void await_renewal_done(struct harness_db *db)
{
	int64_t until = hnow_ms() + 3000;

	while (renewals_sleeping(db) > 0 && hnow_ms() < until)
		hsleep_ms(5);
	hsleep_ms(100); /* its reply reaches the agent */
}

/* After the hand-back the row stays free and nothing re-acquired it. */
static void assert_stays_handed_back(struct harness_db *db, const char *name, int64_t session,
				     struct lclient *next)
{
	struct lreply r;

	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.lease_events a WHERE a.name = '%s' "
			   "AND a.event = 'acquired' AND a.session = %lld AND a.id > "
			   "(SELECT max(id) FROM pgcoord.lease_events r WHERE r.name = '%s' "
			   "AND r.event = 'released' AND r.session = %lld)",
			   name, (long long)session, name, (long long)session),
	    0,
	    "a renewal sent before the hand-back acquired the lease again for "
	    "session %lld",
	    (long long)session);
	cr_assert_eq(row_holder(db, name), 0);
	lc_acquire_ok(next, name, 3000, false, &r);
	cr_assert(r.leader, "the handed-back lease is held by session %lld",
		  (long long)r.holder_session);
}

Test(leases, a_renewal_in_flight_does_not_undo_a_release)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "race-release", NULL);
	struct lclient holder, next;
	struct lreply r;

	lc_init(&holder, "holder");
	lc_init(&next, "next");
	lc_open_ok(&holder, a, "holder");
	lc_open_ok(&next, a, "next");
	lc_acquire_ok(&holder, "racy", 3000, false, &r);
	cr_assert(r.leader);
	slow_renewals_of(db, holder.session);

	await_renewal_in_flight(db);
	cr_assert(lc_release_ok(&holder, "racy"));
	await_renewal_done(db);
	assert_stays_handed_back(db, "racy", holder.session, &next);

	lc_close(&holder);
	lc_close(&next);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(leases, a_renewal_in_flight_does_not_undo_a_session_close)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "race-close", NULL);
	struct lclient holder, next;
	struct lreply r;

	lc_init(&holder, "holder");
	lc_init(&next, "next");
	lc_open_ok(&holder, a, "holder");
	lc_open_ok(&next, a, "next");
	lc_acquire_ok(&holder, "racy", 3000, false, &r);
	cr_assert(r.leader);
	int64_t session = holder.session;
	slow_renewals_of(db, session);

	await_renewal_in_flight(db);
	cr_assert_eq(lc_session_close(&holder), PGCOORD_OK, "%s", pgcoord_last_message(holder.c));
	await_renewal_done(db);
	assert_stays_handed_back(db, "racy", session, &next);

	lc_close(&holder);
	lc_close(&next);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A packed params map {name, ttl_ms (unless 0)} for the raw socket. */
static void pack_name(msgpack_sbuffer *sb, const char *name, int ttl_ms)
{
	msgpack_packer pk;

	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, ttl_ms ? 2 : 1);
	pgc_pack_kv_str(&pk, "name", name);
	if (ttl_ms)
		pgc_pack_kv_int(&pk, "ttl_ms", ttl_ms);
}

/* Reads until the responses to msgids first..last (in any order) arrived;
 * values[i] is the result's boolean `keys[i]`. Fails the test on an error
 * reply. */
static void raw_results(int fd, uint32_t first, uint32_t last, const char *const *keys,
			bool *values)
{
	msgpack_unpacked u;
	struct pgc_message m;
	char err[128];
	unsigned missing = last - first + 1;

	msgpack_unpacked_init(&u);
	while (missing > 0) {
		cr_assert_eq(hraw_recv_msg(fd, 5000, &u), HRAW_MSG, "responses missing");
		cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
		if (m.type != PGC_RPC_RESPONSE || m.msgid < first || m.msgid > last)
			continue;
		cr_assert_null(m.error, "request %u failed", m.msgid);
		cr_assert(pgc_obj_bool(pgc_map_get(m.result, keys[m.msgid - first]),
				       &values[m.msgid - first]));
		missing--;
	}
	msgpack_unpacked_destroy(&u);
}

/*
 * MessagePack-RPC lets a client pipeline: lease.release and a new
 * lease.acquire sent back to back. The agent runs them on different pool
 * connections; if the acquire (a renewal, as the session still holds the
 * row) ran first and the release second, the agent would believe in a lease
 * the database had just freed for anyone. The test makes the release slow
 * so that order is certain if the agent does not keep it.
 */
Test(leases, pipelined_release_and_acquire_keep_their_order)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "pipeline-a", NULL);
	int fd = hraw_connect(hagent_socket(a));
	const char *const leader_key[] = {"leader"};
	const char *const keys[] = {"released", "leader"};
	msgpack_unpacked u;
	msgpack_sbuffer sb;
	bool v[2];

	cr_assert_geq(fd, 0);
	msgpack_unpacked_init(&u);
	cr_assert_eq(hraw_call(fd, 1, "session.open", NULL, 0, 5000, &u), HRAW_MSG);
	msgpack_unpacked_destroy(&u);
	pack_name(&sb, "piped", 3000);
	cr_assert(hraw_send_request(fd, 2, "lease.acquire", sb.data, sb.size));
	msgpack_sbuffer_destroy(&sb);
	raw_results(fd, 2, 2, leader_key, v);
	cr_assert(v[0]);

	hdb_exec(db, "ALTER FUNCTION pgcoord.lease_release(text, bigint, text) "
		     "RENAME TO lease_release_now");
	hdb_exec(db, "CREATE FUNCTION pgcoord.lease_release(p_name text, p_session bigint, "
		     "p_reason text) RETURNS pgcoord.lease_hand_back LANGUAGE plpgsql AS $$ "
		     "BEGIN PERFORM pg_sleep(0.3); RETURN "
		     "pgcoord.lease_release_now(p_name, p_session, p_reason); END $$");

	/* one write: the agent sees both before it answers either */
	msgpack_sbuffer both;
	msgpack_packer pk;
	msgpack_sbuffer_init(&both);
	msgpack_packer_init(&pk, &both, msgpack_sbuffer_write);
	pgc_pack_request_begin(&pk, 3, "lease.release");
	msgpack_pack_map(&pk, 1);
	pgc_pack_kv_str(&pk, "name", "piped");
	pgc_pack_request_begin(&pk, 4, "lease.acquire");
	msgpack_pack_map(&pk, 2);
	pgc_pack_kv_str(&pk, "name", "piped");
	pgc_pack_kv_int(&pk, "ttl_ms", 3000);
	cr_assert(hraw_send(fd, both.data, both.size));
	msgpack_sbuffer_destroy(&both);
	raw_results(fd, 3, 4, keys, v);
	cr_assert(v[0], "the release released nothing");
	bool leader = v[1];

	/* whatever the agent answered, its belief and the row agree */
	pack_name(&sb, "piped", 0);
	cr_assert(hraw_send_request(fd, 5, "lease.status", sb.data, sb.size));
	msgpack_sbuffer_destroy(&sb);
	raw_results(fd, 5, 5, leader_key, v);
	long held =
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = 'piped' AND "
			       "holder_session IS NOT NULL AND expires_at > now()");
	cr_assert(!v[0] || held == 1,
		  "the agent believes it leads (the acquire answered leader=%d) a lease the "
		  "database freed",
		  leader);
	cr_assert_eq(leader, held == 1);

	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- failover ------------------------------------------------------------ */

/* Two agents; `leader` (on the first) leads `name`, `follower` (on the
 * second) campaigns. Returns the leader's epoch. */
static int64_t leader_and_follower_ttl(struct hagent *a, struct hagent *b, const char *name,
				       int ttl_ms, struct lclient *leader, struct lclient *follower)
{
	struct lreply r;

	lc_init(leader, "leader");
	lc_init(follower, "follower");
	lc_open_ok(leader, a, "leader");
	lc_open_ok(follower, b, "follower");
	lc_acquire_ok(leader, name, ttl_ms, true, &r);
	cr_assert(r.leader, "the first campaigner did not win a free lease");
	lc_expect(leader, "lease.changed", 1, 1000, "belief starts");
	lc_acquire_ok(follower, name, ttl_ms, true, &r);
	cr_assert_not(r.leader);
	cr_assert(r.campaigning);
	return r.epoch;
}

static int64_t leader_and_follower(struct hagent *a, struct hagent *b, const char *name,
				   struct lclient *leader, struct lclient *follower)
{
	return leader_and_follower_ttl(a, b, name, TTL_MS, leader, follower);
}

/*
 * SIGSTOP freezes the leader's agent past its ttl. Its client, which keeps
 * running, must see its own deadline pass before anyone else is told it
 * leads; after SIGCONT the agent must not claim the lease back.
 */
/* The frozen-leader case for a lease of ttl_ms on agents started with
 * args; attached: the lease rides the beats and lives on its agent's row
 * (0019), checked before the freeze. */
static void frozen_leader_case(const char *name, int ttl_ms, const char *const *args, bool attached)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, attached ? "frozen-att-a" : "frozen-a", args);
	struct hagent *b = hagent_start(db, attached ? "frozen-att-b" : "frozen-b", args);
	struct lclient leader, follower;
	struct lnote n;

	int64_t epoch = leader_and_follower_ttl(a, b, name, ttl_ms, &leader, &follower);
	/* a fresh renewal: the deadline the client holds at the freeze */
	n = lc_expect(&leader, "lease.renewed", 1, 2000, "renewal");
	if (attached)
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM pgcoord.lease_rows WHERE name = "
					    "'%s' AND expires_at IS NULL",
					    name),
			     1, "the renewed lease is not attached to its agent's row");
	int64_t deadline = n.at_ms + n.valid_ms;

	hagent_kill(a, SIGSTOP);
	int64_t stopped = hnow_ms();
	/* drain what the agent sent before it froze */
	while (lc_wait(&leader, "lease.renewed", 1, 20, &n))
		deadline = n.at_ms + n.valid_ms;
	n = lc_expect(&follower, "lease.changed", 1, ttl_ms + 3000, "successor after the freeze");
	int64_t successor = n.at_ms, successor_epoch = n.epoch;
	fprintf(stderr,
		"frozen leader (%s): client deadline %+lld ms after SIGSTOP, successor leads at "
		"%+lld ms (%lld ms after the old leader's deadline)\n",
		name, (long long)(deadline - stopped), (long long)(successor - stopped),
		(long long)(successor - deadline));
	cr_assert_lt(deadline, successor,
		     "the frozen leader's client still believed (until %+lld ms) when the "
		     "successor was told it leads (%+lld ms)",
		     (long long)(deadline - stopped), (long long)(successor - stopped));
	cr_assert_gt(successor_epoch, epoch);

	hagent_kill(a, SIGCONT);
	n = lc_expect(&leader, "lease.changed", 0, 3000, "the thawed agent ends its belief");
	cr_assert_eq(n.epoch, epoch, "belief of which epoch ended? %lld", (long long)n.epoch);
	/* it keeps campaigning but never wins while the successor renews */
	cr_assert_not(lc_wait(&leader, "lease.changed", 1, 2000, &n),
		      "the thawed agent claimed the lease again (epoch %lld)", (long long)n.epoch);
	cr_assert_not(lc_wait(&leader, "lease.renewed", -1, 0, NULL));
	struct lreply r;
	lc_status_ok(&leader, name, false, &r);
	cr_assert_not(r.leader);
	cr_assert_eq(r.holder_session, follower.session);
	cr_assert_eq(row_holder(db, name), follower.session);
	cr_assert_eq(row_epoch(db, name), successor_epoch);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.lease_events WHERE name = '%s' "
				    "AND event = 'acquired' AND session = %lld",
				    name, (long long)leader.session),
		     1, "the old holder acquired the lease again");
	cr_assert_eq(events(db, name, "expired", leader.session, epoch), 1);
	assert_events_consistent(db, name);

	lc_close(&leader);
	lc_close(&follower);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

Test(leases, frozen_leader_loses_belief_before_a_successor_leads)
{
	/* an eager successor makes the race as tight as it gets */
	const char *const eager[] = {"--lease-retry-ms", "50", NULL};
	frozen_leader_case("frozen", TTL_MS, eager, false);
}

/* The same with a lease that lives on its agent's row: the row's expiry is
 * the frozen agent's last beat + ttl, and nobody leads before the frozen
 * leader's client stopped believing. */
Test(leases, frozen_leader_of_an_attached_lease_loses_belief_before_a_successor_leads)
{
	const char *const eager[] = {"--lease-retry-ms",
				     "50",
				     "--heartbeat-interval-ms",
				     "200",
				     "--session-ttl-ms",
				     "3000",
				     NULL};
	frozen_leader_case("frozen-attached", 3000, eager, true);
}

/* A crashed leader's lease lapses by its ttl; the campaigner then wins on
 * its next try. No janitor is involved: the lease row's own expiry decides. */
Test(leases, kill9_of_the_leaders_agent_fails_over_within_ttl_and_a_retry)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "crash-a", NULL);
	struct hagent *b = hagent_start(db, "crash-b", NULL);
	struct lclient leader, follower;

	int64_t epoch = leader_and_follower(a, b, "crash", &leader, &follower);
	lc_expect(&leader, "lease.renewed", 1, 2000, "renewal");

	int64_t killed = hnow_ms();
	hagent_kill(a, SIGKILL);
	hagent_wait(a, -1);
	struct lnote n = lc_expect(&follower, "lease.changed", 1, TTL_MS + RETRY_MS + 3000,
				   "successor after kill -9");
	int64_t took = n.at_ms - killed;
	fprintf(stderr, "kill -9 failover: %lld ms (ttl %d + retry %d)\n", (long long)took, TTL_MS,
		RETRY_MS);
	cr_assert_leq(took, TTL_MS + RETRY_MS + 500, "failover after kill -9 took %lld ms",
		      (long long)took);
	cr_assert_gt(n.epoch, epoch);
	cr_assert_eq(row_holder(db, "crash"), follower.session);
	cr_assert_eq(events(db, "crash", "expired", leader.session, epoch), 1);
	cr_assert_eq(events(db, "crash", "acquired", follower.session, n.epoch), 1);
	assert_events_consistent(db, "crash");

	lc_close(&leader);
	lc_close(&follower);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/*
 * kill -9 of the agent whose lease lives on its row: the lease expires at
 * that agent's last beat + ttl, by the database clock, and not before: the
 * successor acquires no earlier than that and within a retry after it.
 */
Test(leases, kill9_of_an_attached_leases_agent_fails_over_at_its_last_beat_plus_ttl)
{
	const char *const args[] = {"--heartbeat-interval-ms",
				    "200",
				    "--session-ttl-ms",
				    "3000",
				    "--lease-retry-ms",
				    "100",
				    NULL};
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "crash-att-a", args);
	struct hagent *b = hagent_start(db, "crash-att-b", args);
	struct lclient leader, follower;

	int64_t epoch = leader_and_follower_ttl(a, b, "crash-attached", 3000, &leader, &follower);
	lc_expect(&leader, "lease.renewed", 1, 2000, "renewal");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_rows WHERE name = "
					"'crash-attached' AND expires_at IS NULL"),
		     1, "the renewed lease is not attached to its agent's row");

	hagent_kill(a, SIGKILL);
	hagent_wait(a, -1);
	struct lnote n =
	    lc_expect(&follower, "lease.changed", 1, 3000 + 3000, "successor after kill -9");
	/* database times: the dead agent's last beat, the successor's
	 * acquisition */
	long gap = hdb_query_long(
	    db,
	    "SELECT (extract(epoch FROM e.at - a.heartbeat_at) * 1000)::bigint "
	    "FROM pgcoord.lease_events e, pgcoord.agents a WHERE e.name = 'crash-attached' "
	    "AND e.event = 'acquired' AND e.session = %lld AND a.replica_id = 'crash-att-a'",
	    (long long)follower.session);
	fprintf(stderr,
		"attached lease: the successor acquired %ld ms after the dead agent's "
		"last beat (ttl 3000, retry 100)\n",
		gap);
	cr_assert_geq(gap, 3000, "the lease was taken %ld ms after the holder's last beat", gap);
	cr_assert_leq(gap, 3000 + 100 + 1000, "failover took %ld ms after the last beat", gap);
	cr_assert_gt(n.epoch, epoch);
	cr_assert_eq(row_holder(db, "crash-attached"), follower.session);
	cr_assert_eq(events(db, "crash-attached", "expired", leader.session, epoch), 1);
	assert_events_consistent(db, "crash-attached");

	lc_close(&leader);
	lc_close(&follower);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* SIGTERM hands leases back: the campaigner wins on its next try. */
Test(leases, sigterm_of_the_leaders_agent_fails_over_within_a_retry)
{
	struct harness_db *db = lease_db();
	struct hagent *a = hagent_start(db, "term-a", NULL);
	struct hagent *b = hagent_start(db, "term-b", NULL);
	struct lclient leader, follower;

	int64_t epoch = leader_and_follower(a, b, "term", &leader, &follower);

	int64_t stopped = hnow_ms();
	cr_assert_eq(hagent_stop(a), 0, "log:\n%s", hagent_log(a));
	struct lnote n = lc_expect(&leader, "lease.changed", 0, 0, "belief ends on SIGTERM");
	cr_assert(strstr(n.reason, "shutting down"), "reason: %s", n.reason);
	n = lc_expect(&follower, "lease.changed", 1, 5000, "successor after SIGTERM");
	int64_t took = n.at_ms - stopped;
	fprintf(stderr, "SIGTERM failover: %lld ms (retry %d)\n", (long long)took, RETRY_MS);
	cr_assert_lt(took, 2500, "failover after SIGTERM took %lld ms", (long long)took);
	cr_assert_gt(n.epoch, epoch);
	cr_assert_eq(events(db, "term", "released", leader.session, epoch), 1);
	cr_assert_eq(row_holder(db, "term"), follower.session);
	assert_events_consistent(db, "term");

	lc_close(&leader);
	lc_close(&follower);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- the janitor --------------------------------------------------------- */

#define JANITOR_TTL 2000

/* Which of the agents say janitor=true; dead or silent ones count as not. */
static int janitors(struct hagent **agents, int n, int *which)
{
	int count = 0;

	for (int i = 0; i < n; i++) {
		bool j = false;

		if (agents[i] && lc_agent_status_try(agents[i], "janitor", 1000, &j) && j) {
			count++;
			*which = i;
		}
	}
	return count;
}

Test(leases, janitor_is_one_agent_and_survives_its_death)
{
	const char *const args[] = {"--lease-ttl-ms",
				    "2000",
				    "--session-ttl-ms",
				    "3000",
				    "--heartbeat-interval-ms",
				    "500",
				    "--janitor-interval-ms",
				    "200",
				    NULL};
	struct harness_db *db = lease_db();
	struct hagent *agents[3];
	const char *ids[3] = {"janitor-a", "janitor-b", "janitor-c"};
	int j = -1;

	for (int i = 0; i < 3; i++)
		agents[i] = hagent_start(db, ids[i], args);
	int64_t until = hnow_ms() + JANITOR_TTL + 2 * RETRY_MS;
	while (janitors(agents, 3, &j) != 1 && hnow_ms() < until)
		hsleep_ms(50);
	/* exactly one, and it stays so */
	for (int round = 0; round < 10; round++) {
		cr_assert_eq(janitors(agents, 3, &j), 1, "janitors at round %d", round);
		hsleep_ms(50);
	}
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.leases l JOIN pgcoord.sessions s "
				    "ON s.id = l.holder_session WHERE l.name = 'pgcoord.janitor' "
				    "AND l.holder_replica = '%s' AND s.replica_id = '%s' AND "
				    "s.name = 'pgcoord-agent' AND s.closed_at IS NULL AND "
				    "l.expires_at > now()",
				    ids[j], ids[j]),
		     1, "the janitor lease is not held by %s's own session", ids[j]);

	/* a client session on the janitor's agent, to be expired by the next one */
	struct lclient victim;
	lc_init(&victim, "victim");
	lc_open_ok(&victim, agents[j], "victim");
	char *inc = hdb_query_value(db,
				    "SELECT incarnation FROM pgcoord.agents WHERE replica_id = "
				    "'%s'",
				    ids[j]);

	int64_t killed = hnow_ms();
	hagent_kill(agents[j], SIGKILL);
	hagent_wait(agents[j], -1);
	hagent_destroy(agents[j]);
	agents[j] = NULL;
	int dead = j, successor = -1, most = 0;
	until = killed + JANITOR_TTL + RETRY_MS + 3000;
	for (;;) {
		int n = janitors(agents, 3, &successor);
		most = n > most ? n : most;
		if (n == 1 || hnow_ms() > until)
			break;
		hsleep_ms(20);
	}
	int64_t took = hnow_ms() - killed;
	fprintf(stderr, "janitor failover after kill -9: %lld ms (lease ttl %d + retry %d)\n",
		(long long)took, JANITOR_TTL, RETRY_MS);
	cr_assert_eq(most, 1, "no successor janitor, or more than one");
	cr_assert_neq(successor, dead);
	cr_assert_leq(took, JANITOR_TTL + RETRY_MS + 700, "janitor failover took %lld ms",
		      (long long)took);

	/* the successor closes the dead agent's sessions once they lapse */
	until = hnow_ms() + 3000 + 3000;
	long open = 1;
	while (hnow_ms() < until &&
	       (open = hdb_query_long(db,
				      "SELECT count(*) FROM pgcoord.sessions WHERE replica_id = "
				      "'%s' AND closed_at IS NULL",
				      ids[dead])) > 0)
		hsleep_ms(100);
	cr_assert_eq(open, 0, "the dead agent's sessions were not closed");
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE replica_id = '%s' "
			   "AND incarnation = %s AND id = %lld AND close_reason = 'expired'",
			   ids[dead], inc, (long long)victim.session),
	    1, "the client session of the dead agent was not expired by the janitor");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE replica_id = '%s' "
				    "AND incarnation = %s AND close_reason IS DISTINCT FROM "
				    "'expired'",
				    ids[dead], inc),
		     0);
	cr_assert_eq(janitors(agents, 3, &j), 1);
	cr_assert_eq(j, successor);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.leases WHERE name = "
				    "'pgcoord.janitor' AND holder_replica = '%s'",
				    ids[successor]),
		     1);
	assert_events_consistent(db, "pgcoord.janitor");

	free(inc);
	lc_close(&victim);
	for (int i = 0; i < 3; i++)
		hagent_destroy(agents[i]);
	hdb_drop(db);
}

/* Calls of pgcoord.lease_acquire the server has counted, by every backend
 * (the database has track_functions on). */
static long acquire_calls(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
				  "WHERE schemaname = 'pgcoord' AND funcname = 'lease_acquire'");
}

/*
 * Candidates for the janitor lease learn from each lost campaign when the
 * holder's row expires (by the database clock) and try again then, not every
 * lease_retry_ms: with a retry of 100 ms two candidates would call
 * lease_acquire 20 times a second; here they call it about once per expiry.
 * When the janitor is killed, its successor still leads within the lease's
 * ttl and the jitter (a quarter of lease_retry_ms).
 */
Test(leases, janitor_candidates_campaign_at_the_holders_expiry_not_every_retry)
{
	const char *const args[] = {"--lease-ttl-ms",
				    "3000",
				    "--lease-retry-ms",
				    "100",
				    "--janitor-interval-ms",
				    "200",
				    NULL};
	struct harness_db *db = lease_db();
	struct hagent *agents[3];
	const char *ids[3] = {"expiry-a", "expiry-b", "expiry-c"};
	int j = -1;

	hdb_exec(db, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %%I SET track_functions = "
		     "''all''', current_database()); END $$");
	for (int i = 0; i < 3; i++)
		agents[i] = hagent_start(db, ids[i], args);
	int64_t until = hnow_ms() + 3000 + 2000;
	while (janitors(agents, 3, &j) != 1 && hnow_ms() < until)
		hsleep_ms(50);
	cr_assert_eq(janitors(agents, 3, &j), 1, "no single janitor");

	hsleep_ms(1500); /* the server's function counts lag by up to a second */
	long before = acquire_calls(db);
	hsleep_ms(6000);
	long calls = acquire_calls(db) - before;
	fprintf(stderr, "lease_acquire calls in 6 s, 1 holder + 2 candidates: %ld\n", calls);
	/* the holder renews every second; each candidate tries about once per
	 * expiry (2 s to 3 s apart). Every 100 ms would be 120. */
	cr_assert_leq(calls, 6 + 2 * 4 + 2, "%ld lease_acquire calls in 6 s", calls);
	cr_assert_geq(calls, 5, "the holder did not renew (%ld calls in 6 s)", calls);

	int64_t killed = hnow_ms();
	hagent_kill(agents[j], SIGKILL);
	hagent_wait(agents[j], -1);
	hagent_destroy(agents[j]);
	agents[j] = NULL;
	int dead = j, successor = -1;
	until = killed + 3000 + 3000;
	while (janitors(agents, 3, &successor) != 1 && hnow_ms() < until)
		hsleep_ms(20);
	int64_t took = hnow_ms() - killed;
	fprintf(stderr, "janitor failover after kill -9: %lld ms (lease ttl 3000 + jitter 25)\n",
		(long long)took);
	cr_assert_eq(janitors(agents, 3, &successor), 1, "no successor janitor");
	cr_assert_neq(successor, dead);
	/* ttl and jitter, plus the status polls' own step and latency */
	cr_assert_leq(took, 3000 + 25 + 400, "janitor failover took %lld ms", (long long)took);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.leases WHERE name = "
			   "'pgcoord.janitor' AND holder_replica = '%s' AND expires_at > now()",
			   ids[successor]),
	    1, "the database does not name the successor as the janitor");
	assert_events_consistent(db, "pgcoord.janitor");

	for (int i = 0; i < 3; i++)
		hagent_destroy(agents[i]);
	hdb_drop(db);
}

/* --- renewals carried by the heartbeat ---------------------------------- */

/* An agent that beats every 200 ms: a lease of ttl 3000 (renewed every
 * 1000 ms) rides its beats. */
static const char *const beat_args[] = {"--heartbeat-interval-ms", "200", "--session-ttl-ms",
					"3000", NULL};

/* Every lease_acquire call from now on leaves a row in
 * pgcoord.test_acquires (the server's own function counts can lag by
 * seconds): the function is wrapped before any agent prepares a call. */
static void count_acquires(struct harness_db *db)
{
	hdb_exec(db, "CREATE TABLE pgcoord.test_acquires (name text, "
		     "at timestamptz NOT NULL DEFAULT clock_timestamp())");
	hdb_exec(db, "ALTER FUNCTION pgcoord.lease_acquire(text, bigint, text, bigint, bigint) "
		     "RENAME TO lease_acquire_counted");
	hdb_exec(db, "CREATE FUNCTION pgcoord.lease_acquire(a text, b bigint, c text, d bigint, "
		     "e bigint) RETURNS pgcoord.lease_decision LANGUAGE plpgsql SECURITY DEFINER "
		     "SET search_path = pg_catalog AS $$ BEGIN "
		     "INSERT INTO pgcoord.test_acquires (name) VALUES (a); "
		     "RETURN pgcoord.lease_acquire_counted(a, b, c, d, e); END $$");
	hdb_exec(db, "GRANT EXECUTE ON FUNCTION pgcoord.lease_acquire(text, bigint, text, bigint, "
		     "bigint) TO PUBLIC");
}

/*
 * A held lease is renewed inside the heartbeat's statement, not by a
 * statement of its own, and once attached to its agent's row it is not
 * written at all: in 5 s of holding a lease renewed every second,
 * lease_acquire runs for no held lease, the row keeps its version, and the
 * lease is renewed all along (renewed_at moves, expires_at stays ahead,
 * one epoch, one acquisition), the client's belief with it (lease.renewed).
 */
Test(leases, renewals_ride_the_heartbeat)
{
	struct harness_db *db = lease_db();
	struct lclient holder;
	struct lreply r;

	count_acquires(db);
	struct hagent *a = hagent_start(db, "beat-renew", beat_args);
	lc_init(&holder, "holder");
	lc_open_ok(&holder, a, "holder");
	lc_acquire_ok(&holder, "ridden", 3000, false, &r);
	cr_assert(r.leader);
	int64_t epoch = r.epoch;

	/* the first renewal a beat carries attaches the lease to the agent's
	 * row (0019): after it, nothing is written to the lease row */
	int64_t until = hnow_ms() + 3000;
	while (hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_rows WHERE name = "
				  "'ridden' AND expires_at IS NULL") == 0 &&
	       hnow_ms() < until)
		hsleep_ms(50);
	long version = hdb_query_long(db, "SELECT xmin::text::bigint FROM pgcoord.lease_rows "
					  "WHERE name = 'ridden'");
	long renewed_before =
	    hdb_query_long(db, "SELECT (extract(epoch FROM renewed_at) * 1000)::bigint "
			       "FROM pgcoord.leases WHERE name = 'ridden'");
	hsleep_ms(5000);
	cr_assert_eq(hdb_query_long(db, "SELECT xmin::text::bigint FROM pgcoord.lease_rows "
					"WHERE name = 'ridden' AND expires_at IS NULL"),
		     version, "the attached lease's row was written while the beats renewed it");
	long acquires = hdb_query_long(db, "SELECT count(*) FROM pgcoord.test_acquires WHERE "
					   "at > now() - interval '5 s'");
	fprintf(stderr, "lease_acquire calls in the last 5 s: %ld (all: %ld)\n", acquires,
		hdb_query_long(db, "SELECT count(*) FROM pgcoord.test_acquires"));
	/* the janitor lease of this lone agent rides the beats too (ttl 15 s) */
	cr_assert_eq(acquires, 0, "%ld lease_acquire calls for leases the beats renew", acquires);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.leases WHERE name = 'ridden' "
				    "AND holder_session = %lld AND epoch = %lld AND expires_at > "
				    "now() + interval '1500 ms' AND (extract(epoch FROM "
				    "renewed_at) * 1000)::bigint > %ld + 3000",
				    (long long)holder.session, (long long)epoch, renewed_before),
		     1, "the row was not renewed along");
	cr_assert_eq(events(db, "ridden", "acquired", holder.session, epoch), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_events WHERE "
					"name = 'ridden'"),
		     1, "a renewal wrote a lease event");
	lc_status_ok(&holder, "ridden", false, &r);
	cr_assert(r.leader, "the belief ended while the beats renewed the row");
	cr_assert_gt(r.valid_ms, 0);
	lc_expect(&holder, "lease.renewed", 1, 2000, "a renewal told the holder");

	lc_close(&holder);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * A renewal in a beat only renews: once the row no longer carries the
 * epoch the agent believes in (here rewritten by hand, as a successor's
 * acquisition would), the beat renews nothing, the agent asks lease_acquire
 * at once, and the belief under the old epoch ends.
 */
Test(leases, a_beat_renewal_of_a_changed_row_ends_the_belief)
{
	struct harness_db *db = lease_db();
	struct lclient holder;
	struct lreply r;

	struct hagent *a = hagent_start(db, "beat-changed", beat_args);
	lc_init(&holder, "holder");
	lc_open_ok(&holder, a, "holder");
	lc_acquire_ok(&holder, "changed", 3000, false, &r);
	cr_assert(r.leader);
	hdb_exec(db, "UPDATE pgcoord.leases SET epoch = epoch + 1000 WHERE name = 'changed'");
	struct lnote n =
	    lc_expect(&holder, "lease.changed", 0, 3000, "the belief under the old epoch ended");
	fprintf(stderr, "belief ended: %s\n", n.reason);
	cr_assert_eq(n.epoch, r.epoch, "the end names epoch %lld, not the one believed",
		     (long long)n.epoch);

	lc_close(&holder);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * A beat that carries a renewal and is still running when the client hands
 * the lease back must not take it back after the hand-back committed: the
 * beat is made slow for this agent, the release goes while it runs, and
 * afterwards the row stays free (the release waits for the beat, and a
 * renewal in a beat never takes a free row).
 */
Test(leases, a_beat_in_flight_does_not_undo_a_release)
{
	struct harness_db *db = lease_db();
	struct lclient holder, next;
	struct lreply r;

	struct hagent *a = hagent_start(db, "beat-race", beat_args);
	lc_init(&holder, "holder");
	lc_init(&next, "next");
	lc_open_ok(&holder, a, "holder");
	lc_open_ok(&next, a, "next");
	lc_acquire_ok(&holder, "racy", 3000, false, &r);
	cr_assert(r.leader);
	/* every beat of this agent that carries a lease sleeps 400 ms first */
	hdb_exec(db, "ALTER FUNCTION pgcoord.agent_beat(text, bigint, bigint, bigint[], text[], "
		     "bigint[], bigint[], bigint[], integer) RENAME TO agent_beat_fast");
	hdb_exec(db, "CREATE FUNCTION pgcoord.agent_beat(a text, b bigint, c bigint, d bigint[], "
		     "e text[], f bigint[], g bigint[], h bigint[], i integer) "
		     "RETURNS pgcoord.beat_result LANGUAGE plpgsql AS $$ BEGIN "
		     "IF cardinality(e) > 0 THEN PERFORM pg_sleep(0.4); END IF; "
		     "RETURN pgcoord.agent_beat_fast(a, b, c, d, e, f, g, h, i); END $$");
	hdb_exec(db, "GRANT EXECUTE ON FUNCTION pgcoord.agent_beat(text, bigint, bigint, bigint[], "
		     "text[], bigint[], bigint[], bigint[], integer) TO PUBLIC");
	int64_t until = hnow_ms() + 5000;
	while (hdb_query_long(db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = "
				  "'PgSleep' AND query LIKE '%%agent_beat%%'") == 0 &&
	       hnow_ms() < until)
		hsleep_ms(5);
	cr_assert_lt(hnow_ms(), until, "no beat carried the renewal");
	cr_assert(lc_release_ok(&holder, "racy"));
	hsleep_ms(1000);
	assert_stays_handed_back(db, "racy", holder.session, &next);

	lc_close(&holder);
	lc_close(&next);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- contention under crashes ------------------------------------------- */

/*
 * Three agents, three clients on each, all campaigning for one lease while
 * clients release it, close and reopen their sessions, and agents are
 * killed with SIGKILL and restarted. Each client thread records its own
 * beliefs; the test then checks that no two overlapped and that epochs only
 * grew from one holder to the next, and that lease_events agrees.
 */

#define CONTENDED "contended"
#define C_AGENTS 3
#define C_PER_AGENT 3
#define C_WORKERS (C_AGENTS * C_PER_AGENT)

struct interval {
	int worker;
	int64_t session, epoch;
	int64_t start, end; /* hnow_ms() */
	bool given_up;	    /* ended by the client's release or close */
};

struct arena {
	pthread_mutex_t mu;
	char socket[C_AGENTS][108];
	bool up[C_AGENTS];
	atomic_bool stop;
	int leader_agent; /* of the latest belief that started, -1 after it ended */
	struct interval *iv;
	size_t niv, cap;
};

struct worker {
	struct arena *ar;
	int idx, agent;
	unsigned rng;
	struct lclient lc;
	bool believing;
	int64_t session, epoch, start, deadline; /* of the belief */
	/* a lease.renewed may restart a belief only after it lapsed by its
	 * deadline (a slow reader), not after the client gave it up */
	bool lapsed;
	bool campaigning;
	int64_t next_campaign;
	int64_t prev_session; /* of a connection the agent's death cut */
	int wins, releases, closes, resumes, reconnects;
	char failure[600];
};

static void belief_end_as(struct worker *w, int64_t at, bool given_up)
{
	struct arena *ar = w->ar;

	if (!w->believing)
		return;
	w->believing = false;
	pthread_mutex_lock(&ar->mu);
	if (ar->leader_agent == w->agent)
		ar->leader_agent = -1;
	if (ar->niv == ar->cap) {
		size_t cap = ar->cap ? ar->cap * 2 : 256;
		struct interval *bigger = realloc(ar->iv, cap * sizeof(*bigger));

		if (!bigger) {
			pthread_mutex_unlock(&ar->mu);
			snprintf(w->failure, sizeof(w->failure), "out of memory");
			return;
		}
		ar->iv = bigger;
		ar->cap = cap;
	}
	ar->iv[ar->niv++] = (struct interval){w->idx, w->session, w->epoch, w->start, at, given_up};
	pthread_mutex_unlock(&ar->mu);
}

static void belief_end(struct worker *w, int64_t at)
{
	belief_end_as(w, at, false);
}

static void belief_start(struct worker *w, int64_t epoch, int64_t at, int64_t valid_ms)
{
	w->believing = true;
	w->lapsed = false;
	w->session = w->lc.session;
	w->epoch = epoch;
	w->start = at;
	w->deadline = at + valid_ms;
	w->wins++;
	pthread_mutex_lock(&w->ar->mu);
	w->ar->leader_agent = w->agent;
	pthread_mutex_unlock(&w->ar->mu);
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* Runs inside lc_poll, on the worker's thread. */
static void worker_note(struct lclient *lc, const struct lnote *n)
{
	struct worker *w = lc->user;

	if (strcmp(n->name, CONTENDED) != 0)
		return;
	if (w->believing && n->at_ms >= w->deadline) {
		belief_end(w, w->deadline);
		w->lapsed = true;
	}
	if (strcmp(n->method, "lease.changed") == 0) {
		if (n->session != lc->session)
			return; /* about a session this client already closed */
		if (!n->leader) {
			belief_end(w, n->at_ms);
			w->lapsed = false;
			return;
		}
		if (w->believing && n->epoch != w->epoch)
			belief_end(w, min64(n->at_ms, w->deadline));
		if (w->believing)
			w->deadline = n->at_ms + n->valid_ms;
		else if (n->valid_ms > 0)
			belief_start(w, n->epoch, n->at_ms, n->valid_ms);
	} else if (strcmp(n->method, "lease.renewed") == 0 && n->valid_ms > 0) {
		if (w->believing && n->epoch == w->epoch)
			w->deadline = n->at_ms + n->valid_ms;
		else if (!w->believing && w->lapsed && n->epoch == w->epoch)
			belief_start(w, n->epoch, n->at_ms, n->valid_ms);
	}
}

static int rnd(struct worker *w, int n)
{
	return (int)(rand_r(&w->rng) % (unsigned)n);
}

/* The agent died or cut us off: the belief runs on to its deadline. */
static void agent_gone(struct worker *w)
{
	w->prev_session = w->lc.session;
	lc_close(&w->lc);
	w->campaigning = false;
}

/* True for errors that mean the agent is gone or going (a test kills them). */
static bool agent_down(pgcoord_err err)
{
	return err == PGCOORD_E_IO || err == PGCOORD_E_CLOSED || err == PGCOORD_E_CONNECT ||
	       err == PGCOORD_E_CALL_TIMEOUT || err == PGCOORD_E_SHUTTING_DOWN;
}

static void fail(struct worker *w, const char *what, pgcoord_err err)
{
	snprintf(w->failure, sizeof(w->failure), "worker %d (agent %d): %s: %s (%s)", w->idx,
		 w->agent, what, pgcoord_strerror(err),
		 w->lc.c ? pgcoord_last_message(w->lc.c) : "");
}

static void worker_connect(struct worker *w)
{
	char path[108], name[32];
	bool up;
	pgcoord_err err;

	pthread_mutex_lock(&w->ar->mu);
	up = w->ar->up[w->agent];
	memcpy(path, w->ar->socket[w->agent], sizeof(path));
	pthread_mutex_unlock(&w->ar->mu);
	if (!up || lc_open(&w->lc, path, NULL) != PGCOORD_OK) {
		hsleep_ms(30);
		return;
	}
	w->reconnects++;
	/* now and then, take back the session the crashed agent's successor adopted */
	if (w->prev_session && rnd(w, 3) == 0 &&
	    lc_session_resume(&w->lc, w->prev_session) == PGCOORD_OK) {
		w->resumes++;
	} else {
		snprintf(name, sizeof(name), "contender-%d", w->idx);
		err = lc_session_open(&w->lc, name);
		if (err != PGCOORD_OK) {
			if (!agent_down(err) && err != PGCOORD_E_UNAVAILABLE)
				fail(w, "session.open", err);
			lc_close(&w->lc);
			hsleep_ms(30);
			return;
		}
	}
	w->prev_session = 0;
	w->campaigning = false;
	w->next_campaign = hnow_ms();
}

static void campaign(struct worker *w)
{
	pgcoord_err err = lc_acquire(&w->lc, CONTENDED, TTL_MS, true, NULL);

	if (err == PGCOORD_OK) {
		w->campaigning = true;
		lc_poll(&w->lc, 0);
	} else if (agent_down(err)) {
		agent_gone(w);
	} else if (err == PGCOORD_E_UNAVAILABLE || err == PGCOORD_E_TIMEOUT) {
		w->next_campaign = hnow_ms() + 100;
	} else {
		fail(w, "lease.acquire", err);
	}
}

/* Gives the lease up now and then, and sometimes the whole session. */
static void worker_act(struct worker *w)
{
	int dice = rnd(w, 1000);
	pgcoord_err err;

	if (w->believing && dice < 25) {
		/* a client stops acting as leader before it asks to release */
		belief_end_as(w, hnow_ms(), true);
		w->lapsed = false;
		err = lc_release(&w->lc, CONTENDED, NULL);
		lc_poll(&w->lc, 0);
		if (agent_down(err)) {
			agent_gone(w);
			return;
		}
		if (err != PGCOORD_OK && err != PGCOORD_E_UNAVAILABLE && err != PGCOORD_E_TIMEOUT) {
			fail(w, "lease.release", err);
			return;
		}
		w->releases++;
		w->campaigning = false;
		w->next_campaign = hnow_ms() + rnd(w, 600);
	} else if (dice >= 996) {
		belief_end_as(w, hnow_ms(), true);
		w->lapsed = false;
		err = lc_session_close(&w->lc);
		if (err == PGCOORD_OK)
			err = lc_session_open(&w->lc, "contender-reopened");
		lc_poll(&w->lc, 0);
		if (agent_down(err)) {
			agent_gone(w);
			return;
		}
		if (err != PGCOORD_OK) {
			fail(w, "session close/reopen", err);
			return;
		}
		w->closes++;
		w->campaigning = false;
		w->next_campaign = hnow_ms() + rnd(w, 300);
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	w->lc.hook = worker_note;
	w->lc.user = w;
	while (!atomic_load(&w->ar->stop) && !w->failure[0]) {
		int64_t now = hnow_ms();

		if (w->believing && now >= w->deadline) {
			belief_end(w, w->deadline);
			w->lapsed = true;
		}
		if (!w->lc.c) {
			worker_connect(w);
			continue;
		}
		if (!w->campaigning && now >= w->next_campaign) {
			campaign(w);
			continue;
		}
		if (lc_poll(&w->lc, 20) != PGCOORD_OK) {
			agent_gone(w);
			continue;
		}
		/* keep the notes of a long run from piling up */
		w->lc.nnotes = w->lc.cursor = 0;
		worker_act(w);
	}
	if (w->believing)
		belief_end(w, min64(hnow_ms(), w->deadline));
	lc_close(&w->lc);
	return NULL;
}

static int by_start(const void *x, const void *y)
{
	const struct interval *a = x, *b = y;

	return a->start < b->start ? -1 : a->start > b->start;
}

static int contention_seconds(void)
{
	const char *v = getenv("PGCOORD_TEST_CONTENTION_S");
	int s = v ? atoi(v) : 0;

	return s > 0 ? s : 25;
}

Test(leases, contention_under_crashes_never_has_two_believers)
{
	const char *const args[] = {"--lease-retry-ms",
				    "200",
				    "--heartbeat-interval-ms",
				    "300",
				    "--session-ttl-ms",
				    "3000",
				    "--session-grace-ms",
				    "2000",
				    NULL};
	const char *ids[C_AGENTS] = {"contend-a", "contend-b", "contend-c"};
	struct harness_db *db = lease_db();
	struct hagent *agents[C_AGENTS];
	static struct arena ar;
	static struct worker workers[C_WORKERS];
	pthread_t threads[C_WORKERS];
	unsigned seed = (unsigned)getpid() ^ (unsigned)hnow_ms();
	int kills = 0;

	memset(&ar, 0, sizeof(ar));
	ar.leader_agent = -1;
	pthread_mutex_init(&ar.mu, NULL);
	for (int i = 0; i < C_AGENTS; i++) {
		agents[i] = hagent_start(db, ids[i], args);
		snprintf(ar.socket[i], sizeof(ar.socket[i]), "%s", hagent_socket(agents[i]));
		ar.up[i] = true;
	}
	fprintf(stderr, "contention: seed %u\n", seed);
	for (int i = 0; i < C_WORKERS; i++) {
		struct worker *w = &workers[i];

		memset(w, 0, sizeof(*w));
		w->ar = &ar;
		w->idx = i;
		w->agent = i % C_AGENTS;
		w->rng = seed + (unsigned)i * 7919u;
		snprintf(w->lc.label, sizeof(w->lc.label), "worker-%d", i);
		cr_assert_eq(pthread_create(&threads[i], NULL, worker_main, w), 0);
	}

	/* agents crash and come back, from this thread (they die with it) */
	int64_t end = hnow_ms() + contention_seconds() * 1000;
	while (hnow_ms() < end) {
		hsleep_ms(1000 + (int)(rand_r(&seed) % 1500));
		if (hnow_ms() >= end)
			break;
		/* every other kill is aimed at the leader's agent */
		int k = (int)(rand_r(&seed) % C_AGENTS);
		pthread_mutex_lock(&ar.mu);
		if (kills % 2 == 0 && ar.leader_agent >= 0)
			k = ar.leader_agent;
		ar.up[k] = false;
		pthread_mutex_unlock(&ar.mu);
		hagent_kill(agents[k], SIGKILL);
		hagent_wait(agents[k], -1);
		kills++;
		hsleep_ms((int)(rand_r(&seed) % 700));
		hagent_destroy(agents[k]);
		agents[k] = hagent_start(db, ids[k], args);
		pthread_mutex_lock(&ar.mu);
		snprintf(ar.socket[k], sizeof(ar.socket[k]), "%s", hagent_socket(agents[k]));
		ar.up[k] = true;
		pthread_mutex_unlock(&ar.mu);
	}
	atomic_store(&ar.stop, true);
	int wins = 0, releases = 0, closes = 0, resumes = 0;
	for (int i = 0; i < C_WORKERS; i++) {
		pthread_join(threads[i], NULL);
		cr_assert_eq(workers[i].failure[0], '\0', "%s", workers[i].failure);
		wins += workers[i].wins;
		releases += workers[i].releases;
		closes += workers[i].closes;
		resumes += workers[i].resumes;
	}

	/* at most one believer at any instant; epochs grow from holder to holder */
	qsort(ar.iv, ar.niv, sizeof(ar.iv[0]), by_start);
	int64_t min_gap = INT64_MAX, min_lapse_gap = INT64_MAX;
	int holders = 0, lapses = 0;
	for (size_t i = 0; i < ar.niv; i++) {
		const struct interval *x = &ar.iv[i];

		cr_assert_leq(x->start, x->end);
		for (size_t k = i + 1; k < ar.niv && ar.iv[k].start < x->end; k++) {
			const struct interval *y = &ar.iv[k];

			cr_assert_eq(y->session, x->session,
				     "two believers: worker %d (session %lld, epoch %lld) from "
				     "%lld to %lld ms and worker %d (session %lld, epoch %lld) "
				     "from %lld ms",
				     x->worker, (long long)x->session, (long long)x->epoch,
				     (long long)x->start, (long long)x->end, y->worker,
				     (long long)y->session, (long long)y->epoch,
				     (long long)y->start);
		}
		if (i > 0) {
			const struct interval *p = &ar.iv[i - 1];

			if (p->session != x->session) {
				cr_assert_gt(x->epoch, p->epoch,
					     "session %lld led with epoch %lld after session %lld "
					     "with epoch %lld",
					     (long long)x->session, (long long)x->epoch,
					     (long long)p->session, (long long)p->epoch);
				min_gap = min64(min_gap, x->start - p->end);
				if (!p->given_up) {
					min_lapse_gap = min64(min_lapse_gap, x->start - p->end);
					lapses++;
				}
				holders++;
			} else {
				cr_assert_geq(x->epoch, p->epoch);
			}
		}
		/* every belief rests on an acquisition the database recorded */
		cr_assert_eq(events(db, CONTENDED, "acquired", x->session, x->epoch), 1,
			     "session %lld believed in epoch %lld, which it never acquired",
			     (long long)x->session, (long long)x->epoch);
	}
	assert_events_consistent(db, CONTENDED);
	long acquired = hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_events WHERE name "
					   "= '" CONTENDED "' AND event = 'acquired'");
	fprintf(stderr,
		"contention: %d s, %zu beliefs (%d wins), %d changes of holder, %ld epochs "
		"acquired, %d kills, %d releases, %d session reopens, %d resumes; closest "
		"handover %lld ms, closest of the %d after a belief the client did not give up "
		"%lld ms\n",
		contention_seconds(), ar.niv, wins, holders, acquired, kills, releases, closes,
		resumes, (long long)(min_gap == INT64_MAX ? -1 : min_gap), lapses,
		(long long)(min_lapse_gap == INT64_MAX ? -1 : min_lapse_gap));
	cr_assert_geq(holders, 10, "too little happened to judge (%d changes of holder)", holders);
	cr_assert_geq(kills, 3);

	free(ar.iv);
	pthread_mutex_destroy(&ar.mu);
	for (int i = 0; i < C_AGENTS; i++)
		hagent_destroy(agents[i]);
	hdb_drop(db);
}
