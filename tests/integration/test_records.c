/*
 * test_records.c — records and recovery (DESIGN.md guarantee 8) against a
 * real Postgres and real agents, asserting on the database rows
 * (pgcoord.records, record_events, sessions, permits, permit_events), not
 * only on replies.
 *
 * Worker threads (one libpgcoord handle each) only record what happened;
 * every assertion and every harness call runs on the test's own thread.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

TestSuite(records, .timeout = 120);

#define CALL_MS 10000

/* Short liveness for agents a test kills or freezes, so their sessions
 * lapse within the test: three heartbeats fit in the ttl, as the agent
 * demands. */
static const char *const fast_liveness[] = {"--heartbeat-interval-ms",
					    "200",
					    "--session-ttl-ms",
					    "1200",
					    "--session-grace-ms",
					    "300",
					    NULL};

/* --- helpers ------------------------------------------------------------ */

static struct harness_db *records_db(void)
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

/* A put that must create the record; returns its token. */
static int64_t put(pgcoord *c, const char *kind, const char *key, const char *state,
		   const char *permit)
{
	bool created = false;
	int64_t token = 0;
	pgcoord_err err = pgcoord_record_put(c, kind, key, state, key, strlen(key), permit, CALL_MS,
					     &created, &token);
	cr_assert_eq(err, PGCOORD_OK, "put %s/%s: %s (%s)", kind, key, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert(created, "put %s/%s found the record already there", kind, key);
	cr_assert_gt(token, 0);
	return token;
}

static void claim(pgcoord *c, const char *id, const char *quota, int32_t weight)
{
	const char *keys[1] = {quota};
	int32_t weights[1] = {weight};
	pgcoord_claim *cl = NULL;
	pgcoord_err err = pgcoord_permit_claim(
	    c, id,
	    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					 .keys = keys,
					 .weights = weights,
					 .nquotas = 1,
					 .limit = PGCOORD_NO_LIMIT},
	    CALL_MS, &cl);
	cr_assert_eq(err, PGCOORD_OK, "claim %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED, "claim %s", id);
	pgcoord_claim_free(cl);
}

/* A recovery that must get an answer. */
static pgcoord_recovery *recover(pgcoord *c, const char *kind, int32_t limit, unsigned flags)
{
	pgcoord_recovery *rv = NULL;
	const char *kinds[1] = {kind};
	pgcoord_err err =
	    pgcoord_record_recover(c, kinds, kind ? 1 : 0, limit, flags, CALL_MS, &rv);
	cr_assert_eq(err, PGCOORD_OK, "recover %s: %s (%s)", kind ? kind : "(all)",
		     pgcoord_strerror(err), pgcoord_last_message(c));
	return rv;
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

/* Waits until the database no longer holds session id live. */
static void wait_dead(struct harness_db *db, int64_t id)
{
	char sql[160];
	snprintf(sql, sizeof(sql), "SELECT (NOT pgcoord.session_is_live(%lld))::int",
		 (long long)id);
	cr_assert(wait_for(db, 15000, sql), "session %lld never lapsed", (long long)id);
}

static long adopt_events(struct harness_db *db, const char *kind)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pgcoord.record_events "
			      "WHERE kind = '%s' AND event = 'adopt'",
			      kind);
}

static long owned_by(struct harness_db *db, const char *kind, int64_t session)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pgcoord.records "
			      "WHERE kind = '%s' AND owner_session = %lld",
			      kind, (long long)session);
}

/* Guarantee 2 still holds around records: every quota's in_flight equals
 * its open permits' weights and its audit deltas. */
static void assert_conserved(struct harness_db *db, const char *when)
{
	long bad = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits_check() "
				      "WHERE problem <> ''");
	cr_assert_eq(bad, 0, "conservation broken %s", when);
}

/* What agent.status says of the agent's database connection. */
static bool agent_db_up(pgcoord *c)
{
	void *res = NULL;
	size_t len = 0, off = 0;
	msgpack_unpacked u;
	bool up = false;

	cr_assert_eq(pgcoord_call(c, "agent.status", NULL, 0, CALL_MS, &res, &len), PGCOORD_OK);
	msgpack_unpacked_init(&u);
	cr_assert_eq(msgpack_unpack_next(&u, res, len, &off), MSGPACK_UNPACK_SUCCESS);
	up = pgc_obj_str_eq(pgc_map_get(&u.data, "db"), "up");
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);
	return up;
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

/* --- records: ownership stamped by the agent --------------------------------- */

/*
 * The owner of a record is the session of the connection that put it, never
 * a parameter; only that session changes it, and every change is audited.
 */
Test(records, owner_is_stamped_by_the_agent_and_only_the_owner_writes)
{
	struct harness_db *db = records_db();
	struct hagent *a = hagent_start(db, "own-a", NULL);
	struct hagent *b = hagent_start(db, "own-b", NULL);
	pgcoord *mine = client(a, "owner");
	pgcoord *other = client(b, "stranger");
	int64_t me = pgcoord_session_id(mine), them = pgcoord_session_id(other);
	msgpack_sbuffer sb;
	msgpack_packer pk;

	/* a caller cannot name an owner: the key is refused, nothing is written */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 5);
	pgc_pack_kv_str(&pk, "kind", "job");
	pgc_pack_kv_str(&pk, "key", "forged");
	pgc_pack_kv_str(&pk, "state", "queued");
	pgc_pack_kv_int(&pk, "owner_session", them);
	pgc_pack_kv_str(&pk, "owner_replica", "own-b");
	cr_assert_eq(pgcoord_call(mine, "record.put", sb.data, sb.size, CALL_MS, NULL, NULL),
		     PGCOORD_E_INVALID_PARAMS);
	cr_assert(strstr(pgcoord_last_message(mine), "\"owner_session\" for record.put"), "%s",
		  pgcoord_last_message(mine));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.records WHERE key = 'forged'"), 0);
	/* the agent stamps its own session */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	pgc_pack_kv_str(&pk, "kind", "job");
	pgc_pack_kv_str(&pk, "key", "forged");
	pgc_pack_kv_str(&pk, "state", "queued");
	cr_assert_eq(pgcoord_call(mine, "record.put", sb.data, sb.size, CALL_MS, NULL, NULL),
		     PGCOORD_OK, "%s", pgcoord_last_message(mine));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(hdb_query_long(db, "SELECT owner_session FROM pgcoord.records "
					"WHERE kind = 'job' AND key = 'forged'"),
		     me);
	char *rep = hdb_query_value(db, "SELECT owner_replica FROM pgcoord.records "
					"WHERE kind = 'job' AND key = 'forged'");
	cr_assert_str_eq(rep, "own-a");
	free(rep);

	int64_t token = put(mine, "job", "j1", "queued", NULL);
	cr_assert_gt(token, 0);
	cr_assert_eq(hdb_query_long(db, "SELECT token FROM pgcoord.records WHERE key = 'j1'"),
		     token);
	/* the same put again answers the record; another content is a conflict */
	bool created = true;
	int64_t again = 0;
	cr_assert_eq(pgcoord_record_put(mine, "job", "j1", "queued", "j1", 2, NULL, CALL_MS,
					&created, &again),
		     PGCOORD_OK);
	cr_assert(!created);
	cr_assert_eq(again, token);
	cr_assert_eq(
	    pgcoord_record_put(mine, "job", "j1", "running", NULL, 0, NULL, CALL_MS, NULL, NULL),
	    PGCOORD_E_CONFLICT);
	cr_assert_eq(
	    pgcoord_record_put(other, "job", "j1", "queued", "j1", 2, NULL, CALL_MS, NULL, NULL),
	    PGCOORD_E_CONFLICT);
	cr_assert(strstr(pgcoord_last_message(other), "owned by session"), "%s",
		  pgcoord_last_message(other));

	/* only the owner writes */
	cr_assert_eq(pgcoord_record_update(other, "job", "j1", "hijacked", NULL, 0, 0, CALL_MS),
		     PGCOORD_E_FORBIDDEN);
	cr_assert_eq(pgcoord_record_settle(other, "job", "j1", "done", 0, CALL_MS),
		     PGCOORD_E_FORBIDDEN);
	cr_assert_eq(pgcoord_record_update(mine, "job", "j1", "running", "bytes\0x", 7, 0, CALL_MS),
		     PGCOORD_OK, "%s", pgcoord_last_message(mine));
	cr_assert_eq(
	    pgcoord_record_update(mine, "job", "j1", "running", NULL, 0, token + 1000, CALL_MS),
	    PGCOORD_E_FENCED, "a stale token must be refused");
	pgcoord_record *r = NULL;
	cr_assert_eq(pgcoord_record_get(other, "job", "j1", CALL_MS, &r), PGCOORD_OK);
	cr_assert_str_eq(pgcoord_record_get_state(r), "running");
	size_t len = 0;
	const void *data = pgcoord_record_get_data(r, &len);
	cr_assert_eq(len, 7);
	cr_assert(data && memcmp(data, "bytes\0x", 7) == 0);
	cr_assert_eq(pgcoord_record_get_owner_session(r), me);
	cr_assert(pgcoord_record_get_owner_live(r));
	cr_assert_eq(pgcoord_record_get_adopted_from(r), 0);
	pgcoord_record_free(r);

	cr_assert_eq(pgcoord_record_settle(mine, "job", "j1", "done", token, CALL_MS), PGCOORD_OK,
		     "%s", pgcoord_last_message(mine));
	cr_assert_eq(pgcoord_record_update(mine, "job", "j1", "again", NULL, 0, 0, CALL_MS),
		     PGCOORD_E_CONFLICT);
	cr_assert_eq(pgcoord_record_settle(mine, "job", "j1", "done", 0, CALL_MS),
		     PGCOORD_E_CONFLICT);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.records WHERE key = 'j1' "
				    "AND terminal AND state = 'done' AND settled_at IS NOT NULL"),
		     1);
	char *trail =
	    hdb_query_value(db, "SELECT string_agg(event || ':' || state, ',' ORDER BY id)"
				" FROM pgcoord.record_events WHERE key = 'j1'");
	cr_assert_str_eq(trail, "put:queued,update:running,settle:done");
	free(trail);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.record_events "
				    "WHERE key = 'j1' AND to_session <> %lld",
				    (long long)me),
		     0);
	cr_assert_eq(pgcoord_record_get(other, "job", "nope", CALL_MS, &r), PGCOORD_E_NOT_FOUND);
	cr_assert_eq(pgcoord_record_update(mine, "job", "nope", "x", NULL, 0, 0, CALL_MS),
		     PGCOORD_E_NOT_FOUND);

	/* a record names a permit its own session holds, that still counts */
	cr_assert_eq(pgcoord_quota_set(mine, "rq", 5, -1, CALL_MS), PGCOORD_OK);
	claim(mine, "p-mine", "rq", 1);
	claim(other, "p-theirs", "rq", 1);
	put(mine, "job", "with-permit", "queued", "p-mine");
	cr_assert_eq(pgcoord_record_put(mine, "job", "stolen", "queued", NULL, 0, "p-theirs",
					CALL_MS, NULL, NULL),
		     PGCOORD_E_FORBIDDEN);
	cr_assert_eq(pgcoord_record_put(mine, "job", "ghost", "queued", NULL, 0, "p-none", CALL_MS,
					NULL, NULL),
		     PGCOORD_E_NOT_FOUND);

	/* parameters are checked before anything reaches the database */
	char big_key[202];
	memset(big_key, 'k', 201);
	big_key[201] = '\0';
	cr_assert_eq(
	    pgcoord_record_put(mine, "job", big_key, "queued", NULL, 0, NULL, CALL_MS, NULL, NULL),
	    PGCOORD_E_INVALID_PARAMS);
	cr_assert_eq(pgcoord_record_put(mine, "job", "s",
					"a-state-that-is-much-longer-than-"
					"sixty-four-bytes-which-is-the-limit-x",
					NULL, 0, NULL, CALL_MS, NULL, NULL),
		     PGCOORD_E_INVALID_PARAMS);
	static char blob[65537];
	cr_assert_eq(pgcoord_record_put(mine, "job", "big", "queued", blob, sizeof(blob), NULL,
					CALL_MS, NULL, NULL),
		     PGCOORD_E_TOO_LARGE);
	pgcoord *nosession = client(a, NULL);
	cr_assert_eq(
	    pgcoord_record_put(nosession, "job", "x", "queued", NULL, 0, NULL, CALL_MS, NULL, NULL),
	    PGCOORD_E_NO_SESSION);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.records"), 3);

	/* listing by owner and liveness */
	void *res = NULL;
	cr_assert_eq(
	    pgcoord_record_list(other, "job", me, PGCOORD_RECORDS_OPEN, CALL_MS, &res, &len),
	    PGCOORD_OK);
	cr_assert(memmem(res, len, "forged", 6) && memmem(res, len, "with-permit", 11) &&
		  !memmem(res, len, "j1", 2));
	pgcoord_free(res);
	cr_assert_eq(
	    pgcoord_record_list(other, NULL, 0, PGCOORD_RECORDS_DEAD_OWNER, CALL_MS, &res, &len),
	    PGCOORD_OK);
	cr_assert(!memmem(res, len, "forged", 6), "a live owner's record listed as dead");
	pgcoord_free(res);

	pgcoord_close(nosession);
	pgcoord_close(mine);
	pgcoord_close(other);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- recovery leaves live owners alone ------------------------------------------- */

#define LIVE_RECORDS 20

/* A child process that puts LIVE_RECORDS records through its own session,
 * writes the session id to fd, then does nothing: a replica that is slow,
 * or frozen, while its agent keeps it live. */
static pid_t slow_replica(const char *socket, int fd)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	pgcoord *c = NULL;
	int64_t id = 0;
	if (pgcoord_connect(socket, CALL_MS, &c) == PGCOORD_OK &&
	    pgcoord_session_open(c, "slow", CALL_MS, &id) == PGCOORD_OK) {
		for (int i = 0; i < LIVE_RECORDS && id; i++) {
			char key[32];
			snprintf(key, sizeof(key), "slow-%d", i);
			if (pgcoord_record_put(c, "live", key, "running", NULL, 0, NULL, CALL_MS,
					       NULL, NULL) != PGCOORD_OK)
				id = 0;
		}
	}
	if (write(fd, &id, sizeof(id)) != sizeof(id))
		_exit(1);
	for (;;)
		pause();
}

/*
 * A live owner's records are never adopted: not while its client is
 * frozen (SIGSTOP; its agent keeps the session live), nor while an owner's
 * agent is killed and restarted within the session's ttl and the client
 * resumes its session within the grace. Recoveries on another agent keep
 * running through all of it and say they left the records alone.
 */
Test(records, live_owners_records_are_never_adopted, .timeout = 90)
{
	/* a ttl that outlasts an agent restart, and a grace for the resume */
	static const char *const steady[] = {"--heartbeat-interval-ms",
					     "300",
					     "--session-ttl-ms",
					     "3000",
					     "--session-grace-ms",
					     "3000",
					     NULL};
	struct harness_db *db = records_db();
	struct hagent *b = hagent_start(db, "live-b", NULL);
	struct hagent *c = hagent_start(db, "live-c", steady);
	struct hagent *a = hagent_start(db, "live-a", steady);
	pgcoord *rescuer = client(b, "rescuer");
	pgcoord *owner = client(a, "owner");
	int64_t own_id = pgcoord_session_id(owner), slow_id = 0;
	int fds[2];

	for (int i = 0; i < LIVE_RECORDS; i++) {
		char key[32];
		snprintf(key, sizeof(key), "own-%d", i);
		put(owner, "live", key, "running", NULL);
	}
	cr_assert_eq(pipe(fds), 0);
	pid_t child = slow_replica(hagent_socket(c), fds[1]);
	cr_assert_gt(child, 0);
	cr_assert_eq(read(fds[0], &slow_id, sizeof(slow_id)), sizeof(slow_id));
	cr_assert_gt(slow_id, 0, "the slow replica could not put its records");
	kill(child, SIGSTOP);
	char *tokens_before = hdb_query_value(db, "SELECT string_agg(token::text, ',' ORDER BY key)"
						  " FROM pgcoord.records");

	/* the frozen client and the idle one stay live for 3 ttls */
	int64_t until = hnow_ms() + 9000;
	int rounds = 0;
	while (hnow_ms() < until) {
		pgcoord_recovery *rv = recover(rescuer, "live", 0, 0);
		cr_assert(pgcoord_recovery_liveness_read(rv));
		cr_assert_eq(pgcoord_recovery_count(rv), 0, "a live owner's record was adopted");
		cr_assert_eq(pgcoord_recovery_left_alone(rv), 2 * LIVE_RECORDS);
		cr_assert_eq(pgcoord_recovery_remaining(rv), 0);
		pgcoord_recovery_free(rv);
		rounds++;
		hsleep_ms(100);
	}
	cr_assert_gt(rounds, 20);

	/* kill -9 of the owner's agent and a quick restart with the same
	 * replica_id; recoveries all along; the client resumes its session */
	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);
	pgcoord_recovery *rv = recover(rescuer, "live", 0, 0);
	cr_assert_eq(pgcoord_recovery_count(rv), 0, "adopted while the agent was down");
	cr_assert_eq(pgcoord_recovery_left_alone(rv), 2 * LIVE_RECORDS);
	pgcoord_recovery_free(rv);
	struct hagent *a2 = hagent_start(db, "live-a", steady);
	rv = recover(rescuer, "live", 0, 0);
	cr_assert_eq(pgcoord_recovery_count(rv), 0, "adopted after the agent restarted");
	pgcoord_recovery_free(rv);
	pgcoord_close(owner);
	owner = client(a2, NULL);
	cr_assert_eq(pgcoord_session_resume(owner, own_id, CALL_MS), PGCOORD_OK, "resume: %s",
		     pgcoord_last_message(owner));
	until = hnow_ms() + 4000;
	while (hnow_ms() < until) {
		rv = recover(rescuer, "live", 0, 0);
		cr_assert_eq(pgcoord_recovery_count(rv), 0, "adopted a resumed owner's record");
		cr_assert_eq(pgcoord_recovery_left_alone(rv), 2 * LIVE_RECORDS);
		pgcoord_recovery_free(rv);
		hsleep_ms(100);
	}
	/* the resumed owner still writes its records */
	cr_assert_eq(
	    pgcoord_record_update(owner, "live", "own-0", "still mine", NULL, 0, 0, CALL_MS),
	    PGCOORD_OK, "%s", pgcoord_last_message(owner));

	cr_assert_eq(adopt_events(db, "live"), 0);
	cr_assert_eq(owned_by(db, "live", own_id), LIVE_RECORDS);
	cr_assert_eq(owned_by(db, "live", slow_id), LIVE_RECORDS);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id IN "
				    "(%lld, %lld) AND closed_at IS NULL",
				    (long long)own_id, (long long)slow_id),
		     2);
	char *tokens_after = hdb_query_value(db, "SELECT string_agg(token::text, ',' ORDER BY key)"
						 " FROM pgcoord.records");
	cr_assert_str_eq(tokens_after, tokens_before, "a live owner's token changed");
	free(tokens_before);
	free(tokens_after);

	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	close(fds[0]);
	close(fds[1]);
	pgcoord_close(owner);
	pgcoord_close(rescuer);
	hagent_destroy(a);
	hagent_destroy(a2);
	hagent_destroy(b);
	hagent_destroy(c);
	hdb_drop(db);
}

/* --- kill -9, and concurrent recoveries ----------------------------------------- */

#define RESCUERS 3
#define CYCLES 8
#define VICTIM_SESSIONS 3
#define PER_SESSION 40
#define DEAD_RECORDS (VICTIM_SESSIONS * PER_SESSION)
#define LIVE_CONTROL 5
#define MAX_ROUNDS 400

struct rescuer {
	pthread_t thread;
	int index;
	pgcoord *c;
	int32_t limit;
	const char *kind;
	pthread_barrier_t *barrier;
	atomic_int *adopted_total; /* by every rescuer, this cycle */
	atomic_int *failed;
	int target;
	/* what this rescuer adopted this cycle: record key indexes */
	int adopted[DEAD_RECORDS];
	int nadopted;
	int rounds;
	int64_t bad_left_alone; /* a left_alone below LIVE_CONTROL, or 0 */
	char error[512];
};

static void *rescue(void *arg)
{
	struct rescuer *r = arg;
	for (;;) {
		pthread_barrier_wait(r->barrier); /* everyone recovers at the same instant */
		pgcoord_recovery *rv = NULL;
		const char *kinds[1] = {r->kind};
		pgcoord_err err = pgcoord_record_recover(r->c, kinds, 1, r->limit, 0, CALL_MS, &rv);
		if (err != PGCOORD_OK || !pgcoord_recovery_liveness_read(rv)) {
			snprintf(r->error, sizeof(r->error), "rescuer %d round %d: %s (%s)",
				 r->index, r->rounds, pgcoord_strerror(err),
				 err ? pgcoord_last_message(r->c) : pgcoord_recovery_reason(rv));
			atomic_store(r->failed, 1);
		} else {
			size_t n = pgcoord_recovery_count(rv);
			/* the control session's records, and those the other
			 * rescuers adopted already: all live */
			if (pgcoord_recovery_left_alone(rv) < LIVE_CONTROL)
				r->bad_left_alone = pgcoord_recovery_left_alone(rv) - 1000000;
			for (size_t i = 0; i < n && r->nadopted < DEAD_RECORDS; i++) {
				const pgcoord_record *rec = pgcoord_recovery_record(rv, i);
				int idx = -1;
				if (sscanf(pgcoord_record_get_key(rec), "dead-%d", &idx) != 1 ||
				    pgcoord_record_get_owner_session(rec) !=
					pgcoord_session_id(r->c)) {
					snprintf(r->error, sizeof(r->error),
						 "rescuer %d adopted %s for session %lld", r->index,
						 pgcoord_record_get_key(rec),
						 (long long)pgcoord_record_get_owner_session(rec));
					atomic_store(r->failed, 1);
					continue;
				}
				r->adopted[r->nadopted++] = idx;
			}
			atomic_fetch_add(r->adopted_total, (int)n);
		}
		pgcoord_recovery_free(rv);
		r->rounds++;
		pthread_barrier_wait(r->barrier); /* the round is over for everyone */
		/* every rescuer reads the same totals here: they stop together */
		if (atomic_load(r->adopted_total) >= r->target || atomic_load(r->failed) ||
		    r->rounds >= MAX_ROUNDS)
			break;
	}
	return NULL;
}

/*
 * An agent holding records (some with permits) is killed with SIGKILL;
 * three other agents' clients recover at the same instant, round after
 * round (a barrier), each with a small limit so the rounds contend. Every
 * dead record is adopted exactly once: the adopted sets are disjoint, their
 * union is every dead record, the audit has one adopt per record, and each
 * record (and its permit) belongs to the rescuer that reported it. A live
 * session's records in the same kind are left alone every time. The victim
 * restarts with the same replica_id for each cycle: a new incarnation.
 */
Test(records, killed_agents_records_are_adopted_exactly_once, .timeout = 120)
{
	struct harness_db *db = records_db();
	struct hagent *agents[RESCUERS];
	struct rescuer rescuers[RESCUERS];
	pthread_barrier_t barrier;
	atomic_int total, failed;
	int rounds = 0;
	char name[32];

	for (int i = 0; i < RESCUERS; i++) {
		snprintf(name, sizeof(name), "rescue-%d", i);
		agents[i] = hagent_start(db, name, NULL);
	}
	pgcoord *control = client(agents[0], "control");
	cr_assert_eq(pgcoord_quota_set(control, "rq", 1000000, -1, CALL_MS), PGCOORD_OK);
	for (int i = 0; i < RESCUERS; i++) {
		memset(&rescuers[i], 0, sizeof(rescuers[i]));
		rescuers[i].index = i;
		snprintf(name, sizeof(name), "rescuer-%d", i);
		rescuers[i].c = client(agents[i], name);
		rescuers[i].limit = i == 2 ? 2 : 1;
		rescuers[i].barrier = &barrier;
		rescuers[i].adopted_total = &total;
		rescuers[i].failed = &failed;
		rescuers[i].target = DEAD_RECORDS;
	}

	for (int cycle = 0; cycle < CYCLES; cycle++) {
		char kind[32];
		int64_t victims[VICTIM_SESSIONS];
		pgcoord *vc[VICTIM_SESSIONS];
		snprintf(kind, sizeof(kind), "work-%d", cycle);

		struct hagent *v = hagent_start(db, "victim", fast_liveness);
		for (int s = 0; s < VICTIM_SESSIONS; s++) {
			pgcoord *c = vc[s] = client(v, "victim");
			victims[s] = pgcoord_session_id(c);
			for (int i = 0; i < PER_SESSION; i++) {
				char key[32], permit[64];
				int idx = s * PER_SESSION + i;
				snprintf(key, sizeof(key), "dead-%d", idx);
				snprintf(permit, sizeof(permit), "perm-%d-%d", cycle, idx);
				if (idx % 10 == 0)
					claim(c, permit, "rq", 1);
				put(c, kind, key, "running", idx % 10 == 0 ? permit : NULL);
			}
		}
		for (int i = 0; i < LIVE_CONTROL; i++) {
			char key[32];
			snprintf(key, sizeof(key), "live-%d", i);
			put(control, kind, key, "running", NULL);
		}
		hagent_kill(v, SIGKILL);
		hagent_wait(v, 5000);
		hagent_destroy(v);
		for (int s = 0; s < VICTIM_SESSIONS; s++) {
			pgcoord_close(vc[s]);
			wait_dead(db, victims[s]);
		}

		atomic_store(&total, 0);
		atomic_store(&failed, 0);
		cr_assert_eq(pthread_barrier_init(&barrier, NULL, RESCUERS), 0);
		for (int i = 0; i < RESCUERS; i++) {
			rescuers[i].kind = kind;
			rescuers[i].nadopted = 0;
			rescuers[i].rounds = 0;
			cr_assert_eq(
			    pthread_create(&rescuers[i].thread, NULL, rescue, &rescuers[i]), 0);
		}
		for (int i = 0; i < RESCUERS; i++)
			pthread_join(rescuers[i].thread, NULL);
		pthread_barrier_destroy(&barrier);
		rounds += rescuers[0].rounds;

		/* the replies: pairwise disjoint, their union every dead record */
		int seen[DEAD_RECORDS] = {0};
		for (int i = 0; i < RESCUERS; i++) {
			cr_assert_str_empty(rescuers[i].error, "%s", rescuers[i].error);
			cr_assert_eq(rescuers[i].bad_left_alone, 0,
				     "cycle %d: rescuer %d left %lld alone, fewer than the %d live "
				     "records",
				     cycle, i, (long long)rescuers[i].bad_left_alone + 1000000,
				     LIVE_CONTROL);
			for (int k = 0; k < rescuers[i].nadopted; k++)
				seen[rescuers[i].adopted[k]]++;
		}
		for (int k = 0; k < DEAD_RECORDS; k++)
			cr_assert_eq(seen[k], 1, "cycle %d: dead-%d was adopted %d times", cycle, k,
				     seen[k]);

		/* the database agrees, row by row */
		cr_assert_eq(adopt_events(db, kind), DEAD_RECORDS);
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM (SELECT key FROM "
					    "pgcoord.record_events WHERE kind = '%s' AND event = "
					    "'adopt' GROUP BY key HAVING count(*) <> 1) x",
					    kind),
			     0);
		for (int i = 0; i < RESCUERS; i++)
			cr_assert_eq(owned_by(db, kind, pgcoord_session_id(rescuers[i].c)),
				     rescuers[i].nadopted, "cycle %d rescuer %d", cycle, i);
		cr_assert_eq(
		    hdb_query_long(db,
				   "SELECT count(*) FROM pgcoord.records WHERE kind = '%s' "
				   "AND key LIKE 'dead-%%' AND adopted_from IN "
				   "(%lld, %lld, %lld) AND adopted_at IS NOT NULL",
				   kind, (long long)victims[0], (long long)victims[1],
				   (long long)victims[2]),
		    DEAD_RECORDS);
		/* a fresh token each, larger than the put's */
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM pgcoord.records r "
					    "JOIN pgcoord.record_events e ON e.kind = r.kind "
					    "AND e.key = r.key AND e.event = 'put' "
					    "WHERE r.kind = '%s' AND r.key LIKE 'dead-%%' "
					    "AND r.token > e.token",
					    kind),
			     DEAD_RECORDS);
		/* the live records were never touched */
		cr_assert_eq(owned_by(db, kind, pgcoord_session_id(control)), LIVE_CONTROL);
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM pgcoord.record_events "
					    "WHERE kind = '%s' AND key LIKE 'live-%%' "
					    "AND event <> 'put'",
					    kind),
			     0);
		/* each permit went with its record, once, still uncertain */
		cr_assert_eq(hdb_query_long(db,
					    "SELECT count(*) FROM pgcoord.records r "
					    "JOIN pgcoord.permits p ON p.id = r.permit_id "
					    "WHERE r.kind = '%s' AND p.owner_session = "
					    "r.owner_session AND p.state = 'uncertain'",
					    kind),
			     DEAD_RECORDS / 10);
		cr_assert_eq(
		    hdb_query_long(db,
				   "SELECT count(*) FROM pgcoord.permit_events "
				   "WHERE permit_id LIKE 'perm-%d-%%' AND event = 'adopted'",
				   cycle),
		    DEAD_RECORDS / 10);
		assert_conserved(db, "after a recovery cycle");
	}
	cr_assert_geq(rounds, 200, "only %d rounds of concurrent recovery", rounds);
	cr_assert_eq(hdb_query_long(db, "SELECT sum(in_flight) FROM pgcoord.quotas"),
		     CYCLES * DEAD_RECORDS / 10, "adopted permits stopped counting");
	cr_log_info("%d rounds of %d concurrent recoveries, %d records adopted exactly once",
		    rounds, RESCUERS, CYCLES * DEAD_RECORDS);

	for (int i = 0; i < RESCUERS; i++)
		pgcoord_close(rescuers[i].c);
	pgcoord_close(control);
	for (int i = 0; i < RESCUERS; i++)
		hagent_destroy(agents[i]);
	hdb_drop(db);
}

/* --- liveness unreadable: nothing is adopted ---------------------------------- */

/*
 * When the database cannot say who is live, recovery adopts nothing and
 * says so in its result (liveness_read false, with the reason) instead of
 * guessing; the records stay for a later recovery. The failure is forced
 * from the test's own connection: pgcoord.session_is_live raises.
 */
Test(records, unreadable_liveness_adopts_nothing_and_says_so)
{
	struct harness_db *db = records_db();
	struct hagent *b = hagent_start(db, "unread-b", NULL);
	struct hagent *a = hagent_start(db, "unread-a", fast_liveness);
	pgcoord *owner = client(a, "doomed");
	pgcoord *rescuer = client(b, "rescuer");
	int64_t dead = pgcoord_session_id(owner);

	for (int i = 0; i < 10; i++) {
		char key[32];
		snprintf(key, sizeof(key), "u-%d", i);
		put(owner, "unread", key, "running", NULL);
	}
	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);
	pgcoord_close(owner);
	wait_dead(db, dead);

	char *original = hdb_query_value(
	    db, "SELECT pg_get_functiondef('pgcoord.session_is_live(bigint)'::regprocedure)");
	cr_assert_not_null(original);
	hdb_exec(db, "CREATE OR REPLACE FUNCTION pgcoord.session_is_live(p_session bigint) "
		     "RETURNS boolean LANGUAGE plpgsql STABLE AS $$ BEGIN "
		     "RAISE EXCEPTION 'liveness is unreadable (forced by the test)'; END $$");

	pgcoord_recovery *rv = recover(rescuer, "unread", 0, 0);
	cr_assert(!pgcoord_recovery_liveness_read(rv));
	cr_assert_eq(pgcoord_recovery_count(rv), 0);
	cr_assert_eq(pgcoord_recovery_left_alone(rv), -1);
	cr_assert(strstr(pgcoord_recovery_reason(rv), "liveness is unreadable"), "%s",
		  pgcoord_recovery_reason(rv));
	pgcoord_recovery_free(rv);
	rv = recover(rescuer, "unread", 0, PGCOORD_RECOVER_DRY_RUN);
	cr_assert(!pgcoord_recovery_liveness_read(rv));
	pgcoord_recovery_free(rv);
	const char *args[] = {"recover", "--dry-run", NULL};
	char *out = NULL;
	cr_assert_eq(run_ctl(b, &out, args), 1, "%s", out);
	cr_assert(strstr(out, "liveness could not be read"), "%s", out);
	free(out);

	cr_assert_eq(adopt_events(db, "unread"), 0);
	cr_assert_eq(owned_by(db, "unread", dead), 10, "a record moved though liveness was unread");

	/* readable again: the same call adopts them all */
	hdb_exec(db, "%s", original);
	free(original);
	rv = recover(rescuer, "unread", 0, 0);
	cr_assert(pgcoord_recovery_liveness_read(rv));
	cr_assert_eq(pgcoord_recovery_count(rv), 10);
	pgcoord_recovery_free(rv);
	cr_assert_eq(owned_by(db, "unread", pgcoord_session_id(rescuer)), 10);
	cr_assert_eq(adopt_events(db, "unread"), 10);

	/*
	 * The database down altogether: nothing is adopted. Connected to it
	 * directly, the agent knows it has no connection and answers
	 * liveness_read false. Behind PgBouncer it cannot tell; the statement
	 * waits in the pooler until query_timeout_ms, and an unknown outcome is
	 * an error (`timeout`), which also adopted nothing.
	 */
	hpg_stop("fast");
	if (!hbouncer_enabled()) {
		int64_t deadline = hnow_ms() + 10000;
		while (agent_db_up(rescuer) && hnow_ms() < deadline)
			hsleep_ms(50);
		cr_assert(!agent_db_up(rescuer), "the agent never noticed the database was down");
	}
	const char *kinds[1] = {"unread"};
	pgcoord_err err = pgcoord_record_recover(rescuer, kinds, 1, 0, 0, CALL_MS, &rv);
	if (err == PGCOORD_OK) {
		cr_assert(!pgcoord_recovery_liveness_read(rv),
			  "liveness read with the database down");
		cr_assert_eq(pgcoord_recovery_count(rv), 0);
		cr_assert_not_null(pgcoord_recovery_reason(rv));
		pgcoord_recovery_free(rv);
	} else {
		cr_assert(hbouncer_enabled() &&
			      (err == PGCOORD_E_TIMEOUT || err == PGCOORD_E_UNAVAILABLE),
			  "recover with the database down: %s (%s)", pgcoord_strerror(err),
			  pgcoord_last_message(rescuer));
	}
	hpg_start();
	cr_assert_eq(owned_by(db, "unread", pgcoord_session_id(rescuer)), 10);

	pgcoord_close(rescuer);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/*
 * The race the seed left open: a heartbeat whose transaction began while
 * the owner was still live (its now() is then earlier than the recovery's)
 * must not renew the owner after a recovery judged it dead and adopted its
 * records. Recovery closes the dead owner's session row in the same
 * transaction, so the late heartbeat finds it closed and reports it lost.
 */
Test(records, late_heartbeat_cannot_revive_an_owner_whose_records_were_adopted)
{
	struct harness_db *db = records_db();
	struct hagent *b = hagent_start(db, "late-b", NULL);
	struct hagent *a = hagent_start(db, "late-a", fast_liveness);
	pgcoord *owner = client(a, "owner");
	pgcoord *rescuer = client(b, "rescuer");
	int64_t s = pgcoord_session_id(owner);
	char *inc = hdb_query_value(db, "SELECT incarnation FROM pgcoord.agents "
					"WHERE replica_id = 'late-a'");

	put(owner, "late", "l1", "running", NULL);
	put(owner, "late", "l2", "running", NULL);
	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);

	/* the heartbeat's transaction starts while the session is live */
	PGconn *hb = hdb_connect(db);
	PGresult *res = PQexec(hb, "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT 1");
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(hb));
	PQclear(res);
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.session_is_live(%lld)::int", (long long)s),
		     1, "the session lapsed before the heartbeat began");

	wait_dead(db, s);
	pgcoord_recovery *rv = recover(rescuer, "late", 0, 0);
	cr_assert_eq(pgcoord_recovery_count(rv), 2);
	pgcoord_recovery_free(rv);

	/* now the late heartbeat runs, with its earlier now() */
	char sql[256];
	snprintf(sql, sizeof(sql),
		 "SELECT agent_ok, %lld = ANY (lost) FROM pgcoord.agent_heartbeat('late-a', %s, "
		 "1200, ARRAY[%lld]::bigint[])",
		 (long long)s, inc, (long long)s);
	res = PQexec(hb, sql);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(hb));
	cr_assert_str_eq(PQgetvalue(res, 0, 1), "t", "the late heartbeat renewed a dead owner");
	PQclear(res);
	res = PQexec(hb, "COMMIT");
	PQclear(res);
	PQfinish(hb);

	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.session_is_live(%lld)::int", (long long)s),
		     0, "the dead owner is live again after its records were adopted");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld "
				    "AND closed_at IS NOT NULL",
				    (long long)s),
		     1);
	cr_assert_eq(owned_by(db, "late", pgcoord_session_id(rescuer)), 2);
	free(inc);
	pgcoord_close(owner);
	pgcoord_close(rescuer);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- fencing ------------------------------------------------------------------- */

/*
 * A replica frozen long enough to be declared dead (its agent SIGSTOPped:
 * no heartbeats) has its records adopted by another; when it wakes and tries
 * to settle or update them it is refused with `fenced`, naming the adopter,
 * and nothing it sent reaches the rows.
 */
Test(records, frozen_replica_is_fenced_when_it_resumes)
{
	struct harness_db *db = records_db();
	struct hagent *b = hagent_start(db, "fence-b", NULL);
	struct hagent *a = hagent_start(db, "fence-a", fast_liveness);
	pgcoord *sleeper = client(a, "sleeper");
	pgcoord *rescuer = client(b, "rescuer");
	int64_t old = pgcoord_session_id(sleeper), adopter = pgcoord_session_id(rescuer);
	char adopter_s[32];

	int64_t t1 = put(sleeper, "fence", "f1", "running", NULL);
	put(sleeper, "fence", "f2", "running", NULL);

	hagent_kill(a, SIGSTOP);
	wait_dead(db, old);
	/* dead by database time: its agent's row lapsed, and the session's
	 * expiry is that row's (attached, or pinned to it when closed) */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.session_liveness l "
				    "JOIN pgcoord.agents a ON a.replica_id = 'fence-a' "
				    "WHERE l.id = %lld AND NOT l.live AND a.expires_at <= now() "
				    "AND l.expires_at = a.expires_at",
				    (long long)old),
		     1, "the frozen agent's session did not die with its agent row");
	char *lapsed_at = hdb_query_value(
	    db, "SELECT expires_at FROM pgcoord.agents WHERE replica_id = 'fence-a'");
	pgcoord_recovery *rv = recover(rescuer, "fence", 0, 0);
	cr_assert_eq(pgcoord_recovery_count(rv), 2);
	int64_t t1_new = pgcoord_record_get_token(pgcoord_recovery_record(rv, 0));
	cr_assert_gt(t1_new, t1, "adoption must draw a new token");
	cr_assert_eq(pgcoord_record_get_adopted_from(pgcoord_recovery_record(rv, 0)), old);
	pgcoord_recovery_free(rv);
	hagent_kill(a, SIGCONT);

	/* awake, the agent beats again (its row is renewed) but its session
	 * stays dead, with the expiry it had when the row lapsed */
	cr_assert(wait_for(db, 10000,
			   "SELECT count(*) FROM pgcoord.agents WHERE replica_id = 'fence-a' "
			   "AND expires_at > now()"),
		  "the woken agent never renewed its row");
	hsleep_ms(600);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld "
				    "AND NOT live AND expires_at = '%s'",
				    (long long)old, lapsed_at),
		     1, "the woken agent's heartbeat revived its dead session");
	free(lapsed_at);

	cr_assert_eq(pgcoord_record_settle(sleeper, "fence", "f1", "done", 0, CALL_MS),
		     PGCOORD_E_FENCED, "the former owner settled an adopted record (%s)",
		     pgcoord_last_message(sleeper));
	snprintf(adopter_s, sizeof(adopter_s), "session %lld", (long long)adopter);
	cr_assert(strstr(pgcoord_last_message(sleeper), "fenced") &&
		      strstr(pgcoord_last_message(sleeper), adopter_s),
		  "%s", pgcoord_last_message(sleeper));
	cr_assert_eq(
	    pgcoord_record_update(sleeper, "fence", "f2", "overwritten", "x", 1, 0, CALL_MS),
	    PGCOORD_E_FENCED, "%s", pgcoord_last_message(sleeper));
	/* with its original token, too */
	cr_assert_eq(pgcoord_record_settle(sleeper, "fence", "f1", "done", t1, CALL_MS),
		     PGCOORD_E_FENCED);

	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.records WHERE kind = "
				    "'fence' AND state = 'running' AND NOT terminal "
				    "AND owner_session = %lld",
				    (long long)adopter),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.record_events "
					"WHERE kind = 'fence' AND event IN ('update', 'settle')"),
		     0);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.record_events WHERE kind = "
				    "'fence' AND event = 'adopt' AND from_session = %lld "
				    "AND to_session = %lld",
				    (long long)old, (long long)adopter),
		     2);
	/* the adopter drives them on */
	cr_assert_eq(pgcoord_record_settle(rescuer, "fence", "f1", "done", t1_new, CALL_MS),
		     PGCOORD_OK, "%s", pgcoord_last_message(rescuer));

	pgcoord_close(sleeper);
	pgcoord_close(rescuer);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- incarnations ---------------------------------------------------------------- */

/*
 * A replica restarted with the same replica_id is a new incarnation: it
 * adopts its predecessor's unfinished records (whose session nobody
 * resumed), while its own new records are left alone by everyone.
 */
Test(records, restarted_replica_adopts_its_predecessors_records)
{
	struct harness_db *db = records_db();
	struct hagent *b = hagent_start(db, "inc-b", NULL);
	struct hagent *a = hagent_start(db, "inc-a", fast_liveness);
	pgcoord *before = client(a, "before");
	int64_t old = pgcoord_session_id(before);
	long inc1 = hdb_query_long(db, "SELECT incarnation FROM pgcoord.agents "
				       "WHERE replica_id = 'inc-a'");

	for (int i = 0; i < 8; i++) {
		char key[32];
		snprintf(key, sizeof(key), "old-%d", i);
		put(before, "inc", key, "running", NULL);
	}
	cr_assert_eq(pgcoord_record_settle(before, "inc", "old-0", "done", 0, CALL_MS), PGCOORD_OK);
	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);
	pgcoord_close(before);

	struct hagent *a2 = hagent_start(db, "inc-a", fast_liveness);
	cr_assert_neq(hdb_query_long(db, "SELECT incarnation FROM pgcoord.agents "
					 "WHERE replica_id = 'inc-a'"),
		      inc1, "a restart must be a new incarnation");
	pgcoord *after = client(a2, "after");
	put(after, "inc", "new-0", "running", NULL);

	/* the predecessor's session lapses (or its grace ends) within moments */
	int adopted = 0;
	int64_t deadline = hnow_ms() + 15000;
	while (adopted < 7 && hnow_ms() < deadline) {
		pgcoord_recovery *rv = recover(after, "inc", 0, 0);
		adopted += (int)pgcoord_recovery_count(rv);
		pgcoord_recovery_free(rv);
		if (adopted < 7)
			hsleep_ms(100);
	}
	cr_assert_eq(adopted, 7, "the restarted replica adopted %d of 7 records", adopted);
	cr_assert_eq(owned_by(db, "inc", pgcoord_session_id(after)), 8);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.records WHERE kind = 'inc' "
				    "AND adopted_from = %lld",
				    (long long)old),
		     7);
	/* the settled one stays with its dead owner: terminal records are never adopted */
	cr_assert_eq(owned_by(db, "inc", old), 1);

	/* another replica leaves the new incarnation's records alone */
	pgcoord *other = client(b, "other");
	pgcoord_recovery *rv = recover(other, "inc", 0, 0);
	cr_assert_eq(pgcoord_recovery_count(rv), 0);
	cr_assert_eq(pgcoord_recovery_left_alone(rv), 8);
	pgcoord_recovery_free(rv);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.record_events "
					"WHERE key = 'new-0' AND event = 'adopt'"),
		     0);

	pgcoord_close(after);
	pgcoord_close(other);
	hagent_destroy(a);
	hagent_destroy(a2);
	hagent_destroy(b);
	hdb_drop(db);
}

/* --- adopted permits ------------------------------------------------------------ */

/*
 * The permits a dead owner's records hold move with the records: owned by
 * the adopter, still uncertain, still counted, and settled through
 * permit.resolve. pgcoordctl shows what a recovery would take beforehand.
 */
Test(records, adopted_permits_belong_to_the_adopter_count_and_resolve)
{
	struct harness_db *db = records_db();
	struct hagent *b = hagent_start(db, "perm-b", NULL);
	struct hagent *a = hagent_start(db, "perm-a", fast_liveness);
	pgcoord *owner = client(a, "doomed");
	pgcoord *rescuer = client(b, "rescuer");
	int64_t dead = pgcoord_session_id(owner), me = pgcoord_session_id(rescuer);

	cr_assert_eq(pgcoord_quota_set(rescuer, "gpu", 4, -1, CALL_MS), PGCOORD_OK);
	claim(owner, "pa", "gpu", 1);
	claim(owner, "pb", "gpu", 2);
	claim(owner, "pc", "gpu", 1); /* named by no record */
	put(owner, "train", "ra", "running", "pa");
	put(owner, "train", "rb", "running", "pb");
	hagent_kill(a, SIGKILL);
	hagent_wait(a, 5000);
	pgcoord_close(owner);
	wait_dead(db, dead);

	/* what an operator sees first */
	const char *dead_args[] = {"records", "--dead", NULL};
	char *out = NULL;
	cr_assert_eq(run_ctl(b, &out, dead_args), 0, "%s", out);
	cr_assert(strstr(out, "ra") && strstr(out, "rb") && strstr(out, "pb"), "%s", out);
	free(out);
	const char *dry_args[] = {"recover", "--dry-run", "--kinds", "train,other", NULL};
	cr_assert_eq(run_ctl(b, &out, dry_args), 0, "%s", out);
	cr_assert(strstr(out, "would adopt 2 records"), "%s", out);
	free(out);
	const char *wet_args[] = {"recover", NULL};
	cr_assert_eq(run_ctl(b, &out, wet_args), 2, "%s", out);
	free(out);
	cr_assert_eq(adopt_events(db, "train"), 0, "a dry run adopted something");

	pgcoord_recovery *rv = recover(rescuer, "train", 0, 0);
	cr_assert_eq(pgcoord_recovery_count(rv), 2);
	cr_assert_str_eq(pgcoord_record_get_permit(pgcoord_recovery_record(rv, 0)), "pa");
	size_t len = 0;
	const void *raw = pgcoord_recovery_result(rv, &len);
	cr_assert(raw && memmem(raw, len, "uncertain", 9), "the result lists the permits");
	pgcoord_recovery_free(rv);

	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits WHERE id IN ('pa', "
				    "'pb') AND owner_session = %lld AND state = 'uncertain'",
				    (long long)me),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT owner_session FROM pgcoord.permits "
					"WHERE id = 'pc'"),
		     dead, "a permit no record names stayed with its dead owner");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permit_events WHERE "
				    "event = 'adopted' AND actor LIKE 'session:%lld@%%'",
				    (long long)me),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'gpu'"),
		     4, "adopted permits stopped counting");
	assert_conserved(db, "after the adoption");
	const char *keys[1] = {"gpu"};
	pgcoord_claim *cl = NULL;
	cr_assert_eq(pgcoord_permit_claim(
			 rescuer, "pd",
			 &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						      .keys = keys,
						      .nquotas = 1,
						      .limit = PGCOORD_NO_LIMIT},
			 CALL_MS, &cl),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED, "no room is left");
	pgcoord_claim_free(cl);

	/* the adopter settles them on evidence */
	cr_assert_eq(pgcoord_permit_resolve(rescuer, "pa", PGCOORD_OUTCOME_RUNNING,
					    "pod ra is running", 0, CALL_MS),
		     PGCOORD_OK, "%s", pgcoord_last_message(rescuer));
	cr_assert_eq(pgcoord_permit_resolve(rescuer, "pb", PGCOORD_OUTCOME_GONE,
					    "no pod rb in the cluster", 0, CALL_MS),
		     PGCOORD_OK, "%s", pgcoord_last_message(rescuer));
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits WHERE id = 'pa' "
				    "AND state = 'held' AND owner_session = %lld",
				    (long long)me),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'gpu'"),
		     2);
	cr_assert_eq(pgcoord_record_settle(rescuer, "train", "rb", "gone", 0, CALL_MS), PGCOORD_OK);
	assert_conserved(db, "after resolving");

	pgcoord_close(rescuer);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}
