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
 *
 * And a database the series before 0016_ledger_events.sql built and wrote
 * upgrades to it: every cycle of its explicit audit rows counts once, in
 * the check, the fold and retention, beside the cycles that keep their
 * events in their permit rows (the second test). Leases upgrade to 0019
 * (the third), live permits to 0022's one-statement claim and release
 * (the fourth).
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

/*
 * 0016_ledger_events.sql on a ledger the series before it wrote: the
 * database is built from the migration texts up to 0014 (recorded as the
 * runner records them), and its ledger by the functions the agent of that
 * schema called. Its audit rows are explicit; after the upgrade each of
 * its cycles still counts exactly once (no admission read both from its
 * audit row and from its permit row), its history reads the same, and the
 * cycles of the new schema keep their events in the permit rows.
 */

/* Applies and records every migration below version `below`, as
 * `pgcoord-agent migrate` would. */
static void migrate_below(struct harness_db *db, int below)
{
	const char *dir = henv("PGCOORD_TEST_MIGRATIONS_DIR");
	hdb_exec(db, "CREATE SCHEMA IF NOT EXISTS pgcoord; "
		     "CREATE TABLE IF NOT EXISTS pgcoord.schema_migrations ("
		     " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
		     " applied_at timestamptz NOT NULL DEFAULT now())");
	for (int v = 1; v < below; v++) {
		char cmd[512];
		snprintf(cmd, sizeof(cmd), "ls '%s' | grep '^%04d_.*\\.sql$'", dir, v);
		char *name = NULL;
		const char *const sh[] = {"/bin/sh", "-c", cmd, NULL};
		if (hrun(sh, &name) != 0) {
			free(name);
			continue; /* a gap in the series */
		}
		name[strcspn(name, "\n")] = '\0';
		char path[1024];
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		char *sql = hread_file(path);
		cr_assert(sql, "cannot read %s", path);
		cr_assert_null(strstr(sql, "$mig$"));
		hdb_exec(
		    db,
		    "BEGIN; %s; INSERT INTO pgcoord.schema_migrations (version, name, checksum) "
		    "VALUES (%d, '%.*s', encode(sha256(convert_to($mig$%s$mig$, 'UTF8')), 'hex'));"
		    " COMMIT",
		    sql, v, (int)(strlen(name) - 9), name + 5, sql);
		free(sql);
		free(name);
	}
	hdb_exec(db, "SELECT pgcoord.grant_runtime('%s')", henv("PGCOORD_TEST_RUNTIME_ROLE"));
}

/* Every audit row of the whole trail, as text in id order. */
static char *trail(struct harness_db *db)
{
	return hdb_query_value(db, "SELECT string_agg(concat_ws(' ', e.id, e.permit_id, e.key, "
				   "e.delta, e.event, e.actor, e.reason, e.state, e.phase, e.at), "
				   "E'\\n' ORDER BY e.id) FROM pgcoord.permit_events e");
}

/* The audit's deltas per quota against in_flight: a line per quota where
 * they differ, none when every cycle counts once. */
static char *unconserved(struct harness_db *db)
{
	return hdb_query_value(
	    db, "SELECT string_agg(q.key || ' ' || q.in_flight || ' ' || coalesce(s.d, 0), ', ') "
		"FROM pgcoord.quotas q LEFT JOIN (SELECT key, sum(delta) AS d FROM "
		"pgcoord.permit_events WHERE key IS NOT NULL GROUP BY key) s ON s.key = q.key "
		"WHERE q.in_flight <> coalesce(s.d, 0)");
}

/* Folds the whole audit, as the janitor does over several sweeps. */
static void fold_all(struct harness_db *db)
{
	for (int i = 0; i < 4; i++)
		hdb_exec(db, "SELECT pgcoord.janitor_fold_audit(1000)");
	cr_assert_eq(hdb_query_long(db, "SELECT (folded_upto >= (SELECT last_value FROM "
					"pgcoord.permit_events_id_seq))::int FROM "
					"pgcoord.permit_audit_horizon"),
		     1, "the fold did not reach the end of the audit");
}

/* An agent of the old schema, registered by the function it called, with
 * two sessions of uid and the quotas slot (of slot_limit), m1 and m2. */
static void old_agent(struct harness_db *db, long uid, int slot_limit, long *s1, long *s2)
{
	hdb_exec(db, "SELECT pgcoord.agent_register('old', 1, 'host', 1, 'v', 600000, NULL)");
	*s1 = hdb_query_long(db, "SELECT pgcoord.session_open('old', 1, 'a', 600000, false, %ld)",
			     uid);
	*s2 = hdb_query_long(db, "SELECT pgcoord.session_open('old', 1, 'b', 600000, false, %ld)",
			     uid);
	hdb_exec(db,
		 "SELECT pgcoord.quota_set('slot', %d, NULL, 'test'); "
		 "SELECT pgcoord.quota_set('m1', 5, NULL, 'test'); "
		 "SELECT pgcoord.quota_set('m2', 5, NULL, 'test')",
		 slot_limit);
}

#define CALL(db, want, fn, ...)                                                                    \
	assert_value(db, want, "SELECT (pgcoord." fn ").status", __VA_ARGS__)

Test(upgrade, explicit_audit_rows_of_old_cycles_count_once_after_0016)
{
	struct harness_db *db = hdb_create();
	migrate_below(db, 16);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT (to_regclass('pgcoord.permit_events_log') IS NULL "
				    "AND to_regclass('pgcoord.permit_events') IS NOT NULL)::int"),
		     1, "not the schema before 0016");
	long uid = (long)getuid(), s1, s2;
	old_agent(db, uid, 2, &s1, &s2);

	/* the old ledger: a finished cycle, part of the audit folded, a held
	 * permit, one of two quotas, one uncertain (its session ended), one
	 * released by an override, a claim queued behind the full slot */
#define CLAIM(id, keys, weights, s)                                                                \
	CALL(db, "admitted",                                                                       \
	     "permit_claim_as(%ld, false, '" id "', '" keys "', '" weights "', %ld, 'old', "       \
	     "'uncertain', NULL, NULL, 'session:' || %ld || '@old')",                              \
	     uid, s, s)
#define RELEASE(id, s)                                                                             \
	CALL(db, "released", "permit_release_one(%ld, '" id "', %ld, false, NULL, NULL)", uid, s)
	CLAIM("p-done", "{slot}", "{1}", s1);
	RELEASE("p-done", s1);
	fold_all(db);
	CLAIM("p-held", "{slot}", "{1}", s1);
	CLAIM("p-multi", "{m1,m2}", "{2,3}", s1);
	CLAIM("p-over", "{m1}", "{1}", s1);
	CALL(db, "released", "permit_release_one(%ld, 'p-over', NULL, true, 'operator', 'test')",
	     uid);
	CLAIM("p-unc", "{slot}", "{1}", s2);
	hdb_exec(db, "SELECT pgcoord.session_close(ARRAY[%ld], 1, 'test')", s2);
	assert_value(db, "uncertain", "SELECT state FROM pgcoord.permits WHERE id = 'p-unc'");
	long s3 = hdb_query_long(
	    db, "SELECT pgcoord.session_open('old', 1, 'c', 600000, false, %ld)", uid);
	CALL(db, "queued",
	     "permit_wait(%ld, false, 'p-wait', '{slot}', '{1}', %ld, 'old', 'uncertain', NULL, "
	     "NULL, 'session:' || %ld || '@old', 60000)",
	     uid, s3, s3);
	cr_assert_eq(check_problems(db), 0);
	char *before = trail(db);
	long rows = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events");

	/* the upgrade, by the runner, on the database as it is */
	hdb_migrate(db);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.schema_migrations WHERE version = 16"),
	    1);
	char *after = trail(db);
	cr_assert_str_eq(after, before, "the upgrade changed the audit trail");
	free(after);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events_log"), rows,
		     "the old rows are not all in the log");
	cr_assert_null(unconserved(db));
	cr_assert_eq(check_problems(db), 0);
	assert_value(db, "2", "SELECT audit_sum FROM pgcoord.permits_check() WHERE key = 'slot'");

	/* the new schema's cycles, through an agent: the old held permit is
	 * released (its release is an audit row, as its admission is), the
	 * queue gets the slot, and a new cycle keeps its events in its row */
	const char *const args[] = {"--wait-poll-ms", "50", NULL};
	struct hagent *a = hagent_start(db, "new", args);
	RELEASE("p-held", s1);
	cr_assert(
	    iwait_sql(
		db, 10000,
		"SELECT count(*) FROM pgcoord.permits WHERE id = 'p-wait' AND state = 'held'"),
	    "the queued claim was not handed the slot:\n%s", hagent_log(a));
	int fd = iconnect(hagent_socket(a));
	isession_open(fd, "new");
	iquota_set(fd, "fresh", 3);
	claim(fd, "p-new", "fresh", 0, "admitted");
	id_call_ok(fd, "permit.release", "p-new");
	claim(fd, "p-open", "fresh", 0, "admitted");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events_log WHERE "
					"permit_id IN ('p-new', 'p-open')"),
		     0, "a new cycle wrote audit rows");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events_log WHERE "
					"permit_id = 'p-held' AND event = 'released'"),
		     1, "the release of a permit admitted before 0016 is not in the log");
	assert_value(db, "admitted released",
		     "SELECT string_agg(event, ' ' ORDER BY id) FROM pgcoord.permit_events "
		     "WHERE permit_id = 'p-new'");
	cr_assert_null(unconserved(db));
	cr_assert_eq(check_problems(db), 0);

	/* a permit with its admission in its row released by an override: its
	 * release is a row of the log, which counts zero beside its row */
	claim(fd, "p-ovr", "fresh", 0, "admitted");
	CALL(db, "released", "permit_release_one(%ld, 'p-ovr', NULL, true, 'operator', 'test')",
	     uid);
	assert_value(db, "admitted override_released",
		     "SELECT string_agg(event, ' ' ORDER BY id) FROM pgcoord.permit_events "
		     "WHERE permit_id = 'p-ovr'");
	cr_assert_null(unconserved(db));
	cr_assert_eq(check_problems(db), 0);

	/* in_flight over a lowered limit is no violation; an admission after
	 * that limit was set is, also once that permit is released */
	hdb_exec(db, "SELECT pgcoord.quota_set('over', 2, NULL, 'test')");
	CLAIM("o-1", "{over}", "{1}", s1);
	CLAIM("o-2", "{over}", "{1}", s1);
	hdb_exec(db, "SELECT pgcoord.quota_set('over', 1, NULL, 'test')");
	cr_assert_eq(check_problems(db), 0);
	hdb_exec(db,
		 "INSERT INTO pgcoord.permits (id, token, owner_session, owner_replica, state, "
		 "phase, on_owner_loss, quota_key, quota_weight, admit_event, admit_actor) "
		 "VALUES ('o-forged', nextval('pgcoord.token_seq'), %ld, 'old', 'held', "
		 "'reserved', 'uncertain', 'over', 1, nextval('pgcoord.permit_events_id_seq'), "
		 "'forger'); UPDATE pgcoord.quotas SET in_flight = in_flight + 1 "
		 "WHERE key = 'over'",
		 s1);
	assert_value(db, "in_flight exceeds the limit and a permit was admitted since it was set",
		     "SELECT problem FROM pgcoord.permits_check() WHERE key = 'over'");
	RELEASE("o-forged", s1);
	assert_value(db, "in_flight exceeds the limit and a permit was admitted since it was set",
		     "SELECT problem FROM pgcoord.permits_check() WHERE key = 'over'");
	fold_all(db);
	assert_value(db, "in_flight exceeds the limit and a permit was admitted since it was set",
		     "SELECT problem FROM pgcoord.permits_check() WHERE key = 'over'");
	RELEASE("o-1", s1);
	RELEASE("o-2", s1);
	cr_assert_eq(check_problems(db), 0);

	/* the whole audit folded, and then the finished permits purged: still
	 * one count per cycle */
	fold_all(db);
	cr_assert_eq(check_problems(db), 0);
	assert_value(db, "2", "SELECT audit_sum FROM pgcoord.permits_check() WHERE key = 'slot'");
	assert_value(db, "1", "SELECT audit_sum FROM pgcoord.permits_check() WHERE key = 'fresh'");
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_purge_permits(100, 0)"), 8,
		     "p-done, p-over, p-held, p-new, p-ovr and the three on 'over' are not all "
		     "purged");
	cr_assert_eq(check_problems(db), 0);
	cr_assert_null(unconserved(db));
	const char *check[] = {"check", NULL};
	char *out = NULL;
	cr_assert_eq(ictl_run(hagent_socket(a), check, &out), 0, "%s", out);
	free(out);
	const char *hist[] = {"permits", "history", "p-open", NULL};
	cr_assert_eq(ictl_run(hagent_socket(a), hist, &out), 0, "%s", out);
	cr_assert(strstr(out, "admitted"), "%s", out);
	free(out);

	close(fd);
	free(before);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * 0019_attached_leases.sql on leases the series before it wrote: the
 * database is built from the migration texts up to 0018, its leases by the
 * functions the agent of that schema called (an acquisition, a renewal in
 * a beat, a hand-back). The upgrade leaves every lease as it was, read
 * through the view; the next beat attaches the held one to its agent's
 * row, its expiry then follows that row's beats, a campaigner still loses,
 * and a session that stops being renewed gives the lease back its own
 * expiry.
 */
static char *lease_picture(struct harness_db *db)
{
	return hdb_query_value(db, "SELECT concat_ws(E'\\n--\\n', "
				   "(SELECT string_agg(l::text, E'\\n' ORDER BY l.name) "
				   " FROM pgcoord.leases l), "
				   "(SELECT string_agg(e::text, E'\\n' ORDER BY e.id) "
				   " FROM pgcoord.lease_events e))");
}

Test(upgrade, held_and_handed_back_leases_survive_0019_and_attach_on_the_next_beat)
{
	struct harness_db *db = hdb_create();
	migrate_below(db, 19);
	cr_assert_eq(hdb_query_long(db, "SELECT (to_regclass('pgcoord.lease_rows') IS NULL)::int"),
		     1, "not the schema before 0019");
	long uid = (long)getuid();
	hdb_exec(db, "SELECT pgcoord.agent_register('old', 1, 'host', 1, 'v', 600000, NULL); "
		     "SELECT pgcoord.agent_register('other', 1, 'host', 2, 'v', 600000, NULL)");
	long s = hdb_query_long(
	    db, "SELECT pgcoord.session_open('old', 1, 'holder', 600000, false, %ld)", uid);
	long s2 = hdb_query_long(
	    db, "SELECT pgcoord.session_open('other', 1, 'campaigner', 600000, false, %ld)", uid);
	long epoch =
	    hdb_query_long(db,
			   "SELECT epoch FROM pgcoord.lease_acquire('kept', %ld, 'old', 1, 30000) "
			   "WHERE leader",
			   s);
	hdb_exec(db,
		 "SELECT pgcoord.lease_acquire('given-back', %ld, 'old', 1, 30000); "
		 "SELECT pgcoord.lease_release('given-back', %ld, 'done')",
		 s, s);
	/* 0017's beat renews the held lease by writing its row */
	assert_value(db, "{t}",
		     "SELECT renewed::text FROM pgcoord.agent_beat('old', 1, 600000, '{%ld}', "
		     "'{kept}', '{%ld}', '{%ld}', '{30000}', NULL)",
		     s, s, epoch);
	char *before = lease_picture(db);

	hdb_migrate(db);
	cr_assert_eq(hdb_query_long(db, "SELECT max(version) FROM pgcoord.schema_migrations"),
		     atol(henv("PGCOORD_TEST_MIGRATIONS")));
	char *after = lease_picture(db);
	cr_assert_str_eq(after, before, "the leases read otherwise after the upgrade");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.lease_rows "
					"WHERE expires_at IS NULL"),
		     0, "the upgrade attached a lease");

	/* the next beat attaches the held lease; its expiry is then the agent's
	 * last beat + ttl */
	assert_value(db, "{t}",
		     "SELECT renewed::text FROM pgcoord.agent_beat('old', 1, 600000, '{%ld}', "
		     "'{kept}', '{%ld}', '{%ld}', '{30000}', NULL)",
		     s, s, epoch);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.lease_rows l "
				    "JOIN pgcoord.leases v USING (name) "
				    "JOIN pgcoord.agents a ON a.replica_id = 'old' "
				    "WHERE l.name = 'kept' AND l.expires_at IS NULL "
				    "AND v.expires_at = a.heartbeat_at + interval '30 s' "
				    "AND v.holder_session = %ld AND v.epoch = %ld",
				    s, epoch),
		     1, "the held lease is not attached to its agent's row");
	/* a campaigner loses, without writing */
	assert_value(db, "false",
		     "SELECT leader::text FROM pgcoord.lease_acquire('kept', %ld, "
		     "'other', 1, 30000)",
		     s2);
	/* a beat that confirms an attached lease writes nothing to its row */
	long version = hdb_query_long(db, "SELECT xmin::text::bigint FROM pgcoord.lease_rows "
					  "WHERE name = 'kept'");
	assert_value(db, "{t}",
		     "SELECT renewed::text FROM pgcoord.agent_beat('old', 1, 600000, '{%ld}', "
		     "'{kept}', '{%ld}', '{%ld}', '{30000}', NULL)",
		     s, s, epoch);
	cr_assert_eq(hdb_query_long(db, "SELECT xmin::text::bigint FROM pgcoord.lease_rows "
					"WHERE name = 'kept'"),
		     version, "confirming an attached lease wrote its row");
	/* the session stops being renewed (the beat no longer lists it): the
	 * lease gets back an expiry of its own, the beat before + ttl */
	hdb_exec(db,
		 "SELECT pgcoord.agent_beat('old', 1, 600000, '{}', '{}', '{}', '{}', '{}', NULL)");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.lease_rows l "
				    "WHERE l.name = 'kept' AND l.expires_at IS NOT NULL "
				    "AND l.expires_at > now() + interval '25 s' "
				    "AND l.holder_session = %ld",
				    s),
		     1, "the lease of a session no longer renewed was not pinned");
	assert_value(db, "false",
		     "SELECT leader::text FROM pgcoord.lease_acquire('kept', %ld, "
		     "'other', 1, 30000)",
		     s2);

	free(before);
	free(after);
	hdb_drop(db);
}

/*
 * 0022_claim_release_fast.sql on a database in use: the ledger the series
 * before it wrote (held permits claimed in a group and alone, one of two
 * quotas, one uncertain, a claim queued behind a full quota) reads the same
 * after the upgrade; the one-statement release frees the old permits, the
 * queue is handed the slot at its commit, the one-statement claim admits
 * new ones beside them, the group functions an agent of schema 21 calls
 * still work, and the check, the counters and the audit trail agree.
 */
#define FAST_CLAIM(ids, keys, sessions)                                                            \
	"SELECT string_agg(coalesce(f.status::text, f.err_state), ' ' ORDER BY f.member) "         \
	"FROM pgcoord.permit_claim_fast(array_fill(%ld::bigint, ARRAY[cardinality(" ids            \
	"::text[])]), "                                                                            \
	"array_fill(false, ARRAY[cardinality(" ids "::text[])]), " ids "::text[], " keys           \
	"::text[], array_fill('{1}'::text, ARRAY[cardinality(" ids "::text[])]), " sessions        \
	"::bigint[], array_fill('old'::text, ARRAY[cardinality(" ids "::text[])]), "               \
	"array_fill('uncertain'::text, ARRAY[cardinality(" ids "::text[])]), "                     \
	"array_fill(NULL::bytea, ARRAY[cardinality(" ids "::text[])]), "                           \
	"array_fill(NULL::integer, ARRAY[cardinality(" ids "::text[])]), "                         \
	"array_fill('agent@old'::text, ARRAY[cardinality(" ids "::text[])])) f"
#define FAST_RELEASE(ids, sessions)                                                                \
	"SELECT string_agg(coalesce(f.status::text, f.err_state), ' ' ORDER BY f.member) "         \
	"FROM pgcoord.permit_release_fast(array_fill(%ld::bigint, ARRAY[cardinality(" ids          \
	"::text[])]), " ids "::text[], " sessions "::bigint[], "                                   \
	"array_fill(false, ARRAY[cardinality(" ids "::text[])]), "                                 \
	"array_fill(NULL::text, ARRAY[cardinality(" ids "::text[])]), "                            \
	"array_fill(NULL::text, ARRAY[cardinality(" ids "::text[])])) f"

Test(upgrade, live_permits_of_schema_21_are_released_and_claimed_by_0022s_statements)
{
	struct harness_db *db = hdb_create();
	migrate_below(db, 22);
	cr_assert_eq(hdb_query_long(db, "SELECT (to_regproc('pgcoord.permit_claim_fast') IS NULL)"
					"::int"),
		     1, "not the schema before 0022");
	long uid = (long)getuid(), s1, s2;
	old_agent(db, uid, 3, &s1, &s2);

	/* schema 21's ledger, written by the functions its agent calls: two
	 * held permits claimed as one group, one alone, one of two quotas, one
	 * uncertain (its session ended), one queued behind the full slot */
	assert_value(db, "admitted admitted",
		     "SELECT string_agg(g.status::text, ' ' ORDER BY g.member) FROM "
		     "pgcoord.permit_claim_group('{%ld,%ld}', '{f,f}', '{g-1,g-2}', "
		     "'{\"{slot}\",\"{m1}\"}', '{\"{1}\",\"{1}\"}', '{%ld,%ld}', '{old,old}', "
		     "'{uncertain,uncertain}', '{NULL,NULL}', '{NULL,NULL}', "
		     "'{agent@old,agent@old}') g",
		     uid, uid, s1, s1);
	CLAIM("p-multi", "{m1,m2}", "{2,3}", s1);
	CLAIM("p-unc", "{slot}", "{1}", s2);
	hdb_exec(db, "SELECT pgcoord.session_close(ARRAY[%ld], 1, 'test')", s2);
	assert_value(db, "uncertain", "SELECT state FROM pgcoord.permits WHERE id = 'p-unc'");
	CLAIM("p-held", "{slot}", "{1}", s1);
	long s3 = hdb_query_long(
	    db, "SELECT pgcoord.session_open('old', 1, 'c', 600000, false, %ld)", uid);
	CALL(db, "queued",
	     "permit_wait(%ld, false, 'p-wait', '{slot}', '{1}', %ld, 'old', 'uncertain', NULL, "
	     "NULL, 'session:' || %ld || '@old', 60000)",
	     uid, s3, s3);
	cr_assert_eq(check_problems(db), 0);
	char *before = ledger(db);

	/* the upgrade adds functions only: the ledger reads the same */
	hdb_migrate(db);
	cr_assert_eq(hdb_query_long(db, "SELECT max(version) FROM pgcoord.schema_migrations"),
		     atol(henv("PGCOORD_TEST_MIGRATIONS")));
	char *after = ledger(db);
	cr_assert_str_eq(after, before, "the upgrade changed the ledger");
	free(after);
	cr_assert_eq(check_problems(db), 0);

	/* the old held permits of one quota, released as one statement; the
	 * permit of two quotas, the uncertain one and another session's are
	 * left to the group function; the queue gets the slot at the commit */
	assert_value(db, "released released PCSLW PCSLW",
		     FAST_RELEASE("'{g-1,p-held,p-multi,p-unc}'", "'{%ld,%ld,%ld,%ld}'"), uid, s1,
		     s1, s1, s1);
	assert_value(db, "held", "SELECT state FROM pgcoord.permits WHERE id = 'p-wait'");
	assert_value(db, "2 0",
		     "SELECT concat_ws(' ', in_flight, waiting) FROM pgcoord.quotas "
		     "WHERE key = 'slot'");
	assert_value(db, "3", "SELECT in_flight FROM pgcoord.quotas WHERE key = 'm1'");
	cr_assert_eq(check_problems(db), 0);
	cr_assert_null(unconserved(db));

	/* new claims as one statement: room on m1 for both, not on slot for
	 * both of its two (left to the group function, which would admit the
	 * first; nothing written), an id that exists (a retry, the group
	 * function's too) */
	assert_value(db, "admitted admitted PCSLW PCSLW PCSLW",
		     FAST_CLAIM("'{n-1,n-2,n-3,n-4,g-2}'",
				"'{\"{m1}\",\"{m1}\",\"{slot}\",\"{slot}\",\"{m1}\"}'",
				"'{%ld,%ld,%ld,%ld,%ld}'"),
		     uid, s1, s1, s1, s1, s1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits "
					"WHERE id IN ('n-3', 'n-4')"),
		     0, "a claim left to the group function wrote its row");
	assert_value(db, "5 2",
		     "SELECT concat_ws(' ', m.in_flight, s.in_flight) FROM "
		     "pgcoord.quotas m, pgcoord.quotas s WHERE m.key = 'm1' AND s.key = 'slot'");
	/* their events are in their rows, in order: the old permit's admission
	 * and release, the new one's admission */
	assert_value(db, "admitted released",
		     "SELECT string_agg(event::text, ' ' ORDER BY id) FROM pgcoord.permit_events "
		     "WHERE permit_id = 'p-held'");
	assert_value(db, "admitted",
		     "SELECT string_agg(event::text, ' ' ORDER BY id) FROM pgcoord.permit_events "
		     "WHERE permit_id = 'n-2'");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events_log WHERE "
					"permit_id IN ('n-1', 'n-2', 'g-1', 'p-held')"),
		     0, "the one-statement cycle wrote audit rows");
	cr_assert_eq(hdb_query_long(db, "SELECT (max(token) FILTER (WHERE id = 'n-2') > "
					"max(token) FILTER (WHERE id = 'n-1'))::int "
					"FROM pgcoord.permits"),
		     1, "tokens are not in arrival order");

	/* an agent of schema 21 goes on calling the group functions */
	assert_value(db, "released released",
		     "SELECT string_agg(g.status::text, ' ' ORDER BY g.member) FROM "
		     "pgcoord.permit_release_group('{%ld,%ld}', '{n-1,p-multi}', '{%ld,%ld}', "
		     "'{f,f}', '{NULL,NULL}', '{NULL,NULL}') g",
		     uid, uid, s1, s1);
	/* and a release of one already released is the group function's
	 * answer, through the fast statement */
	assert_value(db, "PCSLW", FAST_RELEASE("'{n-1}'", "'{%ld}'"), uid, s1);
	assert_value(db, "2 0",
		     "SELECT concat_ws(' ', m.in_flight, x.in_flight) FROM "
		     "pgcoord.quotas m, pgcoord.quotas x WHERE m.key = 'm1' AND x.key = 'm2'");
	cr_assert_eq(check_problems(db), 0);
	cr_assert_null(unconserved(db));
	fold_all(db);
	cr_assert_eq(check_problems(db), 0);

	free(before);
	hdb_drop(db);
}
