/*
 * test_permit_await.c — libpgcoord's side of waiting claims against a real
 * Postgres and a real agent: the typed permit.admitted / permit.expired
 * events and pgcoord_permit_await, with its cancel on timeout. The
 * database is the judge: the permits row, its audit rows and the queue.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(permit_await, .timeout = 60);

#define CALL_MS 10000
/* a poll interval, the statement and the socket, on a busy CI machine */
#define HEAR_MS 5000

static const char *const wait_args[] = {"--wait-poll-ms", "50", NULL};

static pgcoord *client(struct hagent *a, const char *name)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(hagent_socket(a), CALL_MS, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect: %s", pgcoord_strerror(err));
	err = pgcoord_session_open(c, name, CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "session.open: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return c;
}

/* Claims 1 of quota q as id, waiting up to wait_ms; the status. */
static pgcoord_claim_status claim(pgcoord *c, const char *id, int64_t wait_ms)
{
	const char *keys[1] = {"q"};
	struct pgcoord_claim_opts o = PGCOORD_CLAIM_OPTS_INIT;
	pgcoord_claim *cl = NULL;
	o.keys = keys;
	o.nquotas = 1;
	o.wait_ms = wait_ms;
	pgcoord_err err = pgcoord_permit_claim(c, id, &o, CALL_MS, &cl);
	cr_assert_eq(err, PGCOORD_OK, "claim %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	pgcoord_claim_status st = pgcoord_claim_get_status(cl);
	pgcoord_claim_free(cl);
	return st;
}

static void release(pgcoord *c, const char *id)
{
	bool released = false;
	pgcoord_err err = pgcoord_permit_release(c, id, 0, NULL, CALL_MS, &released);
	cr_assert_eq(err, PGCOORD_OK, "release %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert(released);
}

static long queue_rows(struct harness_db *db, const char *id)
{
	return hdb_query_long(
	    db, "SELECT count(*) FROM pgcoord.waiters WHERE id = '%s' AND state = 'queued'", id);
}

static long permit_rows(struct harness_db *db, const char *id, const char *where)
{
	return hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = '%s' AND %s", id,
			      where);
}

static long audit_rows(struct harness_db *db, const char *id)
{
	return hdb_query_long(
	    db, "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id = '%s'", id);
}

/* The one audit row of an admission from the queue. */
static void assert_admitted_from_queue(struct harness_db *db, const char *id)
{
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id = "
			   "'%s' AND event = 'admitted' AND reason LIKE 'from the queue%%'",
			   id),
	    1, "%s has no admission from the queue in the audit", id);
	cr_assert_eq(audit_rows(db, id), 1);
}

struct seen {
	int admitted, expired, raw;
	char id[64], reason[64];
	int64_t token, owner_session, queued_ms;
};

static void on_permit_event(void *user, const struct pgcoord_permit_event *ev)
{
	struct seen *s = user;
	if (ev->kind == PGCOORD_PERMIT_ADMITTED) {
		s->admitted++;
		s->token = ev->token;
		s->owner_session = ev->owner_session;
		s->queued_ms = ev->queued_ms;
	} else {
		s->expired++;
		snprintf(s->reason, sizeof(s->reason), "%s", ev->reason);
	}
	snprintf(s->id, sizeof(s->id), "%s", ev->id);
}

static void on_raw(void *user, const char *method, const void *params, size_t params_len)
{
	(void)method, (void)params, (void)params_len;
	((struct seen *)user)->raw++;
}

/* pgcoord_poll until the callback saw `want` events (admitted + expired). */
static void poll_until(pgcoord *c, struct seen *s, int want)
{
	int64_t until = hnow_ms() + HEAR_MS;
	while (s->admitted + s->expired < want) {
		cr_assert_lt(hnow_ms(), until, "no permit event in %d ms", HEAR_MS);
		cr_assert_eq(pgcoord_poll(c, 100, NULL), PGCOORD_OK, "%s", pgcoord_last_message(c));
	}
}

Test(permit_await, a_release_admits_the_waiter_and_the_callback_and_await_get_it_typed)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "await-admit", wait_args);
	pgcoord *holder = client(a, "holder"), *w = client(a, "waiter");
	struct pgcoord_permit_event *ev = NULL;
	struct seen s = {0};

	cr_assert_eq(pgcoord_quota_set(holder, "q", 1, -1, CALL_MS), PGCOORD_OK);
	cr_assert_eq(claim(holder, "held", 0), PGCOORD_CLAIM_ADMITTED);
	cr_assert_eq(claim(w, "first", 30000), PGCOORD_CLAIM_QUEUED);
	cr_assert_eq(queue_rows(db, "first"), 1);
	cr_assert_eq(permit_rows(db, "first", "true"), 0);

	/* await: the other session's release hands the slot over */
	release(holder, "held");
	cr_assert_eq(pgcoord_permit_await(w, "first", HEAR_MS, &ev), PGCOORD_OK, "%s",
		     pgcoord_last_message(w));
	cr_assert_eq(ev->kind, PGCOORD_PERMIT_ADMITTED);
	cr_assert_str_eq(ev->id, "first");
	cr_assert_str_eq(ev->state, "held");
	cr_assert_gt(ev->token, 0);
	cr_assert_eq(ev->owner_session, pgcoord_session_id(w));
	cr_assert_geq(ev->queued_ms, 0);
	cr_assert_null(ev->reason);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits WHERE id = 'first' AND "
				    "state = 'held' AND owner_session = %lld AND token = %lld",
				    (long long)pgcoord_session_id(w), (long long)ev->token),
		     1);
	assert_admitted_from_queue(db, "first");
	cr_assert_eq(queue_rows(db, "first"), 0);
	pgcoord_permit_event_free(ev);

	/* the callback: a second waiter, admitted by the first's release;
	 * permit events do not reach the raw callback */
	pgcoord_set_notify(w, on_raw, &s);
	pgcoord_set_permit_events(w, on_permit_event, &s);
	cr_assert_eq(claim(w, "second", 30000), PGCOORD_CLAIM_QUEUED);
	release(w, "first");
	poll_until(w, &s, 1);
	cr_assert_eq(s.admitted, 1);
	cr_assert_str_eq(s.id, "second");
	cr_assert_eq(s.owner_session, pgcoord_session_id(w));
	cr_assert_eq(s.raw, 0);
	cr_assert_eq(hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'second'"),
		     s.token);
	assert_admitted_from_queue(db, "second");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 1);

	pgcoord_close(holder);
	pgcoord_close(w);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(permit_await, an_expired_wait_is_reported_and_holds_nothing)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "await-expire", wait_args);
	pgcoord *holder = client(a, "holder"), *w = client(a, "waiter");
	struct pgcoord_permit_event *ev = NULL;
	struct seen s = {0};

	cr_assert_eq(pgcoord_quota_set(holder, "q", 1, -1, CALL_MS), PGCOORD_OK);
	cr_assert_eq(claim(holder, "held", 0), PGCOORD_CLAIM_ADMITTED);

	/* await */
	cr_assert_eq(claim(w, "short", 300), PGCOORD_CLAIM_QUEUED);
	cr_assert_eq(pgcoord_permit_await(w, "short", HEAR_MS, &ev), PGCOORD_E_EXPIRED, "%s",
		     pgcoord_last_message(w));
	cr_assert_eq(ev->kind, PGCOORD_PERMIT_EXPIRED);
	cr_assert_str_eq(ev->id, "short");
	cr_assert_str_eq(ev->reason, "wait_ms elapsed");
	cr_assert_eq(ev->token, -1);
	pgcoord_permit_event_free(ev);
	cr_assert(strstr(pgcoord_last_message(w), "wait_ms elapsed"), "%s",
		  pgcoord_last_message(w));

	/* the callback */
	pgcoord_set_permit_events(w, on_permit_event, &s);
	cr_assert_eq(claim(w, "shorter", 200), PGCOORD_CLAIM_QUEUED);
	poll_until(w, &s, 1);
	cr_assert_eq(s.expired, 1);
	cr_assert_str_eq(s.id, "shorter");
	cr_assert_str_eq(s.reason, "wait_ms elapsed");

	/* nothing was ever counted for them; the slot is still the holder's */
	for (const char *const *id = (const char *const[]){"short", "shorter", NULL}; *id; id++) {
		cr_assert_eq(permit_rows(db, *id, "true"), 0, "%s", *id);
		cr_assert_eq(audit_rows(db, *id), 0, "%s", *id);
		cr_assert_eq(queue_rows(db, *id), 0, "%s", *id);
	}
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 1);

	pgcoord_close(holder);
	pgcoord_close(w);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(permit_await, a_timed_out_await_cancels_or_reports_the_permit_it_owns)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "await-cancel", wait_args);
	pgcoord *holder = client(a, "holder"), *w = client(a, "waiter");
	struct pgcoord_permit_event *ev = NULL;

	cr_assert_eq(pgcoord_quota_set(holder, "q", 1, -1, CALL_MS), PGCOORD_OK);
	cr_assert_eq(claim(holder, "held", 0), PGCOORD_CLAIM_ADMITTED);

	/* no room comes: the await cancels the claim, which leaves no trace */
	cr_assert_eq(claim(w, "patient", 30000), PGCOORD_CLAIM_QUEUED);
	cr_assert_eq(pgcoord_permit_await(w, "patient", 300, &ev), PGCOORD_E_EXPIRED, "%s",
		     pgcoord_last_message(w));
	cr_assert_eq(ev->kind, PGCOORD_PERMIT_EXPIRED);
	cr_assert_str_eq(ev->reason, "the await timed out");
	pgcoord_permit_event_free(ev);
	cr_assert_eq(queue_rows(db, "patient"), 0);
	cr_assert_eq(permit_rows(db, "patient", "true"), 0);
	cr_assert_eq(audit_rows(db, "patient"), 0);
	/* the id is free again */
	cr_assert_eq(claim(w, "patient", 30000), PGCOORD_CLAIM_QUEUED);

	/* admitted before the await's cancel: the caller owns the permit */
	release(holder, "held");
	cr_assert_eq(pgcoord_permit_await(w, "patient", 0, &ev), PGCOORD_OK, "%s",
		     pgcoord_last_message(w));
	cr_assert_eq(ev->kind, PGCOORD_PERMIT_ADMITTED);
	cr_assert_str_eq(ev->id, "patient");
	cr_assert_eq(ev->owner_session, pgcoord_session_id(w));
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits WHERE id = 'patient' AND "
				    "state = 'held' AND owner_session = %lld AND token = %lld",
				    (long long)pgcoord_session_id(w), (long long)ev->token),
		     1);
	pgcoord_permit_event_free(ev);
	assert_admitted_from_queue(db, "patient");
	release(w, "patient");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);

	pgcoord_close(holder);
	pgcoord_close(w);
	hagent_destroy(a);
	hdb_drop(db);
}
