/*
 * test_identity.c — guarantee 9: one live agent per replica_id. A second
 * agent refuses naming the holder, a clean stop frees the replica_id, and a
 * crashed agent's successor on the same host takes over at once and keeps
 * the predecessor's sessions resumable.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(identity, .timeout = 60);

static long db_incarnation(struct harness_db *db, const char *replica)
{
	return hdb_query_long(db, "SELECT incarnation FROM pgcoord.agents WHERE replica_id = '%s'",
			      replica);
}

Test(identity, second_agent_with_live_replica_id_refuses_naming_host_and_pid)
{
	struct harness_db *db = idb_migrated();
	struct hagent *first = hagent_start(db, "id-dup", NULL);
	int64_t incarnation = istatus_int(first, "incarnation");
	char pid_text[32], *log = NULL;

	int rc = hagent_start_expect_exit(db, "id-dup", NULL, &log);
	cr_assert_eq(rc, 1, "the second agent exited %d:\n%s", rc, log);
	snprintf(pid_text, sizeof(pid_text), "pid %d", (int)hagent_pid(first));
	cr_assert(strstr(log, ihostname()), "the refusal does not name host %s:\n%s", ihostname(),
		  log);
	cr_assert(strstr(log, pid_text), "the refusal does not name %s:\n%s", pid_text, log);
	free(log);

	/* the database still holds the first one's incarnation, untouched */
	cr_assert_eq(db_incarnation(db, "id-dup"), incarnation);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT pid FROM pgcoord.agents WHERE replica_id = 'id-dup'"),
	    hagent_pid(first));
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'id-dup' AND stopped_at IS NULL AND expires_at > now()"),
		     1);
	cr_assert(hagent_running(first));
	cr_assert_eq(istatus_int(first, "incarnation"), incarnation);
	hagent_destroy(first);
	hdb_drop(db);
}

Test(identity, replica_id_is_free_again_once_its_agent_stopped_cleanly)
{
	struct harness_db *db = idb_migrated();
	struct hagent *first = hagent_start(db, "id-stop", NULL);
	int64_t first_inc = istatus_int(first, "incarnation");

	cr_assert_eq(hagent_stop(first), 0, "%s", hagent_log(first));
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
				    "'id-stop' AND incarnation = %lld AND stopped_at IS NOT NULL",
				    (long long)first_inc),
		     1, "SIGTERM did not record stopped_at");

	/* a long ttl: only the recorded stop can explain an immediate start */
	const char *const slow[] = {"--session-ttl-ms", "60000", NULL};
	struct hagent *second = hagent_start(db, "id-stop", slow);
	int64_t second_inc = istatus_int(second, "incarnation");
	cr_assert_neq(second_inc, first_inc);
	cr_assert_eq(db_incarnation(db, "id-stop"), second_inc);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
				    "'id-stop' AND stopped_at IS NULL AND pid = %d",
				    (int)hagent_pid(second)),
		     1);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}

/*
 * kill -9 leaves the row live for session_ttl_ms (here 20 s): the successor
 * must not wait that out, because the holder's pid on this host is dead.
 */
Test(identity, restarted_agent_takes_over_from_a_killed_predecessor_and_resumes_its_sessions)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--heartbeat-interval-ms",
				    "200",
				    "--session-ttl-ms",
				    "20000",
				    "--session-grace-ms",
				    "10000",
				    NULL};
	struct hagent *first = hagent_start(db, "id-crash", args);
	int64_t first_inc = istatus_int(first, "incarnation");
	int fd1 = iconnect(hagent_socket(first)), fd2 = iconnect(hagent_socket(first));
	int64_t s1 = isession_open(fd1, "crash-a"), s2 = isession_open(fd2, "crash-b");

	hagent_kill(first, SIGKILL);
	cr_assert_eq(hagent_wait(first, 5000), 128 + SIGKILL);
	close(fd1);
	close(fd2);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
				    "'id-crash' AND stopped_at IS NULL AND expires_at > now() + "
				    "interval '10 seconds'"),
		     1, "the killed agent's row should still look live for a long while");

	int64_t t0 = hnow_ms();
	struct hagent *second = hagent_start(db, "id-crash", args);
	int64_t took = hnow_ms() - t0;
	int64_t second_inc = istatus_int(second, "incarnation");
	cr_assert_lt(took, 5000, "the successor waited %lld ms instead of taking over at once",
		     (long long)took);
	cr_assert_neq(second_inc, first_inc);
	cr_assert_eq(db_incarnation(db, "id-crash"), second_inc);
	cr_assert(strstr(hagent_log(second), "taking over"), "%s", hagent_log(second));

	/* the predecessor's sessions moved to the successor, still open */
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE id IN (%lld, %lld) "
			   "AND incarnation = %lld AND closed_at IS NULL",
			   (long long)s1, (long long)s2, (long long)second_inc),
	    2);

	/* and each resumes on the new agent under its old id */
	int64_t ids[2] = {s1, s2};
	for (int i = 0; i < 2; i++) {
		int fd = iconnect(hagent_socket(second));
		struct iparams p;
		struct ireply r;
		const msgpack_object *res;

		pgc_pack_kv_int(iparams_begin(&p, 1), "resume", ids[i]);
		res = icall_ok(fd, "session.open", &p, &r);
		cr_assert_eq(iint(res, "session"), ids[i]);
		cr_assert(ibool(res, "resumed"));
		ireply_destroy(&r);
		iparams_destroy(&p);
		res = icall_ok(fd, "session.keepalive", NULL, &r);
		cr_assert_eq(iint(res, "session"), ids[i]);
		cr_assert(ibool(res, "live"));
		ireply_destroy(&r);
		close(fd);
	}
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id IN (%lld, %lld) "
			   "AND closed_at IS NULL AND expires_at > now()",
			   (long long)s1, (long long)s2),
	    2);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}

/*
 * The takeover is only for a dead pid on this host: a live holder, even one
 * frozen so it cannot heartbeat, keeps its replica_id until its row lapses.
 */
Test(identity, frozen_agent_keeps_its_replica_id_until_its_heartbeat_lapses)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--heartbeat-interval-ms", "100", "--session-ttl-ms", "1500",
				    NULL};
	struct hagent *first = hagent_start(db, "id-frozen", args);
	int64_t first_inc = istatus_int(first, "incarnation");
	char *log = NULL;

	hagent_kill(first, SIGSTOP);
	int rc = hagent_start_expect_exit(db, "id-frozen", args, &log);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, log);
	free(log);
	cr_assert_eq(db_incarnation(db, "id-frozen"), first_inc);

	/* once the frozen agent's row has lapsed, the replica_id is free */
	cr_assert(iwait_sql(db, 10000,
			    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = 'id-frozen' "
			    "AND expires_at <= now()"));
	struct hagent *second = hagent_start(db, "id-frozen", args);
	int64_t second_inc = istatus_int(second, "incarnation");
	cr_assert_eq(db_incarnation(db, "id-frozen"), second_inc);

	/* the frozen agent learns it was superseded when it wakes, and exits 1 */
	hagent_kill(first, SIGCONT);
	rc = hagent_wait(first, 10000);
	cr_assert_eq(rc, 1, "the superseded agent exited %d:\n%s", rc, hagent_log(first));
	cr_assert(hagent_running(second));
	cr_assert_eq(db_incarnation(db, "id-frozen"), second_inc);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}

/*
 * Between a successor's takeover and the old agent's next heartbeat, the old
 * agent still serves: a session.open it sends then is refused by the
 * database (PCSUP) as superseded, with nothing written, and the agent keeps
 * running until its heartbeat tells it.
 */
Test(identity, session_open_after_a_takeover_is_refused_superseded_and_writes_nothing)
{
	struct harness_db *db = idb_migrated();
	/* no heartbeat during the test: the database is the only one to know */
	const char *const args[] = {"--heartbeat-interval-ms", "20000", "--session-ttl-ms", "60000",
				    NULL};
	struct hagent *first = hagent_start(db, "id-sup", args);
	int64_t first_inc = istatus_int(first, "incarnation");
	int fd = iconnect(hagent_socket(first));
	struct iparams p;
	struct ireply r;
	char inc_text[32];

	/* a successor takes the replica_id over, as agent_register does */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT ok::int FROM pgcoord.agent_register('id-sup', %lld, "
				    "'elsewhere', 1, 'test', 60000, %lld)",
				    (long long)first_inc + 1, (long long)first_inc),
		     1);
	char *before = idb_fingerprint(db);

	pgc_pack_kv_str(iparams_begin(&p, 1), "name", "too-late");
	icall(fd, "session.open", &p, &r);
	snprintf(inc_text, sizeof(inc_text), "incarnation %lld", (long long)first_inc);
	ierr(&r, "superseded", false,
	     (const char *const[]){inc_text, "id-sup", "no longer current", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	char *after = idb_fingerprint(db);
	cr_assert_str_eq(after, before, "the refused session.open changed the database");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE name = 'too-late'"),
		     0);
	cr_assert_eq(db_incarnation(db, "id-sup"), first_inc + 1);
	cr_assert(hagent_running(first), "%s", hagent_log(first));
	free(before);
	free(after);
	close(fd);
	hagent_destroy(first);
	hdb_drop(db);
}

/* A taken-over session nobody resumes is closed when its grace runs out on
 * the successor, like any detached session; one that is resumed stays. */
Test(identity, taken_over_session_not_resumed_within_grace_is_closed_by_the_successor)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--heartbeat-interval-ms",
				    "100",
				    "--session-ttl-ms",
				    "20000",
				    "--session-grace-ms",
				    "800",
				    NULL};
	struct hagent *first = hagent_start(db, "id-grace", args);
	int fd1 = iconnect(hagent_socket(first)), fd2 = iconnect(hagent_socket(first));
	int64_t kept = isession_open(fd1, "kept"), dropped = isession_open(fd2, "dropped");

	hagent_kill(first, SIGKILL);
	cr_assert_eq(hagent_wait(first, 5000), 128 + SIGKILL);
	close(fd1);
	close(fd2);
	struct hagent *second = hagent_start(db, "id-grace", args);
	int fd = iconnect(hagent_socket(second));
	struct iparams p;
	struct ireply r;

	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", kept);
	cr_assert_eq(iint(icall_ok(fd, "session.open", &p, &r), "session"), kept);
	ireply_destroy(&r);
	iparams_destroy(&p);

	cr_assert(iwait_sql(db, 5000,
			    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND "
			    "close_reason = 'resume grace expired'",
			    (long long)dropped),
		  "the unresumed session was never closed; log:\n%s", hagent_log(second));
	/* well past the grace: the resumed one is live and renewed */
	hsleep_ms(300);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND "
			   "closed_at IS NULL AND expires_at > now() + interval '19 s'",
			   (long long)kept),
	    1);
	cr_assert_eq(iint(icall_ok(fd, "session.keepalive", NULL, &r), "session"), kept);
	ireply_destroy(&r);
	close(fd);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}

Test(identity, successor_closes_a_killed_predecessors_own_session_and_frees_its_janitor_lease)
{
	struct harness_db *db = idb_migrated();
	/* a 20 s session ttl and the default 15 s lease ttl: only the
	 * successor's hand-back explains a janitor within a few seconds */
	const char *const args[] = {"--heartbeat-interval-ms", "200", "--session-ttl-ms", "20000",
				    NULL};
	struct hagent *first = hagent_start(db, "id-janitor", args);
	iwait_janitor(first);
	int64_t deadline;
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases l JOIN "
					"pgcoord.sessions s ON s.id = l.holder_session "
					"WHERE l.name = 'pgcoord.janitor' AND s.internal"),
		     1, "the first agent should hold the janitor lease with its own session");
	long internal = hdb_query_long(db, "SELECT holder_session FROM pgcoord.leases "
					   "WHERE name = 'pgcoord.janitor'");

	hagent_kill(first, SIGKILL);
	cr_assert_eq(hagent_wait(first, 5000), 128 + SIGKILL);
	int64_t t0 = hnow_ms();
	struct hagent *second = hagent_start(db, "id-janitor", args);

	/* the dead agent's own session is closed, never offered for resume */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %ld AND "
				    "closed_at IS NOT NULL AND close_reason = 'its agent was "
				    "replaced by a new incarnation'",
				    internal),
		     1);
	int fd = iconnect(hagent_socket(second));
	struct iparams p;
	struct ireply r;
	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", internal);
	icall(fd, "session.open", &p, &r);
	ierr(&r, "session_expired", false, NULL);
	ireply_destroy(&r);
	iparams_destroy(&p);
	close(fd);

	/* and the janitor lease went back at once, so the successor wins it
	 * long before the 15 s lease could have lapsed */
	deadline = t0 + 8000;
	while (!istatus_bool(second, "janitor") && hnow_ms() < deadline)
		hsleep_ms(50);
	int64_t took = hnow_ms() - t0;
	cr_assert_lt(took, 8000, "no janitor %lld ms after the takeover", (long long)took);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_events WHERE name = "
					"'pgcoord.janitor' AND event = 'released' AND reason = "
					"'its agent was replaced'"),
		     1);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}
