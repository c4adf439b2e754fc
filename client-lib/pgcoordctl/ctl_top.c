/*
 * ctl_top.c — see ctl_top.h.
 */
#include "ctl_top.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"

#define TOP_AGENTS_MAX 8
#define TOP_LEASES_MAX 8
#define TOP_QUOTAS_MAX 5
#define TOP_PERMITS_MAX 5

/* One call's outcome within a frame. */
struct answer {
	void *buf;
	msgpack_unpacked u;
	const msgpack_object *obj; /* the result, or NULL */
	bool missing;		   /* method_not_found: the agent has no such method */
	char why[256];		   /* otherwise, when obj is NULL: what went wrong */
};

struct top {
	const struct ctl_top_options *opt;
	pgcoord *conn;
	bool tty;
};

static void answer_free(struct answer *a)
{
	if (a->obj)
		msgpack_unpacked_destroy(&a->u);
	pgcoord_free(a->buf);
	memset(a, 0, sizeof(*a));
}

/* False when the agent could not be reached (the connection is dropped so
 * the next frame reconnects). */
static bool ask(struct top *t, const char *method, const void *params, size_t plen,
		struct answer *a)
{
	size_t len = 0, off = 0;
	pgcoord_err err;

	memset(a, 0, sizeof(*a));
	if (!t->conn) {
		err = pgcoord_connect(t->opt->socket_path, t->opt->timeout_ms, &t->conn);
		if (err != PGCOORD_OK) {
			snprintf(
			    a->why, sizeof(a->why), "cannot connect to %s: %s", t->opt->socket_path,
			    err == PGCOORD_E_CONNECT ? strerror(errno) : pgcoord_strerror(err));
			t->conn = NULL;
			return false;
		}
	}
	err = pgcoord_call(t->conn, method, params, plen, t->opt->timeout_ms, &a->buf, &len);
	if (err == PGCOORD_E_METHOD_NOT_FOUND) {
		a->missing = true;
		return true;
	}
	if (err != PGCOORD_OK) {
		const char *msg = pgcoord_last_message(t->conn);
		snprintf(a->why, sizeof(a->why), "%s: %s", method,
			 msg && *msg ? msg : pgcoord_strerror(err));
		if ((int)err >= 100) { /* the library's own: the connection is unusable */
			pgcoord_close(t->conn);
			t->conn = NULL;
			return false;
		}
		return true;
	}
	msgpack_unpacked_init(&a->u);
	if (msgpack_unpack_next(&a->u, a->buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    a->u.data.type != MSGPACK_OBJECT_MAP) {
		msgpack_unpacked_destroy(&a->u);
		snprintf(a->why, sizeof(a->why), "%s: the result does not decode", method);
		return true;
	}
	a->obj = &a->u.data;
	return true;
}

static const msgpack_object *list_of(const struct answer *a, const char *key)
{
	const msgpack_object *rows = a->obj ? ctl_map_get(a->obj, key) : NULL;
	return rows && rows->type == MSGPACK_OBJECT_ARRAY ? rows : NULL;
}

static int64_t get_int(const msgpack_object *map, const char *key)
{
	int64_t v = 0;
	ctl_obj_int64(map ? ctl_map_get(map, key) : NULL, &v);
	return v;
}

static bool get_bool(const msgpack_object *map, const char *key)
{
	bool v = false;
	ctl_obj_bool(map ? ctl_map_get(map, key) : NULL, &v);
	return v;
}

/* A str field as a C string in buf ("" when absent), control bytes dropped. */
static const char *get_str(const msgpack_object *map, const char *key, char *buf, size_t len)
{
	const char *s = "";
	size_t n = 0, j = 0;
	ctl_obj_str(map ? ctl_map_get(map, key) : NULL, &s, &n);
	for (size_t i = 0; i < n && j + 1 < len; i++)
		if ((unsigned char)s[i] >= 0x20 && s[i] != 0x7f)
			buf[j++] = s[i];
	buf[j] = '\0';
	return buf;
}

/* Prints a section heading and rows (reshaped by the caller into maps with
 * the columns' keys), at most max of them. */
static void section(const char *title, msgpack_sbuffer *rows, size_t nrows, size_t total,
		    const struct ctl_column *cols, size_t ncols, int64_t now)
{
	msgpack_unpacked u;
	size_t off = 0;

	printf("\n%s\n", title);
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, rows->data, rows->size, &off) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_table(stdout, &u.data, cols, ncols, now);
	msgpack_unpacked_destroy(&u);
	if (total > nrows)
		printf("  … %zu more\n", total - nrows);
}

static void note(const char *title, const struct answer *a)
{
	if (a->missing)
		return; /* this agent has no such method: no section */
	printf("\n%s\n  (%s)\n", title, a->why[0] ? a->why : "no answer");
}

static void pack_copy(msgpack_packer *pk, const msgpack_object *map, const char *key)
{
	const msgpack_object *v = map ? ctl_map_get(map, key) : NULL;
	ctl_pack_cstr(pk, key);
	if (v)
		msgpack_pack_object(pk, *v);
	else
		msgpack_pack_nil(pk);
}

static void draw_header(const struct answer *status, const struct answer *agents,
			const struct answer *sessions, int interval_ms)
{
	const msgpack_object *s = status->obj;
	char replica[256], state[32], db[16], ago[32], up[32], every[32];
	time_t now = time(NULL);
	struct tm tm;
	char when[32];

	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	ctl_format_duration(every, sizeof(every), interval_ms);
	printf("pgcoordctl top  %s  (every %s, Ctrl-C quits)\n", when, every);
	if (!s) {
		printf("agent   unreachable: %s\n", status->why);
		return;
	}
	int64_t hb = get_int(s, "last_heartbeat_ms_ago");
	int64_t leases = get_int(s, "leases_held"), nsess = get_int(s, "sessions");
	int64_t conns = get_int(s, "connections");
	if (hb >= 0)
		ctl_format_duration(ago, sizeof(ago), hb);
	else
		snprintf(ago, sizeof(ago), "never");
	ctl_format_duration(up, sizeof(up), get_int(s, "uptime_ms"));
	printf("agent   %s %s, database %s, heartbeat %s%s, up %s\n",
	       get_str(s, "replica_id", replica, sizeof(replica)),
	       get_str(s, "state", state, sizeof(state)), get_str(s, "db", db, sizeof(db)), ago,
	       hb >= 0 ? " ago" : "", up);
	printf("here    %lld connection%s, %lld session%s, %lld lease%s held%s\n", (long long)conns,
	       conns == 1 ? "" : "s", (long long)nsess, nsess == 1 ? "" : "s", (long long)leases,
	       leases == 1 ? "" : "s", get_bool(s, "janitor") ? ", the fleet's janitor" : "");
	const msgpack_object *a = list_of(agents, "agents"), *ss = list_of(sessions, "sessions");
	if (a || ss) {
		size_t live = 0, n = a ? a->via.array.size : 0;
		for (size_t i = 0; i < n; i++)
			live += get_bool(&a->via.array.ptr[i], "live");
		printf("fleet   %zu agent%s (%zu live), %zu live session%s\n", n, n == 1 ? "" : "s",
		       live, ss ? (size_t)ss->via.array.size : 0,
		       ss && ss->via.array.size == 1 ? "" : "s");
	}
}

static void draw_agents(const struct answer *agents)
{
	static const struct ctl_column cols[] = {
	    {"REPLICA", "replica_id", CTL_FMT_AUTO},
	    {"LIVE", "live", CTL_FMT_YESNO},
	    {"HOST", "host", CTL_FMT_AUTO},
	    {"PID", "pid", CTL_FMT_AUTO},
	    {"HEARTBEAT", "heartbeat_at", CTL_FMT_AGE},
	    {"VERSION", "version", CTL_FMT_AUTO},
	};
	const msgpack_object *rows = list_of(agents, "agents");
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t n;

	if (!rows) {
		note("AGENTS", agents);
		return;
	}
	/* live ones first: the dead are history */
	n = rows->via.array.size < TOP_AGENTS_MAX ? rows->via.array.size : TOP_AGENTS_MAX;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	size_t done = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < rows->via.array.size && done < n; i++) {
			const msgpack_object *r = &rows->via.array.ptr[i];
			if (get_bool(r, "live") != (pass == 0))
				continue;
			msgpack_pack_map(&pk, 6);
			for (size_t c = 0; c < 6; c++)
				pack_copy(&pk, r, cols[c].key);
			done++;
		}
	}
	section("AGENTS", &sb, n, rows->via.array.size, cols, 6, ctl_now_ms(agents->obj));
	msgpack_sbuffer_destroy(&sb);
}

static void draw_leases(const struct answer *leases)
{
	static const struct ctl_column cols[] = {
	    {"LEASE", "name", CTL_FMT_AUTO},
	    {"HOLDER", "holder", CTL_FMT_AUTO},
	    {"SESSION", "session", CTL_FMT_AUTO},
	    {"EPOCH", "epoch", CTL_FMT_AUTO},
	    {"EXPIRES_IN", "expires_in_ms", CTL_FMT_DURATION},
	};
	const msgpack_object *rows = list_of(leases, "leases");
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char buf[256];

	if (!rows) {
		note("LEASES", leases);
		return;
	}
	size_t n = rows->via.array.size < TOP_LEASES_MAX ? rows->via.array.size : TOP_LEASES_MAX;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		const msgpack_object *r = &rows->via.array.ptr[i];
		const msgpack_object *h = ctl_map_get(r, "holder");
		bool held = h && h->type == MSGPACK_OBJECT_MAP;
		msgpack_pack_map(&pk, 5);
		pack_copy(&pk, r, "name");
		ctl_pack_kv_str(&pk, "holder",
				held ? get_str(h, "replica_id", buf, sizeof(buf)) : "(free)");
		ctl_pack_cstr(&pk, "session");
		if (held)
			msgpack_pack_int64(&pk, get_int(h, "session"));
		else
			msgpack_pack_nil(&pk);
		pack_copy(&pk, r, "epoch");
		ctl_pack_cstr(&pk, "expires_in_ms");
		if (held)
			msgpack_pack_int64(&pk, get_int(r, "expires_in_ms"));
		else
			msgpack_pack_nil(&pk);
	}
	section("LEASES", &sb, n, rows->via.array.size, cols, 5, 0);
	msgpack_sbuffer_destroy(&sb);
}

/* in_flight / limit, with a closed quota (limit 0) first */
static double fullness(const msgpack_object *q)
{
	int64_t limit = get_int(q, "limit"), inflight = get_int(q, "in_flight");
	return limit > 0 ? (double)inflight / (double)limit : 1e9;
}

static void draw_quotas(const struct answer *quotas)
{
	static const struct ctl_column cols[] = {
	    {"QUOTA", "key", CTL_FMT_AUTO},	      {"LIMIT", "limit", CTL_FMT_AUTO},
	    {"IN_FLIGHT", "in_flight", CTL_FMT_AUTO}, {"UNCERTAIN", "uncertain", CTL_FMT_AUTO},
	    {"USED", "used", CTL_FMT_AUTO},
	};
	const msgpack_object *rows = list_of(quotas, "quotas");
	const msgpack_object *pick[TOP_QUOTAS_MAX];
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t n = 0;

	if (!rows) {
		note("QUOTAS NEAREST THEIR LIMIT", quotas);
		return;
	}
	/* a partial selection sort: the few fullest */
	for (size_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *q = &rows->via.array.ptr[i];
		size_t at = n < TOP_QUOTAS_MAX ? n++ : TOP_QUOTAS_MAX;
		if (at == TOP_QUOTAS_MAX) {
			if (fullness(q) <= fullness(pick[TOP_QUOTAS_MAX - 1]))
				continue;
			at = TOP_QUOTAS_MAX - 1;
		}
		while (at > 0 && fullness(pick[at - 1]) < fullness(q)) {
			pick[at] = pick[at - 1];
			at--;
		}
		pick[at] = q;
	}
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		char used[32];
		int64_t limit = get_int(pick[i], "limit");
		if (limit > 0)
			snprintf(used, sizeof(used), "%.0f%%", 100.0 * fullness(pick[i]));
		else
			snprintf(used, sizeof(used), "closed");
		msgpack_pack_map(&pk, 5);
		pack_copy(&pk, pick[i], "key");
		pack_copy(&pk, pick[i], "limit");
		pack_copy(&pk, pick[i], "in_flight");
		pack_copy(&pk, pick[i], "uncertain");
		ctl_pack_kv_str(&pk, "used", used);
	}
	section("QUOTAS NEAREST THEIR LIMIT", &sb, n, rows->via.array.size, cols, 5, 0);
	msgpack_sbuffer_destroy(&sb);
}

static void draw_permits(const struct answer *permits)
{
	static const struct ctl_column cols[] = {
	    {"PERMIT", "id", CTL_FMT_AUTO},
	    {"UNCERTAIN_SINCE", "state_at", CTL_FMT_AGE},
	    {"OWNER", "owner", CTL_FMT_AUTO},
	    {"REASON", "uncertain_reason", CTL_FMT_AUTO},
	};
	const msgpack_object *rows = list_of(permits, "permits");
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char who[300], rep[256];

	if (!rows) {
		note("UNCERTAIN PERMITS", permits);
		return;
	}
	/* permit.list answers one row per permit and quota: keep each id once */
	size_t n = 0, total = 0;
	const char *last = NULL;
	size_t lastlen = 0;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	const msgpack_object *uniq[TOP_PERMITS_MAX];
	for (size_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *r = &rows->via.array.ptr[i];
		const char *id;
		size_t idlen;
		if (!ctl_obj_str(ctl_map_get(r, "id"), &id, &idlen))
			continue;
		if (last && idlen == lastlen && memcmp(id, last, idlen) == 0)
			continue;
		last = id;
		lastlen = idlen;
		total++;
		if (n < TOP_PERMITS_MAX)
			uniq[n++] = r;
	}
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_map(&pk, 4);
		pack_copy(&pk, uniq[i], "id");
		pack_copy(&pk, uniq[i], "state_at");
		if (ctl_map_get(uniq[i], "owner_session") &&
		    ctl_map_get(uniq[i], "owner_session")->type != MSGPACK_OBJECT_NIL)
			snprintf(who, sizeof(who), "%lld@%s",
				 (long long)get_int(uniq[i], "owner_session"),
				 get_str(uniq[i], "owner_replica", rep, sizeof(rep)));
		else
			snprintf(who, sizeof(who), "(none)");
		ctl_pack_kv_str(&pk, "owner", who);
		pack_copy(&pk, uniq[i], "uncertain_reason");
	}
	if (get_bool(permits->obj, "truncated"))
		total++; /* at least one more than shown */
	section(total ? "UNCERTAIN PERMITS (oldest first)" : "UNCERTAIN PERMITS", &sb, n, total,
		cols, 4, ctl_now_ms(permits->obj));
	msgpack_sbuffer_destroy(&sb);
}

/* --json: the frame's answers as one object (null for what is missing). */
static void print_json_frame(const char *const *names, struct answer *answers, size_t n)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;
	size_t off = 0;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, n);
	for (size_t i = 0; i < n; i++) {
		ctl_pack_cstr(&pk, names[i]);
		if (answers[i].obj) {
			msgpack_pack_object(&pk, *answers[i].obj);
		} else if (answers[i].missing) {
			msgpack_pack_nil(&pk);
		} else {
			msgpack_pack_map(&pk, 1);
			ctl_pack_kv_str(&pk, "error", answers[i].why);
		}
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_json(stdout, &u.data);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}

/* One frame; false when the agent could not be reached at all. */
static bool frame(struct top *t)
{
	static const char *const names[] = {"status", "agents", "sessions",
					    "leases", "quotas", "permits"};
	static const char *const methods[] = {"agent.status", "fleet.agents", "fleet.sessions",
					      "lease.list",   "quota.list",   "permit.list"};
	struct answer a[6];
	msgpack_sbuffer uncertain;
	msgpack_packer pk;
	bool reached = true;

	/* permit.list {state: uncertain, limit: 5 + 1 to know there are more} */
	msgpack_sbuffer_init(&uncertain);
	msgpack_packer_init(&pk, &uncertain, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	ctl_pack_kv_str(&pk, "state", "uncertain");
	ctl_pack_kv_int(&pk, "limit", TOP_PERMITS_MAX);
	for (size_t i = 0; i < 6; i++) {
		memset(&a[i], 0, sizeof(a[i]));
		if (!reached) {
			snprintf(a[i].why, sizeof(a[i].why), "%s", a[0].why);
			continue;
		}
		if (!ask(t, methods[i], i == 5 ? uncertain.data : NULL, i == 5 ? uncertain.size : 0,
			 &a[i]))
			reached = false;
	}
	msgpack_sbuffer_destroy(&uncertain);

	if (t->opt->json) {
		print_json_frame(names, a, 6);
	} else {
		if (t->tty)
			fputs("\033[H\033[2J", stdout);
		draw_header(&a[0], &a[1], &a[2], t->opt->interval_ms);
		if (reached) {
			draw_agents(&a[1]);
			draw_leases(&a[3]);
			draw_quotas(&a[4]);
			draw_permits(&a[5]);
		}
		if (!t->tty)
			fputs("\n", stdout);
	}
	fflush(stdout);
	for (size_t i = 0; i < 6; i++)
		answer_free(&a[i]);
	return reached;
}

static void sleep_ms(int64_t ms)
{
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
	while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ctl_top(const struct ctl_top_options *opt)
{
	struct top t = {.opt = opt, .tty = !opt->json && isatty(STDOUT_FILENO)};
	bool reached = false;

	for (int i = 0; opt->count == 0 || i < opt->count; i++) {
		int64_t start = now_ms();
		reached = frame(&t);
		/* the same cadence however long the calls took */
		if (opt->count == 0 || i + 1 < opt->count)
			sleep_ms(opt->interval_ms - (now_ms() - start));
	}
	pgcoord_close(t.conn);
	return reached ? 0 : 3;
}
