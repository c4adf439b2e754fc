/*
 * test_sessions.c — session.open/keepalive/close and resume against the
 * rows of pgcoord.sessions; the resume grace; one session per connection.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(sessions, .timeout = 60);

/* Fast heartbeats so the grace is enforced promptly. */
static const char *const fast[] = {"--heartbeat-interval-ms",
				   "100",
				   "--session-ttl-ms",
				   "1000",
				   "--session-grace-ms",
				   "1500",
				   NULL};

static void resume(int fd, int64_t id, struct ireply *r)
{
	struct iparams p;

	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", id);
	icall(fd, "session.open", &p, r);
	iparams_destroy(&p);
}

Test(sessions, open_keepalive_close_are_recorded_in_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-basic", NULL);
	iwait_janitor(a);
	int64_t inc = istatus_int(a, "incarnation");
	int fd = iconnect(hagent_socket(a));
	struct iparams p;
	struct ireply r;
	const msgpack_object *res;

	pgc_pack_kv_str(iparams_begin(&p, 1), "name", "worker-7");
	res = icall_ok(fd, "session.open", &p, &r);
	iparams_destroy(&p);
	int64_t id = iint(res, "session");
	cr_assert_not(ibool(res, "resumed"));
	cr_assert_eq(iint(res, "ttl_ms"), 10000);
	cr_assert_eq(iint(res, "grace_ms"), 10000);
	ireply_destroy(&r);

	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND name "
			   "= 'worker-7' AND replica_id = 'sess-basic' AND incarnation = "
			   "%lld AND closed_at IS NULL AND expires_at > now()",
			   (long long)id, (long long)inc),
	    1);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.live_sessions WHERE id = %lld",
				    (long long)id),
		     1);
	cr_assert_eq(istatus_int(a, "sessions"), 2, "the agent counts its janitor session too");

	res = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(res, "session"), id);
	cr_assert(ibool(res, "live"));
	cr_assert_geq(iint(res, "last_heartbeat_ms_ago"), 0);
	ireply_destroy(&r);

	res = icall_ok(fd, "session.close", NULL, &r);
	cr_assert(ibool(res, "closed"));
	ireply_destroy(&r);
	char *reason = hdb_query_value(
	    db,
	    "SELECT close_reason FROM pgcoord.sessions WHERE id = %lld AND closed_at IS NOT "
	    "NULL AND closed_at <= now()",
	    (long long)id);
	cr_assert_not_null(reason, "session.close did not set closed_at");
	cr_assert_str_eq(reason, "closed by client");
	free(reason);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.live_sessions WHERE id = %lld",
				    (long long)id),
		     0);

	/* the connection has no session any more, and can open a new one */
	icall(fd, "session.keepalive", NULL, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	int64_t again = isession_open(fd, "worker-7b");
	cr_assert_neq(again, id);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(sessions, resume_within_grace_keeps_the_session_id_and_never_closes_it)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-resume", fast);
	int fd = iconnect(hagent_socket(a));
	int64_t id = isession_open(fd, "resumer");
	char *expires_before = hdb_query_value(
	    db, "SELECT expires_at FROM pgcoord.session_liveness WHERE id = %lld", (long long)id);
	struct ireply r;

	close(fd);
	/* Away for most of the grace and longer than the ttl: only the agent's
	 * heartbeat keeps the row live meanwhile. Sampled all along. */
	int64_t until = hnow_ms() + 1100;
	while (hnow_ms() < until) {
		cr_assert_eq(
		    hdb_query_long(db,
				   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld "
				   "AND closed_at IS NULL AND expires_at > now()",
				   (long long)id),
		    1, "the detached session was closed or lapsed inside its grace");
		hsleep_ms(50);
	}
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND "
			   "expires_at > '%s'",
			   (long long)id, expires_before),
	    1, "heartbeats stopped renewing the detached session");
	free(expires_before);

	fd = iconnect(hagent_socket(a));
	resume(fd, id, &r);
	const msgpack_object *res = iok(&r, "session.open {resume}");
	cr_assert_eq(iint(res, "session"), id);
	cr_assert(ibool(res, "resumed"));
	ireply_destroy(&r);
	res = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(res, "session"), id);
	ireply_destroy(&r);

	/* past the original grace, it stays: it is attached again */
	hsleep_ms(800);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND "
			   "closed_at IS NULL AND expires_at > now()",
			   (long long)id),
	    1);
	res = icall_ok(fd, "session.keepalive", NULL, &r);
	cr_assert_eq(iint(res, "session"), id);
	ireply_destroy(&r);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(sessions, session_past_its_grace_is_closed_in_the_database_and_cannot_resume)
{
	struct harness_db *db = idb_migrated();
	const char *const short_grace[] = {"--heartbeat-interval-ms",
					   "100",
					   "--session-ttl-ms",
					   "5000",
					   "--session-grace-ms",
					   "300",
					   NULL};
	struct hagent *a = hagent_start(db, "sess-grace", short_grace);
	int fd = iconnect(hagent_socket(a));
	int64_t id = isession_open(fd, "leaver");
	struct ireply r;
	int64_t left = hnow_ms();

	close(fd);
	cr_assert(iwait_sql(db, 5000,
			    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND closed_at "
			    "IS NOT NULL",
			    (long long)id),
		  "the session was not closed after its grace");
	int64_t took = hnow_ms() - left;
	/* the grace ran out, not the (5 s) ttl */
	cr_assert_lt(took, 3000, "closing took %lld ms", (long long)took);
	char *reason = hdb_query_value(
	    db, "SELECT close_reason FROM pgcoord.sessions WHERE id = %lld", (long long)id);
	cr_assert_str_eq(reason, "resume grace expired");
	free(reason);

	fd = iconnect(hagent_socket(a));
	resume(fd, id, &r);
	ierr(&r, "session_expired", false, NULL);
	ireply_destroy(&r);
	/* still closed, not revived by the attempt */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.live_sessions WHERE id = %lld",
				    (long long)id),
		     0);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(sessions, second_session_open_on_a_connection_answers_conflict)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-conflict", NULL);
	int fd = iconnect(hagent_socket(a));
	int64_t id = isession_open(fd, "only-one");
	char idtext[32];
	struct iparams p;
	struct ireply r;

	snprintf(idtext, sizeof(idtext), "%lld", (long long)id);
	const char *const mentions[] = {idtext, NULL};
	pgc_pack_kv_str(iparams_begin(&p, 1), "name", "second");
	icall(fd, "session.open", &p, &r);
	iparams_destroy(&p);
	ierr(&r, "conflict", false, mentions);
	ireply_destroy(&r);
	/* resuming (even itself) on a connection that has a session: the same */
	resume(fd, id, &r);
	ierr(&r, "conflict", false, NULL);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE replica_id = "
					"'sess-conflict' AND name <> 'pgcoord-agent'"),
		     1, "the refused open created a row");

	/* a session attached elsewhere cannot be taken by another connection */
	int other = iconnect(hagent_socket(a));
	resume(other, id, &r);
	ierr(&r, "conflict", false, NULL);
	ireply_destroy(&r);
	close(other);

	struct ireply k;
	cr_assert_eq(iint(icall_ok(fd, "session.keepalive", NULL, &k), "session"), id);
	ireply_destroy(&k);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(sessions, session_calls_without_a_session_answer_no_session)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-none", NULL);
	int fd = iconnect(hagent_socket(a));
	/* the picture is taken once the agent's own rows settled: its janitor
	 * lease is won a moment after it is ready */
	iwait_janitor(a);
	char *before = idb_fingerprint(db);
	struct iparams p;
	struct ireply r;

	icall(fd, "session.keepalive", NULL, &r);
	ierr(&r, "no_session", false, (const char *const[]){"session.open", NULL});
	ireply_destroy(&r);
	icall(fd, "session.close", NULL, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	pgc_pack_kv_str(iparams_begin(&p, 1), "name", "some-lease");
	icall(fd, "lease.acquire", &p, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	icall(fd, "lease.release", &p, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* an unknown session id cannot be resumed either */
	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", 987654321);
	icall(fd, "session.open", &p, &r);
	ierr(&r, "session_expired", false, NULL);
	ireply_destroy(&r);
	iparams_destroy(&p);

	char *after = idb_fingerprint(db);
	cr_assert_str_eq(after, before, "refused calls changed the database:\n%s\nbecame\n%s",
			 before, after);
	free(before);
	free(after);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(sessions, closing_the_connection_during_session_open_leaves_a_resumable_session)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-race", fast);
	int fd = iconnect(hagent_socket(a));
	struct iparams p;

	pgc_pack_kv_str(iparams_begin(&p, 1), "name", "hasty");
	cr_assert(hraw_send_request(fd, inext_msgid(), "session.open", p.sb.data, p.sb.size));
	iparams_destroy(&p);
	close(fd);
	/* the row is created; the agent keeps it in grace, then closes it */
	cr_assert(iwait_sql(db, 5000,
			    "SELECT count(*) FROM pgcoord.sessions WHERE name = 'hasty' AND "
			    "close_reason = 'resume grace expired'"),
		  "the orphaned session was never closed; log:\n%s", hagent_log(a));
	cr_assert(hagent_running(a));
	hagent_destroy(a);
	hdb_drop(db);
}

/* Reads from fd until the notification `method` arrives; fails after
 * timeout_ms. Responses in between are dropped. */
static void wait_notification(int fd, const char *method, int64_t session, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;

	for (;;) {
		struct ireply r;
		char err[256];
		int left = (int)(deadline - hnow_ms());

		cr_assert_gt(left, 0, "no %s within %d ms", method, timeout_ms);
		msgpack_unpacked_init(&r.u);
		enum hraw_result got = hraw_recv_msg(fd, left, &r.u);
		cr_assert(got == HRAW_MSG || got == HRAW_TIMEOUT, "the connection broke (%d)", got);
		if (got == HRAW_MSG) {
			cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
			if (r.m.type == PGC_RPC_NOTIFY && r.m.method_len == strlen(method) &&
			    memcmp(r.m.method, method, r.m.method_len) == 0) {
				cr_assert_eq(iint(r.m.params, "session"), session);
				ireply_destroy(&r);
				return;
			}
		}
		ireply_destroy(&r);
	}
}

/* Another replica (the janitor, an operator) closed the row: the next
 * heartbeat finds it, never revives it, and the client hears it is lost. */
Test(sessions, session_closed_in_the_database_is_reported_lost_and_never_revived)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-dropped", fast);
	int fd = iconnect(hagent_socket(a));
	int64_t id = isession_open(fd, "dropped-under-me");
	struct ireply r;

	hdb_exec(db,
		 "UPDATE pgcoord.sessions SET closed_at = now(), close_reason = 'operator' WHERE "
		 "id = %lld",
		 (long long)id);
	wait_notification(fd, "session.lost", id, 3000);
	icall(fd, "session.keepalive", NULL, &r);
	ierr(&r, "session_expired", false, NULL);
	ireply_destroy(&r);
	cr_assert_eq(istatus_int(a, "sessions"), 1, "the agent still counts the lost session");

	hsleep_ms(300); /* three more heartbeats */
	char *reason = hdb_query_value(
	    db,
	    "SELECT close_reason FROM pgcoord.sessions WHERE id = %lld AND closed_at IS NOT NULL",
	    (long long)id);
	cr_assert_not_null(reason, "a heartbeat revived the closed session");
	cr_assert_str_eq(reason, "operator");
	free(reason);
	/* the connection may start afresh */
	cr_assert_neq(isession_open(fd, "fresh"), id);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(sessions, session_of_another_agent_cannot_be_resumed_here)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sess-owner", fast);
	struct hagent *b = hagent_start(db, "sess-thief", fast);
	int fa = iconnect(hagent_socket(a));
	int64_t id = isession_open(fa, "owned-by-a");
	int fb = iconnect(hagent_socket(b));
	struct ireply r;

	close(fa); /* in its grace on a: still, only a may hand it back */
	resume(fb, id, &r);
	ierr(&r, "session_expired", false, NULL);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND "
				    "replica_id = 'sess-owner' AND closed_at IS NULL",
				    (long long)id),
		     1);
	fa = iconnect(hagent_socket(a));
	resume(fa, id, &r);
	cr_assert_eq(iint(iok(&r, "resume on its own agent"), "session"), id);
	ireply_destroy(&r);
	close(fa);
	close(fb);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}
