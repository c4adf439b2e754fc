/*
 * test_why.c — quota.why: who holds a quota's room, as an operator (root,
 * an admin) and as two tenants (unprivileged uids) see it, checked against
 * the ledger's rows; a tenant sees the numbers of everyone and the details
 * of its own permits only.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(why, .timeout = 120);

#define UID_A 65534u
#define UID_B 65533u

static void claim(int fd, const char *id, const char *key, int64_t weight, int64_t wait_ms,
		  const char *want_status)
{
	struct ireply r;

	iclaim_call(fd, id, key, weight, wait_ms, &r);
	const msgpack_object *res = iok(&r, "permit.claim");
	cr_assert(istr_is(res, "status", want_status), "claim %s: not %s", id, want_status);
	ireply_destroy(&r);
}

static const msgpack_object *why(int fd, const char *key, int64_t holders, struct ireply *r)
{
	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, holders ? 2 : 1);

	pgc_pack_kv_str(pk, "key", key);
	if (holders)
		pgc_pack_kv_int(pk, "holders", holders);
	const msgpack_object *res = icall_ok(fd, "quota.why", &p, r);
	iparams_destroy(&p);
	return res;
}

/* The ids of list (an array of holders), comma-separated, malloc'd. */
static char *ids_of(const msgpack_object *res, const char *list)
{
	const msgpack_object *a = pgc_map_get(res, list);
	char *out = calloc(1, 1024);

	cr_assert(a && a->type == MSGPACK_OBJECT_ARRAY, "no list %s", list);
	for (uint32_t i = 0; i < a->via.array.size; i++) {
		char *id = istr(&a->via.array.ptr[i], "id");
		if (i)
			strcat(out, ",");
		strncat(out, id, 1000 - strlen(out));
		free(id);
	}
	return out;
}

static void assert_ids(const msgpack_object *res, const char *list, const char *want)
{
	char *got = ids_of(res, list);
	cr_assert_str_eq(got, want, "%s: %s, expected %s", list, got, want);
	free(got);
}

static const msgpack_object *holder(const msgpack_object *res, const char *list, uint32_t i)
{
	const msgpack_object *a = pgc_map_get(res, list);
	cr_assert(a && a->type == MSGPACK_OBJECT_ARRAY && a->via.array.size > i);
	return &a->via.array.ptr[i];
}

Test(why, names_the_holders_to_an_admin_and_only_a_tenants_own_to_the_tenant)
{
	const char *const args[] = {"--socket-mode", "0666", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "why-1", args);
	struct iparams p;
	struct ireply r;

	int fa = iconnect_as(hagent_socket(ag), UID_A);
	int fb = iconnect_as(hagent_socket(ag), UID_B);
	int fr = iconnect_as(hagent_socket(ag), 0);
	int64_t sa = isession_open(fa, "tenant-a");
	isession_open(fb, "tenant-b");
	isession_open(fr, "operator");
	iquota_set(fr, "q", 10);

	claim(fa, "a-big", "q", 5, 0, "admitted");
	claim(fb, "b-mid", "q", 3, 0, "admitted");
	claim(fa, "a-small", "q", 1, 0, "admitted");
	iparams_begin(&p, 2);
	pgc_pack_kv_str(&p.pk, "id", "a-small");
	pgc_pack_kv_str(&p.pk, "reason", "lost sight of the worker");
	icall_ok(fa, "permit.mark_uncertain", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	/* 9 of 10 in flight: B's claim of 5 waits, A's of 1 is then denied
	 * (a quota with waiters has no room for an immediate claim) */
	claim(fb, "b-waits", "q", 5, 30000, "queued");
	claim(fa, "a-denied", "q", 1, 0, "denied");
	char *before = idb_fingerprint(db);

	/* the operator sees everyone */
	const msgpack_object *res = why(fr, "q", 0, &r);
	const msgpack_object *q = pgc_map_get(res, "quota");
	cr_assert_eq(iint(q, "limit"), 10);
	cr_assert_eq(iint(q, "in_flight"), 9);
	cr_assert_eq(iint(q, "in_flight"),
		     hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"));
	cr_assert_eq(iint(q, "available"), 1);
	cr_assert_eq(iint(q, "waiting"), 1);
	cr_assert_eq(iint(q, "holders"),
		     hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_quotas pq "
					"JOIN pgcoord.permits p ON p.id = pq.permit_id "
					"WHERE pq.key = 'q' AND p.state <> 'released'"));
	cr_assert_eq(iint(q, "holders"), 3);
	cr_assert_eq(iint(q, "hidden"), 0);
	cr_assert_eq(iint(q, "uncertain_weight"), 1);
	assert_ids(res, "largest", "a-big,b-mid,a-small");
	assert_ids(res, "oldest", "a-big,b-mid,a-small");
	assert_ids(res, "uncertain", "a-small");
	const msgpack_object *u = holder(res, "uncertain", 0);
	cr_assert(istr_is(u, "reason", "lost sight of the worker"));
	cr_assert(istr_is(u, "state", "uncertain"));
	cr_assert_eq(iint(u, "weight"), 1);
	cr_assert_eq(iint(u, "owner_session"), sa);
	cr_assert(istr_is(u, "owner_replica", "why-1"));
	cr_assert_geq(iint(u, "held_ms"), iint(u, "state_ms"));
	const msgpack_object *head = pgc_map_get(res, "queue_head");
	cr_assert(istr_is(head, "id", "b-waits"));
	cr_assert_eq(iint(head, "weight"), 5);
	cr_assert_geq(iint(head, "waited_ms"), 0);
	cr_assert_gt(iint(res, "now_at"), 0);
	ireply_destroy(&r);

	/* a cap on each list */
	res = why(fr, "q", 1, &r);
	assert_ids(res, "largest", "a-big");
	assert_ids(res, "oldest", "a-big");
	cr_assert_eq(iint(pgc_map_get(res, "quota"), "holders"), 3);
	ireply_destroy(&r);

	/* tenant A: every count, its own permits, nothing of B's */
	res = why(fa, "q", 0, &r);
	q = pgc_map_get(res, "quota");
	cr_assert_eq(iint(q, "in_flight"), 9);
	cr_assert_eq(iint(q, "holders"), 3);
	cr_assert_eq(iint(q, "hidden"), 1);
	assert_ids(res, "largest", "a-big,a-small");
	head = pgc_map_get(res, "queue_head");
	cr_assert(iis_nil(head, "id"), "A was told B's queued id");
	cr_assert_eq(iint(head, "weight"), 5);
	ireply_destroy(&r);

	/* tenant B: its own only */
	res = why(fb, "q", 0, &r);
	cr_assert_eq(iint(pgc_map_get(res, "quota"), "hidden"), 2);
	assert_ids(res, "largest", "b-mid");
	assert_ids(res, "uncertain", "");
	cr_assert(istr_is(pgc_map_get(res, "queue_head"), "id", "b-waits"));
	ireply_destroy(&r);

	/* an empty quota: no holders, no queue */
	iquota_set(fr, "empty", 3);
	char *before_empty = idb_fingerprint(db);
	res = why(fa, "empty", 0, &r);
	cr_assert_eq(iint(pgc_map_get(res, "quota"), "holders"), 0);
	cr_assert_eq(iint(pgc_map_get(res, "quota"), "available"), 3);
	cr_assert(iis_nil(res, "queue_head"));
	assert_ids(res, "largest", "");
	ireply_destroy(&r);

	/* wrong questions */
	pgc_pack_kv_str(iparams_begin(&p, 1), "key", "no-such-quota");
	icall(fa, "quota.why", &p, &r);
	ierr(&r, "not_found", false, (const char *const[]){"no-such-quota", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	iparams_begin(&p, 2);
	pgc_pack_kv_str(&p.pk, "key", "q");
	pgc_pack_kv_int(&p.pk, "holders", 51);
	icall(fa, "quota.why", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"holders", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	icall(fa, "quota.why", NULL, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"key", NULL});
	ireply_destroy(&r);

	/* asking changed nothing */
	char *after = idb_fingerprint(db);
	cr_assert_str_eq(after, before_empty);
	cr_assert_neq(strcmp(before, before_empty), 0, "the fingerprint did not see quota.set");
	free(before);
	free(before_empty);
	free(after);
	close(fa);
	close(fb);
	close(fr);
	cr_assert_eq(hagent_stop(ag), 0, "%s", hagent_log(ag));
	hagent_destroy(ag);
	hdb_drop(db);
}

static int count_of(const char *out, const char *want)
{
	int n = 0;
	for (const char *at = strstr(out, want); at; at = strstr(at + 1, want))
		n++;
	return n;
}

static void assert_has(const char *out, const char *want)
{
	cr_assert(strstr(out, want), "no \"%s\" in:\n%s", want, out);
}

Test(why, pgcoordctl_why_shows_a_quota_or_a_permits_quotas_and_fails_clearly)
{
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "why-ctl", NULL);
	const char *sock = hagent_socket(ag);
	struct iparams p;
	struct ireply r;
	char *out = NULL;

	int fd = iconnect(sock);
	isession_open(fd, "worker");
	iquota_set(fd, "gpu", 3);
	iquota_set(fd, "cpu", 8);
	claim(fd, "job-big", "gpu", 2, 0, "admitted");
	claim(fd, "job-small", "gpu", 1, 0, "admitted");
	claim(fd, "job-cpu", "cpu", 4, 0, "admitted");
	iparams_begin(&p, 2);
	pgc_pack_kv_str(&p.pk, "id", "job-small");
	pgc_pack_kv_str(&p.pk, "reason", "worker went quiet");
	icall_ok(fd, "permit.mark_uncertain", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);

	cr_assert_eq(ictl_run(sock, (const char *const[]){"why", "gpu", NULL}, &out), 0, "%s", out);
	assert_has(out, "in_flight");
	assert_has(out, "largest holders");
	assert_has(out, "job-big");
	assert_has(out, "worker went quiet");
	assert_has(out, "queue: empty");
	cr_assert_null(strstr(out, "job-cpu"), "another quota's permit in:\n%s", out);
	free(out);

	cr_assert_eq(ictl_run(sock,
			      (const char *const[]){"--json", "why", "gpu", "--limit", "1", NULL},
			      &out),
		     0, "%s", out);
	assert_has(out, "\"holders\": 2");
	assert_has(out, "\"uncertain_weight\": 1");
	/* one per list: job-big leads largest and oldest, job-small is the
	 * only uncertain one */
	cr_assert_eq(count_of(out, "\"id\": \"job-big\""), 2, "%s", out);
	cr_assert_eq(count_of(out, "\"id\": \"job-small\""), 1, "%s", out);
	free(out);

	cr_assert_eq(
	    ictl_run(sock, (const char *const[]){"why", "--permit", "job-cpu", NULL}, &out), 0,
	    "%s", out);
	assert_has(out, "== quota cpu");
	assert_has(out, "job-cpu");
	free(out);

	/* a quota that does not exist, an id with no permit, and wrong usage */
	cr_assert_eq(ictl_run(sock, (const char *const[]){"why", "nope", NULL}, &out), 1, "%s",
		     out);
	assert_has(out, "no quota \"nope\"");
	free(out);
	cr_assert_eq(
	    ictl_run(sock, (const char *const[]){"why", "--permit", "never-claimed", NULL}, &out),
	    1, "%s", out);
	assert_has(out, "a denied claim leaves no permit behind");
	free(out);
	cr_assert_eq(ictl_run(sock, (const char *const[]){"why", NULL}, &out), 2, "%s", out);
	assert_has(out, "why KEY");
	free(out);
	cr_assert_eq(
	    ictl_run(sock, (const char *const[]){"why", "gpu", "--limit", "51", NULL}, &out), 2,
	    "%s", out);
	free(out);

	close(fd);
	cr_assert_eq(hagent_stop(ag), 0, "%s", hagent_log(ag));
	hagent_destroy(ag);
	hdb_drop(db);
}

#define UID_C 65532u

/* The holders a denied or queued answer names: ids, comma-separated. */
static void assert_holders(const msgpack_object *res, const char *want)
{
	assert_ids(res, "holders", want);
}

Test(why, a_denied_or_queued_claim_names_who_holds_the_room)
{
	const char *const args[] = {"--socket-mode", "0666", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "why-3", args);
	struct iparams p;
	struct ireply r;

	int fa = iconnect_as(hagent_socket(ag), UID_A);
	int fb = iconnect_as(hagent_socket(ag), UID_B);
	int fc = iconnect_as(hagent_socket(ag), UID_C);
	int fr = iconnect_as(hagent_socket(ag), 0);
	int64_t sa = isession_open(fa, "tenant-a");
	int64_t sb = isession_open(fb, "tenant-b");
	isession_open(fc, "tenant-c");
	isession_open(fr, "operator");
	iquota_set(fr, "q", 6);
	iquota_set(fr, "aaa", 10);
	claim(fa, "a-1", "q", 4, 0, "admitted");
	claim(fb, "b-1", "q", 2, 0, "admitted");

	/* A, denied: the numbers as the ledger has them, and A's own holder */
	iclaim_call(fa, "a-2", "q", 1, 0, &r);
	const msgpack_object *res = iok(&r, "permit.claim");
	cr_assert(istr_is(res, "status", "denied"));
	cr_assert(istr_is(res, "quota", "q"));
	cr_assert_eq(iint(res, "limit"), 6);
	cr_assert_eq(iint(res, "in_flight"),
		     hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"));
	cr_assert_eq(iint(res, "in_flight"), 6);
	cr_assert_eq(iint(res, "waiting"), 0);
	cr_assert_eq(iint(res, "hidden"), 1, "B's permit is not A's to see");
	assert_holders(res, "a-1");
	const msgpack_object *h = holder(res, "holders", 0);
	cr_assert_eq(iint(h, "weight"), 4);
	cr_assert(istr_is(h, "state", "held"));
	cr_assert(istr_is(h, "owner_replica", "why-3"));
	cr_assert_eq(iint(h, "owner_session"), sa);
	cr_assert_eq(
	    iint(h, "owner_session"),
	    hdb_query_long(db, "SELECT owner_session FROM pgcoord.permits WHERE id = 'a-1'"));
	cr_assert_geq(iint(h, "age_ms"), 0);
	cr_assert(iis_nil(h, "reason"));
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'a-2'"), 0,
		     "the denied claim left a permit");

	/* C owns nothing there: the counts, no holder at all */
	iclaim_call(fc, "c-1", "q", 1, 0, &r);
	res = iok(&r, "permit.claim");
	cr_assert(istr_is(res, "status", "denied"));
	cr_assert_eq(iint(res, "in_flight"), 6);
	cr_assert_eq(iint(res, "hidden"), 2);
	assert_holders(res, "");
	ireply_destroy(&r);

	/* the operator sees both, largest first; an uncertain one says why */
	iparams_begin(&p, 2);
	pgc_pack_kv_str(&p.pk, "id", "b-1");
	pgc_pack_kv_str(&p.pk, "reason", "worker went quiet");
	icall_ok(fb, "permit.mark_uncertain", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	iclaim_call(fr, "r-1", "q", 1, 0, &r);
	res = iok(&r, "permit.claim");
	cr_assert(istr_is(res, "status", "denied"));
	cr_assert_eq(iint(res, "hidden"), 0);
	assert_holders(res, "a-1,b-1");
	h = holder(res, "holders", 1);
	cr_assert(istr_is(h, "state", "uncertain"));
	cr_assert(istr_is(h, "reason", "worker went quiet"));
	cr_assert_eq(iint(h, "owner_session"), sb);
	ireply_destroy(&r);

	/* libpgcoord hands the same to a C caller */
	pgcoord *c = NULL;
	pgcoord_claim *cl = NULL;
	const char *const ckeys[] = {"q"};
	struct pgcoord_claim_opts opts = PGCOORD_CLAIM_OPTS_INIT;
	const char *quota = NULL;
	int64_t limit = 0, in_flight = 0, waiting = -1, hidden = -1;
	opts.keys = ckeys;
	opts.nquotas = 1;
	cr_assert_eq(pgcoord_connect(hagent_socket(ag), 5000, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "libpgcoord", 5000, NULL), PGCOORD_OK);
	cr_assert_eq(pgcoord_permit_claim(c, "lib-1", &opts, 5000, &cl), PGCOORD_OK, "%s",
		     pgcoord_last_message(c));
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_DENIED);
	cr_assert(pgcoord_claim_room(cl, &quota, &limit, &in_flight, &waiting, &hidden));
	cr_assert_str_eq(quota, "q");
	cr_assert_eq(limit, 6);
	cr_assert_eq(in_flight, 6);
	cr_assert_eq(waiting, 0);
	cr_assert_eq(hidden, 0);
	cr_assert_eq(pgcoord_claim_holder_count(cl), 2);
	const pgcoord_holder *ch = pgcoord_claim_holder_at(cl, 0);
	cr_assert_str_eq(ch->id, "a-1");
	cr_assert_eq(ch->weight, 4);
	cr_assert_str_eq(ch->state, "held");
	cr_assert_str_eq(ch->owner_replica, "why-3");
	cr_assert_eq(ch->owner_session, sa);
	cr_assert_null(ch->reason);
	ch = pgcoord_claim_holder_at(cl, 1);
	cr_assert_str_eq(ch->id, "b-1");
	cr_assert_str_eq(ch->reason, "worker went quiet");
	cr_assert_null(pgcoord_claim_holder_at(cl, 2));
	pgcoord_claim_free(cl);
	pgcoord_close(c);

	/* B, queued: the quota that keeps it out, with its numbers */
	iclaim_call(fb, "b-2", "q", 1, 30000, &r);
	res = iok(&r, "permit.claim");
	cr_assert(istr_is(res, "status", "queued"));
	cr_assert(istr_is(res, "quota", "q"));
	cr_assert_eq(iint(res, "limit"), 6);
	cr_assert_eq(iint(res, "in_flight"), 6);
	cr_assert_eq(iint(res, "waiting"), 1);
	cr_assert_eq(iint(res, "waiting"),
		     hdb_query_long(db, "SELECT waiting FROM pgcoord.quotas WHERE key = 'q'"));
	cr_assert_eq(iint(res, "position"), 1);
	assert_holders(res, "b-1");
	cr_assert_eq(iint(res, "hidden"), 1);
	ireply_destroy(&r);

	/* a claim of two quotas waits for the one without room, not the
	 * first in key order */
	iparams_begin(&p, 3);
	pgc_pack_kv_str(&p.pk, "id", "r-2");
	pgc_pack_cstr(&p.pk, "quotas");
	msgpack_pack_array(&p.pk, 2);
	msgpack_pack_map(&p.pk, 1);
	pgc_pack_kv_str(&p.pk, "key", "aaa");
	msgpack_pack_map(&p.pk, 1);
	pgc_pack_kv_str(&p.pk, "key", "q");
	pgc_pack_kv_int(&p.pk, "wait_ms", 30000);
	res = icall_ok(fr, "permit.claim", &p, &r);
	iparams_destroy(&p);
	cr_assert(istr_is(res, "status", "queued"));
	cr_assert(istr_is(res, "quota", "q"));
	cr_assert_eq(iint(res, "waiting"), 2);
	cr_assert_eq(iint(res, "position"), 2);
	assert_holders(res, "a-1,b-1");
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.waiters "
					"WHERE state = 'queued' AND id IN ('b-2', 'r-2')"),
		     2);

	/* the queued claim is still told when it gets in, after its answer */
	iparams_begin(&p, 1);
	pgc_pack_kv_str(&p.pk, "id", "a-1");
	icall_ok(fa, "permit.release", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	ihear(fb, "permit.admitted", 10000, &r);
	cr_assert(istr_is(r.m.params, "id", "b-2"));
	ireply_destroy(&r);
	cr_assert(iwait_sql(db, 10000,
			    "SELECT count(*) FROM pgcoord.permits WHERE id = 'b-2' "
			    "AND state = 'held'"));

	close(fa);
	close(fb);
	close(fc);
	close(fr);
	cr_assert_eq(hagent_stop(ag), 0, "%s", hagent_log(ag));
	hagent_destroy(ag);
	hdb_drop(db);
}

/* The status code of an HTTP response. */
static int code_of(const char *resp)
{
	const char *sp = strchr(resp, ' ');
	return sp ? atoi(sp + 1) : 0;
}

/* The body of an HTTP response (after the empty line), or "". */
static const char *body_of(const char *resp)
{
	const char *b = strstr(resp, "\r\n\r\n");
	return b ? b + 4 : "";
}

Test(why, the_why_page_shows_a_quota_from_status_escaped)
{
	const char *const args[] = {"--socket-mode", "0666", "--metrics-listen", "127.0.0.1:0",
				    NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "why-http", args);
	struct iparams p;
	struct ireply r;
	int fa = iconnect_as(hagent_socket(ag), UID_A);
	int fr = iconnect_as(hagent_socket(ag), 0);
	int64_t sa = isession_open(fa, "tenant-a");
	isession_open(fr, "operator");
	/* a key that would break out of HTML and of a query string */
	const char *key = "q<&\"x y/%";
	iquota_set(fr, key, 5);
	claim(fa, "w-big", key, 3, 0, "admitted");
	claim(fa, "w-odd<i>", key, 1, 0, "admitted");
	iparams_begin(&p, 2);
	pgc_pack_kv_str(&p.pk, "id", "w-odd<i>");
	pgc_pack_kv_str(&p.pk, "reason", "lost <b>sight</b>");
	icall_ok(fa, "permit.mark_uncertain", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* /status links the quota, its key percent-encoded and escaped */
	char *page = ihttp_get(ag, "/status");
	cr_assert_eq(code_of(page), 200, "%s", page);
	cr_assert(strstr(page, "<a href=\"/why?key=q%3C%26%22x%20y%2F%25\">q&lt;&amp;&quot;x "
			       "y/%</a>"),
		  "%s", page);
	free(page);

	/* the link's page: the numbers and holders the ledger has */
	page = ihttp_get(ag, "/why?key=q%3C%26%22x%20y%2F%25");
	cr_assert_eq(code_of(page), 200, "%s", page);
	cr_assert(strstr(page, "Content-Type: text/html; charset=utf-8"), "%s", page);
	const char *body = body_of(page);
	cr_assert(strstr(body, "Who holds quota &quot;q&lt;&amp;&quot;x y/%&quot;"), "%s", body);
	cr_assert(!strstr(body, "<i>") && !strstr(body, "<b>"), "unescaped: %s", body);
	char want[160];
	snprintf(
	    want, sizeof(want), "<tr><th>in flight</th><td>%ld</td></tr>",
	    hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q<&\"x y/%%'"));
	cr_assert(strstr(body, want), "no %s in %s", want, body);
	cr_assert(strstr(body, "<tr><th>in flight</th><td>4</td></tr>"), "%s", body);
	cr_assert(strstr(body, "<tr><th>limit</th><td>5</td></tr>"), "%s", body);
	cr_assert(strstr(body, "<tr><th>available</th><td>1</td></tr>"), "%s", body);
	cr_assert(strstr(body, "<tr><th>open permits</th><td>2</td></tr>"), "%s", body);
	/* the operator's view: every holder, with its owner */
	snprintf(want, sizeof(want), "<td>w-big</td><td>3</td><td>held</td>");
	cr_assert(strstr(body, want), "%s", body);
	snprintf(want, sizeof(want), "<td>why-http</td><td>%ld</td>", (long)sa);
	cr_assert(strstr(body, want), "%s", body);
	cr_assert(strstr(body, "<td>w-odd&lt;i&gt;</td><td>1</td><td>uncertain</td>"), "%s", body);
	cr_assert(strstr(body, "<td>lost &lt;b&gt;sight&lt;/b&gt;</td>"), "%s", body);
	free(page);

	/* '+' is a space; an unknown quota is 404; a bad key 400 */
	page = ihttp_get(ag, "/why?key=no+such");
	cr_assert_eq(code_of(page), 404, "%s", page);
	cr_assert(strstr(body_of(page), "Who holds quota &quot;no such&quot;"), "%s", page);
	free(page);
	page = ihttp_get(ag, "/why?key=%00");
	cr_assert_eq(code_of(page), 400, "%s", page);
	free(page);
	page = ihttp_get(ag, "/why");
	cr_assert_eq(code_of(page), 400, "%s", page);
	cr_assert(strstr(page, "/why?key=QUOTA"), "%s", page);
	free(page);

	/* the agent served them all and still answers */
	page = ihttp_get(ag, "/healthz");
	cr_assert_eq(code_of(page), 200, "%s", page);
	free(page);
	close(fa);
	close(fr);
	cr_assert_eq(hagent_stop(ag), 0, "%s", hagent_log(ag));
	hagent_destroy(ag);
	hdb_drop(db);
}
