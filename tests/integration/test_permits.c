/*
 * test_permits.c — the permit ledger (DESIGN.md guarantees 1–6) against a
 * real Postgres and real agents, asserting on the database rows
 * (pgcoord.quotas, permits, permit_events), not only on replies.
 *
 * Worker threads (one libpgcoord handle each) only record what happened;
 * every assertion and every harness call runs on the test's own thread.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "itest.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

TestSuite(permits, .timeout = 150);

#define CALL_MS 10000

/* Short liveness so a killed agent's sessions lapse within the test:
 * three heartbeats fit in the ttl, as the agent demands. */
/* Short enough that a lapse is seen in a second or two. The lease ttl is
 * short too: the janitor's lease lives on the janitor's session, and a
 * session that lapses under load (one late beat past 1.2 s) pins the lease
 * for its ttl, with no janitor meanwhile; at the default 15 s that alone
 * outlasted the 15 s a test waits for the janitor to act. */
static const char *const fast_liveness[] = {"--heartbeat-interval-ms",
					    "200",
					    "--session-ttl-ms",
					    "1200",
					    "--session-grace-ms",
					    "300",
					    "--lease-ttl-ms",
					    "2000",
					    NULL};

/* --- helpers ------------------------------------------------------------ */

static struct harness_db *ledger_db(void)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	return db;
}

static pgcoord *client(struct hagent *a, const char *name)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(hagent_socket(a), CALL_MS, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect to %s: %s", hagent_replica_id(a),
		     pgcoord_strerror(err));
	if (name) {
		err = pgcoord_session_open(c, name, CALL_MS, NULL);
		cr_assert_eq(err, PGCOORD_OK, "session.open on %s: %s (%s)", hagent_replica_id(a),
			     pgcoord_strerror(err), pgcoord_last_message(c));
	}
	return c;
}

static void quota_set(pgcoord *c, const char *key, int limit, int lapse_after_s)
{
	pgcoord_err err = pgcoord_quota_set(c, key, limit, lapse_after_s, CALL_MS);
	cr_assert_eq(err, PGCOORD_OK, "quota.set %s: %s (%s)", key, pgcoord_strerror(err),
		     pgcoord_last_message(c));
}

/* A claim that must get an answer (admitted, held or denied). */
static pgcoord_claim *claim_n(pgcoord *c, const char *id, const char *const *keys,
			      const int32_t *weights, size_t n, unsigned flags)
{
	pgcoord_claim *cl = NULL;
	pgcoord_err err = pgcoord_permit_claim(
	    c, id,
	    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					 .keys = keys,
					 .weights = weights,
					 .nquotas = n,
					 .limit = PGCOORD_NO_LIMIT,
					 .flags = flags},
	    CALL_MS, &cl);
	cr_assert_eq(err, PGCOORD_OK, "claim %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return cl;
}

static pgcoord_claim *claim1(pgcoord *c, const char *id, const char *key, unsigned flags)
{
	const char *keys[1] = {key};
	return claim_n(c, id, keys, NULL, 1, flags);
}

/* A claim of id on key that must be refused as conflict, the message
 * containing why. */
static void assert_claim_conflict(pgcoord *c, const char *id, const char *key, const char *why)
{
	pgcoord_claim *cl = NULL;
	cr_assert_eq(iclaim_one(c, id, key, CALL_MS, &cl), PGCOORD_E_CONFLICT,
		     "claim %s was not refused", id);
	cr_assert_null(cl);
	cr_assert(strstr(pgcoord_last_message(c), why), "%s", pgcoord_last_message(c));
}

static long in_flight(struct harness_db *db, const char *key)
{
	return hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = '%s'", key);
}

static long permit_rows(struct harness_db *db, const char *id)
{
	return hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = '%s'", id);
}

static long events(struct harness_db *db, const char *id, const char *event)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pgcoord.permit_events "
			      "WHERE permit_id = '%s' AND event = '%s'",
			      id, event);
}

static char *permit_state(struct harness_db *db, const char *id)
{
	return hdb_query_value(db, "SELECT state FROM pgcoord.permits WHERE id = '%s'", id);
}

static void assert_state(struct harness_db *db, const char *id, const char *want)
{
	char *state = permit_state(db, id);
	cr_assert_str_eq(state, want, "permit %s is %s, not %s", id, state, want);
	free(state);
}

/*
 * Guarantee 2, checked by the test's own SQL in one statement (one
 * snapshot), independently of the agent's permit.check: every quota's
 * in_flight equals the weights of its permits that are not released and the
 * sum of its audit deltas, and never exceeds its limit (no test lowers a
 * limit below in_flight).
 */
static const char conservation_sql[] =
    "SELECT count(*) FROM pgcoord.quotas q "
    "WHERE q.in_flight <> (SELECT coalesce(sum(pq.weight), 0) FROM pgcoord.permit_quotas pq "
    "    JOIN pgcoord.permits p ON p.id = pq.permit_id "
    "    WHERE pq.key = q.key AND p.state <> 'released') "
    "   OR q.in_flight <> (SELECT coalesce(sum(e.delta), 0) FROM pgcoord.permit_events e "
    "    WHERE e.key = q.key) "
    "   OR q.in_flight > q.\"limit\" OR q.in_flight < 0";

static void assert_conserved(struct harness_db *db, const char *when)
{
	long bad = hdb_query_long(db, "%s", conservation_sql);
	if (bad) {
		char *rows = hdb_query_value(
		    db, "SELECT string_agg(format('%%s: limit %%s in_flight %%s weights %%s audit "
			"%%s (%%s)', key, \"limit\", in_flight, permit_weights, audit_sum, "
			"problem), '; ') FROM pgcoord.permits_check()");
		cr_assert_fail("conservation broken %s: %ld quota(s): %s", when, bad,
			       rows ? rows : "?");
	}
}

/* The agent's own check (permit.check) agrees. A retryable answer is
 * retried for a while: after chaos the agent may still be reconnecting. */
static void assert_agent_check_ok(pgcoord *c, const char *when)
{
	bool ok = false;
	pgcoord_err err = pgcoord_permit_check(c, CALL_MS, &ok, NULL, NULL);
	for (int i = 0; i < 100 && (err == PGCOORD_E_UNAVAILABLE || err == PGCOORD_E_TIMEOUT);
	     i++) {
		hsleep_ms(100);
		err = pgcoord_permit_check(c, CALL_MS, &ok, NULL, NULL);
	}
	cr_assert_eq(err, PGCOORD_OK, "permit.check %s: %s (%s)", when, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert(ok, "permit.check reports a violation %s", when);
}

/* Polls sql (an integer, taken verbatim: no printf escapes) until it is
 * non-zero; false on timeout. */
static bool wait_for(struct harness_db *db, int timeout_ms, const char *sql)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	for (;;) {
		if (hdb_query_long(db, "%s", sql) != 0)
			return true;
		if (hnow_ms() > deadline)
			return false;
		hsleep_ms(50);
	}
}

/* Waits until the agent with this replica_id holds the janitor lease. */
static void wait_janitor(struct harness_db *db, const char *replica)
{
	char sql[256];
	snprintf(sql, sizeof(sql),
		 "SELECT count(*) FROM pgcoord.leases WHERE name = 'pgcoord.janitor' "
		 "AND holder_replica = '%s' AND expires_at > now()",
		 replica);
	cr_assert(wait_for(db, 20000, sql), "%s never became the janitor", replica);
}

/* Encodes {id, quotas: [{key, weight: 1}]} for the raw socket. */
static void pack_claim_params(msgpack_sbuffer *sb, const char *id, const char *key)
{
	msgpack_packer pk;
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	pgc_pack_kv_str(&pk, "id", id);
	pgc_pack_cstr(&pk, "quotas");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_map(&pk, 2);
	pgc_pack_kv_str(&pk, "key", key);
	pgc_pack_kv_int(&pk, "weight", 1);
}

static void pack_one(msgpack_sbuffer *sb, const char *k, const char *v)
{
	msgpack_packer pk;
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	pgc_pack_kv_str(&pk, k, v);
}

/* A raw connection with an open session. */
static int raw_session(struct hagent *a)
{
	msgpack_sbuffer sb;
	msgpack_unpacked u;
	struct pgc_message m;
	char err[128];
	int fd = hraw_connect(hagent_socket(a));

	cr_assert_geq(fd, 0, "raw connect: %s", strerror(errno));
	pack_one(&sb, "name", "raw");
	msgpack_unpacked_init(&u);
	cr_assert_eq(hraw_call(fd, 1, "session.open", sb.data, sb.size, CALL_MS, &u), HRAW_MSG);
	cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
	cr_assert_null(m.error, "session.open failed on the raw socket");
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	return fd;
}

static int run_ctl(struct hagent *a, char **out, const char *const *args)
{
	const char *argv[16];
	size_t n = 0;
	argv[n++] = henv("PGCOORD_TEST_CTL_BIN");
	argv[n++] = "--socket";
	argv[n++] = hagent_socket(a);
	for (size_t i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	return hrun(argv, out);
}

/* --- guarantee 1: the quota holds fleet-wide at every instant ------------- */

#define RACE_CLIENTS 8
#define RACE_ROUNDS 300

struct racer {
	pthread_t thread;
	int index;
	const char *socket;
	pthread_barrier_t *barrier;
	/* results[r]: the claim status of round r, or 0 when the call failed */
	pgcoord_claim_status results[RACE_ROUNDS];
	pgcoord_err errors[RACE_ROUNDS];
	int64_t tokens[RACE_ROUNDS];
	char setup_error[256];
};

static void *race_worker(void *arg)
{
	struct racer *r = arg;
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(r->socket, CALL_MS, &c);
	if (err == PGCOORD_OK)
		err = pgcoord_session_open(c, "racer", CALL_MS, NULL);
	if (err != PGCOORD_OK)
		snprintf(r->setup_error, sizeof(r->setup_error), "racer %d: %s", r->index,
			 pgcoord_strerror(err));
	for (int round = 0; round < RACE_ROUNDS; round++) {
		char id[64];
		pgcoord_claim *cl = NULL;

		snprintf(id, sizeof(id), "race-%d-%d", round, r->index);
		pthread_barrier_wait(r->barrier); /* everyone claims at once */
		if (!r->setup_error[0]) {
			r->errors[round] = iclaim_one(c, id, "race", CALL_MS, &cl);
			r->results[round] = cl ? pgcoord_claim_get_status(cl) : 0;
			r->tokens[round] = cl ? pgcoord_claim_get_token(cl) : 0;
			pgcoord_claim_free(cl);
		}
		pthread_barrier_wait(r->barrier); /* the test thread checks the round */
		pthread_barrier_wait(r->barrier);
		/* the winner gives the slot back before the next round */
		if (r->results[round] == PGCOORD_CLAIM_ADMITTED)
			r->errors[round] = pgcoord_permit_release(c, id, 0, NULL, CALL_MS, NULL);
	}
	pgcoord_close(c);
	return NULL;
}

/*
 * RACE_CLIENTS clients, half on each of two agents, claim the one remaining
 * slot at the same instant, RACE_ROUNDS times. Exactly one wins each round,
 * and the ledger is conserved after every round.
 */
Test(permits, race_for_the_last_slot_never_admits_more_than_the_limit, .timeout = 150)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "race-a", NULL);
	struct hagent *b = hagent_start(db, "race-b", NULL);
	pgcoord *admin = client(a, "filler");
	static struct racer racers[RACE_CLIENTS];
	pthread_barrier_t barrier;

	/* limit 3 with two slots held: one remains */
	quota_set(admin, "race", 3, -1);
	pgcoord_claim_free(claim1(admin, "filler-1", "race", 0));
	pgcoord_claim_free(claim1(admin, "filler-2", "race", 0));
	cr_assert_eq(in_flight(db, "race"), 2);

	cr_assert_eq(pthread_barrier_init(&barrier, NULL, RACE_CLIENTS + 1), 0);
	for (int i = 0; i < RACE_CLIENTS; i++) {
		memset(&racers[i], 0, sizeof(racers[i]));
		racers[i].index = i;
		racers[i].socket = hagent_socket(i % 2 ? b : a);
		racers[i].barrier = &barrier;
		cr_assert_eq(pthread_create(&racers[i].thread, NULL, race_worker, &racers[i]), 0);
	}
	for (int round = 0; round < RACE_ROUNDS; round++) {
		int admitted = 0, denied = 0;
		pthread_barrier_wait(&barrier);
		pthread_barrier_wait(&barrier);
		for (int i = 0; i < RACE_CLIENTS; i++) {
			cr_assert_str_empty(racers[i].setup_error, "%s", racers[i].setup_error);
			cr_assert_eq(racers[i].errors[round], PGCOORD_OK, "round %d racer %d: %s",
				     round, i, pgcoord_strerror(racers[i].errors[round]));
			admitted += racers[i].results[round] == PGCOORD_CLAIM_ADMITTED;
			denied += racers[i].results[round] == PGCOORD_CLAIM_DENIED;
		}
		cr_assert_leq(admitted, 1, "round %d admitted %d claims for one slot", round,
			      admitted);
		cr_assert_eq(admitted, 1, "round %d: nobody got the free slot", round);
		cr_assert_eq(denied, RACE_CLIENTS - 1);
		cr_assert_eq(in_flight(db, "race"), 3, "round %d", round);
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM pgcoord.permits "
					    "WHERE id LIKE 'race-%d-%%'",
					    round),
			     1, "round %d: a denied claim left a permit row", round);
		assert_conserved(db, "during the race");
		assert_agent_check_ok(admin, "during the race");
		pthread_barrier_wait(&barrier);
	}
	for (int i = 0; i < RACE_CLIENTS; i++)
		pthread_join(racers[i].thread, NULL);
	for (int i = 0; i < RACE_CLIENTS; i++)
		cr_assert_eq(racers[i].errors[RACE_ROUNDS - 1], PGCOORD_OK, "last release failed");
	cr_assert_eq(in_flight(db, "race"), 2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE key = 'race' AND event = 'admitted'"),
		     RACE_ROUNDS + 2);
	assert_conserved(db, "after the race");
	pthread_barrier_destroy(&barrier);
	pgcoord_close(admin);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- guarantee 3: idempotency ------------------------------------------------ */

/*
 * The claim is sent on a raw connection that is closed before its reply is
 * read; the same claim, retried through the other agent, finds the
 * original grant: held, same token, one permit row, one increment.
 */
Test(permits, claim_retry_after_lost_reply_is_held_with_the_original_token)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "lost-a", NULL);
	struct hagent *b = hagent_start(db, "lost-b", NULL);
	pgcoord *cb = client(b, "retrier");
	msgpack_sbuffer sb;

	quota_set(cb, "lost", 50, -1);

	/* 1. the reply is lost after the claim committed */
	int fd = raw_session(a);
	pack_claim_params(&sb, "lost-1", "lost");
	cr_assert(hraw_send_request(fd, 2, "permit.claim", sb.data, sb.size));
	close(fd);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(wait_for(db, 10000, "SELECT count(*) FROM pgcoord.permits WHERE id = 'lost-1'"),
		  "the claim whose reply was lost never committed");
	long token = hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'lost-1'");

	pgcoord_claim *cl = claim1(cb, "lost-1", "lost", 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_HELD);
	cr_assert_eq(pgcoord_claim_get_token(cl), token, "the retry got another token");
	cr_assert_not(pgcoord_claim_is_mine(cl), "the grant moved to the retrying session");
	pgcoord_claim_free(cl);
	cr_assert_eq(permit_rows(db, "lost-1"), 1);
	cr_assert_eq(events(db, "lost-1", "admitted"), 1);
	cr_assert_eq(in_flight(db, "lost"), 1, "the retry incremented a second time");

	/* 2. the retry races the original, whose connection is cut at once */
	for (int i = 0; i < 20; i++) {
		char id[32];
		snprintf(id, sizeof(id), "lost-race-%d", i);
		fd = raw_session(a);
		pack_claim_params(&sb, id, "lost");
		cr_assert(hraw_send_request(fd, 2, "permit.claim", sb.data, sb.size));
		close(fd);
		msgpack_sbuffer_destroy(&sb);
		cl = claim1(cb, id, "lost", 0);
		cr_assert(pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_ADMITTED ||
			  pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_HELD);
		cr_assert_eq(
		    pgcoord_claim_get_token(cl),
		    hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = '%s'", id));
		pgcoord_claim_free(cl);
	}
	/* let the originals land: whichever came second found the first */
	cr_assert(wait_for(
	    db, 10000, "SELECT (count(*) = 21)::int FROM pgcoord.permits WHERE id LIKE 'lost-%'"));
	cr_assert(wait_for(db, 10000,
			   "SELECT (count(*) = 0)::int FROM pg_stat_activity "
			   "WHERE datname = current_database() AND pid <> pg_backend_pid() "
			   "AND query LIKE '%permit_claim%' AND state = 'active'"));
	hsleep_ms(300);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permit_events "
				    "WHERE permit_id LIKE 'lost-race-%%' AND event = 'admitted'"),
		     20, "a claim was admitted twice");
	cr_assert_eq(in_flight(db, "lost"), 21);
	assert_conserved(db, "after lost replies");
	pgcoord_close(cb);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

struct dup_worker {
	pthread_t thread;
	pgcoord *c;
	pthread_barrier_t *barrier;
	int rounds;
	pgcoord_claim_status status[50];
	int64_t token[50];
	pgcoord_err err[50];
};

static void *dup_run(void *arg)
{
	struct dup_worker *w = arg;
	const char *keys[1] = {"dup"};
	for (int i = 0; i < w->rounds; i++) {
		char id[32];
		pgcoord_claim *cl = NULL;
		snprintf(id, sizeof(id), "dup-%d", i);
		pthread_barrier_wait(w->barrier);
		w->err[i] = pgcoord_permit_claim(
		    w->c, id,
		    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						 .keys = keys,
						 .nquotas = 1,
						 .intent = "x",
						 .intent_len = 1,
						 .limit = PGCOORD_NO_LIMIT},
		    CALL_MS, &cl);
		w->status[i] = cl ? pgcoord_claim_get_status(cl) : 0;
		w->token[i] = cl ? pgcoord_claim_get_token(cl) : 0;
		pgcoord_claim_free(cl);
	}
	return NULL;
}

/* The same claim delivered twice at the same instant, through two agents:
 * one permit, one increment, both deliveries see the same token. */
Test(permits, duplicate_delivery_yields_one_permit_and_one_increment)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "dup-a", NULL);
	struct hagent *b = hagent_start(db, "dup-b", NULL);
	static struct dup_worker w[2];
	pthread_barrier_t barrier;
	const int rounds = 50;

	w[0].c = client(a, "dup-a");
	w[1].c = client(b, "dup-b");
	quota_set(w[0].c, "dup", 1000, -1);
	cr_assert_eq(pthread_barrier_init(&barrier, NULL, 2), 0);
	for (int i = 0; i < 2; i++) {
		w[i].barrier = &barrier;
		w[i].rounds = rounds;
		cr_assert_eq(pthread_create(&w[i].thread, NULL, dup_run, &w[i]), 0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(w[i].thread, NULL);
	for (int i = 0; i < rounds; i++) {
		char id[32];
		snprintf(id, sizeof(id), "dup-%d", i);
		cr_assert_eq(w[0].err[i], PGCOORD_OK, "%s: %s", id, pgcoord_strerror(w[0].err[i]));
		cr_assert_eq(w[1].err[i], PGCOORD_OK, "%s: %s", id, pgcoord_strerror(w[1].err[i]));
		cr_assert_eq((w[0].status[i] == PGCOORD_CLAIM_ADMITTED) +
				 (w[1].status[i] == PGCOORD_CLAIM_ADMITTED),
			     1, "%s: not exactly one admission", id);
		cr_assert_eq((w[0].status[i] == PGCOORD_CLAIM_HELD) +
				 (w[1].status[i] == PGCOORD_CLAIM_HELD),
			     1, "%s: the duplicate was not answered held", id);
		cr_assert_eq(w[0].token[i], w[1].token[i], "%s: two tokens for one grant", id);
		cr_assert_eq(permit_rows(db, id), 1);
		cr_assert_eq(events(db, id, "admitted"), 1);
	}
	cr_assert_eq(in_flight(db, "dup"), rounds, "a duplicate incremented the counter");
	assert_conserved(db, "after duplicate deliveries");
	pthread_barrier_destroy(&barrier);
	pgcoord_close(w[0].c);
	pgcoord_close(w[1].c);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* A released id is a tombstone: a very late duplicate is refused, never
 * admitted a second time. Release itself is idempotent. */
Test(permits, released_id_is_never_admitted_again_and_release_is_idempotent)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "tomb-a", NULL);
	pgcoord *c = client(a, "tomb");
	bool released = false;

	quota_set(c, "tomb", 2, -1);
	pgcoord_claim_free(claim1(c, "t-1", "tomb", 0));
	cr_assert_eq(pgcoord_permit_release(c, "t-1", 0, NULL, CALL_MS, &released), PGCOORD_OK);
	cr_assert(released);
	cr_assert_eq(pgcoord_permit_release(c, "t-1", 0, NULL, CALL_MS, &released), PGCOORD_OK);
	cr_assert_not(released, "a second release released again");
	assert_claim_conflict(c, "t-1", "tomb", "released");
	cr_assert_eq(in_flight(db, "tomb"), 0);
	cr_assert_eq(events(db, "t-1", "admitted"), 1);
	cr_assert_eq(events(db, "t-1", "released"), 1);
	assert_conserved(db, "after a tombstoned retry");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * A session's release of an id without a permit retires the id: the client
 * gave up on a claim whose outcome it never saw, so an attempt still on its
 * way must not take a slot behind its back. An operator's override does not
 * retire (a typo must not burn an id).
 */
Test(permits, release_of_an_unclaimed_id_retires_it)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "retire-a", NULL);
	pgcoord *c = client(a, "retire");
	bool released = true;

	quota_set(c, "ret", 5, -1);
	cr_assert_eq(pgcoord_permit_release(c, "r-0", 0, "gave up", CALL_MS, &released),
		     PGCOORD_E_NOT_FOUND);
	cr_assert(strstr(pgcoord_last_message(c), "retired"), "%s", pgcoord_last_message(c));
	assert_state(db, "r-0", "released");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_quotas "
					"WHERE permit_id = 'r-0'"),
		     0);
	cr_assert_eq(events(db, "r-0", "retired"), 1);
	cr_assert_eq(events(db, "r-0", "admitted"), 0);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.permits p JOIN pgcoord.sessions s "
			   "ON s.id = p.owner_session WHERE p.id = 'r-0' "
			   "AND s.id = %" PRId64 " AND p.owner_replica = 'retire-a'",
			   pgcoord_session_id(c)),
	    1, "the retired id does not name the session that retired it");

	/* the late attempt */
	assert_claim_conflict(c, "r-0", "ret", "was retired");
	cr_assert_eq(in_flight(db, "ret"), 0);
	cr_assert_eq(events(db, "r-0", "admitted"), 0);

	/* releasing it again is the idempotent no-op on a released id */
	cr_assert_eq(pgcoord_permit_release(c, "r-0", 0, NULL, CALL_MS, &released), PGCOORD_OK);
	cr_assert_not(released);

	/* an operator's override of an unknown id changes nothing */
	cr_assert_eq(
	    pgcoord_permit_release(c, "r-typo", PGCOORD_OVERRIDE, "typo", CALL_MS, &released),
	    PGCOORD_E_NOT_FOUND);
	cr_assert_eq(permit_rows(db, "r-typo"), 0);
	assert_conserved(db, "after retiring an id");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Reads replies on fd until the one to msgid; returns it parsed in u/m. */
static void raw_reply(int fd, uint32_t msgid, msgpack_unpacked *u, struct pgc_message *m)
{
	char err[128];
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, u), HRAW_MSG, "no reply to request %u",
			     msgid);
		cr_assert(pgc_parse_message(&u->data, m, err, sizeof(err)), "%s", err);
		if (m->type == PGC_RPC_RESPONSE && m->msgid == msgid)
			return;
	}
	cr_assert_fail("request %u was never answered", msgid);
}

/*
 * The soak's "permit behind a refusal": an attempt of a claim is mid-
 * transaction when its client gives the id up (its reply lost, a retry
 * refused). The attempt waits on its quota row before it writes anything
 * (its permit row goes in after its quota rows, 0018), so the release finds
 * no row, retires the id at once, and the attempt, once it has the quota
 * row, finds the retired id and is refused: whether it had room (it gives
 * its increment back) or not (its denial is answered as the refusal of a
 * retired id). Either way no slot stays taken. Both requests go down one
 * connection: the agent runs them side by side, on two pool connections.
 */
static void release_behind_attempt(bool room)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, room ? "behind-r" : "behind-f", NULL);
	pgcoord *other = client(a, "other");
	msgpack_sbuffer sb;
	struct pgc_message m;
	const msgpack_object *v;

	quota_set(other, "beh", 2, -1);
	pgcoord_claim_free(claim1(other, "b-full", "beh", 0));

	/* hold the quota row, so the attempt stops inside its transaction;
	 * without room, the holder takes the last slot away (a lower limit) */
	PGconn *locker = hdb_connect(db);
	PQclear(PQexec(locker, "BEGIN"));
	PGresult *res = PQexec(locker, room ? "SELECT 1 FROM pgcoord.quotas WHERE key = 'beh' "
					      "FOR UPDATE"
					    : "UPDATE pgcoord.quotas SET \"limit\" = 1 "
					      "WHERE key = 'beh'");
	cr_assert(PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK,
		  "%s", PQerrorMessage(locker));
	PQclear(res);

	int fd = raw_session(a);
	pack_claim_params(&sb, "b-1", "beh");
	cr_assert(hraw_send_request(fd, 2, "permit.claim", sb.data, sb.size));
	msgpack_sbuffer_destroy(&sb);
	cr_assert(
	    wait_for(db, 10000,
		     "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
		     "AND query LIKE '%permit_claim%' AND wait_event_type = 'Lock'"),
	    "the attempt never reached the quota row");
	pack_one(&sb, "id", "b-1");
	cr_assert(hraw_send_request(fd, 3, "permit.release", sb.data, sb.size));
	msgpack_sbuffer_destroy(&sb);

	/* the release is answered while the attempt still waits */
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	raw_reply(fd, 3, &u, &m);
	cr_assert_not_null(m.error, "the release of an id nobody holds succeeded");
	v = pgc_map_get(m.error, "code");
	cr_assert(v && v->type == MSGPACK_OBJECT_STR &&
		  strncmp(v->via.str.ptr, "not_found", v->via.str.size) == 0);
	v = pgc_map_get(m.error, "message");
	cr_assert(v && v->type == MSGPACK_OBJECT_STR &&
		      memmem(v->via.str.ptr, v->via.str.size, "retired", 7),
		  "the release does not say it retired the id");
	msgpack_unpacked_destroy(&u);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
					"current_database() AND query LIKE '%%permit_claim%%' AND "
					"wait_event_type = 'Lock'"),
		     1, "the attempt no longer waits on the quota row");
	PQclear(PQexec(locker, "COMMIT"));
	PQfinish(locker);

	/* the attempt, refused: the id is retired */
	msgpack_unpacked_init(&u);
	raw_reply(fd, 2, &u, &m);
	cr_assert_not_null(m.error, "the attempt behind a retirement was answered as a grant");
	v = pgc_map_get(m.error, "code");
	cr_assert(v && v->type == MSGPACK_OBJECT_STR &&
		      strncmp(v->via.str.ptr, "conflict", v->via.str.size) == 0,
		  "claim: %.*s", v ? (int)v->via.str.size : 0, v ? v->via.str.ptr : "");
	v = pgc_map_get(m.error, "message");
	cr_assert(v && v->type == MSGPACK_OBJECT_STR &&
		      memmem(v->via.str.ptr, v->via.str.size, "retired", 7),
		  "the attempt's refusal does not say the id was retired");
	msgpack_unpacked_destroy(&u);
	close(fd);

	assert_state(db, "b-1", "released");
	cr_assert_eq(in_flight(db, "beh"), 1, "a slot stayed taken behind the give-up");
	cr_assert_eq(events(db, "b-1", "admitted"), 0);
	cr_assert_eq(events(db, "b-1", "released"), 0);
	cr_assert_eq(events(db, "b-1", "retired"), 1);
	assert_conserved(db, "after a release behind an attempt");
	pgcoord_close(other);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * A claim queued on a quota row that someone holds (an operator's open
 * transaction, say) keeps its session row locked while it waits. That lock
 * must not block the heartbeat's renewal: with a FOR SHARE lock it did, and
 * after half a session ttl the agent suspended, then declared lost, every
 * session it served, leaders included.
 */
Test(permits, claim_waiting_on_a_held_quota_row_does_not_stall_heartbeats)
{
	struct harness_db *db = ledger_db();
	/* fast liveness, and a query timeout longer than the wait, so the
	 * claim is answered when the row is let go */
	static const char *const args[] = {"--heartbeat-interval-ms",
					   "200",
					   "--session-ttl-ms",
					   "1200",
					   "--session-grace-ms",
					   "300",
					   "--query-timeout-ms",
					   "20000",
					   NULL};
	struct hagent *a = hagent_start(db, "stuck-a", args);
	pgcoord *leader = client(a, "leader");
	msgpack_sbuffer sb;
	msgpack_unpacked u;
	struct pgc_message m;
	bool leads = false;

	quota_set(leader, "stuck", 5, -1);
	cr_assert_eq(
	    pgcoord_lease_acquire(leader, "stuck-lease", 3000, false, CALL_MS, &leads, NULL),
	    PGCOORD_OK, "%s", pgcoord_last_message(leader));
	cr_assert(leads);

	PGconn *locker = hdb_connect(db);
	PQclear(PQexec(locker, "BEGIN"));
	PGresult *res =
	    PQexec(locker, "SELECT 1 FROM pgcoord.quotas WHERE key = 'stuck' FOR UPDATE");
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(locker));
	PQclear(res);
	int fd = raw_session(a);
	pack_claim_params(&sb, "s-1", "stuck");
	cr_assert(hraw_send_request(fd, 2, "permit.claim", sb.data, sb.size));
	msgpack_sbuffer_destroy(&sb);
	cr_assert(
	    wait_for(db, 10000,
		     "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
		     "AND query LIKE '%permit_claim%' AND wait_event_type = 'Lock'"),
	    "the claim never queued on the quota row");

	/* three session ttls (1200 ms) with the claim stuck */
	for (int i = 0; i < 36; i++) {
		hsleep_ms(100);
		pgcoord_poll(leader, 0, NULL);
	}
	cr_assert(pgcoord_lease_is_leader(leader, "stuck-lease"),
		  "the leader lost its lease while a claim waited:\n%s", hagent_log(a));
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.session_liveness WHERE replica_id = "
			       "'stuck-a' AND NOT internal AND closed_at IS NULL "
			       "AND expires_at > now() + interval '300 ms'"),
	    2, "the agent stopped renewing its sessions while a claim waited:\n%s", hagent_log(a));
	cr_assert_null(strstr(hagent_log(a), "declaring every session lost"), "%s", hagent_log(a));

	PQclear(PQexec(locker, "COMMIT"));
	PQfinish(locker);
	/* the claim goes on and is admitted */
	msgpack_unpacked_init(&u);
	raw_reply(fd, 2, &u, &m);
	cr_assert_null(m.error, "the claim failed");
	const msgpack_object *st = pgc_map_get(m.result, "status");
	cr_assert(st && st->type == MSGPACK_OBJECT_STR &&
		  strncmp(st->via.str.ptr, "admitted", st->via.str.size) == 0);
	msgpack_unpacked_destroy(&u);
	assert_state(db, "s-1", "held");
	cr_assert_eq(in_flight(db, "stuck"), 1);
	assert_conserved(db, "after the quota row was let go");
	close(fd);
	pgcoord_close(leader);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(permits, release_of_an_id_whose_attempt_waits_with_room_retires_it_first)
{
	release_behind_attempt(true);
}

Test(permits, release_of_an_id_whose_attempt_waits_without_room_retires_it_first)
{
	release_behind_attempt(false);
}

/*
 * retention_s: the janitor deletes finished history past the horizon and
 * nothing else — not a recent tombstone, not a permit that counts, not a
 * released permit a record still names — and conservation still holds,
 * audit sums included. A claim of a deleted id is new work.
 */
Test(permits, retention_deletes_only_finished_history_past_the_horizon)
{
	static const char *const args[] = {"--retention-s", "3600", NULL};
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "keep-a", args);
	pgcoord *c = client(a, "keep");
	bool leader = false;
	int64_t token = 0;

	quota_set(c, "keep", 10, -1);
	const char *ids[] = {"k-old", "k-recent", "k-held", "k-named", "k-rec-old"};
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
		pgcoord_claim_free(claim1(c, ids[i], "keep", 0));
	cr_assert_eq(pgcoord_record_put(c, "job", "named", "running", NULL, 0, "k-named", CALL_MS,
					NULL, NULL),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	cr_assert_eq(pgcoord_record_put(c, "job", "old", "running", NULL, 0, "k-rec-old", CALL_MS,
					NULL, &token),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	cr_assert_eq(pgcoord_record_settle(c, "job", "old", "done", token, CALL_MS), PGCOORD_OK,
		     "%s", pgcoord_last_message(c));
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
		if (strcmp(ids[i], "k-held") != 0)
			cr_assert_eq(pgcoord_permit_release(c, ids[i], 0, NULL, CALL_MS, NULL),
				     PGCOORD_OK, "%s", pgcoord_last_message(c));
	cr_assert_eq(pgcoord_lease_acquire(c, "keep-lease", 0, false, CALL_MS, &leader, NULL),
		     PGCOORD_OK);
	cr_assert(leader);
	cr_assert_eq(pgcoord_lease_release(c, "keep-lease", CALL_MS, NULL), PGCOORD_OK);

	/* the janitor's own lease changes stay recent */
	long recent_lease_events = hdb_query_long(
	    db, "SELECT count(*) FROM pgcoord.lease_events WHERE name <> 'keep-lease'");
	cr_assert_gt(recent_lease_events, 0);

	/* two hours pass for everything but k-recent and k-held */
	hdb_exec(db, "UPDATE pgcoord.permits SET released_at = now() - interval '2 hours' "
		     "WHERE id IN ('k-old', 'k-named', 'k-rec-old');"
		     "UPDATE pgcoord.records SET settled_at = now() - interval '2 hours' "
		     "WHERE key = 'old';"
		     "UPDATE pgcoord.lease_events SET at = now() - interval '2 hours' "
		     "WHERE name = 'keep-lease'");
	cr_assert(wait_for(db, 15000,
			   "SELECT (count(*) = 0)::int FROM pgcoord.permits "
			   "WHERE id IN ('k-old', 'k-rec-old')"),
		  "the janitor kept history past the horizon:\n%s", hagent_log(a));
	cr_assert(wait_for(db, 15000,
			   "SELECT (count(*) = 0)::int FROM pgcoord.lease_events "
			   "WHERE name = 'keep-lease'"));

	/* gone with their audit rows and quota shares */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE permit_id IN ('k-old', 'k-rec-old')"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_quotas "
					"WHERE permit_id IN ('k-old', 'k-rec-old')"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.records WHERE key = 'old'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.record_events "
					"WHERE key = 'old'"),
		     0);
	/* kept: recent, counting, or named by an open record */
	cr_assert_geq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_events "
					 "WHERE name <> 'keep-lease'"),
		      recent_lease_events);
	assert_state(db, "k-recent", "released");
	assert_state(db, "k-held", "held");
	assert_state(db, "k-named", "released");
	cr_assert_eq(events(db, "k-named", "admitted"), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.records WHERE key = 'named'"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE event = 'limit_set' AND key = 'keep'"),
		     1);
	cr_assert_eq(in_flight(db, "keep"), 1);
	assert_conserved(db, "after the janitor deleted old history");
	assert_agent_check_ok(c, "after the janitor deleted old history");

	/* past the window, an old id is new work */
	pgcoord_claim *cl = claim1(c, "k-old", "keep", 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	cr_assert_eq(in_flight(db, "keep"), 2);
	assert_conserved(db, "after an old id was claimed again");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- guarantee 6: the reservation lifecycle is visible ------------------------- */

/* Decodes a libpgcoord read result; the caller destroys u and frees res. */
static const msgpack_object *decode(void *res, size_t len, msgpack_unpacked *u)
{
	size_t off = 0;
	msgpack_unpacked_init(u);
	cr_assert_eq(msgpack_unpack_next(u, res, len, &off), MSGPACK_UNPACK_SUCCESS);
	return &u->data;
}

/*
 * The intent bytes are committed with the claim and read back unchanged;
 * phase and state carry their times; the history lists every change in
 * order; an id reused for another claim, and unknown names, are clear
 * errors.
 */
Test(permits, intent_phase_and_history_are_recorded_with_the_claim)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "life-a", NULL);
	pgcoord *c = client(a, "lifecycle");
	static const char intent[] = {'{', '"', 'p', 'o', 'd', '"', 0, (char)0xff, '}'};
	const char *keys[1] = {"life"};
	pgcoord_claim *cl = NULL;
	void *res = NULL;
	size_t len = 0;
	msgpack_unpacked u;

	quota_set(c, "life", 4, -1);
	cr_assert_eq(pgcoord_permit_claim(
			 c, "l-1",
			 &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						      .keys = keys,
						      .nquotas = 1,
						      .intent = intent,
						      .intent_len = sizeof(intent),
						      .limit = PGCOORD_NO_LIMIT},
			 CALL_MS, &cl),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	cr_assert(pgcoord_claim_is_mine(cl));
	cr_assert_eq(pgcoord_claim_get_owner_session(cl), pgcoord_session_id(c));
	cr_assert_eq(pgcoord_claim_get_token(cl),
		     hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'l-1'"));
	pgcoord_claim_free(cl);
	char *hex = hdb_query_value(db, "SELECT encode(intent, 'hex') FROM pgcoord.permits "
					"WHERE id = 'l-1'");
	cr_assert_str_eq(hex, "7b22706f642200ff7d", "the intent was not stored byte for byte");
	free(hex);

	cr_assert_eq(pgcoord_permit_update(c, "l-1", PGCOORD_PHASE_DISPATCHED, CALL_MS),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_update(c, "l-1", PGCOORD_PHASE_RUNNING, CALL_MS), PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_update(c, "l-1", PGCOORD_PHASE_RUNNING, CALL_MS), PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_update(c, "l-1", PGCOORD_PHASE_DISPATCHED, CALL_MS),
		     PGCOORD_E_CONFLICT);
	cr_assert_eq(events(db, "l-1", "phase"), 2, "an unchanged phase was audited");

	cr_assert_eq(pgcoord_permit_get(c, "l-1", CALL_MS, &res, &len), PGCOORD_OK);
	const msgpack_object *p = pgc_map_get(decode(res, len, &u), "permit");
	const msgpack_object *bin = pgc_map_get(p, "intent");
	cr_assert(bin && bin->type == MSGPACK_OBJECT_BIN);
	cr_assert_eq(bin->via.bin.size, sizeof(intent));
	cr_assert_eq(memcmp(bin->via.bin.ptr, intent, sizeof(intent)), 0);
	cr_assert(pgc_obj_str_eq(pgc_map_get(p, "phase"), "running"));
	cr_assert(pgc_obj_str_eq(pgc_map_get(p, "state"), "held"));
	int64_t age = -1, phase_age = -1;
	cr_assert(pgc_obj_int64(pgc_map_get(p, "age_ms"), &age) && age >= 0);
	cr_assert(pgc_obj_int64(pgc_map_get(p, "phase_age_ms"), &phase_age) && phase_age <= age);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);

	/* one id names one claim */
	quota_set(c, "life-2", 4, -1);
	cr_assert_eq(iclaim_one(c, "l-1", "life-2", CALL_MS, &cl), PGCOORD_E_CONFLICT);
	cr_assert_eq(in_flight(db, "life-2"), 0);

	cr_assert_eq(pgcoord_permit_release(c, "l-1", 0, "done", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_history(c, "l-1", CALL_MS, &res, &len), PGCOORD_OK);
	const msgpack_object *evs = pgc_map_get(decode(res, len, &u), "events");
	static const char *const want[] = {"admitted", "phase", "phase", "released"};
	cr_assert(evs && evs->type == MSGPACK_OBJECT_ARRAY && evs->via.array.size == 4);
	for (int i = 0; i < 4; i++)
		cr_assert(pgc_obj_str_eq(pgc_map_get(&evs->via.array.ptr[i], "event"), want[i]),
			  "event %d is not %s", i, want[i]);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);

	int64_t limit = -1;
	cr_assert_eq(pgcoord_quota_get(c, "nope", CALL_MS, &limit, NULL, NULL, NULL),
		     PGCOORD_E_NOT_FOUND);
	cr_assert(strstr(pgcoord_last_message(c), "nope"), "%s", pgcoord_last_message(c));
	cr_assert_eq(pgcoord_permit_get(c, "nope", CALL_MS, &res, &len), PGCOORD_E_NOT_FOUND);
	cr_assert_eq(pgcoord_quota_list(c, CALL_MS, &res, &len), PGCOORD_OK);
	const msgpack_object *qs = pgc_map_get(decode(res, len, &u), "quotas");
	cr_assert(qs && qs->type == MSGPACK_OBJECT_ARRAY && qs->via.array.size == 2);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);
	assert_conserved(db, "after a lifecycle");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- multi-quota: all or nothing ------------------------------------------- */

Test(permits, multi_quota_claim_with_one_full_quota_changes_nothing)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "multi-a", NULL);
	pgcoord *c = client(a, "multi");
	const char *ab[2] = {"m-a", "m-b"};
	const char *ba[2] = {"m-b", "m-a"};
	const char *ac[2] = {"m-a", "m-c"};
	const int32_t w[2] = {2, 1};

	quota_set(c, "m-a", 5, -1); /* room */
	quota_set(c, "m-b", 1, -1); /* full, below */
	quota_set(c, "m-c", 5, -1); /* room */
	pgcoord_claim_free(claim1(c, "m-filler", "m-b", 0));
	long events_before = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events");

	/* the full quota sorts last, then first: the earlier increment is undone
	 * either way */
	pgcoord_claim *cl = claim_n(c, "m-1", ab, w, 2, 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED);
	cr_assert_str_eq(pgcoord_claim_denied_quota(cl), "m-b");
	cr_assert_eq(pgcoord_claim_denied_limit(cl), 1);
	cr_assert_eq(pgcoord_claim_denied_in_flight(cl), 1);
	pgcoord_claim_free(cl);
	cl = claim_n(c, "m-2", ba, NULL, 2, 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED);
	pgcoord_claim_free(cl);

	cr_assert_eq(in_flight(db, "m-a"), 0, "the quota with room kept an increment");
	cr_assert_eq(in_flight(db, "m-b"), 1);
	cr_assert_eq(permit_rows(db, "m-1") + permit_rows(db, "m-2"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_quotas "
					"WHERE permit_id IN ('m-1', 'm-2')"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events"),
		     events_before, "a denied claim wrote audit rows");

	/* both with room: both move, by their weights */
	cl = claim_n(c, "m-3", ac, w, 2, 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	cr_assert_eq(in_flight(db, "m-a"), 2);
	cr_assert_eq(in_flight(db, "m-c"), 1);
	cr_assert_eq(events(db, "m-3", "admitted"), 2);
	/* a share of one quota is kept in the permit's row, shares of two or
	 * more in permit_quotas_multi; readers see both as permit_quotas */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_quotas_multi "
					"WHERE permit_id IN ('m-3', 'm-filler')"),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE "
					"(id, quota_key, quota_weight) IN (('m-filler', 'm-b', 1)) "
					"OR (id = 'm-3' AND quota_key IS NULL)"),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_quotas "
					"WHERE permit_id IN ('m-3', 'm-filler')"),
		     3);

	/* a key that names no quota, and no limit: a clear error, no effect */
	const char *missing[1] = {"m-none"};
	pgcoord_claim *none = NULL;
	cr_assert_eq(iclaim_one(c, "m-4", "m-none", CALL_MS, &none), PGCOORD_E_NOT_FOUND);
	cr_assert(strstr(pgcoord_last_message(c), "m-none"), "%s", pgcoord_last_message(c));
	cr_assert_eq(permit_rows(db, "m-4"), 0);
	/* …unless the claim carries the limit, which is recorded */
	cr_assert_eq(pgcoord_permit_claim(
			 c, "m-4",
			 &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						      .keys = missing,
						      .nquotas = 1,
						      .limit = 7},
			 CALL_MS, &none),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_claim_get_status(none), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(none);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'm-none'"), 7);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE key = 'm-none' AND event = 'limit_set'"),
		     1);
	assert_conserved(db, "after multi-quota claims");
	assert_agent_check_ok(c, "after multi-quota claims");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * Nobody overtakes a queue: while claims wait on a quota (quotas.waiting,
 * kept by waiting claims), an immediate claim on it is denied with that
 * quota's numbers even with room left, and a multi-quota claim refused on
 * its second quota gives back its first. Once nobody waits, the same id is
 * admitted.
 */
Test(permits, claim_is_denied_while_others_wait_on_its_quota)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "queue-a", NULL);
	pgcoord *c = client(a, "queue");
	const char *ab[2] = {"q-a", "q-b"};

	quota_set(c, "q-a", 5, -1);
	quota_set(c, "q-b", 5, -1);
	hdb_exec(db, "UPDATE pgcoord.quotas SET waiting = 1 WHERE key = 'q-b'");
	long events_before = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events");

	pgcoord_claim *cl = claim_n(c, "q-1", ab, NULL, 2, 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED,
		     "a claim overtook a queue");
	cr_assert_str_eq(pgcoord_claim_denied_quota(cl), "q-b");
	cr_assert_eq(pgcoord_claim_denied_limit(cl), 5);
	cr_assert_eq(pgcoord_claim_denied_in_flight(cl), 0);
	pgcoord_claim_free(cl);
	cr_assert_eq(in_flight(db, "q-a"), 0, "the quota before the refusing one kept its share");
	cr_assert_eq(permit_rows(db, "q-1"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events"),
		     events_before, "a denied claim wrote audit rows");

	hdb_exec(db, "UPDATE pgcoord.quotas SET waiting = 0 WHERE key = 'q-b'");
	cl = claim_n(c, "q-1", ab, NULL, 2, 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	cr_assert_eq(in_flight(db, "q-a"), 1);
	cr_assert_eq(in_flight(db, "q-b"), 1);
	cr_assert_eq(events(db, "q-1", "admitted"), 2);
	assert_conserved(db, "after claims behind a queue");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- guarantee 5: an unknown outcome stays visible ------------------------------ */

/*
 * A permit its owner marks uncertain keeps counting and is listed uncertain
 * until a resolve with evidence; a resolve without evidence is refused and
 * changes nothing.
 */
Test(permits, uncertain_permit_counts_until_resolved_with_evidence)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "unc-a", NULL);
	struct hagent *b = hagent_start(db, "unc-b", NULL);
	pgcoord *owner = client(a, "owner");
	pgcoord *other = client(b, "reconciler");
	int64_t held = -1, uncertain = -1, inf = -1;
	bool released = true;

	quota_set(owner, "unc", 1, -1);
	pgcoord_claim_free(claim1(owner, "u-1", "unc", 0));
	cr_assert_eq(pgcoord_permit_update(owner, "u-1", PGCOORD_PHASE_DISPATCHED, CALL_MS),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_update(owner, "u-1", PGCOORD_PHASE_RESERVED, CALL_MS),
		     PGCOORD_E_CONFLICT, "a phase moved backwards");
	cr_assert_eq(
	    pgcoord_permit_mark_uncertain(owner, "u-1", "connector lost before confirm", CALL_MS),
	    PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_mark_uncertain(other, "u-1", "not mine", CALL_MS),
		     PGCOORD_E_FORBIDDEN);

	/* still counted, and shown as uncertain */
	char *state = permit_state(db, "u-1");
	cr_assert_str_eq(state, "uncertain");
	free(state);
	cr_assert_eq(in_flight(db, "unc"), 1);
	cr_assert_eq(pgcoord_quota_get(other, "unc", CALL_MS, NULL, &inf, &held, &uncertain),
		     PGCOORD_OK);
	cr_assert_eq(inf, 1);
	cr_assert_eq(held, 0);
	cr_assert_eq(uncertain, 1);
	pgcoord_claim *cl = claim1(other, "u-2", "unc", 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED,
		     "an uncertain permit's slot was given away");
	pgcoord_claim_free(cl);

	void *res = NULL;
	size_t len = 0;
	cr_assert_eq(pgcoord_permit_list(other, "unc", "uncertain", CALL_MS, &res, &len),
		     PGCOORD_OK);
	cr_assert(memmem(res, len, "u-1", 3) && memmem(res, len, "connector lost", 14),
		  "permit.list does not show u-1 as uncertain with its reason");
	pgcoord_free(res);

	/* the owner cannot just release an uncertain permit */
	cr_assert_eq(pgcoord_permit_release(owner, "u-1", 0, NULL, CALL_MS, &released),
		     PGCOORD_E_CONFLICT);
	/* a resolve without evidence is refused, and nothing changes */
	long ev = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events");
	cr_assert_eq(pgcoord_permit_resolve(other, "u-1", PGCOORD_OUTCOME_GONE, "", 0, CALL_MS),
		     PGCOORD_E_INVALID_PARAMS);
	cr_assert_eq(pgcoord_permit_resolve(other, "u-1", PGCOORD_OUTCOME_GONE, "  ", 0, CALL_MS),
		     PGCOORD_E_INVALID_PARAMS);
	cr_assert_eq(pgcoord_permit_resolve(other, "u-1", PGCOORD_OUTCOME_GONE, NULL, 0, CALL_MS),
		     PGCOORD_E_INVALID_PARAMS);
	const char *no_evidence[] = {"permits", "resolve", "u-1", "--gone", NULL};
	char *out = NULL;
	cr_assert_eq(run_ctl(b, &out, no_evidence), 2, "pgcoordctl resolved without evidence");
	free(out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events"), ev);
	state = permit_state(db, "u-1");
	cr_assert_str_eq(state, "uncertain");
	free(state);
	cr_assert_eq(in_flight(db, "unc"), 1);

	/* observed gone, by another replica: released, audited with the evidence */
	cr_assert_eq(pgcoord_permit_resolve(other, "u-1", PGCOORD_OUTCOME_GONE,
					    "pod u-1 absent from the cluster", 0, CALL_MS),
		     PGCOORD_OK);
	cr_assert_eq(in_flight(db, "unc"), 0);
	cr_assert_eq(events(db, "u-1", "resolved_gone"), 1);
	char *actor = hdb_query_value(db, "SELECT actor || ' / ' || reason FROM "
					  "pgcoord.permit_events WHERE permit_id = 'u-1' "
					  "AND event = 'resolved_gone'");
	cr_assert(strstr(actor, "session:") && strstr(actor, "@unc-b") &&
		      strstr(actor, "pod u-1 absent"),
		  "%s", actor);
	free(actor);
	cl = claim1(other, "u-2", "unc", 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	assert_conserved(db, "after resolving");
	pgcoord_close(owner);
	pgcoord_close(other);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/*
 * The owner's agent is killed: its permit keeps counting, is listed
 * uncertain (at once by liveness, then recorded by the janitor), until a
 * session that observed the work running adopts it. The owner's
 * on_owner_loss=release permit is released instead, exactly once.
 */
Test(permits, killed_owners_permit_stays_counted_and_uncertain_until_resolved)
{
	struct harness_db *db = ledger_db();
	/* b starts first so it is the janitor and survives */
	struct hagent *b = hagent_start(db, "kill-b", fast_liveness);
	struct hagent *a = hagent_start(db, "kill-a", fast_liveness);
	wait_janitor(db, "kill-b");
	pgcoord *owner = client(a, "doomed");
	pgcoord *other = client(b, "survivor");

	quota_set(other, "kq", 3, -1);
	pgcoord_claim_free(claim1(owner, "k-remote", "kq", 0));
	pgcoord_claim_free(claim1(owner, "k-inproc", "kq", PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS));
	cr_assert_eq(pgcoord_permit_update(owner, "k-remote", PGCOORD_PHASE_RUNNING, CALL_MS),
		     PGCOORD_OK);
	cr_assert_eq(in_flight(db, "kq"), 2);

	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);
	pgcoord_close(owner);

	/* the janitor records it: uncertain, still counted; the in-process one
	 * is released once */
	cr_assert(wait_for(db, 15000,
			   "SELECT count(*) FROM pgcoord.permits WHERE id = 'k-remote' "
			   "AND state = 'uncertain'"),
		  "the dead owner's permit was never recorded uncertain; leases: %s; "
		  "the janitor's log:\n%s",
		  hdb_query_value(db, "SELECT string_agg(name || '=' || holder_replica || ' "
				      "expires in ' || (expires_at - now())::text, ', ') "
				      "FROM pgcoord.leases"),
		  hagent_log(b));
	cr_assert(wait_for(db, 15000,
			   "SELECT count(*) FROM pgcoord.permits WHERE id = 'k-inproc' "
			   "AND state = 'released'"));
	cr_assert_eq(events(db, "k-inproc", "owner_lost_released"), 1);
	cr_assert_eq(in_flight(db, "kq"), 1, "the uncertain permit stopped counting");
	char *reason = hdb_query_value(db, "SELECT uncertain_reason FROM pgcoord.permits "
					   "WHERE id = 'k-remote'");
	cr_assert(reason && strstr(reason, "ended"), "%s", reason ? reason : "(null)");
	free(reason);

	void *res = NULL;
	size_t len = 0;
	cr_assert_eq(pgcoord_permit_list(other, NULL, "uncertain", CALL_MS, &res, &len),
		     PGCOORD_OK);
	cr_assert(memmem(res, len, "k-remote", 8), "k-remote is not listed uncertain");
	pgcoord_free(res);
	const char *list[] = {"permits", NULL};
	char *out = NULL;
	cr_assert_eq(run_ctl(b, &out, list), 0);
	cr_assert(strstr(out, "k-remote") && strstr(out, "uncertain"), "%s", out);
	free(out);

	/* two slots remain, not three */
	pgcoord_claim_free(claim1(other, "k-2", "kq", 0));
	pgcoord_claim_free(claim1(other, "k-3", "kq", 0));
	pgcoord_claim *cl = claim1(other, "k-4", "kq", 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED);
	pgcoord_claim_free(cl);

	/* observed running: adopted by the resolving session, held again */
	cr_assert_eq(pgcoord_permit_resolve(other, "k-remote", PGCOORD_OUTCOME_RUNNING,
					    "container k-remote up for 40 s", 0, CALL_MS),
		     PGCOORD_OK);
	cr_assert_eq(hdb_query_long(db, "SELECT owner_session FROM pgcoord.permits "
					"WHERE id = 'k-remote' AND state = 'held'"),
		     pgcoord_session_id(other));
	cr_assert_eq(events(db, "k-remote", "adopted"), 1);
	cr_assert_eq(in_flight(db, "kq"), 3);
	bool released = false;
	cr_assert_eq(pgcoord_permit_release(other, "k-remote", 0, NULL, CALL_MS, &released),
		     PGCOORD_OK);
	cr_assert(released);
	cr_assert_eq(in_flight(db, "kq"), 2);
	assert_conserved(db, "after the owner's agent died");
	pgcoord_close(other);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- owner-loss release and lapse: exactly once ---------------------------------- */

/*
 * on_owner_loss=release, with the owner's own release racing the session's
 * end (both pipelined on one connection, so the agent runs them at once):
 * the permit leaves exactly once.
 */
Test(permits, owner_loss_release_racing_owner_release_decrements_once)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "race-rel-a", NULL);
	pgcoord *admin = client(a, NULL);
	const int rounds = 30;

	quota_set(admin, "ol", 100, -1);
	for (int i = 0; i < rounds; i++) {
		char id[32];
		msgpack_sbuffer sb, rel;
		msgpack_packer pk;
		msgpack_unpacked u;
		int fd = raw_session(a);

		snprintf(id, sizeof(id), "ol-%d", i);
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		msgpack_pack_map(&pk, 3);
		pgc_pack_kv_str(&pk, "id", id);
		pgc_pack_cstr(&pk, "quotas");
		msgpack_pack_array(&pk, 1);
		msgpack_pack_map(&pk, 1);
		pgc_pack_kv_str(&pk, "key", "ol");
		pgc_pack_kv_str(&pk, "on_owner_loss", "release");
		msgpack_unpacked_init(&u);
		cr_assert_eq(hraw_call(fd, 2, "permit.claim", sb.data, sb.size, CALL_MS, &u),
			     HRAW_MSG);
		struct pgc_message m;
		char perr[128];
		cr_assert(pgc_parse_message(&u.data, &m, perr, sizeof(perr)), "%s", perr);
		cr_assert_null(m.error, "the claim of %s failed", id);
		cr_assert(pgc_obj_str_eq(pgc_map_get(m.result, "status"), "admitted"));
		msgpack_sbuffer_destroy(&sb);
		pack_one(&rel, "id", id);
		cr_assert(hraw_send_request(fd, 3, "permit.release", rel.data, rel.size));
		cr_assert(hraw_send_request(fd, 4, "session.close", NULL, 0));
		msgpack_sbuffer_destroy(&rel);
		/* both answers, whatever they say */
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, &u), HRAW_MSG);
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, &u), HRAW_MSG);
		msgpack_unpacked_destroy(&u);
		close(fd);
		char *state = permit_state(db, id);
		cr_assert_str_eq(state, "released");
		free(state);
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM pgcoord.permit_events "
					    "WHERE permit_id = '%s' AND delta < 0",
					    id),
			     1, "%s left more than once", id);
	}
	cr_assert_eq(in_flight(db, "ol"), 0);
	assert_conserved(db, "after owner-loss releases");
	pgcoord_close(admin);
	hagent_destroy(a);
	hdb_drop(db);
}

struct lapse_racer {
	pthread_t thread;
	pthread_barrier_t *barrier;
	pgcoord *c;   /* the resolver's agent connection */
	PGconn *conn; /* the sweeper's database connection */
	int n;
	int released;
};

static void *lapse_resolver(void *arg)
{
	struct lapse_racer *r = arg;
	pthread_barrier_wait(r->barrier);
	for (int i = 0; i < r->n; i++) {
		char id[32];
		snprintf(id, sizeof(id), "lp-%d", i);
		if (pgcoord_permit_resolve(r->c, id, PGCOORD_OUTCOME_GONE, "observed gone", 0,
					   CALL_MS) == PGCOORD_OK)
			r->released++;
	}
	return NULL;
}

static void *lapse_sweeper(void *arg)
{
	struct lapse_racer *r = arg;
	pthread_barrier_wait(r->barrier);
	for (int i = 0; i < 5; i++) {
		PGresult *res =
		    PQexec(r->conn, "SELECT pgcoord.janitor_lapse_permits(1000, 'test')");
		if (PQresultStatus(res) == PGRES_TUPLES_OK)
			r->released += atoi(PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	return NULL;
}

/*
 * lapse_after_s: the janitor releases a permit uncertain for longer than
 * that, once; the owner's later release and resolve find it released and
 * decrement nothing. Then the lapse sweep races resolves of many permits:
 * each leaves exactly once.
 */
Test(permits, lapse_after_releases_uncertain_permits_exactly_once)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "lapse-a", NULL);
	wait_janitor(db, "lapse-a");
	pgcoord *c = client(a, "lapsing");
	bool released = true;

	quota_set(c, "lq", 100, 1);
	pgcoord_claim_free(claim1(c, "lp-first", "lq", 0));
	cr_assert_eq(pgcoord_permit_mark_uncertain(c, "lp-first", "lost contact", CALL_MS),
		     PGCOORD_OK);
	cr_assert(wait_for(db, 10000,
			   "SELECT count(*) FROM pgcoord.permits WHERE id = 'lp-first' "
			   "AND state = 'released'"),
		  "the janitor never lapsed the uncertain permit");
	cr_assert_eq(events(db, "lp-first", "lapsed"), 1);
	char *actor = hdb_query_value(db, "SELECT actor FROM pgcoord.permit_events "
					  "WHERE permit_id = 'lp-first' AND event = 'lapsed'");
	cr_assert_str_eq(actor, "janitor@lapse-a");
	free(actor);
	cr_assert_eq(pgcoord_permit_release(c, "lp-first", 0, NULL, CALL_MS, &released),
		     PGCOORD_OK);
	cr_assert_not(released, "the owner's release decremented a lapsed permit again");
	cr_assert_eq(
	    pgcoord_permit_resolve(c, "lp-first", PGCOORD_OUTCOME_GONE, "gone", 0, CALL_MS),
	    PGCOORD_OK);
	cr_assert_eq(in_flight(db, "lq"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE permit_id = 'lp-first' AND delta < 0"),
		     1);

	/* a held permit never lapses, however old */
	pgcoord_claim_free(claim1(c, "lp-held", "lq", 0));

	/* race: sweeps against resolves, on 20 lapse-due permits */
	const int n = 20;
	for (int i = 0; i < n; i++) {
		char id[32];
		snprintf(id, sizeof(id), "lp-%d", i);
		pgcoord_claim_free(claim1(c, id, "lq", 0));
		cr_assert_eq(pgcoord_permit_mark_uncertain(c, id, "lost", CALL_MS), PGCOORD_OK);
	}
	hsleep_ms(1100);
	struct lapse_racer res = {.c = c, .n = n}, sweep = {.conn = hdb_connect(db)};
	pthread_barrier_t barrier;
	cr_assert_eq(pthread_barrier_init(&barrier, NULL, 2), 0);
	res.barrier = sweep.barrier = &barrier;
	cr_assert_eq(pthread_create(&res.thread, NULL, lapse_resolver, &res), 0);
	cr_assert_eq(pthread_create(&sweep.thread, NULL, lapse_sweeper, &sweep), 0);
	pthread_join(res.thread, NULL);
	pthread_join(sweep.thread, NULL);
	PQfinish(sweep.conn);
	pthread_barrier_destroy(&barrier);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits "
					"WHERE id LIKE 'lp-%%' AND id <> 'lp-held' "
					"AND state <> 'released'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE permit_id LIKE 'lp-%%' AND permit_id <> 'lp-first' "
					"AND delta < 0"),
		     n, "a permit left more than once");
	cr_assert_eq(in_flight(db, "lq"), 1, "only the held permit still counts");
	char *held = permit_state(db, "lp-held");
	cr_assert_str_eq(held, "held");
	free(held);
	assert_conserved(db, "after lapses");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- guarantee 2 under failure -------------------------------------------------- */

#define CHAOS_AGENTS 3
#define CHAOS_WORKERS 6
#define CHAOS_MS 12000
#define CHAOS_MIN_FAULTS 6
#define CHAOS_CAP_MS 60000

struct chaos {
	pthread_mutex_t lock;
	char *sockets[CHAOS_AGENTS]; /* current socket of each slot */
	atomic_bool stop;
	atomic_long claims, admitted, releases, resolved, errors;
};

struct chaos_worker {
	pthread_t thread;
	int index;
	struct chaos *chaos;
};

static pgcoord *chaos_connect(struct chaos *ch, unsigned *seed)
{
	for (int attempt = 0; attempt < 50 && !atomic_load(&ch->stop); attempt++) {
		char path[512];
		pgcoord *c = NULL;
		pthread_mutex_lock(&ch->lock);
		snprintf(path, sizeof(path), "%s", ch->sockets[rand_r(seed) % CHAOS_AGENTS]);
		pthread_mutex_unlock(&ch->lock);
		if (pgcoord_connect(path, 2000, &c) == PGCOORD_OK &&
		    pgcoord_session_open(c, "chaos", 3000, NULL) == PGCOORD_OK)
			return c;
		pgcoord_close(c);
		usleep(50 * 1000);
	}
	return NULL;
}

/* Resolves what it finds uncertain as gone, as a replica reconciling
 * against its cluster would, so the quotas do not fill with the dead. */
static void chaos_reconcile(struct chaos *ch, pgcoord **c, unsigned *seed)
{
	void *res = NULL;
	size_t len = 0, off = 0;
	msgpack_unpacked u;

	if (!*c && !(*c = chaos_connect(ch, seed)))
		return;
	if (pgcoord_permit_list(*c, NULL, "uncertain", 3000, &res, &len) != PGCOORD_OK) {
		pgcoord_close(*c);
		*c = NULL;
		return;
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, res, len, &off) == MSGPACK_UNPACK_SUCCESS) {
		const msgpack_object *list = pgc_map_get(&u.data, "permits");
		for (uint32_t i = 0; list && list->type == MSGPACK_OBJECT_ARRAY &&
				     i < list->via.array.size && !atomic_load(&ch->stop);
		     i++) {
			char *id = pgc_obj_strdup(pgc_map_get(&list->via.array.ptr[i], "id"));
			if (id && pgcoord_permit_resolve(*c, id, PGCOORD_OUTCOME_GONE,
							 "chaos reconciler: not running", 0,
							 3000) == PGCOORD_OK)
				atomic_fetch_add(&ch->resolved, 1);
			free(id);
		}
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);
	usleep(100 * 1000);
}

/* Claims and releases at random, reconnecting to any agent after a
 * failure and retrying with the same id: what a replica does. */
static void *chaos_run(void *arg)
{
	struct chaos_worker *w = arg;
	struct chaos *ch = w->chaos;
	unsigned seed = (unsigned)w->index * 7919u + 1;
	pgcoord *c = NULL;
	static const char *const both[2] = {"cq-a", "cq-b"};

	for (long n = 0; !atomic_load(&ch->stop); n++) {
		if (w->index == 0) {
			chaos_reconcile(ch, &c, &seed);
			continue;
		}
		char id[64];
		int which = rand_r(&seed) % 3;
		const char *const *keys = which == 2 ? both : &both[which];
		size_t nkeys = which == 2 ? 2 : 1;
		unsigned flags = rand_r(&seed) % 4 == 0 ? PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS : 0;
		pgcoord_claim *cl = NULL;
		pgcoord_err err = PGCOORD_E_CLOSED;

		snprintf(id, sizeof(id), "chaos-%d-%ld", w->index, n);
		/* an unanswered claim is retried with the same id, through any
		 * agent: it must come back admitted or held, never twice */
		for (int attempt = 0; attempt < 4 && !atomic_load(&ch->stop); attempt++) {
			if (!c && !(c = chaos_connect(ch, &seed)))
				break;
			err = pgcoord_permit_claim(
			    c, id,
			    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
							 .keys = keys,
							 .nquotas = nkeys,
							 .limit = PGCOORD_NO_LIMIT,
							 .flags = flags},
			    3000, &cl);
			atomic_fetch_add(&ch->claims, 1);
			if (err == PGCOORD_OK)
				break;
			atomic_fetch_add(&ch->errors, 1);
			if (err == PGCOORD_E_UNAVAILABLE || err == PGCOORD_E_TIMEOUT ||
			    err == PGCOORD_E_BUSY) {
				usleep(20 * 1000); /* the agent is up, its database was not */
				continue;
			}
			if (err == PGCOORD_E_CONFLICT || err == PGCOORD_E_INVALID_PARAMS)
				break;
			/* the agent or the session went away: another agent */
			pgcoord_close(c);
			c = NULL;
		}
		if (err == PGCOORD_OK && pgcoord_claim_get_status(cl) != PGCOORD_CLAIM_DENIED &&
		    pgcoord_claim_is_mine(cl)) {
			atomic_fetch_add(&ch->admitted, 1);
			if (rand_r(&seed) % 5 != 0) {
				bool released = false;
				if (pgcoord_permit_release(c, id, 0, NULL, 3000, &released) ==
				    PGCOORD_OK)
					atomic_fetch_add(&ch->releases, released);
			} else if (rand_r(&seed) % 2) {
				pgcoord_permit_mark_uncertain(c, id, "chaos", 3000);
			}
		}
		pgcoord_claim_free(cl);
	}
	pgcoord_close(c);
	return NULL;
}

/*
 * Agents are SIGKILLed (and replaced) and their database connections are
 * terminated while clients claim and release through them; the ledger is
 * conserved at every sampled instant and at the end.
 */
Test(permits, conservation_holds_through_agent_kills_and_terminated_backends, .timeout = 150)
{
	struct harness_db *db = ledger_db();
	struct hagent *agents[CHAOS_AGENTS];
	struct hagent *dead[64];
	int ndead = 0, generation = 0;
	static struct chaos ch;
	static struct chaos_worker workers[CHAOS_WORKERS];
	char name[32];

	memset(&ch, 0, sizeof(ch));
	pthread_mutex_init(&ch.lock, NULL);
	for (int i = 0; i < CHAOS_AGENTS; i++) {
		snprintf(name, sizeof(name), "chaos-%d-%d", i, generation);
		agents[i] = hagent_start(db, name, fast_liveness);
		ch.sockets[i] = strdup(hagent_socket(agents[i]));
	}
	pgcoord *admin = client(agents[0], NULL);
	quota_set(admin, "cq-a", 40, -1);
	quota_set(admin, "cq-b", 25, -1);
	pgcoord_close(admin);

	for (int i = 0; i < CHAOS_WORKERS; i++) {
		workers[i].index = i;
		workers[i].chaos = &ch;
		cr_assert_eq(pthread_create(&workers[i].thread, NULL, chaos_run, &workers[i]), 0);
	}
	/* The chaos runs for CHAOS_MS and then until it has made enough faults
	 * and traffic to mean something: on a loaded machine an agent's restart
	 * can take seconds, and a test of faults must not pass or fail on how
	 * many it had time for. CHAOS_CAP_MS only stops a run that never gets
	 * there (then the assertions below fail). */
	int64_t start = hnow_ms(), end = start + CHAOS_MS;
	unsigned seed = 42;
	int kills = 0, terminations = 0, samples = 0;
	while (hnow_ms() < end ||
	       ((kills + terminations < CHAOS_MIN_FAULTS || atomic_load(&ch.admitted) <= 50) &&
		hnow_ms() < start + CHAOS_CAP_MS)) {
		hsleep_ms(300 + rand_r(&seed) % 400);
		if (rand_r(&seed) % 2) {
			/* kill -9 one agent mid-stream, start a replacement */
			int i = rand_r(&seed) % CHAOS_AGENTS;
			hagent_kill(agents[i], SIGKILL);
			hagent_wait(agents[i], 5000);
			if (ndead < 64)
				dead[ndead++] = agents[i];
			snprintf(name, sizeof(name), "chaos-%d-%d", i, ++generation);
			agents[i] = hagent_start(db, name, fast_liveness);
			pthread_mutex_lock(&ch.lock);
			free(ch.sockets[i]);
			ch.sockets[i] = strdup(hagent_socket(agents[i]));
			pthread_mutex_unlock(&ch.lock);
			kills++;
		} else {
			hdb_exec(db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
				     "WHERE datname = current_database() "
				     "AND pid <> pg_backend_pid()");
			terminations++;
		}
		assert_conserved(db, "mid-chaos");
		samples++;
	}
	atomic_store(&ch.stop, true);
	for (int i = 0; i < CHAOS_WORKERS; i++)
		pthread_join(workers[i].thread, NULL);

	cr_log_info("chaos: %d kills, %d terminations, %ld claims, %ld admitted, %ld released, "
		    "%ld resolved gone, %ld retries",
		    kills, terminations, atomic_load(&ch.claims), atomic_load(&ch.admitted),
		    atomic_load(&ch.releases), atomic_load(&ch.resolved), atomic_load(&ch.errors));
	cr_assert_gt(atomic_load(&ch.admitted), 50, "too little traffic to mean anything");
	cr_assert_geq(kills + terminations, CHAOS_MIN_FAULTS);
	assert_conserved(db, "after chaos");
	/* …and through an agent: pgcoordctl check exits 0 */
	pgcoord *checker = client(agents[0], NULL);
	assert_agent_check_ok(checker, "after chaos");
	pgcoord_close(checker);
	const char *check[] = {"check", NULL};
	char *out = NULL;
	cr_assert_eq(run_ctl(agents[0], &out, check), 0, "%s", out);
	free(out);
	/* no claim id ever admitted twice */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM (SELECT permit_id, key "
					"FROM pgcoord.permit_events WHERE event = 'admitted' "
					"GROUP BY permit_id, key HAVING count(*) > 1) d"),
		     0);
	for (int i = 0; i < CHAOS_AGENTS; i++) {
		hagent_destroy(agents[i]);
		free(ch.sockets[i]);
	}
	for (int i = 0; i < ndead; i++)
		hagent_destroy(dead[i]);
	hdb_drop(db);
}

/* Lowering a limit below in_flight takes nothing away and admits nothing
 * until in_flight + weight fits again; the check does not call that a
 * violation, but does once a claim is admitted over the limit. */
Test(permits, lowered_limit_admits_nothing_until_in_flight_falls_below_it)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "low-a", NULL);
	pgcoord *c = client(a, "lower");
	char id[16];

	quota_set(c, "low", 3, -1);
	for (int i = 0; i < 3; i++) {
		snprintf(id, sizeof(id), "low-%d", i);
		pgcoord_claim_free(claim1(c, id, "low", 0));
	}
	quota_set(c, "low", 1, -1);
	cr_assert_eq(in_flight(db, "low"), 3, "lowering the limit released permits");
	assert_agent_check_ok(c, "after lowering the limit");
	for (int i = 0; i < 3; i++) {
		pgcoord_claim *cl = claim1(c, "low-new", "low", 0);
		cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED,
			     "admitted with in_flight %ld over limit 1", in_flight(db, "low"));
		pgcoord_claim_free(cl);
		snprintf(id, sizeof(id), "low-%d", i);
		cr_assert_eq(pgcoord_permit_release(c, id, 0, NULL, CALL_MS, NULL), PGCOORD_OK);
		assert_agent_check_ok(c, "while in_flight falls");
	}
	pgcoord_claim *cl = claim1(c, "low-new", "low", 0);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	assert_conserved(db, "after lowering a limit");

	/* an admission past the limit (forged here) is a violation */
	hdb_exec(db, "UPDATE pgcoord.quotas SET \"limit\" = 0 WHERE key = 'low'");
	bool ok = true;
	cr_assert_eq(pgcoord_permit_check(c, CALL_MS, &ok, NULL, NULL), PGCOORD_OK);
	cr_assert_not(ok, "in_flight over a limit nobody set through quota.set passed");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- operators: check, overrides, admins ----------------------------------------- */

/* pgcoordctl check exits 0 on a conserved ledger, and 1 with the offending
 * row when a counter drifts. */
Test(permits, ctl_check_reports_a_drifted_counter)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "check-a", NULL);
	pgcoord *c = client(a, "checker");
	const char *check[] = {"check", NULL};
	char *out = NULL;

	quota_set(c, "ck", 3, -1);
	pgcoord_claim_free(claim1(c, "ck-1", "ck", 0));
	cr_assert_eq(run_ctl(a, &out, check), 0, "%s", out);
	free(out);
	hdb_exec(db, "UPDATE pgcoord.quotas SET in_flight = in_flight + 1 WHERE key = 'ck'");
	cr_assert_eq(run_ctl(a, &out, check), 1, "check passed a drifted counter: %s", out);
	cr_assert(strstr(out, "ck") && strstr(out, "differs"), "%s", out);
	free(out);
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* An operator override is audited with the caller's uid and the evidence;
 * pgcoordctl permits history shows it. */
Test(permits, operator_override_is_audited_with_uid_and_evidence)
{
	struct harness_db *db = ledger_db();
	struct hagent *a = hagent_start(db, "op-a", NULL);
	pgcoord *c = client(a, "worker");
	char *out = NULL, expect[64];

	quota_set(c, "op", 2, -1);
	pgcoord_claim_free(claim1(c, "op-1", "op", 0));
	pgcoord_claim_free(claim1(c, "op-2", "op", 0));
	const char *resolve[] = {"permits", "resolve",	  "op-1",
				 "--gone",  "--evidence", "node drained, no process found",
				 NULL};
	cr_assert_eq(run_ctl(a, &out, resolve), 0, "%s", out);
	free(out);
	const char *release_no_override[] = {"permits", "release", "op-2", NULL};
	cr_assert_eq(run_ctl(a, &out, release_no_override), 2);
	free(out);
	const char *release[] = {"permits",  "release",		  "op-2", "--override",
				 "--reason", "tenant offboarded", NULL};
	cr_assert_eq(run_ctl(a, &out, release), 0, "%s", out);
	free(out);
	cr_assert_eq(in_flight(db, "op"), 0);

	snprintf(expect, sizeof(expect), "operator:uid=%u", (unsigned)geteuid());
	char *row = hdb_query_value(db, "SELECT actor || ' ' || event || ' ' || reason FROM "
					"pgcoord.permit_events WHERE permit_id = 'op-1' "
					"AND delta < 0");
	cr_assert(strstr(row, expect) && strstr(row, "node drained"), "%s", row);
	free(row);
	row = hdb_query_value(db, "SELECT actor || ' ' || reason FROM pgcoord.permit_events "
				  "WHERE permit_id = 'op-2' AND delta < 0");
	cr_assert(strstr(row, expect) && strstr(row, "tenant offboarded"), "%s", row);
	free(row);
	const char *history[] = {"permits", "history", "op-1", NULL};
	cr_assert_eq(run_ctl(a, &out, history), 0);
	cr_assert(strstr(out, "admitted") && strstr(out, "override_released") &&
		      strstr(out, expect),
		  "%s", out);
	free(out);
	assert_conserved(db, "after overrides");
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Runs quota.set and an override release of permit as uid 65534 (gid
 * 65534) against socket; returns the two error codes as set * 10 + release. */
static int as_nobody(const char *socket, const char *permit)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		pgcoord *c = NULL;
		if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
			_exit(250);
		if (pgcoord_connect(socket, CALL_MS, &c) != PGCOORD_OK)
			_exit(251);
		int set = pgcoord_quota_set(c, "adm", 9, -1, CALL_MS);
		int rel = pgcoord_permit_release(c, permit, PGCOORD_OVERRIDE, "x", CALL_MS, NULL);
		_exit(set * 10 + rel);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Admin calls only from root, the agent's user, admin_uids or admin_group;
 * a bad admin option stops the agent with a clear message. */
Test(permits, admin_calls_are_forbidden_to_other_uids_unless_listed)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to act as another uid");
	struct harness_db *db = ledger_db();
	const char *open_socket[] = {"--socket-mode", "0666", NULL};
	const char *listed[] = {"--socket-mode", "0666", "--admin-uids", "1234, 65534", NULL};
	struct hagent *a = hagent_start(db, "adm-a", open_socket);
	struct hagent *b = hagent_start(db, "adm-b", listed);
	pgcoord *c = client(a, "adm");

	quota_set(c, "adm", 1, -1);
	pgcoord_claim_free(claim1(c, "adm-1", "adm", 0));
	cr_assert_eq(as_nobody(hagent_socket(a), "adm-1"),
		     PGCOORD_E_FORBIDDEN * 10 + PGCOORD_E_FORBIDDEN,
		     "a non-admin uid made an admin call");
	cr_assert_eq(hdb_query_long(db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'adm'"),
		     1);
	cr_assert_eq(in_flight(db, "adm"), 1);
	cr_assert_eq(as_nobody(hagent_socket(b), "adm-1"), 0,
		     "admin_uids did not make uid 65534 admin");
	cr_assert_eq(hdb_query_long(db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'adm'"),
		     9);
	cr_assert_eq(in_flight(db, "adm"), 0);
	char *actor = hdb_query_value(db, "SELECT actor FROM pgcoord.permit_events "
					  "WHERE permit_id = 'adm-1' AND delta < 0");
	cr_assert_str_eq(actor, "operator:uid=65534");
	free(actor);

	/* admin_group: a peer whose gid is the group's (nobody's is nogroup's) */
	struct group *ng = getgrgid(65534);
	if (ng) {
		const char *by_group[] = {"--socket-mode", "0666", "--admin-group", ng->gr_name,
					  NULL};
		struct hagent *g = hagent_start(db, "adm-g", by_group);
		pgcoord_claim_free(claim1(c, "adm-1b", "adm", 0));
		cr_assert_eq(as_nobody(hagent_socket(g), "adm-1b"), 0,
			     "admin_group %s did not make gid 65534 admin", ng->gr_name);
		cr_assert_eq(in_flight(db, "adm"), 0);
		hagent_destroy(g);
	}

	char *log = NULL;
	const char *bad_group[] = {"--admin-group", "no-such-group-pgcoord", NULL};
	cr_assert_eq(hagent_start_expect_exit(db, "adm-c", bad_group, &log), 2);
	cr_assert(strstr(log, "admin_group") && strstr(log, "no-such-group-pgcoord"), "%s", log);
	free(log);
	const char *bad_uid[] = {"--admin-uids", "12,bob", NULL};
	cr_assert_eq(hagent_start_expect_exit(db, "adm-d", bad_uid, &log), 2);
	cr_assert(strstr(log, "admin_uids"), "%s", log);
	free(log);
	pgcoord_close(c);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* Runs sql as the owner and asserts that it changes exactly one row, or,
 * with refused, that a rule of the column or row refuses it (23514). */
static void owner_write(PGconn *conn, bool refused, const char *sql)
{
	PGresult *res = PQexec(conn, sql);
	if (refused) {
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		cr_assert(state && strcmp(state, "23514") == 0,
			  "not refused as a check violation: %s\n(%s)", sql,
			  state ? PQresultErrorMessage(res) : PQcmdTuples(res));
	} else {
		cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s: %s", sql,
			     PQresultErrorMessage(res));
		cr_assert_str_eq(PQcmdTuples(res), "1", "%s changed no row", sql);
	}
	PQclear(res);
}

/* The rules of a quota's and a permit's columns (domains, and the one
 * table CHECK that ties columns together) refuse a bad row whoever writes
 * it: a row damaged by hand as the owner does not go in. */
Test(permits, column_rules_refuse_a_row_damaged_by_hand)
{
	struct harness_db *db = ledger_db();
	PGconn *conn = hdb_connect(db);

	owner_write(conn, false, "INSERT INTO pgcoord.quotas (key, \"limit\") VALUES ('rules', 5)");
	owner_write(conn, true, "INSERT INTO pgcoord.quotas (key, \"limit\") VALUES ('', 5)");
	owner_write(conn, true,
		    "INSERT INTO pgcoord.quotas (key, \"limit\") VALUES (repeat('k', 201), 5)");
	owner_write(conn, true, "UPDATE pgcoord.quotas SET \"limit\" = -1 WHERE key = 'rules'");
	owner_write(conn, true, "UPDATE pgcoord.quotas SET in_flight = -1 WHERE key = 'rules'");
	owner_write(conn, true, "UPDATE pgcoord.quotas SET lapse_after_s = 0 WHERE key = 'rules'");
	owner_write(conn, false, "UPDATE pgcoord.quotas SET in_flight = 1 WHERE key = 'rules'");

	owner_write(conn, false,
		    "INSERT INTO pgcoord.permits (id, token, state, phase, on_owner_loss, "
		    "quota_key, quota_weight) VALUES ('rules-1', 1, 'held', 'reserved', "
		    "'release', 'rules', 1)");
	owner_write(conn, true,
		    "INSERT INTO pgcoord.permits (id, token, state, phase, on_owner_loss) "
		    "VALUES (repeat('p', 201), 2, 'held', 'reserved', 'release')");
	owner_write(conn, true,
		    "INSERT INTO pgcoord.permits (id, token, state, phase, on_owner_loss) "
		    "VALUES ('', 2, 'held', 'reserved', 'release')");
	owner_write(conn, true, "UPDATE pgcoord.permits SET state = 'gone' WHERE id = 'rules-1'");
	owner_write(conn, true, "UPDATE pgcoord.permits SET phase = 'done' WHERE id = 'rules-1'");
	owner_write(conn, true,
		    "UPDATE pgcoord.permits SET on_owner_loss = 'drop' WHERE id = 'rules-1'");
	owner_write(conn, true,
		    "UPDATE pgcoord.permits SET intent = decode(repeat('00', 65537), 'hex') "
		    "WHERE id = 'rules-1'");
	owner_write(conn, true, "UPDATE pgcoord.permits SET quota_weight = 0 WHERE id = 'rules-1'");
	/* the rules that tie two columns: released iff released_at, and a
	 * share in the row has both its key and its weight */
	owner_write(conn, true,
		    "UPDATE pgcoord.permits SET state = 'released' WHERE id = 'rules-1'");
	owner_write(conn, true,
		    "UPDATE pgcoord.permits SET released_at = now() WHERE id = 'rules-1'");
	owner_write(conn, true,
		    "UPDATE pgcoord.permits SET quota_weight = NULL WHERE id = 'rules-1'");
	owner_write(conn, false,
		    "UPDATE pgcoord.permits SET state = 'released', released_at = now(), "
		    "phase = 'running', on_owner_loss = 'uncertain', quota_weight = 2 "
		    "WHERE id = 'rules-1'");

	PQfinish(conn);
	hdb_drop(db);
}
