/*
 * test_flat_check.c — permit.check and a quota's status cost what is open,
 * not the past (migrations/0004_permits.sql, 0005_permit_audit.sql): over a long history of
 * released permits it reads the quotas, the open permits and the audit rows the janitor has not
 * folded yet, and still finds a broken counter; folding keeps every audit row, so permit.history
 * answers as before.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(flat_check, .timeout = 120);

#define CALL_MS 10000
/* released permits of the past, two audit rows each */
#define PAST_PERMITS 200000
/* rows of permits, permit_quotas and permit_events one check may read: the
 * open permits and the unfolded audit rows, a few times over; the old check
 * read every one of the 800,000 rows of the past */
#define MAX_ROWS_READ 2000

static pgcoord *client(struct hagent *a)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(hagent_socket(a), CALL_MS, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect: %s", pgcoord_strerror(err));
	err = pgcoord_session_open(c, "flat", CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "session.open: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return c;
}

static void claim(pgcoord *c, const char *id)
{
	pgcoord_claim *cl = NULL;
	pgcoord_err err = iclaim_one(c, id, "flat", CALL_MS, &cl);
	cr_assert_eq(err, PGCOORD_OK, "claim %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	pgcoord_claim_free(cl);
}

/* permit.check through the agent: its ok, and whether its reply names
 * text (a key or a problem; MessagePack strings are stored verbatim). */
static bool agent_check(pgcoord *c, const char *text, bool *names_text)
{
	bool ok = false;
	void *res = NULL;
	size_t len = 0;
	pgcoord_err err = pgcoord_permit_check(c, CALL_MS, &ok, &res, &len);
	cr_assert_eq(err, PGCOORD_OK, "permit.check: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	if (names_text)
		*names_text = memmem(res, len, text, strlen(text)) != NULL;
	pgcoord_free(res);
	return ok;
}

/* Rows of the permit tables this connection's transaction has read. */
static long rows_read(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT coalesce(sum(coalesce(seq_tup_read, 0) + "
				  "coalesce(idx_tup_fetch, 0)), 0) FROM pg_stat_xact_user_tables "
				  "WHERE relid IN ('pgcoord.permits'::regclass, "
				  "'pgcoord.permit_quotas'::regclass, "
				  "'pgcoord.permit_events_log'::regclass)");
}

/* Waits until the janitor has folded every audit row written so far. */
static void wait_folded(struct harness_db *db, struct hagent *a)
{
	long last = hdb_query_long(db, "SELECT max(id) FROM pgcoord.permit_events");
	cr_assert(
	    iwait_sql(db, 20000,
		      "SELECT (folded_upto >= %ld)::int FROM pgcoord.permit_audit_horizon", last),
	    "the janitor did not fold the audit up to %ld within 20 s:\n%s", last, hagent_log(a));
}

Test(flat_check, reads_what_is_open_finds_a_broken_counter_and_keeps_history)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "flat-a", NULL);
	pgcoord *c = client(a);
	bool named = false;

	cr_assert_eq(pgcoord_quota_set(c, "flat", 1000, -1, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	/* the past: released permits with their shares and audit rows */
	hdb_exec(db,
		 "INSERT INTO pgcoord.permits (id, token, owner_replica, state, phase, "
		 "on_owner_loss, released_at) SELECT 'past-' || i, nextval('pgcoord.token_seq'), "
		 "'past', 'released', 'reserved', 'uncertain', now() FROM generate_series(1, %d) i;"
		 "INSERT INTO pgcoord.permit_quotas (permit_id, key, weight) "
		 "SELECT 'past-' || i, 'flat', 1 FROM generate_series(1, %d) i;"
		 "INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, state, "
		 "phase) SELECT 'past-' || i, 'flat', d, e, 'past', s, 'reserved' "
		 "FROM generate_series(1, %d) i, (VALUES (1, 'admitted', 'held'), "
		 "(-1, 'released', 'released')) v(d, e, s) ORDER BY i, d DESC;"
		 "ANALYZE pgcoord.permits, pgcoord.permit_quotas, pgcoord.permit_events",
		 PAST_PERMITS, PAST_PERMITS, PAST_PERMITS);
	/* the present: two open permits, one released */
	claim(c, "now-1");
	claim(c, "now-2");
	claim(c, "now-3");
	cr_assert_eq(pgcoord_permit_release(c, "now-3", 0, NULL, CALL_MS, NULL), PGCOORD_OK);
	wait_folded(db, a);
	/* and an audit tail the janitor has not folded yet (it may have by
	 * now: the check is right either way) */
	claim(c, "now-4");
	cr_assert_eq(pgcoord_permit_release(c, "now-4", 0, NULL, CALL_MS, NULL), PGCOORD_OK);

	/* the check reads the open, not the past; PL/pgSQL and SQL functions
	 * plan afresh for the first calls of a backend, so a few calls */
	for (int i = 0; i < 6; i++) {
		hdb_exec(db, "BEGIN");
		long before = rows_read(db);
		long quotas = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits_check() "
						 "WHERE problem = ''");
		long read = rows_read(db) - before;
		hdb_exec(db, "COMMIT");
		cr_assert_eq(quotas, 1, "check %d: the quota was not found conserved", i + 1);
		cr_assert_leq(read, MAX_ROWS_READ,
			      "check %d read %ld rows of the permit tables for 2 open permits: "
			      "it reads the %d released permits of the past",
			      i + 1, read, PAST_PERMITS);
		/* so does a quota's status (quota.get, quota.list, watches):
		 * shares are not read by key, where the past lies */
		hdb_exec(db, "BEGIN");
		before = rows_read(db);
		long held = hdb_query_long(db, "SELECT held FROM pgcoord.quota_status "
					       "WHERE key = 'flat'");
		read = rows_read(db) - before;
		hdb_exec(db, "COMMIT");
		cr_assert_eq(held, 2, "status %d: 'flat' holds %ld, not its 2 open permits", i + 1,
			     held);
		cr_assert_leq(read, MAX_ROWS_READ,
			      "status %d read %ld rows of the permit tables for 2 open permits: "
			      "it reads the %d released permits of the past",
			      i + 1, read, PAST_PERMITS);
	}
	cr_assert(agent_check(c, "", NULL), "permit.check: a violation over a conserved ledger");
	/* the folded audit and the admissions kept in open permit rows
	 * (0016) sum to the two open permits */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT (SELECT delta_sum FROM pgcoord.permit_audit_totals "
				    "WHERE key = 'flat') + (SELECT coalesce(sum(quota_weight), 0) "
				    "FROM pgcoord.permits WHERE state <> 'released' AND "
				    "admit_event IS NOT NULL AND quota_key = 'flat')"),
		     2, "the folded audit of 'flat' does not sum to its two open permits");

	/* folding deleted nothing: the history of the past is still there */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events "
					"WHERE actor = 'past'"),
		     2L * PAST_PERMITS);
	void *hist = NULL;
	size_t hist_len = 0;
	cr_assert_eq(pgcoord_permit_history(c, "past-17", CALL_MS, &hist, &hist_len), PGCOORD_OK,
		     "%s", pgcoord_last_message(c));
	cr_assert(memmem(hist, hist_len, "admitted", 8) && memmem(hist, hist_len, "released", 8),
		  "permit.history of a folded permit lost its admission or release");
	pgcoord_free(hist);
	cr_assert_eq(pgcoord_permit_history(c, "now-3", CALL_MS, &hist, &hist_len), PGCOORD_OK);
	cr_assert(memmem(hist, hist_len, "admitted", 8) && memmem(hist, hist_len, "released", 8));
	pgcoord_free(hist);

	/* a counter edited by SQL is still reported, against both sides */
	hdb_exec(db, "UPDATE pgcoord.quotas SET in_flight = in_flight + 1 WHERE key = 'flat'");
	cr_assert_not(agent_check(c, "in_flight differs from the weights", &named),
		      "permit.check missed an in_flight edited by SQL");
	cr_assert(named, "the violation does not say the counter disagrees with its permits");
	cr_assert_not(agent_check(c, "in_flight differs from the sum of its audit", &named));
	cr_assert(named, "the violation does not say the counter disagrees with its audit");
	hdb_exec(db, "UPDATE pgcoord.quotas SET in_flight = in_flight - 1 WHERE key = 'flat'");
	cr_assert(agent_check(c, "", NULL));

	/* an audit row forged after the fold is reported, and still is once
	 * the janitor has folded it */
	hdb_exec(db, "INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor) "
		     "VALUES ('forged', 'flat', 1, 'admitted', 'forger')");
	cr_assert_not(agent_check(c, "in_flight differs from the sum of its audit", &named),
		      "permit.check missed an audit row it has not folded");
	cr_assert(named);
	wait_folded(db, a);
	cr_assert_not(agent_check(c, "in_flight differs from the sum of its audit", &named),
		      "permit.check missed an audit row it has folded");
	cr_assert(named);

	/* an event of no known kind is refused (the column's domain, 0004),
	 * as the table's CHECK refused it */
	hdb_exec(db, "DO $$ BEGIN "
		     "INSERT INTO pgcoord.permit_events (permit_id, event, actor) "
		     "VALUES ('forged', 'admited', 'forger'); "
		     "RAISE EXCEPTION 'an audit row of event ''admited'' was accepted'; "
		     "EXCEPTION WHEN check_violation THEN NULL; END $$");

	pgcoord_close(c);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
}
