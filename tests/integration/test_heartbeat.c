/*
 * test_heartbeat.c — liveness costs one statement per heartbeat interval per
 * agent, whatever its number of sessions; fleet.agents and fleet.sessions
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
 * anything proportional to the sessions (50 per interval).
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
	    db, "SELECT max(expires_at) FROM pgcoord.sessions WHERE id = ANY ('%s')", ids);
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
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = ANY ('%s') "
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
