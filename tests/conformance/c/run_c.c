/*
 * run_c.c — runs the clients' conformance scenarios (scenarios.json,
 * format in tests/conformance/README.md) with libpgcoord, through its
 * public API only, against real agents on a real database. Needs
 * tests/harness/with-postgres around it and PGCOORD_TEST_AGENT_BIN.
 *
 *     run_c [--only NAME]... scenarios.msgpack
 *
 * The file is scenarios.json converted by json2msgpack.py. Exit status 0
 * when every vector and scenario passed, 1 otherwise.
 */
#include "client.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_NAMED 8

/* A claim running concurrently until an await step (own zone: the main
 * thread keeps allocating in the run's). */
struct background {
	char name[64];
	pthread_t thread;
	bool running;
	struct conf_client *cl;
	msgpack_zone *zone;
	msgpack_object params;
	int timeout_ms;
	int64_t budget_ms;
	pgcoord_err err;
	struct conf_claim claim;
};

struct ended {
	char client[32], lease[128];
	int64_t at_ms;
};

struct run {
	const struct conf_db *db;
	const char *dir;
	msgpack_zone *zone;
	struct conf_vars vars;
	int nagents, nclients, nbg, nended;
	char agent_names[MAX_NAMED][32];
	struct conf_agent agents[MAX_NAMED];
	char client_names[MAX_NAMED][32];
	struct conf_client clients[MAX_NAMED];
	struct conf_proxy *proxies[MAX_NAMED];
	struct conf_held *held;
	struct background bg[MAX_NAMED];
	struct ended ended[32];
};

static int agent_serial;

/* --- the run --------------------------------------------------------------- */

static bool run_start(struct run *r, const struct conf_db *db, const char *dir,
		      const msgpack_object *agents)
{
	memset(r, 0, sizeof(*r));
	r->db = db;
	r->dir = dir;
	r->zone = msgpack_zone_new(8192);
	for (uint32_t i = 0; agents != NULL && i < agents->via.array.size; i++) {
		char *name = conf_str(r->zone, &agents->via.array.ptr[i]);
		char id[96];

		if (name == NULL || r->nagents == MAX_NAMED)
			return conf_fail("bad agents list");
		snprintf(id, sizeof(id), "%s-c%d-%d", name, (int)getpid(), ++agent_serial);
		snprintf(r->agent_names[r->nagents], sizeof(r->agent_names[0]), "%s", name);
		if (!conf_agent_start(&r->agents[r->nagents], db, dir, id))
			return false;
		r->nagents++;
	}
	return true;
}

static void run_print_logs(const struct run *r)
{
	for (int i = 0; i < r->nagents; i++)
		conf_agent_print_log(&r->agents[i]);
}

static void run_end(struct run *r)
{
	for (int i = 0; i < r->nbg; i++) {
		if (r->bg[i].running)
			pthread_join(r->bg[i].thread, NULL);
		msgpack_zone_free(r->bg[i].zone);
	}
	for (int i = 0; i < r->nclients; i++) {
		conf_client_close(&r->clients[i]);
		conf_proxy_stop(r->proxies[i]);
	}
	conf_held_release(r->held);
	for (int i = 0; i < r->nagents; i++)
		conf_agent_stop(&r->agents[i]);
	msgpack_zone_free(r->zone);
}

static struct conf_agent *agent_named(struct run *r, const msgpack_object *s)
{
	for (int i = 0; i < r->nagents; i++)
		if (conf_is_str(conf_get(s, "agent"), r->agent_names[i]))
			return &r->agents[i];
	conf_fail("no agent of that name in the scenario");
	return NULL;
}

static int client_index(struct run *r, const msgpack_object *s)
{
	for (int i = 0; i < r->nclients; i++)
		if (conf_is_str(conf_get(s, "client"), r->client_names[i]))
			return i;
	conf_fail("no client of that name connected");
	return -1;
}

static struct conf_client *client_named(struct run *r, const msgpack_object *s)
{
	int i = client_index(r, s);

	return i < 0 ? NULL : &r->clients[i];
}

/* Judges err against the step's "error" (none expected when absent). */
static bool expect_error(const msgpack_object *s, const char *what, pgcoord_err err,
			 const char *message)
{
	const msgpack_object *want = conf_get(s, "error");

	if (want == NULL && err != PGCOORD_OK)
		return conf_fail("%s: unexpected error %s: %s", what, conf_err_code(err), message);
	if (want != NULL && err == PGCOORD_OK)
		return conf_fail("%s: expected error %.*s, but it succeeded", what,
				 (int)want->via.str.size, want->via.str.ptr);
	if (want != NULL && !conf_is_str(want, conf_err_code(err)))
		return conf_fail("%s: expected error %.*s, got %s: %s", what,
				 (int)want->via.str.size, want->via.str.ptr, conf_err_code(err),
				 message);
	return true;
}

/* "save": {var: field} from a result map. */
static void save_fields(struct run *r, const msgpack_object *s, const msgpack_object *result)
{
	const msgpack_object *spec = conf_get(s, "save");

	if (spec == NULL || spec->type != MSGPACK_OBJECT_MAP)
		return;
	for (uint32_t i = 0; i < spec->via.map.size; i++) {
		char *var = conf_str(r->zone, &spec->via.map.ptr[i].key);
		char *field = conf_str(r->zone, &spec->via.map.ptr[i].val);
		const msgpack_object *v = field ? conf_get(result, field) : NULL;

		if (var != NULL && v != NULL)
			conf_vars_set(&r->vars, r->zone, var, *v);
	}
}

/* --- ops --------------------------------------------------------------------- */

static bool op_connect(struct run *r, const msgpack_object *s)
{
	struct conf_agent *a = agent_named(r, s);
	char *name = conf_get_str(r->zone, s, "client");
	const char *path;
	char proxy_path[300];
	int i = r->nclients;

	if (a == NULL || name == NULL || i == MAX_NAMED)
		return conf_fail("connect: needs an agent and a client name");
	path = a->socket_path;
	if (conf_get_bool(s, "proxy", false)) {
		snprintf(proxy_path, sizeof(proxy_path), "%s/proxy-%s.sock", r->dir, name);
		r->proxies[i] = conf_proxy_start(path, proxy_path);
		if (r->proxies[i] == NULL)
			return false;
		path = conf_proxy_path(r->proxies[i]);
	}
	snprintf(r->client_names[i], sizeof(r->client_names[0]), "%s", name);
	conf_client_init(&r->clients[i], path);
	r->nclients++;
	if (conf_client_ensure(&r->clients[i]) != PGCOORD_OK)
		return conf_fail("connect: %s", r->clients[i].message);
	return true;
}

static bool op_open_session(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	char *name = conf_get_str(r->zone, s, "name");
	const msgpack_object *save = conf_get(s, "save");
	int64_t sid = 0;
	pgcoord_err err;

	if (cl == NULL)
		return false;
	err = conf_client_ensure(cl);
	if (err == PGCOORD_OK)
		err = pgcoord_session_open(cl->h, name, CONF_CALL_TIMEOUT_MS, &sid);
	if (err != PGCOORD_OK)
		return conf_fail("session.open: %s: %s", conf_err_code(err),
				 cl->h ? pgcoord_last_message(cl->h) : cl->message);
	cl->session = sid;
	cl->resumed = false;
	if (save != NULL && save->type == MSGPACK_OBJECT_STR)
		conf_vars_set(&r->vars, r->zone, conf_str(r->zone, save), conf_make_int(sid));
	return true;
}

static bool op_call(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	char *method = conf_get_str(r->zone, s, "method");
	const msgpack_object *want = conf_get(s, "result");
	msgpack_object result;
	pgcoord_err err;

	if (cl == NULL || method == NULL)
		return conf_fail("call: needs a client and a method");
	err = conf_client_call(cl, r->zone, method, conf_get(s, "params"), CONF_CALL_TIMEOUT_MS,
			       &result);
	if (!expect_error(s, method, err, cl->message))
		return false;
	if (err != PGCOORD_OK)
		return true;
	if (want != NULL && !conf_match(want, &result, method))
		return false;
	save_fields(r, s, &result);
	return true;
}

/* permit.claim's params from the step: quotas {key: weight} as a list. */
static msgpack_object claim_params(msgpack_zone *z, const msgpack_object *s)
{
	const msgpack_object *quotas = conf_get(s, "quotas");
	const msgpack_object *limit = conf_get(s, "limit");
	uint32_t n = quotas && quotas->type == MSGPACK_OBJECT_MAP ? quotas->via.map.size : 0;
	msgpack_object list = {.type = MSGPACK_OBJECT_ARRAY};
	msgpack_object *items = msgpack_zone_malloc(z, (n + 1) * sizeof(*items));
	const char *keys[3] = {"id", "quotas", "limit"};
	msgpack_object vals[3];

	if (items == NULL)
		abort();
	for (uint32_t i = 0; i < n; i++) {
		const char *qk[] = {"key", "weight"};
		msgpack_object qv[] = {quotas->via.map.ptr[i].key, quotas->via.map.ptr[i].val};

		items[i] = conf_make_map(z, 2, qk, qv);
	}
	list.via.array.ptr = items;
	list.via.array.size = n;
	vals[0] = *conf_get(s, "id");
	vals[1] = list;
	if (limit != NULL)
		vals[2] = *limit;
	return conf_make_map(z, limit != NULL ? 3 : 2, keys, vals);
}

static void *background_claim(void *arg)
{
	struct background *b = arg;

	b->err =
	    conf_client_claim(b->cl, b->zone, &b->params, b->timeout_ms, b->budget_ms, &b->claim);
	return NULL;
}

static bool op_claim(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	const msgpack_object *want = conf_get(s, "expect");
	const msgpack_object *bgname = conf_get(s, "background");
	int timeout_ms = (int)conf_get_int(s, "timeout_ms", CONF_CALL_TIMEOUT_MS);
	int64_t budget_ms = conf_get_int(s, "retry_ms", CONF_RETRY_BUDGET_MS);
	struct conf_claim claim;
	pgcoord_err err;

	if (cl == NULL || conf_get(s, "id") == NULL)
		return conf_fail("claim: needs a client and an id");
	if (bgname != NULL) {
		struct background *b = &r->bg[r->nbg];

		if (r->nbg == MAX_NAMED)
			return conf_fail("too many background steps");
		snprintf(b->name, sizeof(b->name), "%.*s", (int)bgname->via.str.size,
			 bgname->via.str.ptr);
		b->cl = cl;
		b->zone = msgpack_zone_new(4096);
		b->params = claim_params(b->zone, s);
		b->timeout_ms = timeout_ms;
		b->budget_ms = budget_ms;
		r->nbg++;
		if (pthread_create(&b->thread, NULL, background_claim, b) != 0)
			return conf_fail("pthread_create failed");
		b->running = true;
		return true;
	}
	msgpack_object params = claim_params(r->zone, s);
	err = conf_client_claim(cl, r->zone, &params, timeout_ms, budget_ms, &claim);
	if (claim.gave_up)
		err = (pgcoord_err)-1;
	if (conf_get(s, "error") != NULL && claim.gave_up) {
		if (!conf_is_str(conf_get(s, "error"), "gave_up"))
			return conf_fail("claim: gave up, expected another error");
		return true;
	}
	if (claim.gave_up)
		return conf_fail("claim: gave up: %s", cl->message);
	if (!expect_error(s, "claim", err, cl->message))
		return false;
	if (err != PGCOORD_OK)
		return true;
	if (want != NULL) {
		int64_t least = conf_get_int(want, "$attempts_at_least", 0);

		if (!conf_match(want, &claim.result, "claim"))
			return false;
		if (claim.attempts < least)
			return conf_fail("claim: %d attempt(s), expected at least %lld",
					 claim.attempts, (long long)least);
	}
	save_fields(r, s, &claim.result);
	return true;
}

static bool op_await(struct run *r, const msgpack_object *s)
{
	const msgpack_object *name = conf_get(s, "name");
	const msgpack_object *want = conf_get(s, "error");
	const msgpack_object *released = conf_get(s, "released");
	struct timespec until;
	struct background *b = NULL;

	for (int i = 0; i < r->nbg; i++)
		if (conf_is_str(name, r->bg[i].name))
			b = &r->bg[i];
	if (b == NULL || !b->running)
		return conf_fail("await: no such background step running");
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 60;
	if (pthread_timedjoin_np(b->thread, NULL, &until) != 0)
		return conf_fail("await %s: still running after 60 s", b->name);
	b->running = false;
	const char *got = b->claim.gave_up	 ? "gave_up"
			  : b->err != PGCOORD_OK ? conf_err_code(b->err)
						 : NULL;
	if (want == NULL && got != NULL)
		return conf_fail("await %s: unexpected error %s", b->name, got);
	if (want != NULL && (got == NULL || !conf_is_str(want, got)))
		return conf_fail("await %s: expected error %.*s, got %s", b->name,
				 (int)want->via.str.size, want->via.str.ptr, got ? got : "success");
	if (released != NULL && released->type == MSGPACK_OBJECT_BOOLEAN &&
	    released->via.boolean != b->claim.released)
		return conf_fail("await %s: released is %s", b->name,
				 b->claim.released ? "true" : "false");
	return true;
}

static bool op_release(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	const msgpack_object *want = conf_get(s, "expect");
	const char *keys[] = {"id"};
	msgpack_object vals[1], params, result;
	int attempts;
	bool unseen;
	pgcoord_err err;

	if (cl == NULL || conf_get(s, "id") == NULL)
		return conf_fail("release: needs a client and an id");
	vals[0] = *conf_get(s, "id");
	params = conf_make_map(r->zone, 1, keys, vals);
	err = conf_client_retry(cl, r->zone, "permit.release", &params, CONF_CALL_TIMEOUT_MS,
				CONF_RETRY_BUDGET_MS, &result, &attempts, &unseen);
	if (!expect_error(s, "release", err, cl->message))
		return false;
	return err != PGCOORD_OK || want == NULL || conf_match(want, &result, "release");
}

static bool op_give_up(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	char *id = conf_get_str(r->zone, s, "id");

	if (cl == NULL || id == NULL)
		return conf_fail("give_up: needs a client and an id");
	return conf_client_give_up(cl, r->zone, id) ? true : conf_fail("give_up: %s", cl->message);
}

/* lease.acquire through pgcoord_lease_acquire, which starts the handle's
 * belief. Its typed result has leader, epoch and the ttl: an expect on any
 * other field must be "$any". */
static bool op_lease_acquire(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	char *name = conf_get_str(r->zone, s, "name");
	const msgpack_object *want = conf_get(s, "expect");
	bool leader = false;
	int64_t epoch = 0;
	pgcoord_err err;

	if (cl == NULL || name == NULL)
		return conf_fail("lease_acquire: needs a client and a name");
	err = conf_client_ensure(cl);
	if (err == PGCOORD_OK)
		err = pgcoord_lease_acquire(cl->h, name, (int)conf_get_int(s, "ttl_ms", 0),
					    conf_get_bool(s, "wait", false), CONF_CALL_TIMEOUT_MS,
					    &leader, &epoch);
	if (!expect_error(s, "lease.acquire", err, cl->h ? pgcoord_last_message(cl->h) : ""))
		return false;
	if (err != PGCOORD_OK)
		return true;
	const char *keys[] = {"name", "leader", "epoch", "ttl_ms"};
	msgpack_object vals[] = {conf_make_str(r->zone, name), conf_make_bool(leader),
				 conf_make_int(epoch),
				 conf_make_int(pgcoord_lease_ttl_ms(cl->h, name))};
	msgpack_object got = conf_make_map(r->zone, 4, keys, vals);

	for (uint32_t i = 0; want != NULL && i < want->via.map.size; i++) {
		const msgpack_object_kv *kv = &want->via.map.ptr[i];

		if (conf_get(&got, conf_str(r->zone, &kv->key)) == NULL &&
		    !conf_is_str(&kv->val, "$any"))
			return conf_fail("lease.acquire: libpgcoord's result has no %.*s",
					 (int)kv->key.via.str.size, kv->key.via.str.ptr);
	}
	if (want != NULL) {
		/* Keys answered "$any" that the typed result lacks are left out. */
		msgpack_object_kv *kv =
		    msgpack_zone_malloc(r->zone, (want->via.map.size + 1) * sizeof(*kv));
		msgpack_object known = {.type = MSGPACK_OBJECT_MAP};
		uint32_t n = 0;

		for (uint32_t i = 0; i < want->via.map.size; i++)
			if (conf_get(&got, conf_str(r->zone, &want->via.map.ptr[i].key)) != NULL)
				kv[n++] = want->via.map.ptr[i];
		known.via.map.ptr = kv;
		known.via.map.size = n;
		if (!conf_match(&known, &got, "lease.acquire"))
			return false;
	}
	save_fields(r, s, &got);
	return true;
}

static bool op_lease_release(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	char *name = conf_get_str(r->zone, s, "name");
	const msgpack_object *want = conf_get(s, "expect");
	bool released = false;
	pgcoord_err err;

	if (cl == NULL || name == NULL)
		return conf_fail("lease_release: needs a client and a name");
	err = conf_client_ensure(cl);
	if (err == PGCOORD_OK)
		err = pgcoord_lease_release(cl->h, name, CONF_CALL_TIMEOUT_MS, &released);
	if (err != PGCOORD_OK)
		return conf_fail("lease.release: %s", conf_err_code(err));
	const char *keys[] = {"released"};
	msgpack_object vals[] = {conf_make_bool(released)};
	msgpack_object got = conf_make_map(r->zone, 1, keys, vals);

	return want == NULL || conf_match(want, &got, "lease.release");
}

/* Polls the handle's local belief (no call is made). */
static bool op_expect_leader(struct run *r, const msgpack_object *s)
{
	int ci = client_index(r, s);
	char *name = conf_get_str(r->zone, s, "name");
	bool want = conf_get_bool(s, "leader", false);
	int64_t within = conf_get_int(s, "within_ms", 0);
	int64_t end = conf_now_ms() + within, now;
	const msgpack_object *after = conf_get(s, "after_belief_of");
	struct conf_client *cl;

	if (ci < 0 || name == NULL)
		return conf_fail("expect_leader: needs a client and a name");
	cl = &r->clients[ci];
	/* The belief question does no I/O: take in what the agent pushed first
	 * (a failure closes the handle, which ends the belief). */
	(void)pgcoord_lease_refresh(cl->h);
	while (pgcoord_lease_is_leader(cl->h, name) != want) {
		if (conf_now_ms() >= end)
			return conf_fail("%s: leader of %s is not %s after %lld ms",
					 r->client_names[ci], name, want ? "true" : "false",
					 (long long)within);
		conf_sleep_ms(5);
		(void)pgcoord_lease_refresh(cl->h);
	}
	now = conf_now_ms();
	if (!want) {
		for (int i = 0; i < r->nended; i++)
			if (strcmp(r->ended[i].client, r->client_names[ci]) == 0 &&
			    strcmp(r->ended[i].lease, name) == 0)
				return true;
		if (r->nended < (int)(sizeof(r->ended) / sizeof(r->ended[0]))) {
			struct ended *e = &r->ended[r->nended++];

			snprintf(e->client, sizeof(e->client), "%s", r->client_names[ci]);
			snprintf(e->lease, sizeof(e->lease), "%s", name);
			e->at_ms = now;
		}
		return true;
	}
	if (conf_get(s, "deadline_within_ms") != NULL) {
		int64_t limit = conf_get_int(s, "deadline_within_ms", 0);
		int64_t left = pgcoord_lease_valid_ms(cl->h, name);

		if (left <= 0 || left > limit)
			return conf_fail(
			    "%s: belief deadline %lld ms ahead, expected within (0, %lld]",
			    r->client_names[ci], (long long)left, (long long)limit);
	}
	if (after != NULL) {
		for (int i = 0; i < r->nended; i++)
			if (conf_is_str(after, r->ended[i].client) &&
			    strcmp(r->ended[i].lease, name) == 0 && r->ended[i].at_ms <= now)
				return true;
		return conf_fail("%s leads %s while %.*s may still believe it does",
				 r->client_names[ci], name, (int)after->via.str.size,
				 after->via.str.ptr);
	}
	return true;
}

static bool op_expect_session(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	int64_t want = conf_get_int(s, "session", -1);
	const msgpack_object *resumed = conf_get(s, "resumed");

	if (cl == NULL)
		return false;
	if (cl->session != want || pgcoord_session_id(cl->h) != want)
		return conf_fail("session is %lld (handle: %lld), expected %lld",
				 (long long)cl->session, (long long)pgcoord_session_id(cl->h),
				 (long long)want);
	if (resumed != NULL && resumed->type == MSGPACK_OBJECT_BOOLEAN &&
	    resumed->via.boolean != cl->resumed)
		return conf_fail("resumed is %s", cl->resumed ? "true" : "false");
	return true;
}

static bool op_sql(struct run *r, const msgpack_object *s)
{
	char *query = conf_get_str(r->zone, s, "query");
	const msgpack_object *want = conf_get(s, "rows");
	char **rows = NULL;
	int nrows = 0, ncols = 0;
	bool ok = true;

	if (query == NULL)
		return conf_fail("sql: needs a query");
	if (!conf_sql(r->db, query, &rows, &nrows, &ncols))
		return false;
	/* psql's text: expected values (saved ints too) compare as text */
	if (want != NULL) {
		if (want->type != MSGPACK_OBJECT_ARRAY || want->via.array.size != (uint32_t)nrows)
			ok = conf_fail("sql %s: %d row(s), expected %u", query, nrows,
				       want->type == MSGPACK_OBJECT_ARRAY ? want->via.array.size
									  : 0);
		for (int i = 0; ok && i < nrows; i++) {
			const msgpack_object *row = &want->via.array.ptr[i];

			if (row->type != MSGPACK_OBJECT_ARRAY ||
			    row->via.array.size != (uint32_t)ncols)
				ok = conf_fail("sql %s: row %d has %d column(s)", query, i + 1,
					       ncols);
			for (int j = 0; ok && j < ncols; j++) {
				char *text = conf_text(r->zone, &row->via.array.ptr[j]);

				if (strcmp(text, rows[i * ncols + j]) != 0)
					ok = conf_fail(
					    "sql %s: row %d column %d is %s, expected %s", query,
					    i + 1, j + 1, rows[i * ncols + j], text);
			}
		}
	}
	conf_rows_free(rows, nrows, ncols);
	return ok;
}

/* list_all: every page of a list through pgcoord_list_page (with
 * page_size) or pgcoord_list_all, the rows' `key` values compared in order
 * with the first column of `query`. */
static bool op_list_all(struct run *r, const msgpack_object *s)
{
	struct conf_client *cl = client_named(r, s);
	char *method = conf_get_str(r->zone, s, "method");
	char *key = conf_get_str(r->zone, s, "key");
	char *query = conf_get_str(r->zone, s, "query");
	const msgpack_object *params = conf_get(s, "params");
	int64_t page_size = conf_get_int(s, "page_size", 0);
	msgpack_sbuffer pb;
	msgpack_packer pk;
	char **rows = NULL, *cursor = NULL;
	int nrows = 0, ncols = 0, seen = 0;
	bool ok = true;

	if (cl == NULL || method == NULL || key == NULL || query == NULL)
		return conf_fail("list_all: needs a client, a method, a key and a query");
	if (!conf_sql(r->db, query, &rows, &nrows, &ncols))
		return false;
	msgpack_sbuffer_init(&pb);
	msgpack_packer_init(&pk, &pb, msgpack_sbuffer_write);
	if (params)
		msgpack_pack_object(&pk, *params);
	do {
		void *res = NULL;
		size_t len = 0;
		char *next = NULL;
		pgcoord_err err =
		    page_size > 0
			? pgcoord_list_page(cl->h, method, pb.data, pb.size, page_size, cursor,
					    CONF_CALL_TIMEOUT_MS, &res, &len, &next)
			: pgcoord_list_all(cl->h, method, pb.data, pb.size, CONF_CALL_TIMEOUT_MS,
					   &res, &len);
		pgcoord_free(cursor);
		cursor = next;
		if (err != PGCOORD_OK) {
			ok = conf_fail("list_all %s: %s: %s", method, pgcoord_strerror(err),
				       pgcoord_last_message(cl->h));
			break;
		}
		msgpack_unpacked u;
		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, res, len, NULL) != MSGPACK_UNPACK_SUCCESS ||
		    u.data.type != MSGPACK_OBJECT_MAP) {
			ok = conf_fail("list_all %s: the result is not a map", method);
		} else {
			const msgpack_object *items = NULL;
			for (uint32_t i = 0; i < u.data.via.map.size; i++)
				if (u.data.via.map.ptr[i].val.type == MSGPACK_OBJECT_ARRAY)
					items = &u.data.via.map.ptr[i].val;
			for (uint32_t i = 0; ok && items && i < items->via.array.size;
			     i++, seen++) {
				char *text =
				    conf_text(r->zone, conf_get(&items->via.array.ptr[i], key));
				if (seen >= nrows || strcmp(text, rows[seen * ncols]) != 0)
					ok = conf_fail(
					    "list_all %s: row %d is %s, the database has %s",
					    method, seen + 1, text,
					    seen < nrows ? rows[seen * ncols] : "no more");
			}
		}
		msgpack_unpacked_destroy(&u);
		pgcoord_free(res);
	} while (ok && cursor);
	pgcoord_free(cursor);
	if (ok && seen != nrows)
		ok = conf_fail("list_all %s: %d rows, the database has %d", method, seen, nrows);
	msgpack_sbuffer_destroy(&pb);
	conf_rows_free(rows, nrows, ncols);
	return ok;
}

static bool op_sql_hold(struct run *r, const msgpack_object *s)
{
	char *query = conf_get_str(r->zone, s, "query");

	if (query == NULL || r->held != NULL)
		return conf_fail("sql_hold: needs a query, and nothing held yet");
	r->held = conf_hold(r->db, query);
	return r->held != NULL;
}

static bool op_sql_release(struct run *r, const msgpack_object *s)
{
	(void)s;
	if (r->held == NULL)
		return conf_fail("sql_release: nothing is held");
	conf_held_release(r->held);
	r->held = NULL;
	return true;
}

static bool op_signal(struct run *r, const msgpack_object *s)
{
	static const struct {
		const char *name;
		int sig;
	} sigs[] = {{"STOP", SIGSTOP}, {"CONT", SIGCONT}, {"TERM", SIGTERM},
		    {"KILL", SIGKILL}, {"HUP", SIGHUP},	  {"INT", SIGINT}};
	struct conf_agent *a = agent_named(r, s);

	if (a == NULL)
		return false;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		if (conf_is_str(conf_get(s, "signal"), sigs[i].name))
			return kill(a->pid, sigs[i].sig) == 0
				   ? true
				   : conf_fail("kill: %s", strerror(errno));
	return conf_fail("signal: unknown signal");
}

/* Waits as an application's event loop would: reading what the agents
 * push (lease renewals are dated by when the socket was last seen empty, so
 * a handle left unread for longer than a lease's ttl loses its belief). */
static bool op_sleep(struct run *r, const msgpack_object *s)
{
	int64_t end = conf_now_ms() + conf_get_int(s, "ms", 0);

	for (int64_t now = conf_now_ms(); now < end; now = conf_now_ms()) {
		for (int i = 0; i < r->nclients; i++) {
			bool busy = false;

			for (int j = 0; j < r->nbg; j++)
				busy |= r->bg[j].running && r->bg[j].cl == &r->clients[i];
			if (!busy && r->clients[i].h != NULL && pgcoord_fd(r->clients[i].h) >= 0)
				pgcoord_poll(r->clients[i].h, 0, NULL);
		}
		conf_sleep_ms(end - now < 20 ? end - now : 20);
	}
	return true;
}

static bool op_proxy_drop_reply(struct run *r, const msgpack_object *s)
{
	int i = client_index(r, s);
	char *method = conf_get_str(r->zone, s, "method");

	if (i < 0 || r->proxies[i] == NULL || method == NULL)
		return conf_fail("proxy_drop_reply: the client has no proxy, or no method given");
	conf_proxy_drop_reply(r->proxies[i], method);
	return true;
}

static bool op_proxy_cut(struct run *r, const msgpack_object *s)
{
	int i = client_index(r, s);

	if (i < 0 || r->proxies[i] == NULL)
		return conf_fail("proxy_cut: the client has no proxy");
	conf_proxy_cut(r->proxies[i]);
	return true;
}

static const struct {
	const char *op;
	bool (*fn)(struct run *, const msgpack_object *);
} ops[] = {
    {"connect", op_connect},
    {"open_session", op_open_session},
    {"call", op_call},
    {"claim", op_claim},
    {"await", op_await},
    {"release", op_release},
    {"give_up", op_give_up},
    {"lease_acquire", op_lease_acquire},
    {"lease_release", op_lease_release},
    {"expect_leader", op_expect_leader},
    {"expect_session", op_expect_session},
    {"sql", op_sql},
    {"list_all", op_list_all},
    {"sql_hold", op_sql_hold},
    {"sql_release", op_sql_release},
    {"signal", op_signal},
    {"sleep", op_sleep},
    {"proxy_drop_reply", op_proxy_drop_reply},
    {"proxy_cut", op_proxy_cut},
};

static bool run_step(struct run *r, const msgpack_object *step)
{
	const msgpack_object *op = conf_get(step, "op");
	msgpack_object s;

	if (!conf_substitute(r->zone, &r->vars, step, &s))
		return false;
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (conf_is_str(op, ops[i].op))
			return ops[i].fn(r, &s);
	return conf_fail("unknown op");
}

/* --- vectors and scenarios ---------------------------------------------- */

static int run_vectors(const struct conf_db *db, const char *dir, const msgpack_object *vectors)
{
	const char *names[] = {"v"};
	msgpack_object agent_list = {.type = MSGPACK_OBJECT_ARRAY};
	msgpack_zone *z = msgpack_zone_new(1024);
	msgpack_object agent = conf_make_str(z, names[0]);
	struct run *r = calloc(1, sizeof(*r));
	struct conf_client cl;
	int failures = 0;

	agent_list.via.array.ptr = &agent;
	agent_list.via.array.size = 1;
	if (!run_start(r, db, dir, &agent_list)) {
		printf("FAILED vectors: %s\n", conf_why);
		run_end(r);
		free(r);
		msgpack_zone_free(z);
		return 1;
	}
	conf_client_init(&cl, r->agents[0].socket_path);
	for (uint32_t i = 0; vectors != NULL && i < vectors->via.array.size; i++) {
		const msgpack_object *v = &vectors->via.array.ptr[i];
		const msgpack_object *call = conf_get(v, "call");
		char *method = conf_get_str(r->zone, call, "method");
		const msgpack_object *want = conf_get(v, "result");
		char *name = conf_get_str(r->zone, v, "name");
		msgpack_object result;
		pgcoord_err err;
		bool ok;

		conf_why[0] = '\0';
		err = conf_client_call(&cl, r->zone, method ? method : "", conf_get(call, "params"),
				       CONF_CALL_TIMEOUT_MS, &result);
		ok = expect_error(v, method ? method : "?", err, cl.message) &&
		     (err != PGCOORD_OK || want == NULL || conf_match(want, &result, method));
		if (ok) {
			printf("ok     vector: %s\n", name ? name : "?");
		} else {
			printf("FAILED vector: %s: %s\n", name ? name : "?", conf_why);
			failures++;
		}
	}
	conf_client_close(&cl);
	run_end(r);
	free(r);
	msgpack_zone_free(z);
	return failures;
}

static bool run_scenario(const struct conf_db *db, const char *dir, const msgpack_object *sc)
{
	const msgpack_object *steps = conf_get(sc, "steps");
	const msgpack_object *name = conf_get(sc, "name");
	int64_t started = conf_now_ms();
	struct run *r = calloc(1, sizeof(*r));
	bool ok = run_start(r, db, dir, conf_get(sc, "agents"));
	uint32_t i = 0;

	conf_why[0] = '\0';
	for (; ok && steps != NULL && i < steps->via.array.size; i++)
		ok = run_step(r, &steps->via.array.ptr[i]);
	if (ok) {
		printf("ok     scenario: %.*s (%.1f s)\n", (int)name->via.str.size,
		       name->via.str.ptr, (double)(conf_now_ms() - started) / 1000.0);
	} else {
		const msgpack_object *op =
		    i > 0 ? conf_get(&steps->via.array.ptr[i - 1], "op") : NULL;

		printf("FAILED scenario: %.*s: step %u (%.*s): %s\n", (int)name->via.str.size,
		       name->via.str.ptr, i, op ? (int)op->via.str.size : 5,
		       op ? op->via.str.ptr : "start", conf_why);
		run_print_logs(r);
	}
	fflush(stdout);
	run_end(r);
	free(r);
	return ok;
}

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	char *buf;

	if (f == NULL || fstat(fileno(f), &st) != 0) {
		if (f)
			fclose(f);
		return NULL;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (buf == NULL || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		free(buf);
		fclose(f);
		return NULL;
	}
	fclose(f);
	*len = (size_t)st.st_size;
	return buf;
}

static bool selected(const msgpack_object *name, char **only, int nonly)
{
	if (nonly == 0)
		return true;
	for (int i = 0; i < nonly; i++)
		if (conf_is_str(name, only[i]))
			return true;
	return false;
}

int main(int argc, char **argv)
{
	char *only[32];
	int nonly = 0, failures = 0;
	const char *file = NULL;
	char dir[512];
	size_t len = 0;
	char *bytes;
	msgpack_unpacked spec;
	struct conf_db db;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--only") == 0 && i + 1 < argc && nonly < 32)
			only[nonly++] = argv[++i];
		else if (file == NULL && argv[i][0] != '-')
			file = argv[i];
		else
			file = NULL, i = argc;
	}
	if (file == NULL) {
		fprintf(stderr, "usage: run_c [--only NAME]... scenarios.msgpack\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	bytes = read_file(file, &len);
	msgpack_unpacked_init(&spec);
	if (bytes == NULL ||
	    msgpack_unpack_next(&spec, bytes, len, NULL) != MSGPACK_UNPACK_SUCCESS) {
		fprintf(stderr, "%s: cannot read the scenarios\n", file);
		return 1;
	}
	if (conf_get_int(&spec.data, "format", 0) != 1) {
		printf("unknown scenario format\n");
		return 1;
	}
	snprintf(dir, sizeof(dir), "%s/c-conf.XXXXXX", conf_env("PGCOORD_TEST_TMP"));
	if (mkdtemp(dir) == NULL) {
		perror(dir);
		return 1;
	}
	if (!conf_db_create(&db)) {
		fprintf(stderr, "%s\n", conf_why);
		rmdir(dir);
		return 1;
	}
	if (nonly == 0)
		failures += run_vectors(&db, dir, conf_get(&spec.data, "vectors"));
	const msgpack_object *scenarios = conf_get(&spec.data, "scenarios");
	for (uint32_t i = 0; scenarios != NULL && i < scenarios->via.array.size; i++)
		if (selected(conf_get(&scenarios->via.array.ptr[i], "name"), only, nonly))
			failures += !run_scenario(&db, dir, &scenarios->via.array.ptr[i]);
	conf_db_drop(&db);
	msgpack_unpacked_destroy(&spec);
	free(bytes);
	printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
	return failures ? 1 : 0;
}
