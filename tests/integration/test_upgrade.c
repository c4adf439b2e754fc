/*
 * test_upgrade.c — a database in use upgrades to 0013_ledger.sql: its held,
 * uncertain and queued permits and their history come through the
 * migration as they were, the new agent takes the killed one's sessions
 * over, the queue is handed over on release, and the check is clean.
 *
 * The live ledger is made by a real agent, which is then killed (an agent
 * refuses a schema behind its own, so it runs on the whole series). The
 * schema is then put back to 0012's where 0013 changes it (the BEFORE
 * trigger quotas_no_overtaking) with version 13 unrecorded, a cycle runs on
 * it through the functions the agent calls, and `pgcoord-agent migrate`
 * upgrades it as it stands. Later migrations stay recorded, so the runner
 * also meets a series with a hole and must fill it.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(upgrade, .timeout = 120);

/* What 0012 left of what 0013 changes, and 0013 not recorded. */
static const char back_to_0012[] =
    "DROP TRIGGER quotas_no_overtaking ON pgcoord.quotas; "
    "DROP FUNCTION pgcoord.quotas_no_overtaking_check(); "
    "CREATE TRIGGER quotas_no_overtaking BEFORE UPDATE OF in_flight ON pgcoord.quotas "
    "FOR EACH ROW WHEN (NEW.in_flight > OLD.in_flight AND OLD.waiting > 0) "
    "EXECUTE FUNCTION pgcoord.quotas_no_overtaking(); "
    "DELETE FROM pgcoord.schema_migrations WHERE version = 13";

/* The ledger, whole: every permit, share, waiter, quota counter and audit
 * row, as text in a fixed order. Equal strings: nothing changed. */
static char *ledger(struct harness_db *db)
{
	return hdb_query_value(
	    db, "SELECT concat_ws(E'\\n--\\n', "
		"(SELECT string_agg(t::text, E'\\n' ORDER BY t.id) FROM pgcoord.permits t), "
		"(SELECT string_agg(t::text, E'\\n' ORDER BY t.permit_id, t.key) "
		" FROM pgcoord.permit_quotas_multi t), "
		"(SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM pgcoord.waiters t), "
		"(SELECT string_agg(concat_ws(' ', q.key, q.\"limit\", q.in_flight, q.waiting), "
		" E'\\n' ORDER BY q.key) FROM pgcoord.quotas q), "
		"(SELECT string_agg(t::text, E'\\n' ORDER BY t.id) FROM pgcoord.permit_events t))");
}

static char *history(struct harness_db *db, const char *id)
{
	return hdb_query_value(db,
			       "SELECT string_agg(concat_ws(' ', e.id, e.key, e.delta, e.event, "
			       "e.actor, e.reason, e.state, e.phase, e.at), E'\\n' ORDER BY e.id) "
			       "FROM pgcoord.permit_events e WHERE e.permit_id = '%s'",
			       id);
}

/* The one value the query (format and arguments) answers is want. */
#define assert_value(db, want, ...)                                                                \
	do {                                                                                       \
		char *value_ = hdb_query_value(db, __VA_ARGS__);                                   \
		cr_assert_str_eq(value_, want);                                                    \
		free(value_);                                                                      \
	} while (0)

static long check_problems(struct harness_db *db)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pgcoord.permits_check() WHERE problem <> ''");
}

static void claim(int fd, const char *id, const char *key, int64_t wait_ms, const char *want)
{
	struct ireply r;
	iclaim_call(fd, id, key, 1, wait_ms, &r);
	const msgpack_object *res = iok(&r, "permit.claim");
	cr_assert(istr_is(res, "status", want), "claim %s: not %s", id, want);
	ireply_destroy(&r);
}

static void id_call_ok(int fd, const char *method, const char *id)
{
	struct iparams p;
	struct ireply r;
	pgc_pack_kv_str(iparams_begin(&p, 1), "id", id);
	icall_ok(fd, method, &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
}

static void resume(int fd, int64_t session)
{
	struct iparams p;
	struct ireply r;
	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", session);
	const msgpack_object *res = icall_ok(fd, "session.open", &p, &r);
	cr_assert_eq(iint(res, "session"), session);
	cr_assert(ibool(res, "resumed"));
	ireply_destroy(&r);
	iparams_destroy(&p);
}

Test(upgrade, held_uncertain_and_queued_permits_and_history_survive_0013_and_the_takeover)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--session-ttl-ms",
				    "60000",
				    "--session-grace-ms",
				    "60000",
				    "--wait-poll-ms",
				    "50",
				    NULL};
	struct hagent *a = hagent_start(db, "up-a", args);
	int fd1 = iconnect(hagent_socket(a)), fd2 = iconnect(hagent_socket(a));
	int fd3 = iconnect(hagent_socket(a));
	int64_t s1 = isession_open(fd1, "holder");
	struct ireply r;

	/* the live ledger: on 'slot' (limit 2) one held permit, one uncertain
	 * (its session closed), a claim queued behind them; one finished cycle */
	iquota_set(fd1, "slot", 2);
	claim(fd1, "p-done", "slot", 0, "admitted");
	id_call_ok(fd1, "permit.release", "p-done");
	claim(fd1, "p-held", "slot", 0, "admitted");
	isession_open(fd2, "lost");
	claim(fd2, "p-unc", "slot", 0, "admitted");
	icall_ok(fd2, "session.close", NULL, &r);
	ireply_destroy(&r);
	cr_assert(iwait_sql(
	    db, 5000,
	    "SELECT count(*) FROM pgcoord.permits WHERE id = 'p-unc' AND state = 'uncertain'"));
	isession_open(fd3, "waiter");
	claim(fd3, "p-wait", "slot", 60000, "queued");

	/* the agent dies; its sessions stay open in the database */
	hagent_kill(a, SIGKILL);
	cr_assert_eq(hagent_wait(a, 5000), 128 + SIGKILL);
	close(fd1);
	close(fd2);
	close(fd3);

	/* the schema goes back to 0012's: the BEFORE trigger, 0013 unrecorded */
	hdb_exec(db, "%s", back_to_0012);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.schema_migrations WHERE version = 13"),
	    0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_trigger WHERE tgname = "
					"'quotas_no_overtaking' AND tgtype & 2 = 2"),
		     1, "not the BEFORE trigger of 0006");
	/* on it, a cycle by the functions the agent calls, and its trigger
	 * skipping a counter raised past the queue */
	hdb_exec(db, "SELECT pgcoord.quota_set('other', 1, NULL, 'test')");
	assert_value(db, "admitted",
		     "SELECT (pgcoord.permit_claim_as((SELECT owner_uid FROM pgcoord.sessions "
		     "WHERE id = %lld), false, 'p-sql', '{other}', "
		     "'{1}', %lld, 'up-a', 'uncertain', NULL, NULL, 'agent@up-a')).status",
		     (long long)s1, (long long)s1);
	assert_value(db, "released",
		     "SELECT (pgcoord.permit_release_one((SELECT owner_uid FROM pgcoord.sessions "
		     "WHERE id = %lld), 'p-sql', %lld, false, NULL, "
		     "NULL)).status",
		     (long long)s1, (long long)s1);
	cr_assert_eq(hdb_query_long(db, "WITH u AS (UPDATE pgcoord.quotas SET in_flight = "
					"in_flight + 1 WHERE key = 'slot' RETURNING 1) "
					"SELECT count(*) FROM u"),
		     0, "0012's trigger let a counter overtake the queue");
	cr_assert_eq(check_problems(db), 0);
	char *before = ledger(db);
	char *done = history(db, "p-done"), *sql = history(db, "p-sql");

	/* the new schema, on the database as it is */
	hdb_migrate(db);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.schema_migrations WHERE version = 13"),
	    1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pg_trigger WHERE tgname = "
					"'quotas_no_overtaking' AND tgtype & 2 = 0"),
		     1, "not the AFTER trigger of 0013");
	char *after = ledger(db);
	cr_assert_str_eq(after, before, "the migration changed the ledger");
	free(after);
	cr_assert_eq(check_problems(db), 0);
	/* nobody overtakes the queue: an immediate claim is denied, and a
	 * counter raised past it by hand is refused, not skipped */
	assert_value(db, "denied",
		     "SELECT (pgcoord.permit_claim_as((SELECT owner_uid FROM pgcoord.sessions "
		     "WHERE id = %lld), false, 'p-over', '{slot}', "
		     "'{1}', %lld, 'up-a', 'uncertain', NULL, NULL, 'agent@up-a')).status",
		     (long long)s1, (long long)s1);
	hdb_exec(db, "DO $$ BEGIN UPDATE pgcoord.quotas SET in_flight = in_flight + 1 "
		     "WHERE key = 'slot'; RAISE EXCEPTION 'overtook the queue'; "
		     "EXCEPTION WHEN check_violation THEN NULL; END $$");
	after = ledger(db);
	cr_assert_str_eq(after, before, "a refused claim or update changed the ledger");
	free(after);

	/* the new agent takes the killed one's sessions over; the holder
	 * resumes and releases, and the slot goes to the queue's head */
	struct hagent *b = hagent_start(db, "up-a", args);
	cr_assert(strstr(hagent_log(b), "taking over"), "%s", hagent_log(b));
	int fd = iconnect(hagent_socket(b));
	resume(fd, s1);
	id_call_ok(fd, "permit.release", "p-held");
	cr_assert(
	    iwait_sql(
		db, 10000,
		"SELECT count(*) FROM pgcoord.permits WHERE id = 'p-wait' AND state = 'held'"),
	    "the queued claim was not handed the slot");
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.waiters WHERE state = 'queued'"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT waiting FROM pgcoord.quotas WHERE key = 'slot'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'slot'"),
		     2, "p-unc (uncertain) and p-wait (held) count");
	assert_value(db, "uncertain", "SELECT state FROM pgcoord.permits WHERE id = '%s'", "p-unc");
	cr_assert_eq(check_problems(db), 0);
	const char *check[] = {"check", NULL};
	char *out = NULL;
	cr_assert_eq(ictl_run(hagent_socket(b), check, &out), 0, "%s", out);
	free(out);

	/* the history written before the upgrade reads the same after it */
	char *h = history(db, "p-done");
	cr_assert_str_eq(h, done);
	free(h);
	h = history(db, "p-sql");
	cr_assert_str_eq(h, sql);
	free(h);
	const char *hist[] = {"permits", "history", "p-done", NULL};
	cr_assert_eq(ictl_run(hagent_socket(b), hist, &out), 0, "%s", out);
	cr_assert(strstr(out, "admitted") && strstr(out, "released"), "%s", out);
	free(out);

	close(fd);
	free(before);
	free(done);
	free(sql);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}
