/*
 * test_groups.c — group admission (issue 10): claims that wait in one agent
 * at the same moment go to the database as one statement. Against a real
 * Postgres and a real agent, with one pool connection so that a group
 * forms for certain: the first claim waits on a quota row a test
 * transaction holds, and the claims sent meanwhile queue behind it.
 *
 * The answers, tokens and audit rows of a group must be what the same
 * claims made one at a time give; a group that fails as a whole answers
 * every member retryably, and a retry with the same ids finds a ledger
 * where nothing of the failed group stayed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "itest.h"
#include "proto/codec.h"

TestSuite(groups, .timeout = 60);

#define CALL_MS 10000
#define NCLAIMS 12

static const char *const one_connection[] = {"--pool-size", "1", "--metrics-listen", "127.0.0.1:0",
					     NULL};

/* A claim of weight 1 on key. */
static void claim_params(struct iparams *p, const char *id, const char *key)
{
	msgpack_packer *pk = iparams_begin(p, 2);
	pgc_pack_kv_str(pk, "id", id);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 2);
	pgc_pack_kv_str(pk, "key", key);
	pgc_pack_kv_int(pk, "weight", 1);
}

/* The claims of one run: ids <prefix>-1..10 on key (limit 5: five
 * admitted, five denied, in arrival order), then <prefix>-1 again (held,
 * its first token), then one on a quota that does not exist (not_found,
 * which must not spoil the others). */
static void claim_of(int i, const char *prefix, const char *key, char *id, size_t idlen,
		     const char **on)
{
	if (i < 10)
		snprintf(id, idlen, "%s-%d", prefix, i + 1);
	else if (i == 10)
		snprintf(id, idlen, "%s-1", prefix);
	else
		snprintf(id, idlen, "%s-nowhere", prefix);
	*on = i == 11 ? "no-such-quota" : key;
}

/* What one answer said: "admitted", "held", "denied" or the error code
 * (and then its message). */
struct outcome {
	char what[32];
	int64_t token;
	char message[256];
};

static void read_outcome(const struct pgc_message *m, struct outcome *o)
{
	const msgpack_object *v;
	memset(o, 0, sizeof(*o));
	v = pgc_map_get(m->error ? m->error : m->result, m->error ? "code" : "status");
	cr_assert(v && v->type == MSGPACK_OBJECT_STR, "an answer without status or code");
	snprintf(o->what, sizeof(o->what), "%.*s", (int)v->via.str.size, v->via.str.ptr);
	if (m->error && (v = pgc_map_get(m->error, "message")) && v->type == MSGPACK_OBJECT_STR)
		snprintf(o->message, sizeof(o->message), "%.*s", (int)v->via.str.size,
			 v->via.str.ptr);
	if (!m->error && (v = pgc_map_get(m->result, "token")) && v->type != MSGPACK_OBJECT_NIL)
		cr_assert(pgc_obj_int64(v, &o->token));
}

/* Reads the answers to msgids first..first+n-1, in whatever order. */
static void read_answers(int fd, uint32_t first, int n, struct outcome *out)
{
	char err[128];
	int got = 0;
	while (got < n) {
		msgpack_unpacked u;
		struct pgc_message m;
		msgpack_unpacked_init(&u);
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, &u), HRAW_MSG, "%d of %d answers came", got,
			     n);
		cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
		if (m.type == PGC_RPC_RESPONSE && m.msgid >= first &&
		    m.msgid < first + (uint32_t)n) {
			read_outcome(&m, &out[m.msgid - first]);
			got++;
		}
		msgpack_unpacked_destroy(&u);
	}
}

/* The answers of a claim that waited out its time in the database
 * (first_id) and of one held behind it (held_id), sent at `sent`: both
 * time out, the held one by its own deadline of deadline_ms, neither at
 * once. */
static void read_both_timed_out(int fd, uint32_t first_id, uint32_t held_id, int64_t sent,
				int64_t deadline_ms)
{
	struct outcome first[1], held[1];

	read_answers(fd, first_id, 1, first);
	read_answers(fd, held_id, 1, held);
	int64_t waited = hnow_ms() - sent;
	cr_assert_str_eq(first[0].what, "timeout");
	cr_assert_str_eq(held[0].what, "timeout");
	cr_assert_leq(waited, deadline_ms + 250, "the held claim was answered after %lld ms",
		      (long long)waited);
	cr_assert_geq(waited, deadline_ms / 2, "the held claim was answered after %lld ms",
		      (long long)waited);
}

/* Sends claims i = from..to-1 of a run down fd without waiting. */
static void send_claims(int fd, uint32_t msgid0, int from, int to, const char *prefix,
			const char *key)
{
	for (int i = from; i < to; i++) {
		char id[64];
		const char *on;
		struct iparams p;
		claim_of(i, prefix, key, id, sizeof(id), &on);
		claim_params(&p, id, on);
		cr_assert(hraw_send_request(fd, msgid0 + (uint32_t)i, "permit.claim", p.sb.data,
					    p.sb.size));
		iparams_destroy(&p);
	}
}

/* Holds key's quota row in an open transaction until COMMIT. */
static PGconn *hold_quota(struct harness_db *db, const char *key)
{
	PGconn *c = hdb_connect(db);
	PQclear(PQexec(c, "BEGIN"));
	char sql[200];
	snprintf(sql, sizeof(sql), "SELECT 1 FROM pgcoord.quotas WHERE key = '%s' FOR UPDATE", key);
	PGresult *res = PQexec(c, sql);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(c));
	PQclear(res);
	return c;
}

/* Commits the transaction hold_quota opened, freeing the row, and closes it. */
static void end_hold(PGconn *hold)
{
	PQclear(PQexec(hold, "COMMIT"));
	PQfinish(hold);
}

static void wait_claim_on_lock(struct harness_db *db)
{
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
			    "current_database() AND query LIKE '%%pgcoord.permit_claim_%%' "
			    "AND wait_event_type = 'Lock'"),
		  "no claim reached the held quota row");
}

/* The port of an agent started with --metrics-listen 127.0.0.1:0. */
static int http_port(struct hagent *a)
{
	static const char key[] = "metrics_listen=127.0.0.1:";
	int64_t deadline = hnow_ms() + 5000;
	const char *at;
	while (!(at = strstr(hagent_log(a), key))) {
		cr_assert_lt(hnow_ms(), deadline, "no %s in the log", key);
		hsleep_ms(20);
	}
	return atoi(at + strlen(key));
}

/* One sample of /metrics, e.g. pgcoord_permit_group_largest{kind="claim"}. */
static long metric(struct hagent *a, const char *sample)
{
	char cmd[256], line[512];
	long v = -1;
	snprintf(cmd, sizeof(cmd), "curl -s http://127.0.0.1:%d/metrics", http_port(a));
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, sample, strlen(sample)) == 0 && line[strlen(sample)] == ' ')
			v = atol(line + strlen(sample) + 1);
	pclose(f);
	cr_assert_geq(v, 0, "no %s in /metrics", sample);
	return v;
}

static long audit_rows(struct harness_db *db, const char *prefix, const char *event)
{
	return hdb_query_long(db,
			      "SELECT count(*) FROM pgcoord.permit_events WHERE permit_id LIKE "
			      "'%s-%%' AND event = '%s'",
			      prefix, event);
}

static void assert_conserved(struct harness_db *db)
{
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits_check() "
					"WHERE problem <> ''"),
		     0, "permits_check() found a violation");
}

Test(groups, a_group_answers_as_the_same_claims_made_one_at_a_time)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-same", one_connection);
	int fd = iconnect(hagent_socket(a));
	struct outcome grouped[NCLAIMS], alone[NCLAIMS];

	isession_open(fd, "grouped");
	iquota_set(fd, "grp", 5);
	iquota_set(fd, "one", 5);

	/* one at a time: each answered before the next is sent */
	for (int i = 0; i < NCLAIMS; i++) {
		send_claims(fd, 1000, i, i + 1, "one", "one");
		read_answers(fd, 1000 + (uint32_t)i, 1, &alone[i]);
	}
	cr_assert_eq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), 1,
		     "claims made one at a time were grouped");

	/* together: the first waits on the held row, the rest queue behind it
	 * on the one pool connection and go as one group */
	PGconn *holder = hold_quota(db, "grp");
	send_claims(fd, 2000, 0, 1, "grp", "grp");
	wait_claim_on_lock(db);
	send_claims(fd, 2000, 1, NCLAIMS, "grp", "grp");
	hsleep_ms(200); /* every claim is read and queued */
	end_hold(holder);
	read_answers(fd, 2000, NCLAIMS, grouped);

	cr_assert_geq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), NCLAIMS - 1,
		      "the claims that waited together did not go as one group");
	cr_assert_lt(metric(a, "pgcoord_permit_groups_total{kind=\"claim\"}"),
		     metric(a, "pgcoord_permit_group_members_total{kind=\"claim\"}"));
	/* the quota has no room for all of them: the one statement admitted
	 * none and handed the group on to permit_claim_group, which judged
	 * each in arrival order */
	cr_assert_geq(metric(a, "pgcoord_permit_group_members_total{kind=\"claim_slow\"}"),
		      NCLAIMS - 1, "the group was not handed on to the group function");

	for (int i = 0; i < NCLAIMS; i++)
		cr_assert_str_eq(grouped[i].what, alone[i].what,
				 "claim %d: %s in a group, %s alone", i, grouped[i].what,
				 alone[i].what);
	cr_assert_str_eq(grouped[0].what, "admitted");
	cr_assert_str_eq(grouped[5].what, "denied");
	cr_assert_str_eq(grouped[10].what, "held");
	cr_assert_str_eq(grouped[11].what, "not_found");
	/* fencing tokens: increasing in arrival order, the retry gets the first */
	for (int i = 1; i < 5; i++)
		cr_assert_gt(grouped[i].token, grouped[i - 1].token);
	cr_assert_eq(grouped[10].token, grouped[0].token);

	/* the same rows either way */
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'grp'"),
		     5);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'one'"),
		     5);
	for (int i = 0; i < 10; i++) {
		long exists = hdb_query_long(
		    db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'grp-%d'", i + 1);
		cr_assert_eq(exists, i < 5, "grp-%d: %ld permit rows", i + 1, exists);
	}
	cr_assert_eq(audit_rows(db, "grp", "admitted"), 5);
	cr_assert_eq(audit_rows(db, "one", "admitted"), 5);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id LIKE 'grp-%%'"),
		     hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id LIKE 'one-%%'"));
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A group whose quota has room for all of its members is admitted by the
 * one statement (permit_claim_fast), nothing handed on: every member
 * admitted, tokens in arrival order, each permit's admission in its row. */
Test(groups, a_group_with_room_for_all_is_admitted_by_one_statement)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-room", one_connection);
	int fd = iconnect(hagent_socket(a));
	struct outcome got[10];

	isession_open(fd, "room");
	iquota_set(fd, "room", 20);
	PGconn *holder = hold_quota(db, "room");
	send_claims(fd, 3000, 0, 1, "room", "room");
	wait_claim_on_lock(db);
	send_claims(fd, 3000, 1, 10, "room", "room");
	hsleep_ms(200); /* every claim is read and queued */
	end_hold(holder);
	read_answers(fd, 3000, 10, got);

	for (int i = 0; i < 10; i++)
		cr_assert_str_eq(got[i].what, "admitted", "claim %d: %s", i, got[i].what);
	for (int i = 1; i < 10; i++)
		cr_assert_gt(got[i].token, got[i - 1].token, "tokens out of arrival order");
	cr_assert_geq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), 9);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_total{kind=\"claim_slow\"}"), 0,
		     "a member with room went past the one statement");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'room'"),
		     10);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'room-%%' AND state = 'held' AND quota_key = 'room' AND "
					"admit_event IS NOT NULL"),
		     10);
	cr_assert_eq(audit_rows(db, "room", "admitted"), 10);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events_log "
					"WHERE permit_id LIKE 'room-%%'"),
		     0, "the one statement wrote audit rows");
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Two unprivileged uids (no passwd entry needed for SO_PEERCRED). */
#define UID_A 65534u
#define UID_B 65533u

/* A claim group in which uid B claims an id uid A holds: that member alone
 * is refused conflict, telling nothing of A's grant, and the others (A's
 * own retry of the id among them) are answered as alone. */
Test(groups, a_member_claiming_another_uids_id_is_refused_and_the_others_answered)
{
	static const char *const args[] = {
	    "--pool-size", "1", "--metrics-listen", "127.0.0.1:0", "--socket-mode", "0666", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-uids", args);
	int fr = iconnect_as(hagent_socket(a), 0);
	int fa = iconnect_as(hagent_socket(a), UID_A);
	int fb = iconnect_as(hagent_socket(a), UID_B);
	struct outcome first[1], mine[2], theirs[4];
	char tok[32];

	isession_open(fr, "root");
	int64_t sa = isession_open(fa, "a");
	isession_open(fb, "b");
	iquota_set(fr, "grp", 10);
	iquota_set(fr, "side", 10);
	send_claims(fa, 100, 0, 1, "x", "grp");
	read_answers(fa, 100, 1, first);
	cr_assert_str_eq(first[0].what, "admitted");
	snprintf(tok, sizeof(tok), "%lld", (long long)first[0].token);
	char *row_before = hdb_query_value(db, "SELECT concat_ws(',', owner_session, token, state) "
					       "FROM pgcoord.permits WHERE id = 'x-1'");

	/* A's claim a-1 waits on the held row; behind it, one group: B's
	 * claim of A's x-1, B's own b-1 and b-2 on the same quota and b-3 on
	 * another, and A's retry of x-1 */
	PGconn *holder = hold_quota(db, "grp");
	struct iparams p;
	claim_params(&p, "a-1", "grp");
	cr_assert(hraw_send_request(fa, 200, "permit.claim", p.sb.data, p.sb.size));
	iparams_destroy(&p);
	wait_claim_on_lock(db);
	const char *const b_ids[] = {"x-1", "b-1", "b-2", "b-3"};
	for (int i = 0; i < 4; i++) {
		claim_params(&p, b_ids[i], i == 3 ? "side" : "grp");
		cr_assert(
		    hraw_send_request(fb, 300 + (uint32_t)i, "permit.claim", p.sb.data, p.sb.size));
		iparams_destroy(&p);
	}
	claim_params(&p, "x-1", "grp");
	cr_assert(hraw_send_request(fa, 201, "permit.claim", p.sb.data, p.sb.size));
	iparams_destroy(&p);
	hsleep_ms(200); /* every claim is read and queued */
	end_hold(holder);
	read_answers(fa, 200, 2, mine);
	read_answers(fb, 300, 4, theirs);

	cr_assert_geq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), 5,
		      "the claims that waited together did not go as one group");
	cr_assert_str_eq(mine[0].what, "admitted");
	cr_assert_str_eq(mine[1].what, "held", "A's retry in the group: %s", mine[1].what);
	cr_assert_eq(mine[1].token, first[0].token, "A's retry got another token");
	cr_assert_str_eq(theirs[0].what, "conflict", "B's claim of A's id: %s", theirs[0].what);
	cr_assert_str_eq(theirs[0].message, "permit id \"x-1\" is already in use by another "
					    "owner; choose another id");
	cr_assert_null(strstr(theirs[0].message, tok));
	cr_assert_eq(theirs[0].token, 0);
	for (int i = 1; i < 4; i++)
		cr_assert_str_eq(theirs[i].what, "admitted", "B's %s: %s", b_ids[i],
				 theirs[i].what);

	/* A's permit as it was; the counters hold exactly the admitted ones */
	char *row_after = hdb_query_value(db, "SELECT concat_ws(',', owner_session, token, state) "
					      "FROM pgcoord.permits WHERE id = 'x-1'");
	cr_assert_str_eq(row_after, row_before);
	cr_assert_eq(hdb_query_long(db, "SELECT owner_session FROM pgcoord.permits WHERE id = "
					"'x-1'"),
		     sa);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'grp'"),
		     4);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'side'"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id = 'x-1'"),
		     1);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits p JOIN "
				    "pgcoord.sessions s ON s.id = p.owner_session WHERE "
				    "p.id LIKE 'b-%%' AND s.owner_uid = %u",
				    UID_B),
		     3);
	assert_conserved(db);
	free(row_before);
	free(row_after);
	close(fr);
	close(fa);
	close(fb);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(groups, a_failed_group_answers_every_member_retryably)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-fail", one_connection);
	int fd = iconnect(hagent_socket(a));
	struct outcome first[1], failed[NCLAIMS], retried[NCLAIMS];

	isession_open(fd, "failing");
	iquota_set(fd, "fa", 50);
	iquota_set(fd, "fb", 50);

	/* claim 0 waits on fa; claims 1..9 queue, then run as one group and
	 * wait on fb, where the group's backend is terminated */
	PGconn *hold_a = hold_quota(db, "fa"), *hold_b = hold_quota(db, "fb");
	send_claims(fd, 3000, 0, 1, "fx", "fa");
	wait_claim_on_lock(db);
	send_claims(fd, 3000, 1, 10, "fy", "fb");
	hsleep_ms(200);
	end_hold(hold_a);
	read_answers(fd, 3000, 1, first);
	cr_assert_str_eq(first[0].what, "admitted");
	wait_claim_on_lock(db);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) "
					"FROM pg_stat_activity WHERE datname = current_database() "
					"AND query LIKE '%%pgcoord.permit_claim_%%' "
					"AND wait_event_type = 'Lock') t"),
		     1);
	read_answers(fd, 3001, 9, failed);
	for (int i = 0; i < 9; i++)
		cr_assert_str_eq(failed[i].what, "unavailable", "member %d: %s", i + 1,
				 failed[i].what);
	end_hold(hold_b);
	cr_assert_eq(audit_rows(db, "fy", "admitted"), 0, "a failed group left audit rows");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'fb'"),
		     0);

	/* the same ids again, once the agent has its connection back */
	for (int tries = 0; tries < 20; tries++) {
		send_claims(fd, 4000, 1, 10, "fy", "fb");
		read_answers(fd, 4001, 9, retried);
		if (strcmp(retried[8].what, "unavailable") != 0)
			break;
		hsleep_ms(250); /* the connection is still coming back */
	}
	for (int i = 0; i < 9; i++)
		cr_assert(strcmp(retried[i].what, "admitted") == 0 ||
			      strcmp(retried[i].what, "held") == 0,
			  "retry of member %d: %s", i + 1, retried[i].what);
	cr_assert_eq(audit_rows(db, "fy", "admitted"), 9);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'fb'"),
		     9);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * Release groups (set-based, permit_release_group): a group of several releases is judged as
 * a set, yet each member must be answered, and leave the rows, as the lone
 * release of 0006 (permit_release_as, unchanged) gives one call at a time.
 * The same mix runs both ways on two id/key sets ("g" as one group, "a"
 * one by one) and the answers, permits, counters and audit rows must match.
 */

/* The mix, in arrival order: released, already released, no permit (the
 * id is retired), another session's, another uid's, uncertain, the last
 * holder of a quota with a waiter (handed over), an override, released. */
static const char *const release_mix[] = {"1", "3", "nope", "4", "5", "6", "7", "8", "2"};
#define NMIX (sizeof(release_mix) / sizeof(release_mix[0]))

static void claim_sql(struct harness_db *db, long uid, const char *id, const char *key, int weight,
		      int64_t session)
{
	char *st = hdb_query_value(db,
				   "SELECT status FROM pgcoord.permit_claim_as(%ld, false, '%s', "
				   "ARRAY['%s'], ARRAY[%d], %lld, 'test', 'uncertain', NULL, NULL, "
				   "'test')",
				   uid, id, key, weight, (long long)session);
	cr_assert_str_eq(st, "admitted", "%s: %s", id, st);
	free(st);
}

/* Permits and a waiter for set x; returns the caller's uid. */
static long release_mix_setup(struct harness_db *db, const char *x, int64_t s1, int64_t s2,
			      int64_t s3)
{
	long uid = hdb_query_long(db, "SELECT owner_uid FROM pgcoord.sessions WHERE id = %lld",
				  (long long)s1);
	char id[32], key[32], hw[32];
	snprintf(key, sizeof(key), "%s-key", x);
	snprintf(hw, sizeof(hw), "%s-hw", x);
	hdb_exec(db,
		 "SELECT pgcoord.quota_apply('%s', 100, NULL, 'test', 'test');"
		 "SELECT pgcoord.quota_apply('%s', 2, NULL, 'test', 'test')",
		 key, hw);
	for (int i = 1; i <= 8; i++) {
		int64_t owner = i == 4 || i == 8 ? s2 : i == 5 ? s3 : s1;
		snprintf(id, sizeof(id), "%s-%d", x, i);
		claim_sql(db, i == 5 ? 4242 : uid, id, i == 7 ? hw : key, i == 7 ? 2 : 1, owner);
	}
	hdb_exec(db,
		 "SELECT * FROM pgcoord.permit_release_as(%ld, '%s-3', %lld, false, 'test', NULL);"
		 "UPDATE pgcoord.permits SET state = 'uncertain', uncertain_reason = 'test' "
		 "WHERE id = '%s-6'",
		 uid, x, (long long)s1, x);
	char *st = hdb_query_value(db,
				   "SELECT status FROM pgcoord.permit_wait(%ld, false, '%s-w', "
				   "ARRAY['%s'], ARRAY[1], %lld, 'test', 'uncertain', NULL, NULL, "
				   "'test', 60000)",
				   uid, x, hw, (long long)s2);
	cr_assert_str_eq(st, "queued");
	free(st);
	return uid;
}

#define RELEASE_ROW                                                                                \
	"coalesce(err_state, '') || '|' || coalesce(err_message, '') || '|' || "                   \
	"coalesce(status::text, '') || '|' || coalesce(state, '')"

/* Cuts the set's prefix ("a-", "g-", "o-") off the ids quoted in messages,
 * so the lone and grouped answers compare. */
static void unprefix(char *s)
{
	for (char *q;
	     (q = strstr(s, "\"a-")) || (q = strstr(s, "\"g-")) || (q = strstr(s, "\"o-"));)
		memmove(q + 1, q + 3, strlen(q + 3) + 1);
}

/* A lone call's row as a group member's: what `sql` (one text from a
 * call) selects, or, when the call raised, `raised` formatted with its
 * SQLSTATE and message, as a group shows a member that raised. */
static void define_lone(struct harness_db *db)
{
	hdb_exec(db, "CREATE FUNCTION public.lone(p_sql text, p_raised text) RETURNS text "
		     "LANGUAGE plpgsql AS $$ DECLARE v text; BEGIN EXECUTE p_sql INTO v; RETURN v; "
		     "EXCEPTION WHEN OTHERS THEN RETURN format(p_raised, SQLSTATE, SQLERRM); "
		     "END $$");
}

/* What the rows of set x say, with x cut off the ids and keys. */
static char *rows_of(struct harness_db *db, const char *x)
{
	return hdb_query_value(
	    db,
	    "SELECT (SELECT string_agg(substr(id, 3) || ':' || state, ',' ORDER BY id) FROM "
	    "pgcoord.permits WHERE id LIKE '%s-%%') || ' / ' || "
	    "(SELECT string_agg(substr(key, 3) || '=' || in_flight || '+' || waiting, ',' ORDER "
	    "BY key) FROM pgcoord.quotas WHERE key LIKE '%s-%%') || ' / ' || "
	    "(SELECT string_agg(substr(permit_id, 3) || ':' || coalesce(substr(key, 3), '') || "
	    "':' || delta || ':' || event || ':' || actor || ':' || "
	    "regexp_replace(coalesce(reason, ''), '[0-9]+', 'N', 'g') || ':' || coalesce(state, "
	    "'') || ':' || coalesce(phase, ''), ',' ORDER BY permit_id, id) "
	    "FROM pgcoord.permit_events WHERE permit_id LIKE '%s-%%')",
	    x, x, x);
}

Test(groups, a_release_group_answers_and_writes_as_lone_releases)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-rel", NULL);
	int fd1 = iconnect(hagent_socket(a)), fd2 = iconnect(hagent_socket(a)),
	    fd3 = iconnect(hagent_socket(a));
	int64_t s1 = isession_open(fd1, "one"), s2 = isession_open(fd2, "two"),
		s3 = isession_open(fd3, "three");
	hdb_exec(db, "UPDATE pgcoord.sessions SET owner_uid = 4242 WHERE id = %lld", (long long)s3);
	define_lone(db);
	long uid = release_mix_setup(db, "g", s1, s2, s3);
	cr_assert_eq(release_mix_setup(db, "a", s1, s2, s3), uid);
	cr_assert_eq(release_mix_setup(db, "o", s1, s2, s3), uid);

	/* "a": one call at a time, each its own transaction */
	char alone[4096] = "";
	for (size_t i = 0; i < NMIX; i++) {
		char *row = hdb_query_value(
		    db,
		    "SELECT public.lone(format('SELECT %%s FROM (SELECT NULL::text AS err_state, "
		    "NULL::text AS err_message, * FROM pgcoord.permit_release_as(%ld, %%L, %lld, "
		    "%s, ''test'', NULL)) r', $r$" RELEASE_ROW "$r$, 'a-%s'), '%%s|%%s||')",
		    uid, (long long)s1, i == 7 ? "true" : "false", release_mix[i]);
		unprefix(row);
		snprintf(alone + strlen(alone), sizeof(alone) - strlen(alone), "%s%s",
			 i ? "\n" : "", row);
		free(row);
	}

	/* "o": the same calls one at a time, each by the agent's statement for
	 * a group of one (permit_release_one, its own arguments) */
	char one[4096] = "";
	for (size_t i = 0; i < NMIX; i++) {
		char *row = hdb_query_value(
		    db,
		    "SELECT public.lone(format('SELECT %%s FROM (SELECT 1, NULL::text, NULL::text, "
		    "r.* FROM pgcoord.permit_release_one(%ld::bigint, %%L::text, %lld::bigint, "
		    "%s::boolean, ''test''::text, NULL::text) r) r(member, err_state, "
		    "err_message)', "
		    "$r$" RELEASE_ROW "$r$, 'o-%s'), '%%s|%%s||')",
		    uid, (long long)s1, i == 7 ? "true" : "false", release_mix[i]);
		unprefix(row);
		snprintf(one + strlen(one), sizeof(one) - strlen(one), "%s%s", i ? "\n" : "", row);
		free(row);
	}
	cr_assert_str_eq(one, alone, "a group of one:\n%s\nalone:\n%s", one, alone);

	/* "g": the same calls as one group, one statement */
	char ids[256] = "", overrides[128] = "", uids[256] = "", sessions[256] = "";
	for (size_t i = 0; i < NMIX; i++) {
		const char *sep = i ? "," : "";
		snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), "%sg-%s", sep,
			 release_mix[i]);
		snprintf(overrides + strlen(overrides), sizeof(overrides) - strlen(overrides),
			 "%s%s", sep, i == 7 ? "true" : "false");
		snprintf(uids + strlen(uids), sizeof(uids) - strlen(uids), "%s%ld", sep, uid);
		snprintf(sessions + strlen(sessions), sizeof(sessions) - strlen(sessions), "%s%lld",
			 sep, (long long)s1);
	}
	char *grouped = hdb_query_value(
	    db,
	    "SELECT string_agg(" RELEASE_ROW ", E'\\n' ORDER BY member) || '#' || count(*) "
	    "FROM pgcoord.permit_release_group('{%s}', '{%s}', '{%s}', '{%s}', "
	    "array_fill('test'::text, ARRAY[%zu]), array_fill(NULL::text, ARRAY[%zu]))",
	    uids, ids, sessions, overrides, NMIX, NMIX);
	unprefix(grouped);
	char want[4200];
	snprintf(want, sizeof(want), "%s#%zu", alone, NMIX);
	cr_assert_str_eq(grouped, want, "in a group:\n%s\nalone:\n%s", grouped, want);
	free(grouped);

	/* what each answer says, not only that both agree */
	cr_assert(strstr(alone, "||released|released\n||already_released|released\n||retired|"),
		  "%s", alone);
	cr_assert(strstr(alone, "PCFBD|cannot release permit \"4\": it is owned by session"), "%s",
		  alone);
	cr_assert(strstr(alone, "PCFBD|cannot release permit \"5\": it belongs to uid 4242"), "%s",
		  alone);
	cr_assert(strstr(alone, "PCCFL|cannot release permit \"6\": it is uncertain (test)"), "%s",
		  alone);

	/* the same rows either way; the waiter was handed the freed room */
	char *g = rows_of(db, "g"), *al = rows_of(db, "a"), *o = rows_of(db, "o");
	cr_assert_str_eq(g, al, "group rows:\n%s\nlone rows:\n%s", g, al);
	cr_assert_str_eq(o, al, "group of one rows:\n%s\nlone rows:\n%s", o, al);
	free(g);
	free(al);
	free(o);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'g-w' "
					"AND state = 'held'"),
		     1, "the waiter was not admitted by the group's release");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'g-hw'"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'g-key'"),
		     3, "g-4, g-5, g-6 still count");

	/* one id twice in a group: the second sees the first, as alone */
	char *twice =
	    hdb_query_value(db,
			    "SELECT string_agg(" RELEASE_ROW ", ',' ORDER BY member) FROM "
			    "pgcoord.permit_release_group('{%ld,%ld}', '{g-4,g-4}', '{%lld,%lld}', "
			    "'{true,true}', '{t,t}', '{NULL,NULL}')",
			    uid, uid, (long long)s1, (long long)s1);
	cr_assert_str_eq(twice, "||released|released,||already_released|released");
	free(twice);
	assert_conserved(db);
	close(fd1);
	close(fd2);
	close(fd3);
	hagent_destroy(a);
	hdb_drop(db);
}

/* permit.release {id} of each of ids, sent without waiting. */
static void send_releases(int fd, uint32_t msgid0, const char *const *ids, int n)
{
	for (int i = 0; i < n; i++) {
		struct iparams p;
		pgc_pack_kv_str(iparams_begin(&p, 1), "id", ids[i]);
		cr_assert(hraw_send_request(fd, msgid0 + (uint32_t)i, "permit.release", p.sb.data,
					    p.sb.size));
		iparams_destroy(&p);
	}
}

/* Through the agent: releases that wait together go as one group, each is
 * answered released, and the room they free goes to the claim that waits
 * on the quota (the hand-over fires at the group's commit). */
Test(groups, a_release_group_hands_its_room_to_a_waiter)
{
	static const char *const ids[] = {"rw-1", "rw-2", "rw-3", "rw-4"};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-hand", one_connection);
	int fd = iconnect(hagent_socket(a)), fd2 = iconnect(hagent_socket(a));
	struct outcome claimed[4];
	struct iparams p;
	struct ireply r;

	isession_open(fd, "holder");
	isession_open(fd2, "waiter");
	iquota_set(fd, "rw", 4);
	send_claims(fd, 5000, 0, 4, "rw", "rw");
	read_answers(fd, 5000, 4, claimed);
	for (int i = 0; i < 4; i++)
		cr_assert_str_eq(claimed[i].what, "admitted");

	msgpack_packer *pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "id", "rw-w");
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 2);
	pgc_pack_kv_str(pk, "key", "rw");
	pgc_pack_kv_int(pk, "weight", 2);
	pgc_pack_kv_int(pk, "wait_ms", 30000);
	char *status = istr(icall_ok(fd2, "permit.claim", &p, &r), "status");
	cr_assert_str_eq(status, "queued");
	free(status);
	ireply_destroy(&r);
	iparams_destroy(&p);

	PGconn *holder = hold_quota(db, "rw");
	send_releases(fd, 6000, ids, 1);
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
			    "current_database() AND query LIKE '%%pgcoord.permit_release_%%' "
			    "AND wait_event_type = 'Lock'"),
		  "no release reached the held quota row");
	send_releases(fd, 6001, ids + 1, 3);
	hsleep_ms(200); /* every release is read and queued */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'rw-w'"),
		     0);
	end_hold(holder);

	for (int got = 0; got < 4;) {
		msgpack_unpacked u;
		struct pgc_message m;
		char err[128];
		msgpack_unpacked_init(&u);
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, &u), HRAW_MSG, "%d of 4 answers came", got);
		cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
		if (m.type == PGC_RPC_RESPONSE && m.msgid >= 6000 && m.msgid < 6004) {
			cr_assert_null(m.error, "release %u failed", m.msgid - 6000);
			const msgpack_object *v = pgc_map_get(m.result, "released");
			cr_assert(v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean,
				  "release %u: not released", m.msgid - 6000);
			got++;
		}
		msgpack_unpacked_destroy(&u);
	}
	cr_assert_geq(metric(a, "pgcoord_permit_group_largest{kind=\"release\"}"), 3,
		      "the releases that waited together did not go as one group");
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_total{kind=\"release_slow\"}"), 0,
		     "a release of a held one-quota permit went past the one statement");
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT count(*) FROM pgcoord.permits WHERE id = 'rw-w' AND state = "
			    "'held'"),
		  "the waiter was not handed the room the group freed");
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'rw'"),
		     2);
	cr_assert_eq(audit_rows(db, "rw", "released"), 4);
	assert_conserved(db);
	close(fd);
	close(fd2);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A claim group judged set-based (permit_claim_group) against the same claims made one at
 * a time: two key sets alike, "g" claimed as one group in one statement,
 * "a" one call at a time. Answers, permits, shares, counters, the queue and
 * audit rows must match, ids and keys cut off. */
struct mixed_claim {
	const char *id, *keys, *weights, *limit;
	bool dead_session;
};

/* In arrival order: admitted, multi-key admitted, denied by a queue,
 * denied by room, an idempotent retry, unknown quota (after a key with
 * room), a session that is not live, admitted, denied, a per-call limit,
 * unsorted keys, admitted on the second quota of a multi-key claim, denied
 * there. */
static const struct mixed_claim claim_mix[] = {
    {"1", "hot", "1", "NULL", false},	   {"2", "hot,two", "1,2", "NULL", false},
    {"3", "q", "1", "NULL", false},	   {"4", "hot", "2", "NULL", false},
    {"r", "rk", "1", "NULL", false},	   {"6", "hot,zz", "1,1", "NULL", false},
    {"7", "hot", "1", "NULL", true},	   {"8", "hot", "1", "NULL", false},
    {"9", "hot", "1", "NULL", false},	   {"10", "lim", "1", "4", false},
    {"11", "iz,ia", "1,1", "NULL", false}, {"12", "two", "3", "NULL", false},
    {"13", "two", "1", "NULL", false},
};
#define NCLAIM_MIX (sizeof(claim_mix) / sizeof(claim_mix[0]))

/* "{x-a,x-b}" from "a,b". */
static void prefixed_keys(char *out, size_t len, const char *x, const char *keys)
{
	char copy[64];
	snprintf(copy, sizeof(copy), "%s", keys);
	snprintf(out, len, "{");
	for (char *k = strtok(copy, ","); k; k = strtok(NULL, ","))
		snprintf(out + strlen(out), len - strlen(out), "%s%s-%s",
			 strlen(out) > 1 ? "," : "", x, k);
	snprintf(out + strlen(out), len - strlen(out), "}");
}

/* Quotas, a held permit to retry and a queue on x-q for set x. */
static void claim_mix_setup(struct harness_db *db, const char *x, long uid, int64_t s)
{
	hdb_exec(db,
		 "SELECT pgcoord.quota_apply('%s-hot', 3, NULL, 'test', 'test');"
		 "SELECT pgcoord.quota_apply('%s-two', 5, NULL, 'test', 'test');"
		 "SELECT pgcoord.quota_apply('%s-q', 5, NULL, 'test', 'test');"
		 "SELECT pgcoord.quota_apply('%s-full', 1, NULL, 'test', 'test');"
		 "SELECT pgcoord.quota_apply('%s-rk', 5, NULL, 'test', 'test')",
		 x, x, x, x, x);
	char id[32], key[32];
	snprintf(id, sizeof(id), "%s-h", x);
	snprintf(key, sizeof(key), "%s-full", x);
	claim_sql(db, uid, id, key, 1, s);
	snprintf(id, sizeof(id), "%s-r", x);
	snprintf(key, sizeof(key), "%s-rk", x);
	claim_sql(db, uid, id, key, 1, s);
	/* the head of x-q's queue waits for x-full: x-q has room and a queue */
	char *st =
	    hdb_query_value(db,
			    "SELECT status FROM pgcoord.permit_wait(%ld, false, '%s-w', "
			    "ARRAY['%s-full', '%s-q'], ARRAY[1, 1], %lld, 'test', 'uncertain', "
			    "NULL, NULL, 'test', 60000)",
			    uid, x, x, x, (long long)s);
	cr_assert_str_eq(st, "queued");
	free(st);
}

#define CLAIM_ROW                                                                                  \
	"coalesce(err_state, '') || '|' || coalesce(status::text, '') || '|' || (token IS NOT "    \
	"NULL) || '|' || coalesce(state, '') || '|' || coalesce(phase, '') || '|' || "             \
	"(owner_session IS NOT NULL) || '|' || coalesce(owner_replica, '') || '|' || (created_at " \
	"IS NOT NULL) || '|' || coalesce(released_at::text, '') || '|' || coalesce(substr("        \
	"denied_key, 3), '') || '|' || coalesce(denied_limit::text, '') || '|' || "                \
	"coalesce(denied_in_flight::text, '') || '|' || coalesce(err_message, '')"
/* CLAIM_ROW of a member that raised, for lone() (after printf: its
 * SQLSTATE, its message) */
#define CLAIM_RAISED "%%s||false|||false||false|||||%%s"

/* The shares, limits and queue of set x, beside rows_of's permits,
 * counters and audit rows. */
static char *claim_rows_of(struct harness_db *db, const char *x)
{
	char *rows = rows_of(db, x);
	char *more = hdb_query_value(
	    db,
	    "SELECT (SELECT string_agg(substr(permit_id, 3) || ':' || substr(key, 3) || ':' || "
	    "weight, ',' ORDER BY permit_id, key) FROM pgcoord.permit_quotas WHERE permit_id LIKE "
	    "'%s-%%') || ' / ' || (SELECT string_agg(substr(key, 3) || '<=' || \"limit\", ',' "
	    "ORDER "
	    "BY key) FROM pgcoord.quotas WHERE key LIKE '%s-%%') || ' / ' || (SELECT "
	    "string_agg(substr(id, 3) || ':' || state, ',') FROM pgcoord.waiters WHERE id LIKE "
	    "'%s-%%')",
	    x, x, x);
	char *all = malloc(strlen(rows) + strlen(more) + 4);
	cr_assert(all);
	sprintf(all, "%s / %s", rows, more);
	free(rows);
	free(more);
	return all;
}

static long tokens_drawn(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT last_value FROM pgcoord.token_seq");
}

Test(groups, a_claim_group_answers_and_writes_as_lone_claims)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-clm", NULL);
	int fd = iconnect(hagent_socket(a));
	int64_t s = isession_open(fd, "one");
	long uid = hdb_query_long(db, "SELECT owner_uid FROM pgcoord.sessions WHERE id = %lld",
				  (long long)s);
	int64_t dead = hdb_query_long(db, "SELECT max(id) + 1000 FROM pgcoord.sessions");
	define_lone(db);
	claim_mix_setup(db, "g", uid, s);
	claim_mix_setup(db, "a", uid, s);
	claim_mix_setup(db, "o", uid, s);
	char keys[64];

	/* "a": one call at a time, each its own transaction */
	long t0 = tokens_drawn(db);
	char alone[4096] = "";
	for (size_t i = 0; i < NCLAIM_MIX; i++) {
		const struct mixed_claim *c = &claim_mix[i];
		prefixed_keys(keys, sizeof(keys), "a", c->keys);
		char *row = hdb_query_value(
		    db,
		    "SELECT public.lone(format('SELECT %%s FROM (SELECT NULL::text AS err_state, "
		    "NULL::text AS err_message, * FROM pgcoord.permit_claim_as(%ld, false, %%L, "
		    "%%L, ''{%s}'', %lld, ''test'', ''uncertain'', NULL, %s, ''test'')) r', "
		    "$r$" CLAIM_ROW "$r$, 'a-%s', '%s'), '" CLAIM_RAISED "')",
		    uid, c->weights, (long long)(c->dead_session ? dead : s), c->limit, c->id,
		    keys);
		snprintf(alone + strlen(alone), sizeof(alone) - strlen(alone), "%s%s",
			 i ? "\n" : "", row);
		free(row);
	}
	long alone_tokens = tokens_drawn(db) - t0;

	/* "o": one call at a time, each by the agent's statement for a group
	 * of one (permit_claim_as itself, its own arguments) */
	t0 = tokens_drawn(db);
	char one[4096] = "";
	for (size_t i = 0; i < NCLAIM_MIX; i++) {
		const struct mixed_claim *c = &claim_mix[i];
		prefixed_keys(keys, sizeof(keys), "o", c->keys);
		char *row = hdb_query_value(
		    db,
		    "SELECT public.lone(format('SELECT %%s FROM (SELECT 1, NULL::text, NULL::text, "
		    "c.* FROM pgcoord.permit_claim_as(%ld::bigint, false::boolean, %%L::text, "
		    "%%L::text[], ''{%s}''::integer[], %lld::bigint, ''test''::text, "
		    "''uncertain''::text, NULL::bytea, %s::integer, ''test''::text) "
		    "c) r(member, err_state, err_message)', $r$" CLAIM_ROW
		    "$r$, 'o-%s', '%s'), '" CLAIM_RAISED "')",
		    uid, c->weights, (long long)(c->dead_session ? dead : s), c->limit, c->id,
		    keys);
		snprintf(one + strlen(one), sizeof(one) - strlen(one), "%s%s", i ? "\n" : "", row);
		free(row);
	}
	cr_assert_str_eq(one, alone, "a group of one:\n%s\nalone:\n%s", one, alone);
	cr_assert_eq(tokens_drawn(db) - t0, alone_tokens);

	/* "g": the same claims as one group, one statement */
	char ids[256] = "", klist[512] = "", wlist[256] = "", sessions[256] = "", limits[128] = "",
	     uids[256] = "";
	for (size_t i = 0; i < NCLAIM_MIX; i++) {
		const struct mixed_claim *c = &claim_mix[i];
		const char *sep = i ? "," : "";
		prefixed_keys(keys, sizeof(keys), "g", c->keys);
		snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), "%s'g-%s'", sep, c->id);
		snprintf(klist + strlen(klist), sizeof(klist) - strlen(klist), "%s'%s'", sep, keys);
		snprintf(wlist + strlen(wlist), sizeof(wlist) - strlen(wlist), "%s'{%s}'", sep,
			 c->weights);
		snprintf(sessions + strlen(sessions), sizeof(sessions) - strlen(sessions), "%s%lld",
			 sep, (long long)(c->dead_session ? dead : s));
		snprintf(limits + strlen(limits), sizeof(limits) - strlen(limits), "%s%s", sep,
			 c->limit);
		snprintf(uids + strlen(uids), sizeof(uids) - strlen(uids), "%s%ld", sep, uid);
	}
	t0 = tokens_drawn(db);
	char *grouped = hdb_query_value(
	    db,
	    "SELECT string_agg(" CLAIM_ROW ", E'\\n' ORDER BY member) || '#' || count(*) FROM "
	    "pgcoord.permit_claim_group(ARRAY[%s]::bigint[], array_fill(false, ARRAY[%zu]), "
	    "ARRAY[%s], ARRAY[%s], ARRAY[%s], ARRAY[%s]::bigint[], array_fill('test'::text, "
	    "ARRAY[%zu]), array_fill('uncertain'::text, ARRAY[%zu]), array_fill(NULL::bytea, "
	    "ARRAY[%zu]), ARRAY[%s]::integer[], array_fill('test'::text, ARRAY[%zu]))",
	    uids, NCLAIM_MIX, ids, klist, wlist, sessions, NCLAIM_MIX, NCLAIM_MIX, NCLAIM_MIX,
	    limits, NCLAIM_MIX);
	char want[4200];
	snprintf(want, sizeof(want), "%s#%zu", alone, NCLAIM_MIX);
	cr_assert_str_eq(grouped, want, "in a group:\n%s\nalone:\n%s", grouped, want);
	free(grouped);
	cr_assert_eq(tokens_drawn(db) - t0, alone_tokens, "tokens drawn: %ld in a group, %ld alone",
		     tokens_drawn(db) - t0, alone_tokens);

	/* what each answer says, not only that both agree */
	static const char *const says[] = {
	    "|admitted|true|held|reserved|true|test|true|||||",
	    "|denied|false|||false||false||q|5|0|",
	    "|denied|false|||false||false||hot|3|2|",
	    "|held|true|held|reserved|true|test|true|||||",
	    "|unknown_quota|false|||false||false||zz|||",
	    "PCSEX||false|||false||false|||||this connection's session",
	    "PCINV||false|||false||false|||||keys must be distinct",
	    "|denied|false|||false||false||two|5|5|"};
	for (size_t i = 0; i < sizeof(says) / sizeof(says[0]); i++)
		cr_assert(strstr(alone, says[i]), "no \"%s\" in:\n%s", says[i], alone);

	/* the same rows either way */
	char *g = claim_rows_of(db, "g"), *al = claim_rows_of(db, "a"), *o = claim_rows_of(db, "o");
	cr_assert_str_eq(g, al, "group rows:\n%s\nlone rows:\n%s", g, al);
	cr_assert_str_eq(o, al, "group of one rows:\n%s\nlone rows:\n%s", o, al);
	free(g);
	free(al);
	free(o);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'g-hot'"),
		     3);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'g-two'"),
		     5);
	/* fencing tokens in arrival order on the hot key */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM (SELECT token, lag(token) OVER (ORDER "
				    "BY substr(id, 3)::int) AS prev FROM pgcoord.permits WHERE id "
				    "IN ('g-1', 'g-2', 'g-8')) t WHERE token > prev"),
		     2);

	/* judged in memory: the set-based members' permit rows went in
	 * without a subtransaction each (one xmin), the per-call limit alone */
	cr_assert_eq(hdb_query_long(db, "SELECT count(DISTINCT xmin::text) FROM pgcoord.permits "
					"WHERE id IN ('g-1', 'g-2', 'g-8', 'g-12')"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(DISTINCT xmin::text) FROM pgcoord.permits "
					"WHERE id IN ('g-1', 'g-10')"),
		     2);

	/* one id twice: the second sees the first (both judged alone) */
	char *twice = hdb_query_value(
	    db,
	    "SELECT string_agg(status || ':' || token, ',' ORDER BY member) FROM "
	    "pgcoord.permit_claim_group('{%ld,%ld,%ld}', '{f,f,f}', '{g-d,g-d,g-e}', "
	    "'{\"{g-rk}\",\"{g-rk}\",\"{g-rk}\"}', '{\"{1}\",\"{1}\",\"{1}\"}', "
	    "'{%lld,%lld,%lld}', '{t,t,t}', '{uncertain,uncertain,uncertain}', '{NULL,NULL,NULL}', "
	    "'{NULL,NULL,NULL}', '{t,t,t}')",
	    uid, uid, uid, (long long)s, (long long)s, (long long)s);
	long td = hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'g-d'"),
	     te = hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 'g-e'");
	char want_twice[128];
	snprintf(want_twice, sizeof(want_twice), "admitted:%ld,held:%ld,admitted:%ld", td, td, te);
	cr_assert_str_eq(twice, want_twice);
	cr_assert_gt(te, td);
	free(twice);

	/* keys that do not parse: that member's own error, the others judged */
	char *unparsed = hdb_query_value(
	    db,
	    "SELECT string_agg(coalesce(err_state, '') || ':' || coalesce(status::text, ''), ',' "
	    "ORDER "
	    "BY "
	    "member) FROM pgcoord.permit_claim_group('{%ld,%ld}', '{f,f}', '{g-f,g-u}', "
	    "'{\"{g-rk}\",\"{g-rk\"}', '{\"{1}\",\"{1}\"}', '{%lld,%lld}', '{t,t}', "
	    "'{uncertain,uncertain}', '{NULL,NULL}', '{NULL,NULL}', '{t,t}')",
	    uid, uid, (long long)s, (long long)s);
	cr_assert_str_eq(unparsed, ":admitted,22P02:");
	free(unparsed);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'g-rk'"),
		     4);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * Statements of one kind in flight (group_statements_max): on one hot key,
 * calls that find the bound reached wait in the agent and ride the next
 * statement, rather than each taking a pool connection to queue on the
 * quota row in the database.
 */

#define NHOT 32

static void send_hot_claims(int fd, uint32_t msgid0, int from, int to, const char *key)
{
	for (int i = from; i < to; i++) {
		char id[64];
		struct iparams p;
		snprintf(id, sizeof(id), "%s-%d", key, i);
		claim_params(&p, id, key);
		cr_assert(hraw_send_request(fd, msgid0 + (uint32_t)i, "permit.claim", p.sb.data,
					    p.sb.size));
		iparams_destroy(&p);
	}
}

static long claims_on_lock(struct harness_db *db)
{
	return hdb_query_long(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
				  "current_database() AND query LIKE '%%pgcoord.permit_claim_%%' "
				  "AND wait_event_type = 'Lock'");
}

Test(groups, claims_on_a_hot_key_wait_for_the_statements_in_flight)
{
	static const char *const args[] = {
	    "--pool-size", "8", "--group-statements-max", "2", "--metrics-listen",
	    "127.0.0.1:0", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-hot", args);
	int fd = iconnect(hagent_socket(a));
	struct outcome out[NHOT];

	isession_open(fd, "hot");
	iquota_set(fd, "hot", 100);

	/* two statements take the bound and wait on the held row; the rest
	 * must wait in the agent, not on the row with six more connections */
	PGconn *holder = hold_quota(db, "hot");
	send_hot_claims(fd, 5000, 0, 1, "hot");
	wait_claim_on_lock(db);
	send_hot_claims(fd, 5000, 1, 2, "hot");
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT (count(*) = 2)::int FROM pg_stat_activity WHERE datname = "
			    "current_database() AND query LIKE '%%pgcoord.permit_claim_%%' "
			    "AND wait_event_type = 'Lock'"),
		  "the second statement did not reach the held row");
	send_hot_claims(fd, 5000, 2, NHOT, "hot");
	hsleep_ms(300); /* every claim is read, and would have been sent */
	cr_assert_eq(claims_on_lock(db), 2, "more statements than the bound reached the row");
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight{kind=\"claim\"}"), 2);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"),
		     NHOT - 2);
	end_hold(holder);
	read_answers(fd, 5000, NHOT, out);

	for (int i = 0; i < NHOT; i++)
		cr_assert_str_eq(out[i].what, "admitted", "claim %d: %s", i, out[i].what);
	/* the held ones went together, in the statement after the first */
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight_peak{kind=\"claim\"}"),
		     2);
	cr_assert_eq(metric(a, "pgcoord_permit_groups_total{kind=\"claim\"}"), 3);
	cr_assert_eq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), NHOT - 2);
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight{kind=\"claim\"}"), 0);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'hot'"),
		     NHOT);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'hot-%%' AND released_at IS NULL"),
		     NHOT);
	cr_assert_eq(audit_rows(db, "hot", "admitted"), NHOT);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A claim held behind a statement that waits out its time is answered by
 * its own deadline, as it would have been waiting on the row itself. */
Test(groups, a_held_claim_keeps_its_own_deadline)
{
	static const char *const args[] = {
	    "--pool-size", "4", "--group-statements-max", "1", "--query-timeout-ms", "1000", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-late", args);
	int fd = iconnect(hagent_socket(a));

	isession_open(fd, "late");
	iquota_set(fd, "stuck", 10);

	PGconn *holder = hold_quota(db, "stuck");
	send_hot_claims(fd, 6000, 0, 1, "stuck");
	wait_claim_on_lock(db);
	hsleep_ms(200);
	int64_t sent = hnow_ms();
	send_hot_claims(fd, 6000, 1, 2, "stuck");
	read_both_timed_out(fd, 6000, 6001, sent, 1000);
	end_hold(holder);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'stuck-%%'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'stuck'"),
		     0);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The bound holds back only calls on a key in flight: a claim on a quiet
 * key goes at once while the hot key's claims wait in the agent. */
Test(groups, a_claim_on_another_key_is_not_held_behind_a_hot_key)
{
	static const char *const args[] = {
	    "--pool-size", "4", "--group-statements-max", "1", "--metrics-listen",
	    "127.0.0.1:0", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-quiet", args);
	int fd = iconnect(hagent_socket(a));
	struct outcome hot[8], quiet[1];

	isession_open(fd, "quiet");
	iquota_set(fd, "hot", 100);
	iquota_set(fd, "calm", 100);

	PGconn *holder = hold_quota(db, "hot");
	send_hot_claims(fd, 7000, 0, 1, "hot");
	wait_claim_on_lock(db);
	send_hot_claims(fd, 7000, 1, 8, "hot");
	hsleep_ms(200); /* every hot claim is read, and held */
	int64_t sent = hnow_ms();
	send_hot_claims(fd, 7100, 0, 1, "calm");
	read_answers(fd, 7100, 1, quiet);
	int64_t waited = hnow_ms() - sent;
	cr_assert_str_eq(quiet[0].what, "admitted");
	cr_assert_lt(waited, 2000, "the quiet claim was answered after %lld ms", (long long)waited);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'calm-0' "
					"AND released_at IS NULL"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'calm'"),
		     1);
	cr_assert_eq(audit_rows(db, "calm", "admitted"), 1);
	/* the hot ones are still waiting: one statement on the row, the
	 * other seven in the agent, and only they count as held */
	cr_assert_eq(claims_on_lock(db), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'hot-%%'"),
		     0);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"), 7);

	end_hold(holder);
	read_answers(fd, 7000, 8, hot);
	for (int i = 0; i < 8; i++)
		cr_assert_str_eq(hot[i].what, "admitted", "claim %d: %s", i, hot[i].what);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'hot'"),
		     8);
	cr_assert_eq(audit_rows(db, "hot", "admitted"), 8);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/*
 * Statements of one kind in flight on any key (group_kind_statements_max):
 * past the bound a call waits in the agent even on a key nobody else
 * names, and the calls that waited go together in the next statement.
 * Quotas "sp-<i>" of limit 1, claim "sp-<i>" on its own key.
 */
#define NSPREAD 24

static void send_spread_claim(int fd, uint32_t msgid, int i)
{
	char id[32];
	struct iparams p;
	snprintf(id, sizeof(id), "sp-%d", i);
	claim_params(&p, id, id);
	cr_assert(hraw_send_request(fd, msgid, "permit.claim", p.sb.data, p.sb.size));
	iparams_destroy(&p);
}

static void spread_quotas(int fd)
{
	for (int i = 0; i < NSPREAD; i++) {
		char key[32];
		snprintf(key, sizeof(key), "sp-%d", i);
		iquota_set(fd, key, 1);
	}
}

static void wait_claims_on_lock(struct harness_db *db, int n)
{
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT (count(*) = %d)::int FROM pg_stat_activity WHERE datname = "
			    "current_database() AND query LIKE '%%pgcoord.permit_claim_%%' "
			    "AND wait_event_type = 'Lock'",
			    n),
		  "%d claim statements did not reach the held rows", n);
}

static void assert_spread_admitted(struct harness_db *db)
{
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.quotas WHERE key LIKE "
					"'sp-%%' AND in_flight = 1"),
		     NSPREAD);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'sp-%%' AND released_at IS NULL"),
		     NSPREAD);
	cr_assert_eq(audit_rows(db, "sp", "admitted"), NSPREAD);
	assert_conserved(db);
}

Test(groups, calls_on_any_key_wait_for_the_next_statement_of_their_kind)
{
	static const char *const args[] = {"--pool-size",
					   "8",
					   "--group-kind-statements-max",
					   "2",
					   "--query-timeout-ms",
					   "20000",
					   "--metrics-listen",
					   "127.0.0.1:0",
					   NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-kind", args);
	int fd = iconnect(hagent_socket(a));
	struct outcome out[NSPREAD];

	isession_open(fd, "spread");
	spread_quotas(fd);

	/* two statements take the bound, each on its own held row; sp-1 is
	 * answered last, at msgid 8100, the others at 8000 + i */
	PGconn *hold0 = hold_quota(db, "sp-0"), *hold1 = hold_quota(db, "sp-1");
	send_spread_claim(fd, 8000, 0);
	wait_claims_on_lock(db, 1);
	send_spread_claim(fd, 8100, 1);
	wait_claims_on_lock(db, 2);
	for (int i = 2; i < NSPREAD; i++)
		send_spread_claim(fd, 8000 + (uint32_t)i, i);
	hsleep_ms(300); /* every claim is read, and would have been sent */
	/* their rows are free, yet none was sent: they wait in the agent */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'sp-%%'"),
		     0);
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight{kind=\"claim\"}"), 2);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"),
		     NSPREAD - 2);

	/* the first statement ends: the held claims go as the next one,
	 * while the second still waits on its row */
	end_hold(hold0);
	read_answers(fd, 8000, 1, out);
	read_answers(fd, 8002, NSPREAD - 2, out + 2);
	cr_assert_str_eq(out[0].what, "admitted");
	for (int i = 2; i < NSPREAD; i++)
		cr_assert_str_eq(out[i].what, "admitted", "claim %d: %s", i, out[i].what);
	cr_assert_eq(metric(a, "pgcoord_permit_groups_total{kind=\"claim\"}"), 3);
	cr_assert_eq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), NSPREAD - 2);
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight{kind=\"claim\"}"), 1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'sp-1'"),
		     0);

	end_hold(hold1);
	read_answers(fd, 8100, 1, out + 1);
	cr_assert_str_eq(out[1].what, "admitted");
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight_peak{kind=\"claim\"}"),
		     2);
	assert_spread_admitted(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Below group_kind_statements_max, a call waits too for the statement of
 * its kind in flight when the recent statements carried
 * group_kind_hold_members calls on average (heavy load: the bound adapts
 * to one), and goes at once beside it after small ones (light load). */
Test(groups, large_recent_groups_tighten_the_bound_per_kind_to_one)
{
	static const char *const args[] = {"--pool-size",
					   "8",
					   "--group-kind-statements-max",
					   "2",
					   "--group-kind-hold-members",
					   "2",
					   "--query-timeout-ms",
					   "20000",
					   "--metrics-listen",
					   "127.0.0.1:0",
					   NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-adapt", args);
	int fd = iconnect(hagent_socket(a));
	struct outcome out[9];

	isession_open(fd, "spread");
	spread_quotas(fd);
	PGconn *hold0 = hold_quota(db, "sp-0"), *hold1 = hold_quota(db, "sp-1"),
	       *hold2 = hold_quota(db, "sp-2");
	/* after a statement of one (the average so far: 1), the second goes
	 * beside it */
	send_spread_claim(fd, 8000, 0);
	wait_claims_on_lock(db, 1);
	send_spread_claim(fd, 8001, 1);
	wait_claims_on_lock(db, 2);
	/* past the bound of two, six wait, then go as one statement of six,
	 * on sp-2's held row, when the first ends: the average is now
	 * 1 + (6 - 1) / 4 = 2.25 */
	for (int i = 2; i < 8; i++)
		send_spread_claim(fd, 8000 + (uint32_t)i, i);
	hsleep_ms(300);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"), 6);
	end_hold(hold0);
	read_answers(fd, 8000, 1, out);
	cr_assert_str_eq(out[0].what, "admitted");
	wait_claims_on_lock(db, 2);
	cr_assert_eq(metric(a, "pgcoord_permit_group_largest{kind=\"claim\"}"), 6);

	/* one statement is left in flight, and a claim on a free key waits
	 * for it */
	end_hold(hold1);
	read_answers(fd, 8001, 1, out + 1);
	cr_assert_str_eq(out[1].what, "admitted");
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight{kind=\"claim\"}"), 1);
	send_spread_claim(fd, 8008, 8);
	hsleep_ms(300);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"), 7);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'sp-8'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id = 'sp-8'"),
		     0);

	/* it goes when that statement ends, and everything is written once */
	end_hold(hold2);
	read_answers(fd, 8002, 7, out + 2);
	for (int i = 2; i < 9; i++)
		cr_assert_str_eq(out[i].what, "admitted", "claim %d: %s", i, out[i].what);
	cr_assert_eq(metric(a, "pgcoord_permit_groups_total{kind=\"claim\"}"), 4);
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight_peak{kind=\"claim\"}"),
		     2);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.quotas WHERE key LIKE "
					"'sp-%%' AND in_flight = 1"),
		     9);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'sp-%%' AND released_at IS NULL"),
		     9);
	cr_assert_eq(audit_rows(db, "sp", "admitted"), 9);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* group_kind_statements_max 0 is the behaviour without the bound: every
 * call on a key none in flight names goes at once, however many are in
 * flight. */
Test(groups, no_bound_per_kind_sends_each_call_at_once)
{
	static const char *const args[] = {"--pool-size",
					   "8",
					   "--group-kind-statements-max",
					   "0",
					   "--query-timeout-ms",
					   "20000",
					   "--metrics-listen",
					   "127.0.0.1:0",
					   NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-nokind", args);
	int fd = iconnect(hagent_socket(a));
	struct outcome out[NSPREAD];
	PGconn *hold[4];
	char key[32];

	isession_open(fd, "spread");
	spread_quotas(fd);
	for (int i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "sp-%d", i);
		hold[i] = hold_quota(db, key);
		send_spread_claim(fd, 8000 + (uint32_t)i, i);
	}
	wait_claims_on_lock(db, 4);
	/* the rest go at once, past four statements in flight */
	for (int i = 4; i < NSPREAD; i++)
		send_spread_claim(fd, 8000 + (uint32_t)i, i);
	read_answers(fd, 8004, NSPREAD - 4, out + 4);
	for (int i = 4; i < NSPREAD; i++)
		cr_assert_str_eq(out[i].what, "admitted", "claim %d: %s", i, out[i].what);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"), 0);
	cr_assert_geq(metric(a, "pgcoord_permit_group_statements_in_flight_peak{kind=\"claim\"}"),
		      5);
	cr_assert_eq(metric(a, "pgcoord_permit_group_statements_in_flight{kind=\"claim\"}"), 4);
	for (int i = 0; i < 4; i++)
		end_hold(hold[i]);
	read_answers(fd, 8000, 4, out);
	for (int i = 0; i < 4; i++)
		cr_assert_str_eq(out[i].what, "admitted", "claim %d: %s", i, out[i].what);
	assert_spread_admitted(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A claim held for its kind is sent, once the statement ahead of it ends,
 * with what is left of its own deadline; on a row that stays locked it is
 * answered by then, and nothing of it stays. */
Test(groups, a_call_held_for_its_kind_keeps_its_own_deadline)
{
	static const char *const args[] = {"--pool-size",
					   "4",
					   "--group-kind-statements-max",
					   "1",
					   "--query-timeout-ms",
					   "2000",
					   "--metrics-listen",
					   "127.0.0.1:0",
					   NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-kdl", args);
	int fd = iconnect(hagent_socket(a));

	isession_open(fd, "late");
	spread_quotas(fd);

	PGconn *hold0 = hold_quota(db, "sp-0"), *hold1 = hold_quota(db, "sp-1");
	send_spread_claim(fd, 9000, 0);
	wait_claims_on_lock(db, 1);
	hsleep_ms(200);
	int64_t sent = hnow_ms();
	send_spread_claim(fd, 9001, 1);
	hsleep_ms(100);
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"claim\"}"), 1,
		     "the claim on a free key was not held for its kind");
	cr_assert_eq(claims_on_lock(db), 1);
	read_both_timed_out(fd, 9000, 9001, sent, 2000);
	end_hold(hold0);
	end_hold(hold1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'sp-%%'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT coalesce(sum(in_flight), 0) FROM pgcoord.quotas "
					"WHERE key LIKE 'sp-%%'"),
		     0);
	cr_assert_eq(audit_rows(db, "sp", "admitted"), 0);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* Reads the answers to msgids first..first+n-1 of permit.release: each
 * must say released. */
static void read_released(int fd, uint32_t first, int n)
{
	for (int got = 0; got < n;) {
		msgpack_unpacked u;
		struct pgc_message m;
		char err[128];
		msgpack_unpacked_init(&u);
		cr_assert_eq(hraw_recv_msg(fd, CALL_MS, &u), HRAW_MSG, "%d of %d answers came", got,
			     n);
		cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
		if (m.type == PGC_RPC_RESPONSE && m.msgid >= first &&
		    m.msgid < first + (uint32_t)n) {
			cr_assert_null(m.error, "release %u failed", m.msgid);
			const msgpack_object *v = pgc_map_get(m.result, "released");
			cr_assert(v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean,
				  "release %u: not released", m.msgid);
			got++;
		}
		msgpack_unpacked_destroy(&u);
	}
}

/* A release names no key: the keys its permit was admitted with, which
 * the agent remembered, hold it back while a release statement naming
 * one of them is in flight; a release on another key goes at once. */
Test(groups, a_release_on_a_hot_key_is_held_by_its_remembered_keys)
{
	static const char *const args[] = {"--pool-size",
					   "4",
					   "--group-statements-max",
					   "1",
					   "--group-kind-statements-max",
					   "0",
					   "--query-timeout-ms",
					   "20000",
					   "--metrics-listen",
					   "127.0.0.1:0",
					   NULL};
	static const char *const hot[] = {"rh-0", "rh-1"}, *const calm[] = {"rc-0"};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "grp-remember", args);
	int fd = iconnect(hagent_socket(a));
	struct outcome out[2];

	isession_open(fd, "rel");
	iquota_set(fd, "rh", 10);
	iquota_set(fd, "rc", 10);
	send_hot_claims(fd, 10000, 0, 2, "rh");
	read_answers(fd, 10000, 2, out);
	send_hot_claims(fd, 10010, 0, 1, "rc");
	read_answers(fd, 10010, 1, out);
	cr_assert_str_eq(out[0].what, "admitted");

	PGconn *holder = hold_quota(db, "rh");
	send_releases(fd, 10100, hot, 1);
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
			    "current_database() AND query LIKE '%%pgcoord.permit_release_%%' "
			    "AND wait_event_type = 'Lock'"),
		  "no release reached the held quota row");
	send_releases(fd, 10101, hot + 1, 1);
	hsleep_ms(200); /* read, and held */
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"release\"}"), 1,
		     "the second release on the hot key was not held");

	int64_t sent = hnow_ms();
	send_releases(fd, 10200, calm, 1);
	read_released(fd, 10200, 1);
	cr_assert_lt(hnow_ms() - sent, 2000, "the release on another key waited");
	cr_assert_eq(metric(a, "pgcoord_permit_group_members_held_total{kind=\"release\"}"), 1);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
				    "current_database() AND query LIKE "
				    "'%%pgcoord.permit_release_%%' AND wait_event_type = 'Lock'"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id LIKE "
					"'rh-%%' AND released_at IS NULL"),
		     2);

	end_hold(holder);
	read_released(fd, 10100, 2);
	cr_assert_eq(metric(a, "pgcoord_permit_groups_total{kind=\"release\"}"), 3);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id IN "
					"('rh-0', 'rh-1', 'rc-0') AND released_at IS NOT NULL"),
		     3);
	cr_assert_eq(hdb_query_long(db, "SELECT coalesce(sum(in_flight), 0) FROM pgcoord.quotas "
					"WHERE key IN ('rh', 'rc')"),
		     0);
	cr_assert_eq(audit_rows(db, "rh", "released"), 2);
	cr_assert_eq(audit_rows(db, "rc", "released"), 1);
	assert_conserved(db);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

/* A group of releases whose permit changes while the statement waits for
 * it (here marked uncertain by an operator's transaction that held its
 * row): the one statement had already lowered the quota's counter, cannot
 * take that back in the same statement, and fails as a whole with
 * serialization_failure, so nothing of it stays; the permit still counts,
 * and the other permit of the group is still held. */
Test(groups, a_release_group_whose_permit_changes_under_it_leaves_nothing)
{
	struct harness_db *db = idb_migrated();
	long uid = (long)getuid();
	hdb_exec(db, "SELECT pgcoord.agent_register('fast', 1, 'host', 1, 'v', 600000, NULL)");
	long s = hdb_query_long(
	    db, "SELECT pgcoord.session_open('fast', 1, 'a', 600000, false, %ld)", uid);
	hdb_exec(db, "SELECT pgcoord.quota_set('chg', 5, NULL, 'test')");
	for (int i = 1; i <= 2; i++)
		cr_assert_eq(
		    hdb_query_long(db,
				   "SELECT count(*) FROM pgcoord.permit_claim_as(%ld, false, "
				   "'chg-%d', '{chg}', '{1}', %ld, 'fast', 'uncertain', NULL, "
				   "NULL, 'test') WHERE status = 'admitted'",
				   uid, i, s),
		    1);

	/* the operator's transaction holds chg-2's row and will mark it */
	PGconn *op = hdb_connect(db);
	PQclear(PQexec(op, "BEGIN"));
	PGresult *res = PQexec(op, "SELECT 1 FROM pgcoord.permits WHERE id = 'chg-2' FOR UPDATE");
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(op));
	PQclear(res);

	PGconn *rel = hdb_connect(db);
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "SELECT * FROM pgcoord.permit_release_fast('{%ld,%ld}', '{chg-1,chg-2}', "
		 "'{%ld,%ld}', '{f,f}', '{NULL,NULL}', '{NULL,NULL}')",
		 uid, uid, s, s);
	cr_assert(PQsendQuery(rel, sql), "%s", PQerrorMessage(rel));
	cr_assert(iwait_sql(db, CALL_MS,
			    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
			    "current_database() AND query LIKE '%%permit_release_fast%%' "
			    "AND wait_event_type = 'Lock'"),
		  "the release did not reach the held permit row");
	res = PQexec(op, "UPDATE pgcoord.permits SET state = 'uncertain', "
			 "uncertain_reason = 'test', state_at = now() WHERE id = 'chg-2'");
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQerrorMessage(op));
	PQclear(res);
	PQclear(PQexec(op, "COMMIT"));

	res = PQgetResult(rel);
	cr_assert_eq(PQresultStatus(res), PGRES_FATAL_ERROR, "the group did not fail");
	cr_assert_str_eq(PQresultErrorField(res, PG_DIAG_SQLSTATE), "40001");
	PQclear(res);
	while ((res = PQgetResult(rel)))
		PQclear(res);
	PQfinish(rel);
	PQfinish(op);

	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'chg'"),
		     2, "the failed group's decrement stayed");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE "
					"(id = 'chg-1' AND state = 'held') OR "
					"(id = 'chg-2' AND state = 'uncertain')"),
		     2, "the failed group released a permit");
	assert_conserved(db);
	hdb_drop(db);
}
