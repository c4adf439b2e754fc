/*
 * test_statement_mode.c — prepared_statements = auto (the default) serves
 * directly and behind PgBouncer in transaction mode without a setting:
 * named statements and session timeouts directly, timeouts with each
 * transaction behind the pooler, unnamed statements once the pooler loses
 * a named one, and no call ever answered with the error that made it
 * change.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(statement_mode, .timeout = 120);

#define CALL_MS 10000

static pgcoord *client(struct hagent *a, const char *session_name)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(hagent_socket(a), CALL_MS, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect: %s", pgcoord_strerror(err));
	err = pgcoord_session_open(c, session_name, CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "session.open: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return c;
}

/* Claims id on q and releases it; both must succeed the first time. */
static void claim_and_release(pgcoord *c, const char *id)
{
	pgcoord_claim *cl = NULL;
	pgcoord_err err = iclaim_one(c, id, "q", CALL_MS, &cl);
	cr_assert_eq(err, PGCOORD_OK, "claim %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	err = pgcoord_permit_release(c, id, 0, NULL, CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "release %s: %s (%s)", id, pgcoord_strerror(err),
		     pgcoord_last_message(c));
}

/* One sample of /metrics: the value after "name " (labels included). */
static long metric(struct hagent *a, const char *name)
{
	char *page = ihttp_get(a, "/metrics");
	char line[160];
	long v = -1;

	snprintf(line, sizeof(line), "\n%s ", name);
	const char *at = strstr(page, line);
	if (at)
		v = atol(at + strlen(line));
	free(page);
	cr_assert_geq(v, 0, "no %s in /metrics", name);
	return v;
}

/* What the agent must report: named directly; behind PgBouncer a pooler,
 * and named-pooled or unnamed (unnamed once a named statement went
 * missing, which depends on which server connections PgBouncer chose). */
static char *expect_mode(struct hagent *a)
{
	char *mode = istatus_str(a, "statement_mode");
	char *setting = istatus_str(a, "prepared_statements");
	cr_assert_str_eq(setting, "auto");
	free(setting);
	if (hbouncer_enabled()) {
		cr_assert(strcmp(mode, "named-pooled") == 0 || strcmp(mode, "unnamed") == 0, "%s",
			  mode);
		cr_assert(istatus_bool(a, "db_pooler"));
	} else {
		cr_assert_str_eq(mode, "named");
		cr_assert_not(istatus_bool(a, "db_pooler"));
	}
	return mode;
}

/* The agent's log never shows a statement that failed, a failed heartbeat,
 * or the advice for prepared_statements = on (a 26000 or 42P05 the agent
 * handled itself is logged once, as the reason it went unnamed). */
static void expect_clean_log(struct hagent *a)
{
	const char *log = hagent_log(a);
	cr_assert_null(strstr(log, "statement failed"), "%s", log);
	cr_assert_null(strstr(log, "heartbeat failed"), "%s", log);
	cr_assert_null(strstr(log, "Set prepared_statements"), "%s", log);
	if (hbouncer_enabled())
		cr_assert(strstr(log, "database_url reaches the server through a pooler"), "%s",
			  log);
	else
		cr_assert_null(strstr(log, "through a pooler"), "%s", log);
}

Test(statement_mode, the_default_serves_and_says_which_mode_it_chose)
{
	enum { CYCLES = 30 };
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	const char *const args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "r1", args);
	pgcoord *c = client(a, "first");
	pgcoord *d = client(a, "second");
	cr_assert_eq(pgcoord_quota_set(c, "q", 5, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	for (int i = 0; i < CYCLES; i++) {
		char id[32];
		snprintf(id, sizeof(id), "p%d", i);
		claim_and_release(i % 2 ? d : c, id);
	}
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE name IN "
					"('first', 'second')"),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE state = "
					"'released' AND released_at IS NOT NULL"),
		     CYCLES);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);

	char *mode = expect_mode(a);
	const char *const modes[] = {"named", "named-pooled", "unnamed"};
	for (int m = 0; m < 3; m++) {
		char name[96];
		snprintf(name, sizeof(name), "pgcoord_db_statement_mode{mode=\"%s\"}", modes[m]);
		cr_assert_eq(metric(a, name), strcmp(mode, modes[m]) == 0, "%s", name);
	}
	cr_assert_eq(metric(a, "pgcoord_db_pooler"), hbouncer_enabled());
	char *page = ihttp_get(a, "/status");
	char want[96];
	snprintf(want, sizeof(want), "<td id=\"statement-mode\">%s (prepared_statements = auto",
		 mode);
	cr_assert(strstr(page, want), "%s", page);
	free(page);
	free(mode);
	expect_clean_log(a);
	pgcoord_close(c);
	pgcoord_close(d);
	hagent_destroy(a);
	hdb_drop(db);
}

/* PgBouncer's RECONNECT closes its server connections as they come free:
 * the agent's next named statement reaches a server session that never
 * prepared it. */
static void bouncer_reconnect(void)
{
	char info[512];
	snprintf(info, sizeof(info), "host=%s port=%s dbname=pgbouncer user=postgres",
		 getenv("PGCOORD_TEST_PGBOUNCER_HOST"), getenv("PGCOORD_TEST_PGBOUNCER_PORT"));
	PGconn *admin = PQconnectdb(info);
	cr_assert_eq(PQstatus(admin), CONNECTION_OK, "%s", PQerrorMessage(admin));
	PGresult *res = PQexec(admin, "RECONNECT");
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQerrorMessage(admin));
	PQclear(res);
	PQfinish(admin);
}

/* Behind the pooler, a named statement the server session does not have
 * turns the agent unnamed for good, and the call that met it is sent again
 * unnamed: its client sees only success. Directly, losing the server
 * sessions loses the connections too: the agent reconnects, prepares again
 * and stays named. */
Test(statement_mode, a_named_statement_gone_with_the_server_session_is_sent_again_unnamed)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	const char *const args[] = {"--pool-size", "1", "--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "r1", args);
	pgcoord *c = client(a, "cycler");
	cr_assert_eq(pgcoord_quota_set(c, "q", 5, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	claim_and_release(c, "p0");
	char *before = expect_mode(a);
	long resent_before = metric(a, "pgcoord_db_statements_resent_total");

	if (hbouncer_enabled()) {
		bouncer_reconnect();
		for (int i = 1; i <= 5; i++) {
			char id[16];
			snprintf(id, sizeof(id), "p%d", i);
			claim_and_release(c, id);
		}
		char *after = istatus_str(a, "statement_mode");
		cr_assert_str_eq(after, "unnamed");
		free(after);
		long resent = metric(a, "pgcoord_db_statements_resent_total");
		if (strcmp(before, "named-pooled") == 0)
			cr_assert_gt(resent, resent_before, "no call was sent again");
		const char *log = hagent_log(a);
		cr_assert(strstr(log, "using unnamed statements from now on"), "%s", log);
	} else {
		cr_assert_gt(hdb_query_long(db,
					    "SELECT count(pg_terminate_backend(pid)) FROM "
					    "pg_stat_activity WHERE datname = current_database() "
					    "AND pid <> pg_backend_pid() AND backend_type = "
					    "'client backend'"),
			     0);
		for (int i = 1; i <= 5; i++) {
			char id[16];
			snprintf(id, sizeof(id), "p%d", i);
			pgcoord_claim *cl = NULL;
			pgcoord_err err;
			int tries = 0;
			/* a call on a terminated connection fails retryably */
			while ((err = iclaim_one(c, id, "q", CALL_MS, &cl)) != PGCOORD_OK &&
			       ++tries < 20) {
				cr_assert(pgcoord_err_retryable(err), "%s: %s (%s)", id,
					  pgcoord_strerror(err), pgcoord_last_message(c));
				hsleep_ms(100);
			}
			cr_assert_eq(err, PGCOORD_OK, "%s: %s", id, pgcoord_last_message(c));
			pgcoord_claim_free(cl);
			cr_assert_eq(pgcoord_permit_release(c, id, 0, NULL, CALL_MS, NULL),
				     PGCOORD_OK, "%s", pgcoord_last_message(c));
		}
		char *after = istatus_str(a, "statement_mode");
		cr_assert_str_eq(after, "named");
		free(after);
		cr_assert_eq(metric(a, "pgcoord_db_statements_resent_total"), 0);
		cr_assert_null(strstr(hagent_log(a), "unnamed statements"));
	}
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE state = "
					"'released'"),
		     6);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);
	cr_assert_null(strstr(hagent_log(a), "Set prepared_statements"));
	free(before);
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Two agents behind one PgBouncer share its server connections: a
 * statement one of them prepared is there when the other prepares the
 * same name (42P05), or missing where the other looks for its own (26000).
 * Both still answer every call, the first time. */
Test(statement_mode, two_agents_behind_one_pooler_both_serve)
{
	enum { CYCLES = 40 };
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	struct hagent *a = hagent_start(db, "r1", NULL);
	struct hagent *b = hagent_start(db, "r2", NULL);
	pgcoord *ca = client(a, "on-r1");
	pgcoord *cb = client(b, "on-r2");
	cr_assert_eq(pgcoord_quota_set(ca, "q", 10, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(ca));
	for (int i = 0; i < CYCLES; i++) {
		char id[32];
		snprintf(id, sizeof(id), "p%d", i);
		claim_and_release(i % 2 ? cb : ca, id);
	}
	cr_assert_eq(hdb_query_long(db, "SELECT count(DISTINCT s.replica_id) FROM "
					"pgcoord.permits p JOIN pgcoord.sessions s ON s.id = "
					"p.owner_session WHERE p.state = 'released'"),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE state = "
					"'released'"),
		     CYCLES);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 0);
	free(expect_mode(a));
	free(expect_mode(b));
	expect_clean_log(a);
	expect_clean_log(b);
	pgcoord_close(ca);
	pgcoord_close(cb);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}
