/*
 * test_janitor_scan.c — the janitor's sweep, once a second, costs what is
 * open, not what the fleet did in the past, and little per open row: closed
 * sessions stay in pgcoord.sessions forever, and expiring lapsed sessions
 * must not read them; the permit duty checks every held permit's owner, and
 * must not do it with a function call per permit; while every agent lives
 * the expiry reads none of the sessions attached to them.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "itest.h"

TestSuite(janitor_scan, .timeout = 90);

#define CLOSED_SESSIONS 50000
#define OPEN_SESSIONS 200
/* rows of pgcoord.sessions one sweep may read: the open ones, a few times
 * over (a bitmap scan rechecks), never the closed past */
#define MAX_ROWS_READ (10 * OPEN_SESSIONS)
/* PL/pgSQL plans a statement afresh for the first five calls of a backend
 * and may then keep a generic plan: both must stay cheap */
#define SWEEPS 8
#define HELD_PERMITS 2000

/* Rows of pgcoord.sessions this connection's transaction has read so far. */
static long rows_read(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
				  "FROM pg_stat_xact_user_tables "
				  "WHERE relid = 'pgcoord.sessions'::regclass");
}

Test(janitor_scan, expiry_reads_open_sessions_only_and_still_expires_the_lapsed)
{
	struct harness_db *db = idb_migrated();

	/* a long past: an agent that stopped a day ago and its closed sessions */
	hdb_exec(db, "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		     "expires_at, stopped_at) VALUES ('past', 1, 'h', 1, 'v', "
		     "now() - interval '1 day', now() - interval '1 day')");
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (replica_id, incarnation, expires_at, closed_at, "
		 "close_reason) SELECT 'past', 1, now() - interval '1 day', now() - interval "
		 "'1 day', 'agent stopped' FROM generate_series(1, %d)",
		 CLOSED_SESSIONS);
	/* the present: open sessions renewed well ahead, one of them lapsed */
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (replica_id, incarnation, expires_at) "
		 "SELECT 'present', 1, now() + interval '1 hour' FROM generate_series(1, %d)",
		 OPEN_SESSIONS);
	long lapsed = hdb_query_long(db, "INSERT INTO pgcoord.sessions (replica_id, incarnation, "
					 "expires_at) VALUES ('present', 1, now() - interval "
					 "'1 second') RETURNING id");
	hdb_exec(db, "VACUUM ANALYZE pgcoord.sessions");

	for (int i = 0; i < SWEEPS; i++) {
		hdb_exec(db, "BEGIN");
		long before = rows_read(db);
		long expired = hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)");
		long read = rows_read(db) - before;
		hdb_exec(db, "COMMIT");
		cr_assert_eq(expired, i == 0 ? 1 : 0, "sweep %d expired %ld sessions", i + 1,
			     expired);
		cr_assert_leq(read, MAX_ROWS_READ,
			      "sweep %d read %ld session rows for %d open ones: it scans the "
			      "%d closed sessions of the past",
			      i + 1, read, OPEN_SESSIONS + 1, CLOSED_SESSIONS);
	}
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %ld "
				    "AND close_reason = 'expired'",
				    lapsed),
		     1, "the lapsed session was not expired");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id = 'present' AND closed_at IS NULL"),
		     OPEN_SESSIONS, "a live session was closed");

	/* and a real agent's janitor, over the same past, still expires one */
	struct hagent *a = hagent_start(db, "scan-janitor", NULL);
	iwait_janitor(a);
	lapsed =
	    hdb_query_long(db, "INSERT INTO pgcoord.sessions (replica_id, incarnation, "
			       "expires_at) VALUES ('present', 1, now() - interval '1 second') "
			       "RETURNING id");
	cr_assert(iwait_sql(db, 10000,
			    "SELECT count(*) FROM pgcoord.sessions WHERE id = %ld "
			    "AND close_reason = 'expired'",
			    lapsed),
		  "the agent's janitor did not expire a lapsed session within 10 s");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id = 'present' AND closed_at IS NULL"),
		     OPEN_SESSIONS);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Calls of a pgcoord function in this connection's transaction so far
 * (track_functions must be on). */
static long function_calls(struct harness_db *db, const char *name)
{
	return hdb_query_long(db,
			      "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
			      "WHERE schemaname = 'pgcoord' AND funcname = '%s'",
			      name);
}

Test(janitor_scan, permit_duty_checks_owners_in_one_join_and_still_finds_the_lost)
{
	struct harness_db *db = idb_migrated();

	hdb_exec(db, "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		     "expires_at) VALUES ('held', 1, 'h', 1, 'v', now() + interval '1 hour')");
	/* sessions 1..N live, each holding one permit */
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (id, replica_id, incarnation, expires_at) "
		 "SELECT i, 'held', 1, now() + interval '1 hour' FROM generate_series(1, %d) i",
		 HELD_PERMITS);
	hdb_exec(db,
		 "INSERT INTO pgcoord.permits (id, token, owner_replica, owner_session, state, "
		 "phase, on_owner_loss) SELECT 'live-' || i, nextval('pgcoord.token_seq'), 'held', "
		 "i, 'held', 'reserved', 'uncertain' FROM generate_series(1, %d) i",
		 HELD_PERMITS);
	/* one more, whose owner closed without the end-of-session hook running */
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (id, replica_id, incarnation, expires_at, "
		 "closed_at, close_reason) VALUES (%d, 'held', 1, now(), now(), 'test')",
		 HELD_PERMITS + 1);
	hdb_exec(db,
		 "INSERT INTO pgcoord.permits (id, token, owner_replica, owner_session, state, "
		 "phase, on_owner_loss) VALUES ('orphan', nextval('pgcoord.token_seq'), 'held', "
		 "%d, 'held', 'reserved', 'uncertain')",
		 HELD_PERMITS + 1);
	/* a share of a quota without a lapse policy, so it stays uncertain */
	hdb_exec(db,
		 "INSERT INTO pgcoord.quotas (key, \"limit\", in_flight) VALUES ('scan', 10, 1)");
	hdb_exec(db, "INSERT INTO pgcoord.permit_quotas (permit_id, key, weight) "
		     "VALUES ('orphan', 'scan', 1)");
	hdb_exec(db, "ANALYZE pgcoord.sessions, pgcoord.permits");
	hdb_exec(db, "SET track_functions = 'all'");

	hdb_exec(db, "BEGIN");
	long before = function_calls(db, "session_is_live");
	hdb_query_long(db, "SELECT pgcoord.janitor_lapse_permits(1000)");
	long calls = function_calls(db, "session_is_live") - before;
	hdb_exec(db, "COMMIT");

	cr_assert_leq(calls, 1,
		      "one sweep called session_is_live %ld times for %d held permits: a "
		      "function call per permit, every second",
		      calls, HELD_PERMITS + 1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits "
					"WHERE id = 'orphan' AND state = 'uncertain'"),
		     1, "the permit of a session that ended unnoticed got no owner-loss treatment");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits "
					"WHERE id LIKE 'live-%%' AND state = 'held'"),
		     HELD_PERMITS, "a permit of a live session was touched");
	hdb_drop(db);
}

#define LIVE_AGENTS 64
#define SESSIONS_PER_AGENT 100

/* LIVE_AGENTS agent rows 'live-1'.. alive for an hour, each with
 * per_agent sessions attached (expires_at NULL). */
static void add_live_agents(struct harness_db *db, int per_agent)
{
	hdb_exec(db,
		 "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		 "expires_at) SELECT 'live-' || i, 1, 'h', 1, 'v', now() + interval '1 hour' "
		 "FROM generate_series(1, %d) i",
		 LIVE_AGENTS);
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (replica_id, incarnation) SELECT 'live-' || "
		 "(i %% %d + 1), 1 FROM generate_series(1, %d) i",
		 LIVE_AGENTS, LIVE_AGENTS * per_agent);
}

/* The sessions attached to an agent's row (expires_at NULL) lapse with the
 * agent: a sweep finds them from the dead agents, and reads none while every
 * agent lives. The tables are left unanalyzed, as in a fleet just started:
 * the default estimates once made a join of agents and sessions walk every
 * attached session of the fleet (0020). */
Test(janitor_scan, expiry_reads_no_attached_session_while_every_agent_lives)
{
	struct harness_db *db = idb_migrated();

	add_live_agents(db, SESSIONS_PER_AGENT);
	/* a replica that stopped long ago, its sessions closed: its row stays */
	hdb_exec(db, "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		     "expires_at, stopped_at) VALUES ('stopped', 1, 'h', 1, 'v', "
		     "now() - interval '1 day', now() - interval '1 day')");
	hdb_exec(db, "INSERT INTO pgcoord.sessions (replica_id, incarnation, expires_at, "
		     "closed_at, close_reason) VALUES ('stopped', 1, now() - interval '1 day', "
		     "now() - interval '1 day', 'agent stopped')");

	for (int i = 0; i < SWEEPS; i++) {
		hdb_exec(db, "BEGIN");
		long before = rows_read(db);
		long expired = hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)");
		long read = rows_read(db) - before;
		hdb_exec(db, "COMMIT");
		cr_assert_eq(expired, 0, "sweep %d expired %ld sessions of live agents", i + 1,
			     expired);
		cr_assert_leq(read, SESSIONS_PER_AGENT / 10,
			      "sweep %d read %ld session rows while all %d agents live: it "
			      "walks their %d attached sessions",
			      i + 1, read, LIVE_AGENTS, LIVE_AGENTS * SESSIONS_PER_AGENT);
	}
	/* the stopped replica's row was not locked (a lock is a write) */
	cr_assert_eq(hdb_query_long(db, "SELECT xmax::text::bigint FROM pgcoord.agents "
					"WHERE replica_id = 'stopped'"),
		     0, "a sweep locked the row of a stopped replica without sessions");

	/* one agent dies: its sessions, and only they, are expired (what the
	 * closing reads is a death's cost, once, not a sweep's) */
	hdb_exec(db, "UPDATE pgcoord.agents SET expires_at = now() - interval '1 second' "
		     "WHERE replica_id = 'live-7'");
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)"),
		     SESSIONS_PER_AGENT, "not the dead agent's sessions");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id = 'live-7' AND closed_at IS NOT NULL "
					"AND close_reason = 'expired'"),
		     SESSIONS_PER_AGENT);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id <> 'live-7' AND replica_id <> 'stopped' "
					"AND closed_at IS NULL"),
		     (LIVE_AGENTS - 1) * SESSIONS_PER_AGENT, "a live agent's session was closed");

	/* a limit below the dead agents' sessions leaves the rest for the next sweep */
	hdb_exec(db, "UPDATE pgcoord.agents SET expires_at = now() - interval '1 second' "
		     "WHERE replica_id IN ('live-8', 'live-9')");
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(150)"), 150);
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(150)"), 50);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id IN ('live-8', 'live-9') "
					"AND closed_at IS NULL"),
		     0);
	hdb_drop(db);
}

#define GONE_REPLICAS 5000

/* Index scans of pgcoord.sessions this connection's transaction has run so
 * far: one per probe of an agent's sessions. */
static long session_probes(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables "
				  "WHERE relid = 'pgcoord.sessions'::regclass");
}

/* A replica's row stays after it stops or crashes, so a fleet whose replica
 * ids come and go gathers dead rows: past a few hundred of them a sweep must
 * probe the sessions of the agents that still have attached sessions, not
 * of every replica the fleet ever had (0021; 0020 probed each dead row's,
 * 67-90 ms a sweep at 20,000). A crashed replica among them is still found.
 * (With few dead rows each is probed, as above.) */
Test(janitor_scan, expiry_probes_no_session_of_replicas_long_gone)
{
	struct harness_db *db = idb_migrated();

	add_live_agents(db, 10);
	/* half stopped, half crashed (lapsed, never stopped); all sessions closed */
	hdb_exec(db,
		 "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		 "expires_at, stopped_at) SELECT 'gone-' || i, 1, 'h', 1, 'v', "
		 "now() - interval '1 day', CASE WHEN i %% 2 = 0 THEN now() - interval '1 day' END "
		 "FROM generate_series(1, %d) i",
		 GONE_REPLICAS);
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (replica_id, incarnation, expires_at, closed_at, "
		 "close_reason) SELECT 'gone-' || i, 1, now() - interval '1 day', "
		 "now() - interval '1 day', 'expired' FROM generate_series(1, %d) i",
		 GONE_REPLICAS);
	hdb_exec(db, "ANALYZE pgcoord.agents");
	hdb_exec(db, "ANALYZE pgcoord.sessions");

	for (int i = 0; i < SWEEPS; i++) {
		hdb_exec(db, "BEGIN");
		long before = session_probes(db);
		long expired = hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)");
		long probes = session_probes(db) - before;
		hdb_exec(db, "COMMIT");
		cr_assert_eq(expired, 0, "sweep %d expired %ld sessions", i + 1, expired);
		cr_assert_leq(probes, 2 * LIVE_AGENTS,
			      "sweep %d probed pgcoord.sessions %ld times: once per replica "
			      "long gone (%d), not per agent with attached sessions (%d)",
			      i + 1, probes, GONE_REPLICAS, LIVE_AGENTS);
	}

	/* a replica crashes now: its attached sessions, and only they, lapse */
	hdb_exec(db, "UPDATE pgcoord.agents SET expires_at = now() - interval '1 second' "
		     "WHERE replica_id = 'live-3'");
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)"), 10,
		     "not the crashed replica's 10 sessions");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id = 'live-3' AND close_reason = 'expired'"),
		     10);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions "
					"WHERE replica_id LIKE 'live-%%' AND closed_at IS NULL"),
		     (LIVE_AGENTS - 1) * 10, "a live agent's session was closed");
	/* a stopped replica's session left open (no stop path does that, but a
	 * row restored by hand might) is closed too: stopped is dead */
	hdb_exec(db, "INSERT INTO pgcoord.sessions (replica_id, incarnation) VALUES ('gone-2', 1)");
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)"), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT pgcoord.janitor_expire_sessions(1000)"), 0);
	hdb_drop(db);
}
