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

/* How one call of a frame went, when it brought nothing to show. */
struct outcome {
	bool missing;  /* method_not_found: the agent has no such method */
	char why[256]; /* otherwise: what went wrong ("" when it answered) */
};

/* One raw answer, for --json (the agent's results as they came). */
struct answer {
	void *buf;
	msgpack_unpacked u;
	const msgpack_object *obj; /* the result, or NULL */
	struct outcome o;
};

/* The typed answers of a text frame; NULL where the call brought none. */
struct typed_frame {
	struct outcome o[6];
	struct pgcoord_agent_status *status;
	struct pgcoord_agent_list *agents;
	struct pgcoord_session_list *sessions;
	struct pgcoord_lease_list *leases;
	struct pgcoord_quota_list *quotas;
	struct pgcoord_permit_list *permits;
};

struct top {
	const struct ctl_top_options *opt;
	pgcoord *conn;
	bool tty;
};

static const char *const methods[] = {"agent.status", "fleet.agents", "fleet.sessions",
				      "lease.list",   "quota.list",   "permit.list"};

/* Connects when the last frame left no connection; false when it cannot. */
static bool reach(struct top *t, struct outcome *o)
{
	if (t->conn)
		return true;
	pgcoord_err err = pgcoord_connect(t->opt->socket_path, t->opt->timeout_ms, &t->conn);
	if (err == PGCOORD_OK)
		return true;
	snprintf(o->why, sizeof(o->why), "cannot connect to %s: %s", t->opt->socket_path,
		 err == PGCOORD_E_CONNECT ? strerror(errno) : pgcoord_strerror(err));
	t->conn = NULL;
	return false;
}

/* Notes how method went in o. False when the agent could not be reached
 * (the connection is dropped so the next frame reconnects). */
static bool judge(struct top *t, const char *method, pgcoord_err err, struct outcome *o)
{
	if (err == PGCOORD_OK)
		return true;
	if (err == PGCOORD_E_METHOD_NOT_FOUND) {
		o->missing = true;
		return true;
	}
	const char *msg = pgcoord_last_message(t->conn);
	snprintf(o->why, sizeof(o->why), "%s: %s", method,
		 msg && *msg ? msg : pgcoord_strerror(err));
	if ((int)err >= 100 && err != PGCOORD_E_PROTOCOL) {
		/* the library's own: the connection is unusable */
		pgcoord_close(t->conn);
		t->conn = NULL;
		return false;
	}
	return true;
}

static void answer_free(struct answer *a)
{
	if (a->obj)
		msgpack_unpacked_destroy(&a->u);
	pgcoord_free(a->buf);
	memset(a, 0, sizeof(*a));
}

/* A raw call for --json; false when the agent could not be reached. */
static bool ask(struct top *t, const char *method, const void *params, size_t plen,
		struct answer *a)
{
	size_t len = 0, off = 0;

	memset(a, 0, sizeof(*a));
	if (!reach(t, &a->o))
		return false;
	pgcoord_err err =
	    pgcoord_call(t->conn, method, params, plen, t->opt->timeout_ms, &a->buf, &len);
	if (err != PGCOORD_OK)
		return judge(t, method, err, &a->o);
	msgpack_unpacked_init(&a->u);
	if (msgpack_unpack_next(&a->u, a->buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    a->u.data.type != MSGPACK_OBJECT_MAP) {
		msgpack_unpacked_destroy(&a->u);
		snprintf(a->o.why, sizeof(a->o.why), "%s: the result does not decode", method);
		return true;
	}
	a->obj = &a->u.data;
	return true;
}

/* The typed call i of a text frame (methods[i]). */
static pgcoord_err fetch(struct top *t, size_t i, struct typed_frame *f)
{
	pgcoord *c = t->conn;
	int ms = t->opt->timeout_ms;

	switch (i) {
	case 0:
		return pgcoord_agent_status_get(c, ms, &f->status);
	case 1:
		return pgcoord_fleet_agents_get(c, ms, &f->agents);
	case 2:
		return pgcoord_fleet_sessions_get(c, ms, &f->sessions);
	case 3:
		return pgcoord_lease_list_get(c, ms, &f->leases);
	case 4:
		return pgcoord_quota_list_get(c, ms, &f->quotas);
	default:
		return pgcoord_permit_list_get(c, NULL, "uncertain", ms, &f->permits);
	}
}

static void typed_frame_free(struct typed_frame *f)
{
	pgcoord_agent_status_free(f->status);
	pgcoord_agent_list_free(f->agents);
	pgcoord_session_list_free(f->sessions);
	pgcoord_lease_list_free(f->leases);
	pgcoord_quota_list_free(f->quotas);
	pgcoord_permit_list_free(f->permits);
}

/* A string for the screen ("" for NULL), control bytes dropped. */
static const char *clean(const char *s, char *buf, size_t len)
{
	size_t j = 0;
	for (size_t i = 0; s && s[i] && j + 1 < len; i++)
		if ((unsigned char)s[i] >= 0x20 && s[i] != 0x7f)
			buf[j++] = s[i];
	buf[j] = '\0';
	return buf;
}

/* The database clock of a result, or this host's when it sent none. */
static int64_t now_of(int64_t now_at)
{
	msgpack_object none = {.type = MSGPACK_OBJECT_NIL};
	return now_at > 0 ? now_at : ctl_now_ms(&none);
}

/* Table cells packed from struct fields; -1 (or NULL) is "none": nil. */
static void cell_int(msgpack_packer *pk, const char *key, int64_t v, bool present)
{
	ctl_pack_cstr(pk, key);
	if (present)
		msgpack_pack_int64(pk, v);
	else
		msgpack_pack_nil(pk);
}

static void cell_str(msgpack_packer *pk, const char *key, const char *v)
{
	if (v) {
		ctl_pack_kv_str(pk, key, v);
	} else {
		ctl_pack_cstr(pk, key);
		msgpack_pack_nil(pk);
	}
}

/* Prints a section heading and rows (packed by the caller as maps with
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

static void note(const char *title, const struct outcome *o)
{
	if (o->missing)
		return; /* this agent has no such method: no section */
	printf("\n%s\n  (%s)\n", title, o->why[0] ? o->why : "no answer");
}

static void draw_header(const struct typed_frame *f, int interval_ms)
{
	const struct pgcoord_agent_status *s = f->status;
	char replica[256], state[32], ago[32], up[32], every[32];
	time_t now = time(NULL);
	struct tm tm;
	char when[32];

	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	ctl_format_duration(every, sizeof(every), interval_ms);
	printf("pgcoordctl top  %s  (every %s, Ctrl-C quits)\n", when, every);
	if (!s) {
		printf("agent   unreachable: %s\n", f->o[0].why);
		return;
	}
	int64_t hb = s->last_heartbeat_ms_ago;
	if (hb >= 0)
		ctl_format_duration(ago, sizeof(ago), hb);
	else
		snprintf(ago, sizeof(ago), "never");
	ctl_format_duration(up, sizeof(up), s->uptime_ms);
	printf("agent   %s %s, database %s, heartbeat %s%s, up %s\n",
	       clean(s->replica_id, replica, sizeof(replica)),
	       clean(s->state, state, sizeof(state)), s->db_up ? "up" : "down", ago,
	       hb >= 0 ? " ago" : "", up);
	printf("here    %lld connection%s, %lld session%s, %lld lease%s held%s\n",
	       (long long)s->connections, s->connections == 1 ? "" : "s", (long long)s->sessions,
	       s->sessions == 1 ? "" : "s", (long long)s->leases_held,
	       s->leases_held == 1 ? "" : "s", s->janitor ? ", the fleet's janitor" : "");
	if (f->agents || f->sessions) {
		size_t live = 0, n = f->agents ? f->agents->count : 0;
		size_t ns = f->sessions ? f->sessions->count : 0;
		for (size_t i = 0; i < n; i++)
			live += f->agents->agents[i].live;
		printf("fleet   %zu agent%s (%zu live), %zu live session%s\n", n, n == 1 ? "" : "s",
		       live, ns, ns == 1 ? "" : "s");
	}
}

static void draw_agents(const struct typed_frame *f)
{
	static const struct ctl_column cols[] = {
	    {"REPLICA", "replica_id", CTL_FMT_AUTO},
	    {"LIVE", "live", CTL_FMT_YESNO},
	    {"HOST", "host", CTL_FMT_AUTO},
	    {"PID", "pid", CTL_FMT_AUTO},
	    {"HEARTBEAT", "heartbeat_at", CTL_FMT_AGE},
	    {"VERSION", "version", CTL_FMT_AUTO},
	};
	const struct pgcoord_agent_list *l = f->agents;
	msgpack_sbuffer sb;
	msgpack_packer pk;

	if (!l) {
		note("AGENTS", &f->o[1]);
		return;
	}
	/* live ones first: the dead are history */
	size_t n = l->count < TOP_AGENTS_MAX ? l->count : TOP_AGENTS_MAX, done = 0;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < l->count && done < n; i++) {
			const struct pgcoord_agent_info *r = &l->agents[i];
			if (r->live != (pass == 0))
				continue;
			msgpack_pack_map(&pk, 6);
			cell_str(&pk, "replica_id", r->replica_id);
			ctl_pack_kv_bool(&pk, "live", r->live);
			cell_str(&pk, "host", r->host);
			cell_int(&pk, "pid", r->pid, true);
			cell_int(&pk, "heartbeat_at", r->heartbeat_at, r->heartbeat_at >= 0);
			cell_str(&pk, "version", r->version);
			done++;
		}
	}
	section("AGENTS", &sb, n, l->count, cols, 6, now_of(l->now_at));
	msgpack_sbuffer_destroy(&sb);
}

static void draw_leases(const struct typed_frame *f)
{
	static const struct ctl_column cols[] = {
	    {"LEASE", "name", CTL_FMT_AUTO},
	    {"HOLDER", "holder", CTL_FMT_AUTO},
	    {"SESSION", "session", CTL_FMT_AUTO},
	    {"EPOCH", "epoch", CTL_FMT_AUTO},
	    {"EXPIRES_IN", "expires_in_ms", CTL_FMT_DURATION},
	};
	const struct pgcoord_lease_list *l = f->leases;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char buf[256];

	if (!l) {
		note("LEASES", &f->o[3]);
		return;
	}
	size_t n = l->count < TOP_LEASES_MAX ? l->count : TOP_LEASES_MAX;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		const struct pgcoord_lease_info *r = &l->leases[i];
		bool held = r->holder_session != 0;
		msgpack_pack_map(&pk, 5);
		cell_str(&pk, "name", r->name);
		ctl_pack_kv_str(&pk, "holder",
				held ? clean(r->holder_replica, buf, sizeof(buf)) : "(free)");
		cell_int(&pk, "session", r->holder_session, held);
		cell_int(&pk, "epoch", r->epoch, true);
		cell_int(&pk, "expires_in_ms", r->expires_in_ms, held);
	}
	section("LEASES", &sb, n, l->count, cols, 5, 0);
	msgpack_sbuffer_destroy(&sb);
}

/* in_flight / limit, with a closed quota (limit 0) first */
static double fullness(const struct pgcoord_quota_info *q)
{
	return q->limit > 0 ? (double)q->in_flight / (double)q->limit : 1e9;
}

static void draw_quotas(const struct typed_frame *f)
{
	static const struct ctl_column cols[] = {
	    {"QUOTA", "key", CTL_FMT_AUTO},	      {"LIMIT", "limit", CTL_FMT_AUTO},
	    {"IN_FLIGHT", "in_flight", CTL_FMT_AUTO}, {"UNCERTAIN", "uncertain", CTL_FMT_AUTO},
	    {"USED", "used", CTL_FMT_AUTO},
	};
	const struct pgcoord_quota_list *l = f->quotas;
	const struct pgcoord_quota_info *pick[TOP_QUOTAS_MAX];
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t n = 0;

	if (!l) {
		note("QUOTAS NEAREST THEIR LIMIT", &f->o[4]);
		return;
	}
	/* a partial selection sort: the few fullest */
	for (size_t i = 0; i < l->count; i++) {
		const struct pgcoord_quota_info *q = &l->rows[i];
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
		if (pick[i]->limit > 0)
			snprintf(used, sizeof(used), "%.0f%%", 100.0 * fullness(pick[i]));
		else
			snprintf(used, sizeof(used), "closed");
		msgpack_pack_map(&pk, 5);
		cell_str(&pk, "key", pick[i]->key);
		cell_int(&pk, "limit", pick[i]->limit, pick[i]->limit >= 0);
		cell_int(&pk, "in_flight", pick[i]->in_flight, pick[i]->in_flight >= 0);
		cell_int(&pk, "uncertain", pick[i]->uncertain, pick[i]->uncertain >= 0);
		ctl_pack_kv_str(&pk, "used", used);
	}
	section("QUOTAS NEAREST THEIR LIMIT", &sb, n, l->count, cols, 5, 0);
	msgpack_sbuffer_destroy(&sb);
}

static void draw_permits(const struct typed_frame *f)
{
	static const struct ctl_column cols[] = {
	    {"PERMIT", "id", CTL_FMT_AUTO},
	    {"UNCERTAIN_SINCE", "state_at", CTL_FMT_AGE},
	    {"OWNER", "owner", CTL_FMT_AUTO},
	    {"REASON", "uncertain_reason", CTL_FMT_AUTO},
	};
	const struct pgcoord_permit_list *l = f->permits;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char who[300], rep[256];

	if (!l) {
		note("UNCERTAIN PERMITS", &f->o[5]);
		return;
	}
	size_t n = l->count < TOP_PERMITS_MAX ? l->count : TOP_PERMITS_MAX;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		const struct pgcoord_permit_info *p = l->permits[i];
		msgpack_pack_map(&pk, 4);
		cell_str(&pk, "id", p->id);
		cell_int(&pk, "state_at", p->state_at, p->state_at >= 0);
		if (p->owner_session)
			snprintf(who, sizeof(who), "%lld@%s", (long long)p->owner_session,
				 clean(p->owner_replica, rep, sizeof(rep)));
		else
			snprintf(who, sizeof(who), "(none)");
		ctl_pack_kv_str(&pk, "owner", who);
		cell_str(&pk, "uncertain_reason", p->uncertain_reason);
	}
	size_t total = l->count + l->truncated; /* truncated: at least one more */
	section(total ? "UNCERTAIN PERMITS (oldest first)" : "UNCERTAIN PERMITS", &sb, n, total,
		cols, 4, now_of(l->now_at));
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
		} else if (answers[i].o.missing) {
			msgpack_pack_nil(&pk);
		} else {
			msgpack_pack_map(&pk, 1);
			ctl_pack_kv_str(&pk, "error", answers[i].o.why);
		}
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_json(stdout, &u.data);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}

/* A --json frame: the agent's results as they came. */
static bool json_frame(struct top *t)
{
	static const char *const names[] = {"status", "agents", "sessions",
					    "leases", "quotas", "permits"};
	struct answer a[6];
	msgpack_sbuffer uncertain;
	msgpack_packer pk;
	bool reached = true;

	/* permit.list {state: uncertain, limit: 5} */
	msgpack_sbuffer_init(&uncertain);
	msgpack_packer_init(&pk, &uncertain, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	ctl_pack_kv_str(&pk, "state", "uncertain");
	ctl_pack_kv_int(&pk, "limit", TOP_PERMITS_MAX);
	for (size_t i = 0; i < 6; i++) {
		memset(&a[i], 0, sizeof(a[i]));
		if (!reached) {
			snprintf(a[i].o.why, sizeof(a[i].o.why), "%s", a[0].o.why);
			continue;
		}
		if (!ask(t, methods[i], i == 5 ? uncertain.data : NULL, i == 5 ? uncertain.size : 0,
			 &a[i]))
			reached = false;
	}
	msgpack_sbuffer_destroy(&uncertain);
	print_json_frame(names, a, 6);
	for (size_t i = 0; i < 6; i++)
		answer_free(&a[i]);
	return reached;
}

/* A text frame, from the typed reads. */
static bool text_frame(struct top *t)
{
	struct typed_frame f;
	bool reached = true;

	memset(&f, 0, sizeof(f));
	for (size_t i = 0; i < 6; i++) {
		if (!reached || !reach(t, &f.o[i])) {
			if (!reached)
				snprintf(f.o[i].why, sizeof(f.o[i].why), "%s", f.o[0].why);
			reached = false;
			continue;
		}
		reached = judge(t, methods[i], fetch(t, i, &f), &f.o[i]);
	}
	if (t->tty)
		fputs("\033[H\033[2J", stdout);
	draw_header(&f, t->opt->interval_ms);
	if (reached) {
		draw_agents(&f);
		draw_leases(&f);
		draw_quotas(&f);
		draw_permits(&f);
	}
	if (!t->tty)
		fputs("\n", stdout);
	typed_frame_free(&f);
	return reached;
}

/* One frame; false when the agent could not be reached at all. */
static bool frame(struct top *t)
{
	bool reached = t->opt->json ? json_frame(t) : text_frame(t);
	fflush(stdout);
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
