/*
 * test_leases_outage.c — self-fencing (DESIGN.md guarantee 10) seen from a
 * lease holder: the database goes away for longer than the session ttl.
 * Stopping the server affects every test of the executable, so this one
 * runs with one Criterion job (tests/integration/meson.build).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "lease_client.h"

TestSuite(leases_outage, .timeout = 150);

#define SESSION_TTL 3000
#define HEARTBEAT 500
#define LEASE_TTL 1500

/*
 * The client hears session.suspended and then session.lost before its
 * session row could expire by the database clock; after the outage it
 * opens a new session and leads again under a larger epoch.
 */
Test(leases_outage, lost_arrives_before_the_session_can_expire_and_a_new_epoch_follows)
{
	const char *const args[] = {"--session-ttl-ms",
				    "3000",
				    "--heartbeat-interval-ms",
				    "500",
				    "--lease-retry-ms",
				    "200",
				    "--lease-ttl-ms",
				    "2000", /* the janitor's lease: it expires the old session */
				    "--query-timeout-ms",
				    "1000",
				    NULL};
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	struct hagent *a = hagent_start(db, "outage-a", args);
	struct lclient c;
	struct lreply r;
	struct lnote n;

	memset(&c, 0, sizeof(c));
	snprintf(c.label, sizeof(c.label), "holder");
	lc_open_ok(&c, a, "holder");
	lc_acquire_ok(&c, "fenced", LEASE_TTL, true, &r);
	cr_assert(r.leader);
	int64_t epoch = r.epoch, session = c.session;
	lc_expect(&c, "lease.renewed", 1, 2000, "renewal before the outage");

	/* the agent's own account of its last heartbeat, just before the stop */
	int64_t hb_ago = lc_agent_status_int(a, "last_heartbeat_ms_ago");
	int64_t sampled = hnow_ms();
	cr_assert(hb_ago >= 0 && hb_ago <= 2 * HEARTBEAT, "last heartbeat %lld ms ago",
		  (long long)hb_ago);
	int64_t stopped = hnow_ms();
	hpg_stop("immediate");
	int64_t down = hnow_ms();

	size_t mark = c.cursor;
	struct lnote suspended =
	    lc_expect(&c, "session.suspended", -1, SESSION_TTL + 1000, "heartbeats fail");
	struct lnote lost = lc_expect(&c, "session.lost", -1, SESSION_TTL, "the session is lost");
	cr_assert_eq(suspended.session, session);
	cr_assert_eq(lost.session, session);
	cr_assert_lt(suspended.at_ms, lost.at_ms);
	cr_assert_gt(suspended.safe_ms, 0);
	cr_assert_leq(suspended.at_ms + suspended.safe_ms, lost.at_ms + 100,
		      "lost came before the safe_ms suspended announced");
	/* the lease's belief ended on its own, shorter, deadline */
	c.cursor = mark;
	cr_assert(lc_wait(&c, "lease.changed", 0, 0, &n), "no lease.changed leader=false");
	cr_assert_eq(n.epoch, epoch);
	cr_assert_leq(n.at_ms, lost.at_ms);
	fprintf(stderr,
		"outage: stop took %lld ms; suspended %+lld ms, lost %+lld ms after the stop "
		"began (last heartbeat %lld ms before it, session ttl %d)\n",
		(long long)(down - stopped), (long long)(suspended.at_ms - stopped),
		(long long)(lost.at_ms - stopped), (long long)(hb_ago + stopped - sampled),
		SESSION_TTL);
	cr_assert_lt(lost.at_ms - stopped, SESSION_TTL, "lost came %lld ms after the stop",
		     (long long)(lost.at_ms - stopped));

	/* down for longer than the session ttl */
	int64_t back = stopped + SESSION_TTL + 1000;
	if (hnow_ms() < back)
		hsleep_ms((int)(back - hnow_ms()));
	hpg_start();

	/* the row itself: the lost notice came while it was still live */
	long expires_at =
	    hdb_query_long(db,
			   "SELECT pgcoord.ms(expires_at) FROM pgcoord.session_liveness WHERE "
			   "id = %lld",
			   (long long)session);
	fprintf(stderr, "outage: session.lost came %lld ms before the session row expired\n",
		(long long)(expires_at - lost.wall_ms));
	cr_assert_lt(lost.wall_ms, expires_at,
		     "session.lost arrived %lld ms after the row had expired",
		     (long long)(lost.wall_ms - expires_at));

	/* a new session once the agent reaches the database again */
	pgcoord_err err = PGCOORD_E_UNAVAILABLE;
	int64_t until = hnow_ms() + 15000;
	while (err != PGCOORD_OK && hnow_ms() < until) {
		err = lc_session_open(&c, "holder-again");
		if (err != PGCOORD_OK)
			hsleep_ms(100);
	}
	cr_assert_eq(err, PGCOORD_OK, "no new session after the outage: %s; log:\n%s",
		     pgcoord_strerror(err), hagent_log(a));
	cr_assert_neq(c.session, session);
	lc_acquire_ok(&c, "fenced", LEASE_TTL, true, &r);
	if (!r.leader)
		n = lc_expect(&c, "lease.changed", 1, LEASE_TTL + 2000, "leads again");
	else
		n.epoch = r.epoch;
	cr_assert_gt(n.epoch, epoch, "the new session leads under the old epoch");
	cr_assert_eq(hdb_query_long(db, "SELECT holder_session FROM pgcoord.leases WHERE name = "
					"'fenced'"),
		     c.session);
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.lease_events WHERE name = 'fenced' "
			   "AND event = 'acquired' AND session = %lld AND epoch = %lld",
			   (long long)c.session, (long long)n.epoch),
	    1);

	/* and the janitor, elected again, records the old session as expired */
	char *reason = NULL;
	until = hnow_ms() + 10000;
	while (!reason && hnow_ms() < until) {
		reason =
		    hdb_query_value(db,
				    "SELECT close_reason FROM pgcoord.sessions WHERE id = %lld "
				    "AND closed_at IS NOT NULL",
				    (long long)session);
		if (!reason)
			hsleep_ms(100);
	}
	cr_assert_str_eq(reason ? reason : "(still open)", "expired");
	free(reason);

	lc_close(&c);
	cr_assert_eq(hagent_stop(a), 0, "log:\n%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}
