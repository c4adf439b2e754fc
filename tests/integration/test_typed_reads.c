/*
 * test_typed_reads.c — the typed reads (agent.status, permit.get,
 * permit.list, permit.history, quota.get, quota.list, lease.status,
 * lease.list, record.list, fleet.agents, fleet.sessions, permit.check)
 * and the options structs (records, lease
 * acquire, permit release and resolve) against a real agent: every field
 * as the database holds it.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

TestSuite(typed_reads, .timeout = 60);

#define CALL_MS 10000

Test(typed_reads, permit_and_quota_list_match_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-reads", NULL);
	pgcoord *c = NULL;
	pgcoord_claim *cl = NULL;
	struct pgcoord_permit_info *p = NULL;
	struct pgcoord_quota_list *ql = NULL;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "reader", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "a", 5, 60, CALL_MS), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "b", 2, -1, CALL_MS), PGCOORD_OK);
	const char *keys[] = {"a", "b"};
	const int32_t weights[] = {3, 1};
	struct pgcoord_claim_opts o = PGCOORD_CLAIM_OPTS_INIT;
	o.keys = keys;
	o.weights = weights;
	o.nquotas = 2;
	o.intent = "job 7";
	o.intent_len = 5;
	cr_assert_eq(pgcoord_permit_claim(c, "p1", &o, CALL_MS, &cl), PGCOORD_OK);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	cr_assert_eq(pgcoord_permit_update(c, "p1", PGCOORD_PHASE_RUNNING, CALL_MS), PGCOORD_OK);

	cr_assert_eq(pgcoord_permit_info_get(c, "p1", CALL_MS, &p), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_str_eq(p->id, "p1");
	cr_assert_eq(p->token,
		     hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'p1'"));
	cr_assert_str_eq(p->state, "held");
	cr_assert_str_eq(p->phase, "running");
	cr_assert_eq(p->owner_session, pgcoord_session_id(c));
	cr_assert_str_eq(p->owner_replica, "typed-reads");
	cr_assert(p->owner_live);
	cr_assert_str_eq(p->on_owner_loss, "uncertain");
	cr_assert_null(p->uncertain_reason);
	cr_assert_eq(p->nquotas, 2);
	for (size_t i = 0; i < 2; i++) {
		bool is_a = strcmp(p->quota_keys[i], "a") == 0;
		cr_assert(is_a || strcmp(p->quota_keys[i], "b") == 0, "%s", p->quota_keys[i]);
		cr_assert_eq(p->quota_weights[i], is_a ? 3 : 1);
	}
	cr_assert_eq(p->intent_len, 5);
	cr_assert_eq(memcmp(p->intent, "job 7", 5), 0);
	cr_assert_not(p->redacted);
	cr_assert_gt(p->created_at, 0);
	cr_assert_eq(p->released_at, -1);
	cr_assert_geq(p->now_at, p->created_at);
	pgcoord_permit_info_free(p);

	cr_assert_eq(pgcoord_permit_info_get(c, "nope", CALL_MS, &p), PGCOORD_E_NOT_FOUND);
	cr_assert_null(p);

	cr_assert_eq(pgcoord_quota_list_get(c, CALL_MS, &ql), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(ql->count, 2);
	cr_assert_str_eq(ql->rows[0].key, "a");
	cr_assert_str_eq(ql->rows[1].key, "b");
	for (size_t i = 0; i < 2; i++) {
		const struct pgcoord_quota_info *q = &ql->rows[i];
		cr_assert_eq(q->in_flight,
			     hdb_query_long(db,
					    "SELECT in_flight FROM pgcoord.quotas WHERE key = '%s'",
					    q->key));
		cr_assert_eq(q->limit, i == 0 ? 5 : 2);
		cr_assert_eq(q->held, q->in_flight);
		cr_assert_eq(q->uncertain, 0);
		cr_assert_eq(q->available, q->limit - q->in_flight);
		cr_assert_eq(q->permits, 1);
		cr_assert_eq(q->lapse_after_s, i == 0 ? 60 : -1);
	}
	cr_assert_eq(ql->rows[0].in_flight, 3);
	cr_assert_gt(ql->now_at, 0);
	pgcoord_quota_list_free(ql);
	pgcoord_permit_info_free(NULL);
	pgcoord_quota_list_free(NULL);

	struct pgcoord_quota_info *q = NULL;
	cr_assert_eq(pgcoord_quota_info_get(c, "a", CALL_MS, &q), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_str_eq(q->key, "a");
	cr_assert_eq(q->limit, 5);
	cr_assert_eq(q->in_flight,
		     hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'a'"));
	cr_assert_eq(q->in_flight, 3);
	cr_assert_eq(q->available, 2);
	cr_assert_eq(q->permits, 1);
	cr_assert_eq(q->lapse_after_s, 60);
	cr_assert_gt(q->created_at, 0);
	pgcoord_quota_info_free(q);
	cr_assert_eq(pgcoord_quota_info_get(c, "nope", CALL_MS, &q), PGCOORD_E_NOT_FOUND);
	cr_assert_null(q);
	pgcoord_quota_info_free(NULL);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Claims id on quota key for c's session, admitted. */
static void claim_one(pgcoord *c, const char *id, const char *key)
{
	const char *keys[] = {key};
	struct pgcoord_claim_opts o = PGCOORD_CLAIM_OPTS_INIT;
	pgcoord_claim *cl = NULL;
	o.keys = keys;
	o.nquotas = 1;
	cr_assert_eq(pgcoord_permit_claim(c, id, &o, CALL_MS, &cl), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
}

Test(typed_reads, permit_list_and_history_match_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-lists", NULL);
	pgcoord *c = NULL;
	struct pgcoord_permit_list *pl = NULL;
	struct pgcoord_permit_history *h = NULL;
	bool released = false;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "lister", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "a", 5, -1, CALL_MS), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "b", 5, -1, CALL_MS), PGCOORD_OK);
	claim_one(c, "p1", "a");
	claim_one(c, "p2", "b");
	cr_assert_eq(pgcoord_permit_mark_uncertain(c, "p2", "lost its worker", CALL_MS),
		     PGCOORD_OK);

	/* by id */
	cr_assert_eq(pgcoord_permit_list_get(c, NULL, NULL, CALL_MS, &pl), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(pl->count, 2);
	cr_assert_not(pl->truncated);
	cr_assert_gt(pl->now_at, 0);
	cr_assert_str_eq(pl->permits[1]->id, "p2");
	cr_assert_str_eq(pl->permits[1]->state, "uncertain");
	cr_assert_str_eq(pl->permits[1]->uncertain_reason, "lost its worker");
	cr_assert_str_eq(pl->permits[0]->id, "p1");
	cr_assert_str_eq(pl->permits[0]->state, "held");
	cr_assert_eq(pl->permits[0]->token,
		     hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'p1'"));
	cr_assert_eq(pl->permits[0]->nquotas, 1);
	cr_assert_str_eq(pl->permits[0]->quota_keys[0], "a");
	cr_assert_eq(pl->permits[0]->owner_session, pgcoord_session_id(c));
	pgcoord_permit_list_free(pl);

	cr_assert_eq(pgcoord_permit_list_get(c, "a", NULL, CALL_MS, &pl), PGCOORD_OK);
	cr_assert_eq(pl->count, 1);
	cr_assert_str_eq(pl->permits[0]->id, "p1");
	pgcoord_permit_list_free(pl);
	cr_assert_eq(pgcoord_permit_list_get(c, NULL, "released", CALL_MS, &pl), PGCOORD_OK);
	cr_assert_eq(pl->count, 0);
	pgcoord_permit_list_free(pl);

	cr_assert_eq(pgcoord_permit_update(c, "p1", PGCOORD_PHASE_RUNNING, CALL_MS), PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_release(c, "p1", 0, "done", CALL_MS, &released), PGCOORD_OK);
	cr_assert(released);
	cr_assert_eq(pgcoord_permit_history_get(c, "p1", CALL_MS, &h), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_str_eq(h->id, "p1");
	cr_assert_eq((long)h->count,
		     hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id = 'p1'"));
	cr_assert_geq(h->count, 3, "admitted, phase, released");
	cr_assert_str_eq(h->events[0].event, "admitted");
	cr_assert_str_eq(h->events[0].quota, "a");
	cr_assert_eq(h->events[0].delta, 1);
	cr_assert_not_null(h->events[0].actor);
	const struct pgcoord_permit_history_event *last = &h->events[h->count - 1];
	cr_assert_str_eq(last->event, "released");
	cr_assert_eq(last->delta, -1);
	cr_assert_str_eq(last->reason, "done");
	cr_assert_str_eq(last->state, "released");
	for (size_t i = 1; i < h->count; i++)
		cr_assert_gt(h->events[i].seq, h->events[i - 1].seq, "oldest first");
	cr_assert_geq(last->at, h->events[0].at);
	pgcoord_permit_history_free(h);
	cr_assert_eq(pgcoord_permit_history_get(c, "nope", CALL_MS, &h), PGCOORD_E_NOT_FOUND);
	cr_assert_null(h);
	pgcoord_permit_list_free(NULL);
	pgcoord_permit_history_free(NULL);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(typed_reads, lease_status_and_list_match_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-leases", NULL);
	pgcoord *c = NULL, *op = NULL;
	struct pgcoord_lease_info *l = NULL;
	struct pgcoord_lease_list *ll = NULL;
	bool leader = false;
	int64_t epoch = 0;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &op), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "leader", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_acquire(c, "job", 6000, false, CALL_MS, &leader, &epoch),
		     PGCOORD_OK);
	cr_assert(leader);

	cr_assert_eq(pgcoord_lease_info_get(c, "job", CALL_MS, &l), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_str_eq(l->name, "job");
	cr_assert_eq(l->epoch, epoch);
	cr_assert_eq(l->epoch,
		     hdb_query_long(db, "SELECT epoch FROM pgcoord.leases WHERE name = 'job'"));
	cr_assert_eq(l->holder_session, pgcoord_session_id(c));
	cr_assert_str_eq(l->holder_replica, "typed-leases");
	cr_assert_eq(l->ttl_ms, 6000);
	cr_assert_gt(l->expires_in_ms, 0);
	cr_assert_gt(l->acquired_at, 0);
	cr_assert(l->leader);
	cr_assert_gt(l->valid_ms, 0);
	pgcoord_lease_info_free(l);

	/* an operator without a session sees the holder, not a belief of its own */
	cr_assert_eq(pgcoord_lease_release(c, "job", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_lease_info_get(op, "job", CALL_MS, &l), PGCOORD_OK);
	cr_assert_eq(l->holder_session, 0, "released: nobody holds it");
	cr_assert_null(l->holder_replica);
	cr_assert_not(l->leader);
	cr_assert_eq(l->valid_ms, 0);
	pgcoord_lease_info_free(l);

	cr_assert_eq(pgcoord_lease_list_get(op, CALL_MS, &ll), PGCOORD_OK, "%s",
		     pgcoord_last_message(op));
	cr_assert_eq((long)ll->count, hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases"));
	bool seen = false;
	for (size_t i = 0; i < ll->count; i++) {
		if (i > 0)
			cr_assert_lt(strcmp(ll->leases[i - 1].name, ll->leases[i].name), 0);
		if (strcmp(ll->leases[i].name, "job") == 0)
			seen = ll->leases[i].epoch == epoch;
	}
	cr_assert(seen, "job with its epoch is listed");
	pgcoord_lease_list_free(ll);

	cr_assert_eq(pgcoord_lease_info_get(op, "never", CALL_MS, &l), PGCOORD_E_NOT_FOUND);
	cr_assert_null(l);
	pgcoord_lease_info_free(NULL);
	pgcoord_lease_list_free(NULL);

	pgcoord_close(op);
	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(typed_reads, record_options_and_list_match_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-records", NULL);
	pgcoord *c = NULL;
	struct pgcoord_record_list *rl = NULL;
	struct pgcoord_record_opts o;
	bool created = false;
	int64_t token = 0;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "writer", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "q", 2, -1, CALL_MS), PGCOORD_OK);
	claim_one(c, "work-1", "q");

	pgcoord_record_opts_init(&o);
	o.state = "queued";
	o.data = "abc";
	o.data_len = 3;
	o.permit = "work-1";
	cr_assert_eq(pgcoord_record_put_with(c, "job", "k1", &o, CALL_MS, &created, &token),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	cr_assert(created);
	cr_assert_eq(token, hdb_query_long(db, "SELECT token FROM pgcoord.records WHERE kind = "
					       "'job' AND key = 'k1'"));
	struct pgcoord_record_opts o2 = PGCOORD_RECORD_OPTS_INIT;
	o2.state = "queued";
	cr_assert_eq(pgcoord_record_put_with(c, "job", "k2", &o2, CALL_MS, NULL, NULL), PGCOORD_OK);

	/* update: the token must match; a wrong one is fenced off */
	struct pgcoord_record_opts u = PGCOORD_RECORD_OPTS_INIT;
	u.state = "running";
	u.token = token + 1000;
	cr_assert_neq(pgcoord_record_update_with(c, "job", "k1", &u, CALL_MS), PGCOORD_OK);
	u.token = token;
	cr_assert_eq(pgcoord_record_update_with(c, "job", "k1", &u, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	char *state = hdb_query_value(db, "SELECT state FROM pgcoord.records WHERE key = 'k1'");
	cr_assert_str_eq(state, "running");
	free(state);

	/* what the options refuse before anything is sent */
	o2.token = 5;
	cr_assert_eq(pgcoord_record_put_with(c, "job", "k3", &o2, CALL_MS, NULL, NULL),
		     PGCOORD_E_ARG);
	u.permit = "work-1";
	cr_assert_eq(pgcoord_record_update_with(c, "job", "k1", &u, CALL_MS), PGCOORD_E_ARG);
	u.permit = NULL;
	u.size = 0;
	cr_assert_eq(pgcoord_record_update_with(c, "job", "k1", &u, CALL_MS), PGCOORD_E_ARG);
	cr_assert_eq(pgcoord_record_put_with(c, "job", "k3", NULL, CALL_MS, NULL, NULL),
		     PGCOORD_E_ARG);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.records"), 2);

	cr_assert_eq(pgcoord_record_list_get(c, "job", 0, PGCOORD_RECORDS_OPEN, CALL_MS, &rl),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	cr_assert_eq(rl->count, 2);
	cr_assert_not(rl->truncated);
	cr_assert_gt(rl->now_at, 0);
	cr_assert_str_eq(pgcoord_record_get_key(rl->records[0]), "k1");
	cr_assert_str_eq(pgcoord_record_get_state(rl->records[0]), "running");
	cr_assert_str_eq(pgcoord_record_get_permit(rl->records[0]), "work-1");
	size_t len = 0;
	const void *data = pgcoord_record_get_data(rl->records[0], &len);
	cr_assert_eq(len, 3);
	cr_assert_eq(memcmp(data, "abc", 3), 0);
	cr_assert_eq(pgcoord_record_get_token(rl->records[0]), token);
	cr_assert_eq(pgcoord_record_get_owner_session(rl->records[0]), pgcoord_session_id(c));
	cr_assert(pgcoord_record_get_owner_live(rl->records[0]));
	cr_assert_str_eq(pgcoord_record_get_key(rl->records[1]), "k2");
	cr_assert_null(pgcoord_record_get_permit(rl->records[1]));
	cr_assert_null(pgcoord_record_get_data(rl->records[1], &len));
	pgcoord_record_list_free(rl);

	cr_assert_eq(pgcoord_record_list_get(c, "job", 0, PGCOORD_RECORDS_DEAD_OWNER, CALL_MS, &rl),
		     PGCOORD_OK);
	cr_assert_eq(rl->count, 0);
	pgcoord_record_list_free(rl);

	/* a dry-run recovery by options, from a handle without a session: the
	 * live owner's records stay alone */
	const char *kinds[] = {"job"};
	struct pgcoord_recover_opts ro = PGCOORD_RECOVER_OPTS_INIT;
	pgcoord_recovery *rv = NULL;
	pgcoord *op = NULL;
	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &op), PGCOORD_OK);
	ro.kinds = kinds;
	ro.nkinds = 1;
	ro.flags = PGCOORD_RECOVER_DRY_RUN;
	cr_assert_eq(pgcoord_record_recover_with(op, &ro, CALL_MS, &rv), PGCOORD_OK, "%s",
		     pgcoord_last_message(op));
	cr_assert(pgcoord_recovery_liveness_read(rv));
	cr_assert_eq(pgcoord_recovery_count(rv), 0);
	cr_assert_eq(pgcoord_recovery_left_alone(rv), 2, "left alone: %lld",
		     (long long)pgcoord_recovery_left_alone(rv));
	pgcoord_recovery_free(rv);
	ro.size = 0;
	cr_assert_eq(pgcoord_record_recover_with(op, &ro, CALL_MS, &rv), PGCOORD_E_ARG);
	cr_assert_null(rv);
	pgcoord_close(op);
	pgcoord_record_list_free(NULL);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(typed_reads, agent_status_matches_the_agents_row)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-status", NULL);
	pgcoord *c = NULL;
	struct pgcoord_agent_status *s = NULL;

	iwait_janitor(a);
	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "watcher", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_agent_status_get(c, CALL_MS, &s), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_str_eq(s->replica_id, "typed-status");
	cr_assert_eq(s->incarnation, hdb_query_long(db, "SELECT incarnation FROM pgcoord.agents "
							"WHERE replica_id = 'typed-status'"));
	cr_assert_eq(s->pid, hdb_query_long(db, "SELECT pid FROM pgcoord.agents WHERE "
						"replica_id = 'typed-status'"));
	char *host = hdb_query_value(db, "SELECT host FROM pgcoord.agents");
	cr_assert_str_eq(s->host, host);
	free(host);
	cr_assert_str_eq(s->state, "serving");
	cr_assert(s->db_up);
	cr_assert(s->registered);
	cr_assert(s->janitor);
	cr_assert_eq(s->schema_version,
		     hdb_query_long(db, "SELECT max(version) FROM pgcoord.schema_migrations"));
	cr_assert_eq(s->schema_required, s->schema_version);
	cr_assert_geq(s->sessions, 1);
	cr_assert_geq(s->connections, 1);
	cr_assert_gt(s->uptime_ms, 0);
	cr_assert_geq(s->last_heartbeat_ms_ago, 0);
	cr_assert_not_null(s->version);
	cr_assert_not_null(s->failover);
	pgcoord_agent_status_free(s);
	pgcoord_agent_status_free(NULL);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A column of one row as text, compared and freed. */
static void assert_sql_str(struct harness_db *db, const char *sql, const char *want)
{
	char *got = hdb_query_value(db, "%s", sql);
	cr_assert_str_eq(got, want, "%s", sql);
	free(got);
}

Test(typed_reads, lease_release_and_resolve_options_reach_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-opts", NULL);
	pgcoord *c = NULL;
	bool leader = false, released = false;
	int64_t epoch = 0;

	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "opts", CALL_MS, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_quota_set(c, "q", 3, -1, CALL_MS), PGCOORD_OK);
	claim_one(c, "r1", "q");
	claim_one(c, "r2", "q");

	/* lease.acquire: ttl and the answer as the lease row says */
	struct pgcoord_lease_opts lo = PGCOORD_LEASE_OPTS_INIT;
	lo.ttl_ms = 5000;
	cr_assert_eq(pgcoord_lease_acquire_with(c, "opts-lease", &lo, CALL_MS, &leader, &epoch),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	cr_assert(leader);
	cr_assert(pgcoord_lease_is_leader(c, "opts-lease"));
	cr_assert_eq(epoch, hdb_query_long(db, "SELECT epoch FROM pgcoord.leases WHERE name = "
					       "'opts-lease'"));
	cr_assert_eq(hdb_query_long(db, "SELECT ttl_ms FROM pgcoord.leases WHERE name = "
					"'opts-lease'"),
		     5000);
	cr_assert_eq(hdb_query_long(db, "SELECT holder_session FROM pgcoord.leases WHERE name "
					"= 'opts-lease'"),
		     pgcoord_session_id(c));

	/* release with a reason: the permit and its audit row */
	struct pgcoord_release_opts ro;
	pgcoord_release_opts_init(&ro);
	ro.reason = "finished";
	cr_assert_eq(pgcoord_permit_release_with(c, "r1", &ro, CALL_MS, &released), PGCOORD_OK,
		     "%s", pgcoord_last_message(c));
	cr_assert(released);
	assert_sql_str(db, "SELECT state FROM pgcoord.permits WHERE id = 'r1'", "released");
	assert_sql_str(db,
		       "SELECT reason FROM pgcoord.permit_events WHERE permit_id = 'r1' AND "
		       "event = 'released'",
		       "finished");

	/* resolve GONE with evidence: released by it, the evidence audited */
	cr_assert_eq(pgcoord_permit_mark_uncertain(c, "r2", "lost sight", CALL_MS), PGCOORD_OK);
	struct pgcoord_resolve_opts so = PGCOORD_RESOLVE_OPTS_INIT;
	so.evidence = "no such process";
	cr_assert_eq(pgcoord_permit_resolve_with(c, "r2", PGCOORD_OUTCOME_GONE, &so, CALL_MS),
		     PGCOORD_OK, "%s", pgcoord_last_message(c));
	assert_sql_str(db, "SELECT state FROM pgcoord.permits WHERE id = 'r2'", "released");
	assert_sql_str(db,
		       "SELECT reason FROM pgcoord.permit_events WHERE permit_id = 'r2' AND "
		       "event = 'resolved_gone'",
		       "gone: no such process");

	/* sizes this library does not know, NULL opts, no evidence: refused
	 * before anything is sent */
	claim_one(c, "r3", "q");
	long events = hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events");
	ro.size = 1;
	cr_assert_eq(pgcoord_permit_release_with(c, "r3", &ro, CALL_MS, &released), PGCOORD_E_ARG);
	cr_assert_not(released);
	ro.size = sizeof(ro) + 8;
	cr_assert_eq(pgcoord_permit_release_with(c, "r3", &ro, CALL_MS, &released), PGCOORD_E_ARG);
	cr_assert_not_null(strstr(pgcoord_last_message(c), "PGCOORD_RELEASE_OPTS_INIT"));
	cr_assert_eq(pgcoord_permit_release_with(c, "r3", NULL, CALL_MS, &released), PGCOORD_E_ARG);
	so.size = 0;
	cr_assert_eq(pgcoord_permit_resolve_with(c, "r3", PGCOORD_OUTCOME_GONE, &so, CALL_MS),
		     PGCOORD_E_ARG);
	so.size = sizeof(so);
	so.evidence = NULL;
	cr_assert_eq(pgcoord_permit_resolve_with(c, "r3", PGCOORD_OUTCOME_GONE, &so, CALL_MS),
		     PGCOORD_E_ARG);
	lo.size = sizeof(lo) - 1;
	cr_assert_eq(pgcoord_lease_acquire_with(c, "other", &lo, CALL_MS, &leader, &epoch),
		     PGCOORD_E_ARG);
	cr_assert_not(leader);
	cr_assert_eq(epoch, 0);
	assert_sql_str(db, "SELECT state FROM pgcoord.permits WHERE id = 'r3'", "held");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events"), events);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases WHERE name = "
					"'other'"),
		     0);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(typed_reads, fleet_and_check_match_the_database)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "typed-fleet", NULL);
	pgcoord *c = NULL;
	struct pgcoord_agent_list *al = NULL;
	struct pgcoord_session_list *sl = NULL;
	struct pgcoord_check_report *r = NULL;

	iwait_janitor(a); /* the agent's own session is open by then */
	cr_assert_eq(pgcoord_connect(hagent_socket(a), CALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "fleet-reader", CALL_MS, NULL), PGCOORD_OK);

	cr_assert_eq(pgcoord_fleet_agents_get(c, CALL_MS, &al), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(al->count, 1);
	const struct pgcoord_agent_info *ag = &al->agents[0];
	cr_assert_str_eq(ag->replica_id, "typed-fleet");
	cr_assert_eq(ag->incarnation, hdb_query_long(db, "SELECT incarnation FROM pgcoord.agents"));
	cr_assert_eq(ag->pid, hdb_query_long(db, "SELECT pid FROM pgcoord.agents"));
	assert_sql_str(db, "SELECT host FROM pgcoord.agents", ag->host);
	cr_assert_not_null(ag->version);
	cr_assert(ag->live);
	cr_assert_eq(ag->stopped_at, -1);
	cr_assert_gt(ag->started_at, 0);
	cr_assert_geq(ag->heartbeat_at, ag->started_at);
	cr_assert_gt(ag->expires_at, ag->heartbeat_at);
	cr_assert_geq(al->now_at, ag->started_at);
	pgcoord_agent_list_free(al);

	cr_assert_eq(pgcoord_fleet_sessions_get(c, CALL_MS, &sl), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq((long)sl->count,
		     hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE closed_at "
					"IS NULL"));
	bool mine = false, agents_own = false;
	for (size_t i = 0; i < sl->count; i++) {
		const struct pgcoord_session_info *s = &sl->sessions[i];
		cr_assert_str_eq(s->replica_id, "typed-fleet");
		cr_assert_gt(s->expires_at, s->opened_at);
		if (s->session == pgcoord_session_id(c)) {
			mine = true;
			cr_assert_str_eq(s->name, "fleet-reader");
			cr_assert_eq(s->owner_uid, (int64_t)getuid());
			cr_assert_eq(s->incarnation,
				     hdb_query_long(db,
						    "SELECT incarnation FROM "
						    "pgcoord.sessions WHERE id = %lld",
						    (long long)s->session));
		} else {
			agents_own = strcmp(s->name, "pgcoord-agent") == 0;
		}
	}
	cr_assert(mine && agents_own);
	pgcoord_session_list_free(sl);

	/* permit.check: clean, then a counter edited by SQL is reported */
	cr_assert_eq(pgcoord_quota_set(c, "q", 2, -1, CALL_MS), PGCOORD_OK);
	claim_one(c, "c1", "q");
	cr_assert_eq(pgcoord_permit_check_get(c, CALL_MS, &r), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert(r->ok);
	cr_assert_eq(r->quotas, hdb_query_long(db, "SELECT count(*) FROM pgcoord.quotas"));
	cr_assert_eq(r->nviolations, 0);
	cr_assert_eq(r->nstalled, 0);
	cr_assert_gt(r->now_at, 0);
	pgcoord_check_report_free(r);

	hdb_exec(db, "UPDATE pgcoord.quotas SET in_flight = in_flight + 1 WHERE key = 'q'");
	cr_assert_eq(pgcoord_permit_check_get(c, CALL_MS, &r), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_not(r->ok);
	cr_assert_geq(r->nviolations, 1);
	const struct pgcoord_check_violation *v = &r->violations[0];
	cr_assert_str_eq(v->key, "q");
	cr_assert_eq(v->limit, 2);
	cr_assert_eq(v->in_flight, 2);
	cr_assert_eq(v->permit_weights, 1);
	cr_assert_eq(v->audit_sum, 1);
	cr_assert_not_null(strstr(v->problem, "in_flight differs"), "%s", v->problem);
	pgcoord_check_report_free(r);
	pgcoord_check_report_free(NULL);

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}
