/*
 * test_authz.c — who may do what, tried as an attacker with a shell account
 * would: clients connect as unprivileged uids (a forked child setuid()s,
 * connects and hands the socket back, so SO_PEERCRED names that uid) to an
 * agent whose socket anyone may reach, and every refusal is checked to
 * change nothing in the database.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

TestSuite(authz, .timeout = 120);

/* Two unprivileged uids; neither needs a passwd entry for SO_PEERCRED. */
#define UID_A 65534u
#define UID_B 65533u

/*
 * Request params from a format: one letter per key, then key and value:
 * s string, i int, b bool, q a one-quota list [{key: value}], x bin.
 */
static void pmap(struct iparams *p, const char *fmt, ...)
{
	va_list ap;
	msgpack_packer *pk = iparams_begin(p, (uint32_t)strlen(fmt));

	va_start(ap, fmt);
	for (const char *f = fmt; *f; f++) {
		const char *key = va_arg(ap, const char *);
		const char *s;
		switch (*f) {
		case 's':
			pgc_pack_kv_str(pk, key, va_arg(ap, const char *));
			break;
		case 'i':
			pgc_pack_kv_int(pk, key, va_arg(ap, int64_t));
			break;
		case 'b':
			pgc_pack_kv_bool(pk, key, va_arg(ap, int));
			break;
		case 'x':
			s = va_arg(ap, const char *);
			pgc_pack_cstr(pk, key);
			msgpack_pack_bin(pk, strlen(s));
			msgpack_pack_bin_body(pk, s, strlen(s));
			break;
		case 'q':
			pgc_pack_cstr(pk, key);
			msgpack_pack_array(pk, 1);
			msgpack_pack_map(pk, 1);
			pgc_pack_kv_str(pk, "key", va_arg(ap, const char *));
			break;
		default:
			cr_assert_fail("bad pmap format %c", *f);
		}
	}
	va_end(ap);
}

static void resume(int fd, int64_t id, struct ireply *r)
{
	struct iparams p;

	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", id);
	icall(fd, "session.open", &p, r);
	iparams_destroy(&p);
}

/*
 * Everything a refused call could have changed, leaving out what heartbeats
 * move: sessions (with owners), permits and their quotas and audit, records
 * and their audit, quotas, leases.
 */
static char *picture(struct harness_db *db)
{
	return hdb_query_value(
	    db,
	    "SELECT concat_ws(E'\\n', "
	    " (SELECT string_agg(concat_ws(',', id, name, replica_id, incarnation, owner_uid, "
	    "   closed_at, close_reason), '; ' ORDER BY id) FROM pgcoord.sessions), "
	    " (SELECT string_agg(concat_ws(',', id, token, owner_session, owner_replica, state, "
	    "   phase, md5(intent), uncertain_reason, state_at, released_at), '; ' ORDER BY id) "
	    "   FROM pgcoord.permits), "
	    " (SELECT string_agg(concat_ws(',', permit_id, key, weight), '; ' "
	    "   ORDER BY permit_id, key) FROM pgcoord.permit_quotas), "
	    " (SELECT count(*) || '/' || coalesce(max(id), 0) FROM pgcoord.permit_events), "
	    " (SELECT string_agg(concat_ws(',', key, \"limit\", in_flight, updated_at), '; ' "
	    "   ORDER BY key) FROM pgcoord.quotas), "
	    " (SELECT string_agg(concat_ws(',', kind, key, state, md5(data), owner_session, "
	    "   token, terminal, updated_at), '; ' ORDER BY kind, key) FROM pgcoord.records), "
	    " (SELECT count(*) || '/' || coalesce(max(id), 0) FROM pgcoord.record_events), "
	    " (SELECT string_agg(concat_ws(',', name, holder_session, epoch), '; ' "
	    "   ORDER BY name) FROM pgcoord.leases))");
}

static void assert_forbidden(const struct ireply *r, const char *mention)
{
	ierr(r, "forbidden", false, (const char *const[]){mention, NULL});
}

/* --- sessions ------------------------------------------------------------ */

Test(authz, a_session_records_its_uid_and_resumes_only_for_that_uid)
{
	const char *const args[] = {"--socket-mode", "0666", "--session-grace-ms", "30000", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "authz-resume", args);
	iwait_janitor(ag);
	int fa = iconnect_as(hagent_socket(ag), UID_A);
	int64_t sa = isession_open(fa, "victim");
	struct ireply r;
	const msgpack_object *res;

	cr_assert_eq(hdb_query_long(db, "SELECT owner_uid FROM pgcoord.sessions WHERE id = %lld",
				    (long long)sa),
		     UID_A);
	/* the agent's own session is owned by the agent's user (root here) */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE internal "
					"AND owner_uid = 0 AND replica_id = 'authz-resume'"),
		     1);
	/* fleet.sessions shows the owner, as the view does */
	res = icall_ok(fa, "fleet.sessions", NULL, &r);
	const msgpack_object *list = pgc_map_get(res, "sessions");
	bool seen = false;
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *s = &list->via.array.ptr[i];
		if (iint(s, "session") == sa) {
			cr_assert_eq(iint(s, "owner_uid"), UID_A);
			seen = true;
		}
	}
	cr_assert(seen, "fleet.sessions does not list session %lld", (long long)sa);
	ireply_destroy(&r);
	/* and so does pgcoordctl sessions */
	char *out = NULL;
	const char *const ctl[] = {ictl_bin(), "--socket", hagent_socket(ag), "sessions", NULL};
	cr_assert_eq(hrun(ctl, &out), 0, "%s", out);
	cr_assert(strstr(out, "UID") && strstr(out, "65534") && strstr(out, "victim"), "%s", out);
	free(out);
	close(fa); /* detached: resumable within the grace */

	char *before = picture(db);
	int fb = iconnect_as(hagent_socket(ag), UID_B);
	resume(fb, sa, &r);
	assert_forbidden(&r, "belongs to uid 65534");
	ireply_destroy(&r);
	/* refused, it attached nothing: the intruder has no session */
	icall(fb, "session.keepalive", NULL, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	char *after = picture(db);
	cr_assert_str_eq(before, after);
	cr_assert(strstr(hagent_log(ag), "uid 65533 refused session.open"), "%s", hagent_log(ag));

	/* the owner still resumes it */
	fa = iconnect_as(hagent_socket(ag), UID_A);
	resume(fa, sa, &r);
	res = iok(&r, "the owner's resume");
	cr_assert_eq(iint(res, "session"), sa);
	cr_assert(ibool(res, "resumed"));
	ireply_destroy(&r);
	close(fa);

	/* and root, an admin, may resume anyone's */
	int fr = iconnect_as(hagent_socket(ag), 0);
	resume(fr, sa, &r);
	iok(&r, "an admin's resume");
	ireply_destroy(&r);

	free(before);
	free(after);
	close(fb);
	close(fr);
	hagent_destroy(ag);
	hdb_drop(db);
}

Test(authz, a_predecessors_session_resumes_only_for_its_uid)
{
	const char *const args[] = {"--socket-mode",
				    "0666",
				    "--heartbeat-interval-ms",
				    "200",
				    "--session-ttl-ms",
				    "20000",
				    "--session-grace-ms",
				    "10000",
				    NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *first = hagent_start(db, "authz-crash", args);
	int fa = iconnect_as(hagent_socket(first), UID_A);
	int64_t sa = isession_open(fa, "crash-victim");
	struct ireply r;

	hagent_kill(first, SIGKILL);
	cr_assert_eq(hagent_wait(first, 5000), 128 + SIGKILL);
	close(fa);
	struct hagent *second = hagent_start(db, "authz-crash", args);
	/* the picture is taken once the successor's own rows have settled */
	iwait_janitor(second);

	/* the successor holds it without knowing its owner: the database does */
	char *before = picture(db);
	int fb = iconnect_as(hagent_socket(second), UID_B);
	resume(fb, sa, &r);
	assert_forbidden(&r, "belongs to uid 65534");
	ireply_destroy(&r);
	char *after = picture(db);
	cr_assert_str_eq(before, after);
	/* now the agent knows the owner, and refuses again without asking */
	resume(fb, sa, &r);
	assert_forbidden(&r, "belongs to uid 65534");
	ireply_destroy(&r);

	fa = iconnect_as(hagent_socket(second), UID_A);
	resume(fa, sa, &r);
	cr_assert_eq(iint(iok(&r, "the owner's resume"), "session"), sa);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND "
				    "owner_uid = %u AND closed_at IS NULL",
				    (long long)sa, UID_A),
		     1);
	free(before);
	free(after);
	close(fa);
	close(fb);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}

Test(authz, client_uids_narrows_who_may_open_sessions)
{
	const char *const args[] = {"--socket-mode", "0666", "--client-uids", "65534", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "authz-clients", args);
	iwait_janitor(ag);
	struct ireply r;

	/* a listed uid, and root (an admin), may */
	int fa = iconnect_as(hagent_socket(ag), UID_A);
	isession_open(fa, "listed");
	int fr = iconnect_as(hagent_socket(ag), 0);
	isession_open(fr, "admin");

	/* anyone else keeps the read-only views but opens no session */
	int fb = iconnect_as(hagent_socket(ag), UID_B);
	char *before = picture(db);
	icall(fb, "session.open", NULL, &r);
	assert_forbidden(&r, "uid 65533 may not open sessions");
	ireply_destroy(&r);
	char *after = picture(db);
	cr_assert_str_eq(before, after);
	icall_ok(fb, "fleet.sessions", NULL, &r);
	ireply_destroy(&r);
	cr_assert_eq(
	    hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE owner_uid = %u", UID_B),
	    0);
	free(before);
	free(after);
	close(fa);
	close(fb);
	close(fr);
	hagent_destroy(ag);
	hdb_drop(db);
}

struct world {
	struct harness_db *db;
	struct hagent *ag;
	int fa, fb, fr; /* uid A, uid B, root */
};

/* A call that must be refused with code (mentioning `mention`) and change
 * nothing in the database. Frees p. */
static void refused_cell(struct world *w, int fd, const char *method, struct iparams *p,
			 const char *code, const char *mention)
{
	struct ireply r;
	char *before = picture(w->db);

	icall(fd, method, p, &r);
	ierr(&r, code, false, (const char *const[]){mention, NULL});
	ireply_destroy(&r);
	char *after = picture(w->db);
	cr_assert_str_eq(before, after, "%s changed the database although refused", method);
	free(before);
	free(after);
	if (p)
		iparams_destroy(p);
}

/* A call that must succeed without changing anything (a read). Frees p. */
static void read_cell(struct world *w, int fd, const char *method, struct iparams *p)
{
	struct ireply r;
	char *before = picture(w->db);

	icall_ok(fd, method, p, &r);
	ireply_destroy(&r);
	char *after = picture(w->db);
	cr_assert_str_eq(before, after, "%s changed the database", method);
	free(before);
	free(after);
	if (p)
		iparams_destroy(p);
}

/* A call that must succeed; the caller destroys *r. Frees p. */
static const msgpack_object *ok_cell(int fd, const char *method, struct iparams *p,
				     struct ireply *r)
{
	const msgpack_object *res = icall_ok(fd, method, p, r);
	if (p)
		iparams_destroy(p);
	return res;
}

/* --- per-session limits ---------------------------------------------------- */

static void lease_call(int fd, const char *method, const char *name, const char *flag,
		       struct ireply *r)
{
	struct iparams p;
	if (flag)
		pmap(&p, "sb", "name", name, flag, true);
	else
		pmap(&p, "s", "name", name);
	icall(fd, method, &p, r);
	iparams_destroy(&p);
}

Test(authz, a_session_keeps_only_so_many_lease_watches_and_waiting_campaigns)
{
	const char *const args[] = {"--max-lease-watches-per-session", "2",
				    "--max-lease-campaigns-per-session", "2", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "authz-limits", args);
	iwait_janitor(ag);
	int holder = iconnect(hagent_socket(ag)), fd = iconnect(hagent_socket(ag));
	struct ireply r;
	const char *names[] = {"l1", "l2", "l3"};

	/* another session holds every lease, so campaigns keep waiting */
	isession_open(holder, "holder");
	for (int i = 0; i < 3; i++) {
		lease_call(holder, "lease.acquire", names[i], "wait", &r);
		cr_assert(ibool(iok(&r, "the holder's acquire"), "leader"));
		ireply_destroy(&r);
	}
	isession_open(fd, "greedy");
	for (int i = 0; i < 2; i++) {
		lease_call(fd, "lease.acquire", names[i], "wait", &r);
		cr_assert(ibool(iok(&r, "a campaign"), "campaigning"));
		ireply_destroy(&r);
	}
	/* asking again for a lease it already waits for is no new campaign */
	lease_call(fd, "lease.acquire", "l1", "wait", &r);
	iok(&r, "the same campaign again");
	ireply_destroy(&r);
	lease_call(fd, "lease.acquire", "l3", "wait", &r);
	ierr(&r, "busy", true, (const char *const[]){"max_lease_campaigns_per_session", NULL});
	ireply_destroy(&r);
	/* releasing one makes room */
	lease_call(fd, "lease.release", "l2", NULL, &r);
	iok(&r, "release of a campaign");
	ireply_destroy(&r);
	lease_call(fd, "lease.acquire", "l3", "wait", &r);
	cr_assert(ibool(iok(&r, "a campaign after a release"), "campaigning"));
	ireply_destroy(&r);

	for (int i = 0; i < 2; i++) {
		lease_call(fd, "lease.status", names[i], "watch", &r);
		iok(&r, "a watch");
		ireply_destroy(&r);
	}
	lease_call(fd, "lease.status", "l1", "watch", &r);
	iok(&r, "watching a watched name again");
	ireply_destroy(&r);
	lease_call(fd, "lease.status", "l3", "watch", &r);
	ierr(&r, "busy", true, (const char *const[]){"max_lease_watches_per_session", NULL});
	ireply_destroy(&r);

	/* the limits are per session: another session has its own */
	int other = iconnect(hagent_socket(ag));
	isession_open(other, "other");
	lease_call(other, "lease.status", "l3", "watch", &r);
	iok(&r, "another session's watch");
	ireply_destroy(&r);
	close(holder);
	close(fd);
	close(other);
	hagent_destroy(ag);
	hdb_drop(db);
}

/* --- the reply budget ------------------------------------------------------ */

/* max_output_bytes 256 KiB leaves a reply budget of 192 KiB: three records
 * of 60 KiB data fit in a reply, a fourth does not. */
Test(authz, a_list_over_the_reply_budget_answers_too_large_and_recovery_pages)
{
	const char *const args[] = {"--max-output-bytes", "262144", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "authz-budget", args);
	iwait_janitor(ag);
	int owner = iconnect(hagent_socket(ag)), fd = iconnect(hagent_socket(ag));
	struct iparams p;
	struct ireply r;
	const msgpack_object *res;
	char *data = malloc(60 * 1024 + 1);

	memset(data, 'd', 60 * 1024);
	data[60 * 1024] = '\0';
	isession_open(owner, "big-writer");
	for (int i = 0; i < 5; i++) {
		char key[16];
		snprintf(key, sizeof(key), "big-%d", i);
		pmap(&p, "sssx", "kind", "big", "key", key, "state", "new", "data", data);
		ok_cell(owner, "record.put", &p, &r);
		ireply_destroy(&r);
	}

	/* refused before a reply is built, saying how to page */
	pmap(&p, "s", "kind", "big");
	refused_cell(&(struct world){.db = db}, fd, "record.list", &p, "too_large", "limit: 3");
	pmap(&p, "si", "kind", "big", "limit", 3);
	res = ok_cell(fd, "record.list", &p, &r);
	cr_assert_eq(pgc_map_get(res, "records")->via.array.size, 3);
	cr_assert(ibool(res, "truncated"));
	ireply_destroy(&r);

	/* recovery takes what fits one reply and says how many remain */
	ok_cell(owner, "session.close", NULL, &r);
	ireply_destroy(&r);
	isession_open(fd, "rescuer");
	res = ok_cell(fd, "record.recover", NULL, &r);
	cr_assert_eq(pgc_map_get(res, "adopted")->via.array.size, 3);
	cr_assert_eq(iint(res, "remaining"), 2);
	ireply_destroy(&r);
	res = ok_cell(fd, "record.recover", NULL, &r);
	cr_assert_eq(pgc_map_get(res, "adopted")->via.array.size, 2);
	cr_assert_eq(iint(res, "remaining"), 0);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(
			 db, "SELECT count(*) FROM pgcoord.records r JOIN pgcoord.live_sessions s "
			     "ON s.id = r.owner_session WHERE r.kind = 'big' AND s.name = "
			     "'rescuer'"),
		     5);
	free(data);
	close(owner);
	close(fd);
	hagent_destroy(ag);
	hdb_drop(db);
}

/* --- the matrix ------------------------------------------------------------ */

/* permit.get's intent or record.get's data as text (NULL: nil), and its
 * redacted flag. */
static char *secret_of(const msgpack_object *obj, const char *key, bool *redacted)
{
	const msgpack_object *v = pgc_map_get(obj, key);
	*redacted = ibool(obj, "redacted");
	cr_assert(v, "no %s", key);
	if (v->type == MSGPACK_OBJECT_NIL)
		return NULL;
	cr_assert_eq(v->type, MSGPACK_OBJECT_BIN);
	return strndup(v->via.bin.ptr, v->via.bin.size);
}

static void expect_permit_intent(int fd, const char *id, const char *want)
{
	struct iparams p;
	struct ireply r;
	bool redacted;

	pmap(&p, "s", "id", id);
	const msgpack_object *res = ok_cell(fd, "permit.get", &p, &r);
	char *got = secret_of(pgc_map_get(res, "permit"), "intent", &redacted);
	if (want) {
		cr_assert(got && strcmp(got, want) == 0, "intent of %s: %s", id, got);
		cr_assert_not(redacted);
	} else {
		cr_assert_null(got, "another uid's intent leaked: %s", got);
		cr_assert(redacted);
	}
	free(got);
	ireply_destroy(&r);
}

static void expect_record_data(int fd, const char *key, const char *want)
{
	struct iparams p;
	struct ireply r;
	bool redacted;

	pmap(&p, "ss", "kind", "job", "key", key);
	const msgpack_object *res = ok_cell(fd, "record.get", &p, &r);
	char *got = secret_of(pgc_map_get(res, "record"), "data", &redacted);
	if (want) {
		cr_assert(got && strcmp(got, want) == 0, "data of %s: %s", key, got);
		cr_assert_not(redacted);
	} else {
		cr_assert_null(got, "another uid's data leaked: %s", got);
		cr_assert(redacted);
	}
	free(got);
	ireply_destroy(&r);
}

/* uid's permit id (intent "intent-<id>") and record job/<id> ("data-<id>"). */
static void own_work(int fd, const char *id)
{
	struct iparams p;
	struct ireply r;
	char intent[64], data[64];

	snprintf(intent, sizeof(intent), "intent-%s", id);
	snprintf(data, sizeof(data), "data-%s", id);
	pmap(&p, "sqx", "id", id, "quotas", "q", "intent", intent);
	ok_cell(fd, "permit.claim", &p, &r);
	ireply_destroy(&r);
	pmap(&p, "sssxs", "kind", "job", "key", id, "state", "new", "data", data, "permit", id);
	ok_cell(fd, "record.put", &p, &r);
	ireply_destroy(&r);
}

Test(authz, every_method_for_two_uids_and_root_on_own_and_others_objects)
{
	const char *const args[] = {"--socket-mode", "0666", "--session-grace-ms", "30000", NULL};
	struct world w;
	struct iparams p;
	struct ireply r;
	const msgpack_object *res;

	w.db = idb_migrated();
	w.ag = hagent_start(w.db, "authz-matrix", args);
	iwait_janitor(w.ag);
	w.fa = iconnect_as(hagent_socket(w.ag), UID_A);
	w.fb = iconnect_as(hagent_socket(w.ag), UID_B);
	w.fr = iconnect_as(hagent_socket(w.ag), 0);
	isession_open(w.fa, "a");
	int64_t sb = isession_open(w.fb, "b");
	isession_open(w.fr, "root");

	/* root sets up the quota; each uid claims a permit and puts a record */
	pmap(&p, "si", "key", "q", "limit", 5);
	ok_cell(w.fr, "quota.set", &p, &r);
	ireply_destroy(&r);
	own_work(w.fa, "pa");
	own_work(w.fb, "pb");

	/* read: anyone, and nothing changes */
	const char *reads[] = {"agent.hello",	 "agent.ping", "agent.status", "fleet.agents",
			       "fleet.sessions", "lease.list", "quota.list",   "permit.list",
			       "permit.check",	 "record.list"};
	for (size_t i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
		read_cell(&w, w.fa, reads[i], NULL);
		read_cell(&w, w.fb, reads[i], NULL);
		read_cell(&w, w.fr, reads[i], NULL);
	}
	pmap(&p, "s", "key", "q");
	read_cell(&w, w.fa, "quota.get", &p);
	pmap(&p, "s", "key", "q");
	read_cell(&w, w.fa, "quota.why", &p);
	pmap(&p, "s", "name", "pgcoord.janitor");
	read_cell(&w, w.fa, "lease.status", &p);
	pmap(&p, "s", "id", "pb");
	read_cell(&w, w.fa, "permit.history", &p);

	/* read of intents and data: own in full, others' redacted, root all */
	expect_permit_intent(w.fa, "pa", "intent-pa");
	expect_permit_intent(w.fa, "pb", NULL);
	expect_permit_intent(w.fb, "pa", NULL);
	expect_permit_intent(w.fr, "pb", "intent-pb");
	expect_record_data(w.fa, "pa", "data-pa");
	expect_record_data(w.fa, "pb", NULL);
	expect_record_data(w.fr, "pa", "data-pa");
	pmap(&p, "s", "kind", "job");
	res = ok_cell(w.fa, "record.list", &p, &r);
	const msgpack_object *list = pgc_map_get(res, "records");
	cr_assert_eq(list->via.array.size, 2);
	for (uint32_t i = 0; i < 2; i++) {
		const msgpack_object *rec = &list->via.array.ptr[i];
		char *key = istr(rec, "key");
		bool mine = strcmp(key, "pa") == 0;
		cr_assert_eq(ibool(rec, "redacted"), !mine, "record.list redaction of %s", key);
		cr_assert_eq(iis_nil(rec, "data"), !mine, "record.list data of %s", key);
		free(key);
	}
	ireply_destroy(&r);

	/* admin: refused to a uid, and nothing changes */
	pmap(&p, "si", "key", "q", "limit", 100);
	refused_cell(&w, w.fa, "quota.set", &p, "forbidden", "admin call");
	pmap(&p, "sb", "id", "pb", "override", true);
	refused_cell(&w, w.fa, "permit.release", &p, "forbidden", "admin call");
	pmap(&p, "sssb", "id", "pb", "outcome", "gone", "evidence", "x", "override", true);
	refused_cell(&w, w.fa, "permit.resolve", &p, "forbidden", "admin call");

	/* owner: another uid's live objects */
	pmap(&p, "ss", "id", "pb", "phase", "dispatched");
	refused_cell(&w, w.fa, "permit.update", &p, "forbidden", "pb");
	pmap(&p, "ss", "id", "pb", "reason", "lost sight");
	refused_cell(&w, w.fa, "permit.mark_uncertain", &p, "forbidden", "pb");
	pmap(&p, "s", "id", "pb");
	refused_cell(&w, w.fa, "permit.release", &p, "forbidden", "belongs to uid 65533");
	pmap(&p, "sss", "id", "pb", "outcome", "gone", "evidence", "saw it exit");
	refused_cell(&w, w.fa, "permit.resolve", &p, "forbidden", "belongs to uid 65533");
	pmap(&p, "sss", "kind", "job", "key", "pb", "state", "taken");
	refused_cell(&w, w.fa, "record.put", &p, "conflict", "owned by session");
	pmap(&p, "sss", "kind", "job", "key", "pb", "state", "taken");
	refused_cell(&w, w.fa, "record.update", &p, "forbidden", "owned by session");
	pmap(&p, "sss", "kind", "job", "key", "pb", "state", "done");
	refused_cell(&w, w.fa, "record.settle", &p, "forbidden", "owned by session");
	int fa2 = iconnect_as(hagent_socket(w.ag), UID_A);
	pmap(&p, "i", "resume", sb);
	refused_cell(&w, fa2, "session.open", &p, "forbidden", "belongs to uid 65533");
	close(fa2);

	/* leases are the session's own: a release of another's is a no-op */
	pmap(&p, "s", "name", "lead");
	ok_cell(w.fa, "lease.acquire", &p, &r);
	ireply_destroy(&r);
	char *before = picture(w.db);
	pmap(&p, "s", "name", "lead");
	res = ok_cell(w.fb, "lease.release", &p, &r);
	cr_assert_not(ibool(res, "released"));
	ireply_destroy(&r);
	char *after = picture(w.db);
	cr_assert_str_eq(before, after);
	free(before);
	free(after);

	/* a non-admin's limit never changes an existing quota, even denied */
	pmap(&p, "sqi", "id", "pa-2", "quotas", "q", "limit", 1000);
	ok_cell(w.fa, "permit.claim", &p, &r);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(w.db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'q'"),
		     5);
	/* (applied, a limit of 0 would deny this claim and shut the quota) */
	pmap(&p, "sqi", "id", "pa-3", "quotas", "q", "limit", 0);
	res = ok_cell(w.fa, "permit.claim", &p, &r);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(w.db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'q'"),
		     5);
	/* ...but creates a missing one */
	pmap(&p, "sqi", "id", "pa-4", "quotas", "fresh", "limit", 3);
	ok_cell(w.fa, "permit.claim", &p, &r);
	ireply_destroy(&r);
	cr_assert_eq(
	    hdb_query_long(w.db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'fresh'"), 3);

	/* a retirement speaks for its own uid only: B retires next-1 and
	 * next-2; A still claims next-1, B's own claim of next-2 is refused */
	pmap(&p, "s", "id", "next-1");
	icall(w.fb, "permit.release", &p, &r);
	ierr(&r, "not_found", false, (const char *const[]){"retired", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	pmap(&p, "s", "id", "next-2");
	icall(w.fb, "permit.release", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	pmap(&p, "s", "id", "next-1");
	refused_cell(&w, w.fa, "permit.release", &p, "forbidden", "belongs to uid 65533");
	pmap(&p, "sq", "id", "next-1", "quotas", "q");
	res = ok_cell(w.fa, "permit.claim", &p, &r);
	cr_assert(pgc_obj_str_eq(pgc_map_get(res, "status"), "admitted"));
	ireply_destroy(&r);
	cr_assert_eq(
	    hdb_query_long(w.db,
			   "SELECT count(*) FROM pgcoord.permits WHERE id = 'next-1' AND "
			   "state = 'held' AND pgcoord.session_owner_uid(owner_session) = %u",
			   UID_A),
	    1);
	pmap(&p, "sq", "id", "next-2", "quotas", "q");
	refused_cell(&w, w.fb, "permit.claim", &p, "conflict", "was retired");

	/* B's session ends: its permit becomes uncertain, its record's owner is
	 * dead. Another uid can neither resolve nor recover them */
	close(w.fb);
	w.fb = iconnect_as(hagent_socket(w.ag), UID_B);
	pmap(&p, "i", "resume", sb);
	ok_cell(w.fb, "session.open", &p, &r);
	ireply_destroy(&r);
	ok_cell(w.fb, "session.close", NULL, &r);
	ireply_destroy(&r);
	cr_assert(iwait_sql(w.db, 5000,
			    "SELECT count(*) FROM pgcoord.permits WHERE id = 'pb' AND "
			    "state = 'uncertain'"));
	pmap(&p, "sss", "id", "pb", "outcome", "gone", "evidence", "saw it exit");
	refused_cell(&w, w.fa, "permit.resolve", &p, "forbidden", "belongs to uid 65533");
	before = picture(w.db);
	pmap(&p, "b", "dry_run", true);
	res = ok_cell(w.fa, "record.recover", &p, &r);
	cr_assert_eq(iint(res, "remaining"), 0);
	ireply_destroy(&r);
	res = ok_cell(w.fa, "record.recover", NULL, &r);
	cr_assert_eq(pgc_map_get(res, "adopted")->via.array.size, 0);
	cr_assert_eq(iint(res, "remaining"), 0);
	ireply_destroy(&r);
	after = picture(w.db);
	cr_assert_str_eq(before, after, "another uid's recovery changed something");
	free(before);
	free(after);

	/* the uid is the principal: a new session of B resolves and recovers
	 * what B's dead session left */
	isession_open(w.fb, "b-again");
	res = ok_cell(w.fb, "record.recover", NULL, &r);
	cr_assert_eq(pgc_map_get(res, "adopted")->via.array.size, 1);
	ireply_destroy(&r);
	pmap(&p, "sss", "id", "pb", "outcome", "running", "evidence", "pid 42 still runs");
	ok_cell(w.fb, "permit.resolve", &p, &r);
	ireply_destroy(&r);
	cr_assert_eq(
	    hdb_query_long(w.db,
			   "SELECT count(*) FROM pgcoord.permits WHERE id = 'pb' AND "
			   "state = 'held' AND pgcoord.session_owner_uid(owner_session) = %u",
			   UID_B),
	    1);
	expect_record_data(w.fb, "pb", "data-pb");

	/* admin: root overrides what belongs to anyone */
	pmap(&p, "ssb", "id", "pb", "reason", "operator", "override", true);
	ok_cell(w.fr, "permit.release", &p, &r);
	ireply_destroy(&r);
	pmap(&p, "si", "key", "q", "limit", 7);
	ok_cell(w.fr, "quota.set", &p, &r);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(w.db, "SELECT \"limit\" FROM pgcoord.quotas WHERE key = 'q'"),
		     7);

	/* every refusal above was logged with the uid */
	cr_assert(strstr(hagent_log(w.ag), "uid 65534 refused permit.release"), "%s",
		  hagent_log(w.ag));
	close(w.fa);
	close(w.fb);
	close(w.fr);
	hagent_destroy(w.ag);
	hdb_drop(w.db);
}

/* --- a claim of another uid's id ------------------------------------------ */

/* The message of error reply r, malloc'd. */
static char *error_message(const struct ireply *r)
{
	cr_assert_not_null(r->m.error);
	return istr(r->m.error, "message");
}

/*
 * A claim (params p, freed) that must be refused `conflict` with the one
 * message that names only the id, change nothing in the database, and tell
 * none of the NULL-terminated secrets (the holder's token, session, uid,
 * replica, intent, quotas).
 */
static void claim_conflict(struct world *w, int fd, struct iparams *p, const char *id,
			   const char *const *secrets)
{
	struct ireply r;
	char want[256];
	char *before = picture(w->db);

	snprintf(want, sizeof(want),
		 "permit id \"%s\" is already in use by another owner; choose another id", id);
	icall(fd, "permit.claim", p, &r);
	ierr(&r, "conflict", false, (const char *const[]){"already in use by another owner", NULL});
	char *msg = error_message(&r);
	cr_assert_str_eq(msg, want);
	for (size_t i = 0; secrets[i]; i++)
		cr_assert_null(strstr(msg, secrets[i]), "the refusal \"%s\" tells %s", msg,
			       secrets[i]);
	cr_assert_eq(r.m.error->via.map.size, 3, "the error map carries more than its three keys");
	free(msg);
	ireply_destroy(&r);
	char *after = picture(w->db);
	cr_assert_str_eq(before, after, "a refused claim of %s changed the database", id);
	free(before);
	free(after);
	iparams_destroy(p);
}

/* A claim (params p, freed) that must answer the grant: status, token, mine. */
static void claim_grant(int fd, struct iparams *p, const char *status, int64_t token, bool mine)
{
	struct ireply r;
	const msgpack_object *res = ok_cell(fd, "permit.claim", p, &r);
	cr_assert(istr_is(res, "status", status), "expected status %s", status);
	cr_assert_eq(iint(res, "token"), token, "the retry got another token");
	cr_assert_eq(ibool(res, "mine"), mine);
	ireply_destroy(&r);
}

/* The permit id as the database holds it: owner uid, session, token, state. */
static char *permit_row(struct harness_db *db, const char *id)
{
	return hdb_query_value(db,
			       "SELECT concat_ws(',', pgcoord.session_owner_uid(owner_session), "
			       "owner_session, token, state) FROM pgcoord.permits WHERE id = '%s'",
			       id);
}

Test(authz, a_claim_of_another_uids_id_is_a_conflict_that_tells_nothing)
{
	const char *const args[] = {"--socket-mode", "0666", "--session-grace-ms", "30000", NULL};
	struct world w;
	struct iparams p;
	struct ireply r;
	const msgpack_object *res;
	char tok[32], sess[32], row_before[128];

	w.db = idb_migrated();
	w.ag = hagent_start(w.db, "authz-claim-1", args);
	struct hagent *other = hagent_start(w.db, "authz-claim-2", args);
	iwait_janitor(w.ag);
	w.fa = iconnect_as(hagent_socket(w.ag), UID_A);
	w.fb = iconnect_as(hagent_socket(w.ag), UID_B);
	w.fr = iconnect_as(hagent_socket(w.ag), 0);
	int64_t sa = isession_open(w.fa, "a");
	isession_open(w.fb, "b");
	isession_open(w.fr, "root");
	int fb2 = iconnect_as(hagent_socket(other), UID_B);
	isession_open(fb2, "b-elsewhere");
	iquota_set(w.fr, "q", 5);
	iquota_set(w.fr, "q2", 5);
	iquota_set(w.fr, "full", 1);

	/* A holds "pa" */
	pmap(&p, "sqx", "id", "pa", "quotas", "q", "intent", "secret-intent");
	res = ok_cell(w.fa, "permit.claim", &p, &r);
	cr_assert(istr_is(res, "status", "admitted"));
	int64_t token = iint(res, "token");
	ireply_destroy(&r);
	snprintf(tok, sizeof(tok), "%lld", (long long)token);
	snprintf(sess, sizeof(sess), "%lld", (long long)sa);
	const char *const secrets[] = {tok, sess, "65534", "authz-claim", "secret", "q:", NULL};
	char *row = permit_row(w.db, "pa");
	snprintf(row_before, sizeof(row_before), "%s", row);
	free(row);
	cr_assert_eq(hdb_query_long(w.db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"),
		     1);

	/* B, through either agent, with the same quotas or others; root too */
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_conflict(&w, w.fb, &p, "pa", secrets);
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_conflict(&w, fb2, &p, "pa", secrets);
	pmap(&p, "sq", "id", "pa", "quotas", "q2");
	claim_conflict(&w, w.fb, &p, "pa", secrets);
	pmap(&p, "sqi", "id", "pa", "quotas", "q", "wait_ms", 1000);
	claim_conflict(&w, w.fb, &p, "pa", secrets);
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_conflict(&w, w.fr, &p, "pa", secrets);
	/* (one claim of a new id on each agent: the refusals were judged by
	 * the same agents that admit) */
	pmap(&p, "sq", "id", "pb-new", "quotas", "q2");
	res = ok_cell(fb2, "permit.claim", &p, &r);
	cr_assert(istr_is(res, "status", "admitted"));
	ireply_destroy(&r);
	row = permit_row(w.db, "pa");
	cr_assert_str_eq(row, row_before, "the refused claims changed the permit");
	free(row);
	cr_assert_eq(hdb_query_long(w.db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"),
		     1);
	cr_assert_eq(hdb_query_long(w.db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					  "permit_id = 'pa'"),
		     1);

	/* A's retries keep the grant: the same session, another agent, a
	 * resumed session */
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_grant(w.fa, &p, "held", token, true);
	int fa2 = iconnect_as(hagent_socket(other), UID_A);
	isession_open(fa2, "a-elsewhere");
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_grant(fa2, &p, "held", token, false);
	close(w.fa);
	w.fa = iconnect_as(hagent_socket(w.ag), UID_A);
	resume(w.fa, sa, &r);
	iok(&r, "resume");
	ireply_destroy(&r);
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_grant(w.fa, &p, "held", token, true);

	/* a waiting claim: A's queued id is B's conflict too, whose message
	 * does not name the waiter's quotas */
	pmap(&p, "sq", "id", "pf", "quotas", "full");
	ok_cell(w.fa, "permit.claim", &p, &r);
	ireply_destroy(&r);
	pmap(&p, "sqi", "id", "pw", "quotas", "full", "wait_ms", 60000);
	res = ok_cell(w.fa, "permit.claim", &p, &r);
	cr_assert(istr_is(res, "status", "queued"));
	ireply_destroy(&r);
	const char *const queue_secrets[] = {sess, "65534", "full", NULL};
	pmap(&p, "sqi", "id", "pw", "quotas", "full", "wait_ms", 60000);
	claim_conflict(&w, w.fb, &p, "pw", queue_secrets);
	pmap(&p, "sqi", "id", "pw", "quotas", "q2", "wait_ms", 60000);
	claim_conflict(&w, fb2, &p, "pw", queue_secrets);
	pmap(&p, "sqi", "id", "pw", "quotas", "full", "wait_ms", 60000);
	res = ok_cell(fa2, "permit.claim", &p, &r);
	cr_assert(istr_is(res, "status", "queued"), "A's retry of its queued id");
	cr_assert_eq(iint(res, "position"), 1);
	cr_assert_not(ibool(res, "mine"));
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(w.db,
				    "SELECT count(*) FROM pgcoord.waiters WHERE id = 'pw' "
				    "AND state = 'queued' AND uid = %u",
				    UID_A),
		     1);

	/* released: B learns only that the id is taken; A is told it was
	 * released, as before */
	pmap(&p, "sq", "id", "pr", "quotas", "q");
	ok_cell(w.fa, "permit.claim", &p, &r);
	ireply_destroy(&r);
	pmap(&p, "s", "id", "pr");
	ok_cell(w.fa, "permit.release", &p, &r);
	ireply_destroy(&r);
	const char *const released_secrets[] = {sess, "65534", "released", NULL};
	pmap(&p, "sq", "id", "pr", "quotas", "q");
	claim_conflict(&w, w.fb, &p, "pr", released_secrets);
	pmap(&p, "sq", "id", "pr", "quotas", "q");
	refused_cell(&w, fa2, "permit.claim", &p, "conflict", "already granted and released");

	/* uncertain: A's session ends; B is still refused, and a new session
	 * of A (a restarted process) still gets the grant */
	ok_cell(w.fa, "session.close", NULL, &r);
	ireply_destroy(&r);
	cr_assert(iwait_sql(w.db, 5000,
			    "SELECT count(*) FROM pgcoord.permits WHERE id = 'pa' AND "
			    "state = 'uncertain'"));
	char *row_uncertain = permit_row(w.db, "pa");
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_conflict(&w, w.fb, &p, "pa", secrets);
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	claim_conflict(&w, fb2, &p, "pa", secrets);
	row = permit_row(w.db, "pa");
	cr_assert_str_eq(row, row_uncertain);
	free(row);
	free(row_uncertain);
	isession_open(w.fa, "a-restarted");
	pmap(&p, "sq", "id", "pa", "quotas", "q");
	res = ok_cell(w.fa, "permit.claim", &p, &r);
	cr_assert(istr_is(res, "status", "held"));
	cr_assert(istr_is(res, "state", "uncertain"));
	cr_assert_eq(iint(res, "token"), token);
	cr_assert_not(ibool(res, "mine"));
	ireply_destroy(&r);
	/* the quota counted A's permits only, through all of it */
	cr_assert_eq(hdb_query_long(w.db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"),
		     1);
	cr_assert_eq(hdb_query_long(w.db, "SELECT count(*) FROM pgcoord.permits_check() "
					  "WHERE problem <> ''"),
		     0);
	close(fa2);
	close(fb2);
	close(w.fa);
	close(w.fb);
	close(w.fr);
	hagent_destroy(other);
	hagent_destroy(w.ag);
	hdb_drop(w.db);
}
