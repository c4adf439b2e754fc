/*
 * test_heartbeat.c — liveness costs one statement and one row per heartbeat
 * interval per agent, whatever its number of sessions (their rows are not
 * written by a beat); fleet.agents and fleet.sessions
 * list exactly what the database holds live.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(heartbeat, .timeout = 60);

#define NSESSIONS 50
#define HEARTBEAT_MS 100

/*
 * 50 sessions on 50 connections. Over ~3 s (~30 heartbeats) the agent's
 * db_queries may grow by the heartbeat plus the janitor's sweep and lease
 * renewal (a few per second) — a small constant per interval — never by
 * anything proportional to the sessions (50 per interval). The sessions are
 * attached to the agent's row: over those beats not one session row gets a
 * new version, and all stay live.
 */
Test(heartbeat, fifty_sessions_are_renewed_by_one_statement_per_interval)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--heartbeat-interval-ms", "100", "--session-ttl-ms", "1500",
				    NULL};
	struct hagent *a = hagent_start(db, "hb-fifty", args);
	iwait_janitor(a);
	int fds[NSESSIONS];
	char ids[NSESSIONS * 21 + 2];
	size_t n = 0;

	ids[n++] = '{';
	for (int i = 0; i < NSESSIONS; i++) {
		char name[32];
		snprintf(name, sizeof(name), "hb-%d", i);
		fds[i] = iconnect(hagent_socket(a));
		n += (size_t)snprintf(ids + n, sizeof(ids) - n, "%s%lld", i ? "," : "",
				      (long long)isession_open(fds[i], name));
	}
	ids[n++] = '}';
	ids[n] = '\0';
	cr_assert_eq(istatus_int(a, "sessions"), NSESSIONS + 1); /* + the janitor's */

	char *latest_before = hdb_query_value(
	    db, "SELECT max(expires_at) FROM pgcoord.session_liveness WHERE id = ANY ('%s')", ids);
	/* each session row's version (xmin, ctid): a beat must write none */
	static const char rows_sql[] =
	    "SELECT string_agg(id || ':' || xmin::text || ':' || ctid::text, ',' ORDER BY id) "
	    "FROM pgcoord.sessions WHERE id = ANY ('%s')";
	char *rows_before = hdb_query_value(db, rows_sql, ids);
	char *agent_before = hdb_query_value(
	    db, "SELECT xmin::text FROM pgcoord.agents WHERE replica_id = 'hb-fifty'");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = ANY ('%s') "
				    "AND expires_at IS NULL",
				    ids),
		     NSESSIONS, "the sessions are not attached to their agent's row");
	int64_t q0 = istatus_int(a, "db_queries");
	int64_t t0 = hnow_ms();
	hsleep_ms(3000);
	int64_t q1 = istatus_int(a, "db_queries");
	int64_t elapsed = hnow_ms() - t0;
	int64_t intervals = elapsed / HEARTBEAT_MS;
	int64_t per_interval_x10 = (q1 - q0) * 10 / intervals;

	cr_assert_geq(q1 - q0, intervals / 4, "only %lld statements in %lld ms: no heartbeats?",
		      (long long)(q1 - q0), (long long)elapsed);
	cr_assert_leq(per_interval_x10, 25,
		      "%lld statements in %lld intervals (%lld.%lld per interval) for %d "
		      "sessions: liveness costs more than one statement per interval",
		      (long long)(q1 - q0), (long long)intervals, (long long)per_interval_x10 / 10,
		      (long long)per_interval_x10 % 10, NSESSIONS);

	/* every session's expiry moved past where the latest one stood */
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = ANY ('%s') "
			   "AND closed_at IS NULL AND expires_at > '%s'",
			   ids, latest_before),
	    NSESSIONS, "not every session was renewed");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
				    "'hb-fifty' AND heartbeat_at > '%s'::timestamptz - interval "
				    "'1500 ms'",
				    latest_before),
		     1, "the agent row was not renewed with them");
	free(latest_before);
	char *rows_after = hdb_query_value(db, rows_sql, ids);
	cr_assert_str_eq(rows_after, rows_before,
			 "a heartbeat wrote session rows: liveness costs a write per session");
	char *agent_after = hdb_query_value(
	    db, "SELECT xmin::text FROM pgcoord.agents WHERE replica_id = 'hb-fifty'");
	cr_assert_str_neq(agent_after, agent_before, "the agent row was never written");
	free(rows_before);
	free(rows_after);
	free(agent_before);
	free(agent_after);
	for (int i = 0; i < NSESSIONS; i++)
		close(fds[i]);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The ids of a fleet.sessions result, as "{1,2,3}" in its order. */
static char *session_ids(const msgpack_object *res)
{
	const msgpack_object *list = pgc_map_get(res, "sessions");
	char *out = malloc(16 + 21 * (list ? list->via.array.size : 0));
	size_t n = 0;

	cr_assert(list && list->type == MSGPACK_OBJECT_ARRAY, "no sessions list");
	out[n++] = '{';
	for (uint32_t i = 0; i < list->via.array.size; i++)
		n += (size_t)sprintf(out + n, "%s%lld", i ? "," : "",
				     (long long)iint(&list->via.array.ptr[i], "session"));
	out[n++] = '}';
	out[n] = '\0';
	return out;
}

static const char live_ids_sql[] =
    "SELECT '{' || coalesce(string_agg(id::text, ',' ORDER BY id), '') || '}' "
    "FROM pgcoord.live_sessions";

/* fleet.sessions equals the live_sessions view, read around it until the
 * database holds still for the comparison. */
static void assert_fleet_sessions_match(int fd, struct harness_db *db)
{
	for (int attempt = 0;; attempt++) {
		char *before = hdb_query_value(db, live_ids_sql);
		struct ireply r;
		char *got = session_ids(icall_ok(fd, "fleet.sessions", NULL, &r));
		char *after = hdb_query_value(db, live_ids_sql);
		bool stable = strcmp(before, after) == 0;

		ireply_destroy(&r);
		if (stable || attempt == 5) {
			cr_assert(stable, "the live sessions never held still");
			cr_assert_str_eq(got, before, "fleet.sessions disagrees with the database");
			free(before);
			free(after);
			free(got);
			return;
		}
		free(before);
		free(after);
		free(got);
	}
}

/* Finds replica's row in a fleet.agents result. */
static const msgpack_object *agent_row(const msgpack_object *res, const char *replica)
{
	const msgpack_object *list = pgc_map_get(res, "agents");

	cr_assert(list && list->type == MSGPACK_OBJECT_ARRAY, "no agents list");
	for (uint32_t i = 0; i < list->via.array.size; i++)
		if (pgc_obj_str_eq(pgc_map_get(&list->via.array.ptr[i], "replica_id"), replica))
			return &list->via.array.ptr[i];
	cr_assert_fail("fleet.agents does not list %s", replica);
	return NULL;
}

Test(heartbeat, fleet_agents_and_sessions_list_what_the_database_holds_live)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "fleet-a", NULL);
	struct hagent *b = hagent_start(db, "fleet-b", NULL);
	int fa = iconnect(hagent_socket(a)), fb = iconnect(hagent_socket(b));
	int64_t sa = isession_open(fa, "on-a"), sb = isession_open(fb, "on-b");
	struct ireply r;
	const msgpack_object *res, *row;

	res = icall_ok(fa, "fleet.agents", NULL, &r);
	cr_assert_eq(pgc_map_get(res, "agents")->via.array.size,
		     hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents"));
	cr_assert_gt(iint(res, "now_at"), 0);
	struct hagent *both[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		const char *rid = hagent_replica_id(both[i]);
		row = agent_row(res, rid);
		cr_assert_eq(iint(row, "incarnation"), istatus_int(both[i], "incarnation"));
		cr_assert_eq(iint(row, "incarnation"),
			     hdb_query_long(db,
					    "SELECT incarnation FROM pgcoord.agents WHERE "
					    "replica_id = '%s'",
					    rid));
		cr_assert_eq(iint(row, "pid"), hagent_pid(both[i]));
		char *host = istr(row, "host");
		cr_assert_str_eq(host, ihostname());
		free(host);
		cr_assert(ibool(row, "live"));
		cr_assert(iis_nil(row, "stopped_at"));
		cr_assert_gt(iint(row, "expires_at"), iint(res, "now_at"));
	}
	ireply_destroy(&r);

	assert_fleet_sessions_match(fa, db);
	res = icall_ok(fb, "fleet.sessions", NULL, &r);
	char *ids = session_ids(res);
	char want[64];
	snprintf(want, sizeof(want), "%lld", (long long)sa);
	cr_assert(strstr(ids, want));
	snprintf(want, sizeof(want), "%lld", (long long)sb);
	cr_assert(strstr(ids, want));
	free(ids);
	const msgpack_object *list = pgc_map_get(res, "sessions");
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		const msgpack_object *s = &list->via.array.ptr[i];
		if (iint(s, "session") == sb) {
			char *name = istr(s, "name"), *rid = istr(s, "replica_id");
			cr_assert_str_eq(name, "on-b");
			cr_assert_str_eq(rid, "fleet-b");
			cr_assert_eq(iint(s, "incarnation"), istatus_int(b, "incarnation"));
			free(name);
			free(rid);
		}
	}
	ireply_destroy(&r);

	/* b stops: it is listed stopped and not live, its sessions vanish */
	close(fb);
	cr_assert_eq(hagent_stop(b), 0);
	res = icall_ok(fa, "fleet.agents", NULL, &r);
	row = agent_row(res, "fleet-b");
	cr_assert_not(ibool(row, "live"));
	cr_assert_not(iis_nil(row, "stopped_at"));
	cr_assert_eq(iint(row, "stopped_at"),
		     hdb_query_long(db, "SELECT pgcoord.ms(stopped_at) FROM pgcoord.agents WHERE "
					"replica_id = 'fleet-b'"));
	cr_assert(ibool(agent_row(res, "fleet-a"), "live"));
	ireply_destroy(&r);
	assert_fleet_sessions_match(fa, db);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.live_sessions WHERE replica_id = "
				    "'fleet-b'"),
		     0);
	close(fa);
	hagent_destroy(a);
	hagent_destroy(b);
	hdb_drop(db);
}

/* A session of the 'edge' agent, by what pgcoord.session_liveness says. */
static long edge_live(struct harness_db *db, long long id)
{
	return hdb_query_long(db, "SELECT live::int FROM pgcoord.session_liveness WHERE id = %lld",
			      id);
}

static long long edge_open(struct harness_db *db, const char *expires_sql)
{
	return hdb_query_long(db,
			      "INSERT INTO pgcoord.sessions (replica_id, incarnation, expires_at) "
			      "VALUES ('edge', 1, %s) RETURNING id",
			      expires_sql);
}

/*
 * The liveness rule at its edges, by database time, in the functions the
 * agents call: an attached session (no expires_at of its own) lives and
 * dies with its agent's row, a pinned one by its own expiry; a close
 * inside the grace pins the expiry it had; a beat that no longer lists a
 * session pins it to the row's expiry before the beat; a beat after the
 * row lapsed renews the row but never the sessions that died with it; a
 * new incarnation taking over a live row keeps its sessions attached.
 */
Test(heartbeat, liveness_rule_edges_by_database_time)
{
	struct harness_db *db = idb_migrated();
	hdb_exec(db, "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		     "expires_at) VALUES ('edge', 1, 'h', 1, 'v', now() + interval '1 hour')");
	long long att = edge_open(db, "NULL"), gone = edge_open(db, "NULL");
	long long graced = edge_open(db, "NULL");
	long long pin_live = edge_open(db, "now() + interval '1 hour'");
	long long pin_dead = edge_open(db, "now() - interval '1 second'");

	cr_assert_eq(edge_live(db, att), 1);
	cr_assert_eq(edge_live(db, pin_live), 1);
	cr_assert_eq(edge_live(db, pin_dead), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.live_sessions "
					"WHERE replica_id = 'edge'"),
		     4);

	/* closed inside its grace (detached, not yet renewed out): dead at
	 * once, and its row keeps the agent's expiry as its own */
	cr_assert_eq(
	    hdb_query_long(db, "SELECT pgcoord.session_close(ARRAY[%lld], 1, 'grace')", graced), 1);
	cr_assert_eq(edge_live(db, graced), 0);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions s JOIN pgcoord.agents a "
				    "ON a.replica_id = 'edge' WHERE s.id = %lld "
				    "AND s.expires_at = a.expires_at",
				    graced),
		     1, "a close did not pin the expiry the session had");

	/* a beat listing att and pin_live (not gone, plus the closed one);
	 * the previous beat came after every open */
	hdb_exec(db, "UPDATE pgcoord.agents SET heartbeat_at = now() WHERE replica_id = 'edge'");
	char *prev = hdb_query_value(db, "SELECT expires_at FROM pgcoord.agents "
					 "WHERE replica_id = 'edge'");
	char *lost =
	    hdb_query_value(db,
			    "SELECT lost::text FROM pgcoord.agent_heartbeat('edge', 1, 60000, "
			    "ARRAY[%lld, %lld, %lld])",
			    att, pin_live, graced);
	char want[32];
	snprintf(want, sizeof(want), "{%lld}", graced);
	cr_assert_str_eq(lost, want, "only the closed session is lost");
	free(lost);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld "
				    "AND expires_at = '%s'",
				    gone, prev),
		     1, "a session the beat no longer lists was not pinned to the row's expiry");
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE id IN (%lld, %lld) "
			   "AND expires_at IS NULL AND closed_at IS NULL",
			   att, pin_live),
	    2, "a listed live session is not attached after the beat");
	free(prev);

	/* the row lapses: the attached session is dead without a write */
	char *row =
	    hdb_query_value(db, "SELECT xmin::text FROM pgcoord.sessions WHERE id = %lld", att);
	hdb_exec(db, "UPDATE pgcoord.agents SET expires_at = now() - interval '2 seconds' "
		     "WHERE replica_id = 'edge'");
	cr_assert_eq(edge_live(db, att), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.session_is_live(%lld)::int", att), 0);
	char *row_after =
	    hdb_query_value(db, "SELECT xmin::text FROM pgcoord.sessions WHERE id = %lld", att);
	cr_assert_str_eq(row_after, row);
	free(row);
	free(row_after);
	char *lapsed = hdb_query_value(db, "SELECT expires_at FROM pgcoord.agents "
					   "WHERE replica_id = 'edge'");

	/* a late beat renews the row, never the session that died with it */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT (agent_ok AND lost = ARRAY[%lld]::bigint[])::int FROM "
				    "pgcoord.agent_heartbeat('edge', 1, 60000, ARRAY[%lld])",
				    att, att),
		     1, "the late beat did not report the lapsed session lost");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents "
					"WHERE replica_id = 'edge' AND expires_at > now()"),
		     1);
	cr_assert_eq(edge_live(db, att), 0, "the late beat revived a lapsed session");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld "
				    "AND expires_at = '%s'",
				    att, lapsed),
		     1, "the lapsed session was not pinned to the expiry it died at");
	free(lapsed);

	/* the janitor closes what died, as 'lapsed' (close_reason 'expired') */
	/* pin_live, attached by the first beat, died with the row too */
	cr_assert_eq(edge_live(db, pin_live), 0);

	/* the janitor closes what died, as 'lapsed' (close_reason 'expired') */
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(100)"), 3);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE id IN (%lld, %lld, "
			   "%lld) AND closed_at IS NOT NULL AND close_reason = 'expired'",
			   att, pin_live, pin_dead),
	    3);

	/* a new incarnation takes over the live row: an attached session
	 * moves attached, gone (pinned an hour ahead) moves pinned */
	long long fresh = edge_open(db, "NULL");
	cr_assert_eq(hdb_query_long(db,
				    "SELECT (ok AND taken_over @> ARRAY[%lld, %lld]::bigint[] "
				    "AND cardinality(taken_over) = 2)::int FROM "
				    "pgcoord.agent_register('edge', 2, 'h', 2, 'v', 60000, 1)",
				    fresh, gone),
		     1);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld "
				    "AND incarnation = 2 AND expires_at IS NULL",
				    fresh),
		     1);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld "
				    "AND incarnation = 2 AND expires_at > now()",
				    gone),
		     1);
	cr_assert_eq(edge_live(db, fresh), 1);
	cr_assert_eq(edge_live(db, gone), 1);
	hdb_drop(db);
}
