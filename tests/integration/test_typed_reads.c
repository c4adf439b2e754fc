/*
 * test_typed_reads.c — pgcoord_permit_info_get and pgcoord_quota_list_get
 * against a real agent: every field as the database holds it.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

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

	pgcoord_close(c);
	hagent_destroy(a);
	hdb_drop(db);
}
