/*
 * test_paging.c — keyset paging of the six lists (lease.list, quota.list,
 * fleet.agents, fleet.sessions, permit.list, record.list) against a real
 * agent: more rows than a page, walked page by page with next_cursor;
 * every row exactly once, in key order, as the database holds it; the
 * last page without a cursor; an over-cap limit and malformed cursors
 * refused as invalid_params while the agent keeps serving.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

/* Every test starts its own agent and database (start) and ends them
 * (finish), also when an assertion ends it early. */
static void finish(void);
TestSuite(paging, .timeout = 120, .fini = finish);

#define ROWS 250

/* What one list's rows are called and how a row is written down, the same
 * way as the SQL that reads them from the database. */
struct list {
	const char *method;
	const char *items;	/* the reply's array */
	const char *key, *key2; /* the row's key (key2: the second column, or NULL) */
	const char *field;	/* one more field, compared with the database */
	const char *filter;	/* a string filter (key=value), or NULL */
	const char *filter_val;
};

static void put_cell(char **buf, size_t *len, size_t *cap, const msgpack_object *v)
{
	char tmp[64];
	const char *s = tmp;
	size_t n;

	if (v->type == MSGPACK_OBJECT_STR) {
		s = v->via.str.ptr;
		n = v->via.str.size;
	} else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		n = (size_t)snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v->via.u64);
	} else if (v->type == MSGPACK_OBJECT_NIL) {
		n = (size_t)snprintf(tmp, sizeof(tmp), "nil");
	} else {
		cr_assert_fail("a cell of type %d", v->type);
		return;
	}
	while (*len + n + 2 > *cap) {
		*cap = *cap ? *cap * 2 : 4096;
		*buf = realloc(*buf, *cap);
		cr_assert_not_null(*buf);
	}
	if (n) /* an empty str may have no bytes at all (ptr NULL) */
		memcpy(*buf + *len, s, n);
	*len += n;
	(*buf)[*len] = '\0';
}

static void put_sep(char **buf, size_t *len, size_t *cap, char sep)
{
	static const msgpack_object empty = {.type = MSGPACK_OBJECT_STR};
	put_cell(buf, len, cap, &empty);
	(*buf)[(*len)++] = sep;
	(*buf)[*len] = '\0';
}

static const msgpack_object *get(const msgpack_object *map, const char *key)
{
	const msgpack_object *v = pgc_map_get(map, key);
	cr_assert_not_null(v, "no %s in a row", key);
	return v;
}

/*
 * Walks lst with pages of `limit` rows (0: the default, expecting pages
 * of `expect`); returns "key[/key2]=field,…" in the order the pages gave
 * them. Every page but the last is full and has a next_cursor.
 */
static char *walk(int fd, const struct list *lst, int64_t limit, int64_t expect, int *pages)
{
	char *out = NULL, *cursor = NULL;
	size_t len = 0, cap = 0;
	struct ireply r;

	*pages = 0;
	put_sep(&out, &len, &cap, ',');
	len = 0;
	out[0] = '\0';
	for (;;) {
		struct iparams p;
		uint32_t n = (limit ? 1 : 0) + (cursor ? 1 : 0) + (lst->filter ? 1 : 0);
		msgpack_packer *pk = iparams_begin(&p, n);
		if (limit)
			pgc_pack_kv_int(pk, "limit", limit);
		if (cursor)
			pgc_pack_kv_str(pk, "cursor", cursor);
		if (lst->filter)
			pgc_pack_kv_str(pk, lst->filter, lst->filter_val);
		const msgpack_object *res = icall_ok(fd, lst->method, &p, &r);
		iparams_destroy(&p);
		const msgpack_object *items = pgc_map_get(res, lst->items);
		cr_assert(items && items->type == MSGPACK_OBJECT_ARRAY, "%s: no %s", lst->method,
			  lst->items);
		cr_assert_leq(items->via.array.size, (uint32_t)expect, "%s: a page of %u rows",
			      lst->method, items->via.array.size);
		for (uint32_t i = 0; i < items->via.array.size; i++) {
			const msgpack_object *row = &items->via.array.ptr[i];
			if (len)
				put_sep(&out, &len, &cap, ',');
			put_cell(&out, &len, &cap, get(row, lst->key));
			if (lst->key2) {
				put_sep(&out, &len, &cap, '/');
				put_cell(&out, &len, &cap, get(row, lst->key2));
			}
			put_sep(&out, &len, &cap, '=');
			put_cell(&out, &len, &cap, get(row, lst->field));
		}
		(*pages)++;
		free(cursor);
		cursor = NULL;
		const msgpack_object *next = pgc_map_get(res, "next_cursor");
		cr_assert_not_null(next, "%s: a page without next_cursor", lst->method);
		if (next->type == MSGPACK_OBJECT_NIL) {
			ireply_destroy(&r);
			break;
		}
		cr_assert_eq(next->type, MSGPACK_OBJECT_STR);
		cr_assert_eq(items->via.array.size, (uint32_t)expect,
			     "%s: a page with a next_cursor has %u rows, not a full page",
			     lst->method, items->via.array.size);
		cursor = strndup(next->via.str.ptr, next->via.str.size);
		ireply_destroy(&r);
		cr_assert_lt(*pages, 1000, "%s: the pages do not end", lst->method);
	}
	return out;
}

static void refused(int fd, const char *method, const char *key, const char *sval, int64_t ival,
		    const char *mention)
{
	struct iparams p;
	struct ireply r;
	msgpack_packer *pk = iparams_begin(&p, 1);

	if (sval)
		pgc_pack_kv_str(pk, key, sval);
	else
		pgc_pack_kv_int(pk, key, ival);
	icall(fd, method, &p, &r);
	iparams_destroy(&p);
	ierr(&r, "invalid_params", false, (const char *const[]){mention, NULL});
	ireply_destroy(&r);
	/* and the agent keeps serving on the same connection */
	icall_ok(fd, "agent.ping", NULL, &r);
	ireply_destroy(&r);
}

/* The checks every list gets: pages of 100 (and of 1 and of the cap), all
 * rows once, equal to `want` (the database's rows in key order), and the
 * refusals. */
static void check_list(int fd, const struct list *lst, const char *want, int64_t max, int64_t def)
{
	int pages;
	char *got = walk(fd, lst, 100, 100, &pages);
	cr_assert_str_eq(got, want, "%s in pages of 100", lst->method);
	cr_assert_eq(pages, 3, "%s: %d pages of 100", lst->method, pages);
	free(got);
	got = walk(fd, lst, 7, 7, &pages);
	cr_assert_str_eq(got, want, "%s in pages of 7", lst->method);
	free(got);
	got = walk(fd, lst, max, max, &pages);
	cr_assert_str_eq(got, want, "%s in pages of %lld", lst->method, (long long)max);
	cr_assert_eq(pages, 1);
	free(got);
	got = walk(fd, lst, 0, def, &pages);
	cr_assert_str_eq(got, want, "%s in pages of the default", lst->method);
	cr_assert_eq(pages, def == 100 ? 3 : 1, "%s: %d default pages", lst->method, pages);
	free(got);

	refused(fd, lst->method, "limit", NULL, max + 1, "limit");
	refused(fd, lst->method, "limit", NULL, 0, "limit");
	refused(fd, lst->method, "cursor", "nonsense", 0, "cursor");
	refused(fd, lst->method, "cursor", "", 0, "cursor");
	refused(fd, lst->method, "cursor", "x.6162", 0, "cursor"); /* another list's tag */
	refused(fd, lst->method, "cursor", "q.zz", 0, "cursor");
	refused(fd, lst->method, "cursor", "q.00", 0, "cursor");
	refused(fd, lst->method, "cursor", "r.61.62.63", 0, "cursor");
	refused(fd, lst->method, "cursor", NULL, 5, "cursor");
}

static struct harness_db *db;
static struct hagent *ag;
static int fd;

static void start(void)
{
	db = idb_migrated();
	ag = hagent_start(db, "paging", NULL);
	iwait_janitor(ag);
	fd = iconnect(hagent_socket(ag));
}

static void finish(void)
{
	if (!ag)
		return;
	close(fd);
	int rc = hagent_stop(ag);
	cr_expect_eq(rc, 0, "the agent exited %d: %s", rc, hagent_log(ag));
	hagent_destroy(ag);
	hdb_drop(db);
	ag = NULL;
}

static char *want(const char *sql)
{
	char *s = hdb_query_value(db, "%s", sql);
	cr_assert_not_null(s);
	return s;
}

Test(paging, quota_list)
{
	start();
	for (int i = 0; i < ROWS; i++) {
		char key[32];
		snprintf(key, sizeof(key), "quota-%03d", i);
		iquota_set(fd, key, i + 1);
	}
	char *w = want("SELECT string_agg(key || '=' || \"limit\", ',' ORDER BY key) "
		       "FROM pgcoord.quotas");
	const struct list lst = {"quota.list", "quotas", "key", NULL, "limit", NULL, NULL};
	check_list(fd, &lst, w, 1000, 100);
	free(w);

	/* a page is a snapshot of its own statement: a quota created before
	 * the cursor is not seen, one after it is, and none twice */
	struct iparams p;
	struct ireply r;
	pgc_pack_kv_int(iparams_begin(&p, 1), "limit", 100);
	const msgpack_object *res = icall_ok(fd, "quota.list", &p, &r);
	iparams_destroy(&p);
	char *cursor = istr(res, "next_cursor");
	ireply_destroy(&r);
	iquota_set(fd, "quota-000a", 1); /* before the cursor */
	iquota_set(fd, "quota-249a", 1); /* after it */
	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_int(pk, "limit", 1000);
	pgc_pack_kv_str(pk, "cursor", cursor);
	res = icall_ok(fd, "quota.list", &p, &r);
	iparams_destroy(&p);
	const msgpack_object *q = pgc_map_get(res, "quotas");
	cr_assert_eq(q->via.array.size, ROWS - 100 + 1);
	cr_assert(istr_is(&q->via.array.ptr[0], "key", "quota-100"));
	cr_assert(istr_is(&q->via.array.ptr[ROWS - 100], "key", "quota-249a"));
	cr_assert(iis_nil(res, "next_cursor"));
	ireply_destroy(&r);
	free(cursor);
}

Test(paging, lease_list)
{
	start();
	hdb_exec(db,
		 "INSERT INTO pgcoord.leases (name, epoch, ttl_ms, expires_at) "
		 "SELECT 'lease-' || lpad(i::text, 3, '0'), i, 1000, now() "
		 "FROM generate_series(1, %d) i",
		 ROWS);
	char *w = want("SELECT string_agg(name || '=' || epoch, ',' ORDER BY name) "
		       "FROM pgcoord.leases");
	cr_assert_geq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.leases"), ROWS);
	const struct list lst = {"lease.list", "leases", "name", NULL, "epoch", NULL, NULL};
	check_list(fd, &lst, w, 1000, 100);
	free(w);
}

Test(paging, fleet_agents)
{
	start();
	hdb_exec(db,
		 "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		 "expires_at, stopped_at) "
		 "SELECT 'agent-' || lpad(i::text, 3, '0'), i, 'h', i, 'v', now(), now() "
		 "FROM generate_series(1, %d) i",
		 ROWS);
	char *w = want("SELECT string_agg(replica_id || '=' || incarnation, ',' "
		       "ORDER BY replica_id) FROM pgcoord.agents");
	const struct list lst = {"fleet.agents", "agents", "replica_id", NULL,
				 "incarnation",	 NULL,	   NULL};
	check_list(fd, &lst, w, 1000, 100);
	free(w);
}

Test(paging, fleet_sessions)
{
	start();
	/* open for an hour, of a replica that is not running: nothing renews
	 * or closes them while the test reads */
	hdb_exec(db, "INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, "
		     "expires_at) VALUES ('elsewhere', 1, 'h', 1, 'v', now() + interval '1 hour')");
	hdb_exec(db,
		 "INSERT INTO pgcoord.sessions (replica_id, incarnation, name, expires_at) "
		 "SELECT 'elsewhere', 1, 'sess-' || i, now() + interval '1 hour' "
		 "FROM generate_series(1, %d) i",
		 ROWS);
	/* and one closed, which is not listed */
	hdb_exec(db, "INSERT INTO pgcoord.sessions (replica_id, incarnation, expires_at, "
		     "closed_at) VALUES ('elsewhere', 1, now() + interval '1 hour', now())");
	char *w = want("SELECT string_agg(id || '=' || name, ',' ORDER BY id) "
		       "FROM pgcoord.live_sessions");
	cr_assert_geq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.live_sessions"), ROWS);
	const struct list lst = {"fleet.sessions", "sessions", "session", NULL, "name", NULL, NULL};
	check_list(fd, &lst, w, 1000, 100);
	char *w2 = want("SELECT string_agg(id || '=' || name, ',' ORDER BY id) "
			"FROM pgcoord.live_sessions");
	cr_assert_str_eq(w, w2, "the sessions changed while the test read them");
	free(w);
	free(w2);
	/* a session id cursor must be a number */
	refused(fd, "fleet.sessions", "cursor", "s.6162", 0, "cursor");
}

Test(paging, permit_list)
{
	start();
	pgcoord *c = NULL;
	cr_assert_eq(pgcoord_connect(hagent_socket(ag), ICALL_MS, &c), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(c, "claimer", ICALL_MS, NULL), PGCOORD_OK);
	iquota_set(fd, "pool", 10000);
	for (int i = 0; i < ROWS; i++) {
		char id[32];
		snprintf(id, sizeof(id), "permit-%03d", i);
		pgcoord_claim *cl = NULL;
		cr_assert_eq(iclaim_one(c, id, "pool", ICALL_MS, &cl), PGCOORD_OK, "%s: %s", id,
			     pgcoord_last_message(c));
		pgcoord_claim_free(cl);
	}
	/* a released one is listed only when asked for by state */
	pgcoord_claim *gone = NULL;
	cr_assert_eq(iclaim_one(c, "permit-gone", "pool", ICALL_MS, &gone), PGCOORD_OK);
	pgcoord_claim_free(gone);
	cr_assert_eq(pgcoord_permit_release(c, "permit-gone", 0, NULL, ICALL_MS, NULL), PGCOORD_OK);
	char *w = want("SELECT string_agg(id || '=' || token, ',' ORDER BY id) "
		       "FROM pgcoord.permits WHERE state <> 'released'");
	const struct list lst = {"permit.list", "permits", "id", NULL, "token", NULL, NULL};
	check_list(fd, &lst, w, 10000, 1000);
	free(w);
	/* the filters hold on every page */
	w = want("SELECT string_agg(id || '=' || token, ',' ORDER BY id) "
		 "FROM pgcoord.permits WHERE state <> 'released'");
	const struct list by_quota = {"permit.list", "permits", "id",  NULL,
				      "token",	     "quota",	"pool"};
	int pages;
	char *got = walk(fd, &by_quota, 100, 100, &pages);
	cr_assert_str_eq(got, w);
	free(got);
	free(w);
	pgcoord_close(c);
}

Test(paging, record_list)
{
	start();
	isession_open(fd, "writer");
	for (int i = 0; i < ROWS; i++) {
		struct iparams p;
		struct ireply r;
		char key[32];
		snprintf(key, sizeof(key), "rec-%03d", i);
		msgpack_packer *pk = iparams_begin(&p, 3);
		pgc_pack_kv_str(pk, "kind", i % 2 ? "job" : "task");
		pgc_pack_kv_str(pk, "key", key);
		pgc_pack_kv_str(pk, "state", "new");
		icall_ok(fd, "record.put", &p, &r);
		iparams_destroy(&p);
		ireply_destroy(&r);
	}
	char *w = want("SELECT string_agg(kind || '/' || key || '=' || token, ',' "
		       "ORDER BY kind, key) FROM pgcoord.records");
	const struct list lst = {"record.list", "records", "kind", "key", "token", NULL, NULL};
	check_list(fd, &lst, w, 10000, 1000);
	free(w);
	/* a filtered walk crosses from one page to the next within its kind */
	w = want("SELECT string_agg(kind || '/' || key || '=' || token, ',' ORDER BY kind, key) "
		 "FROM pgcoord.records WHERE kind = 'task'");
	const struct list tasks = {"record.list", "records", "kind", "key",
				   "token",	  "kind",    "task"};
	int pages;
	char *got = walk(fd, &tasks, 50, 50, &pages);
	cr_assert_str_eq(got, w);
	cr_assert_eq(pages, 3);
	free(got);
	free(w);
	/* a record cursor has two parts */
	refused(fd, "record.list", "cursor", "r.6162", 0, "cursor");
}
