/*
 * watches.c — see watches.h.
 */
#include "agent/watches.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/reply.h"
#include "agent/sessions.h"

#define WATCH_TARGET_MAX 200 /* quota keys, permit ids and record kinds */
/* Orphaned records one poll reads per watched kind; more are reported as
 * the first ones are adopted or settled. */
#define WATCH_ORPHANS_PER_KIND 256

enum watch_kind { WATCH_QUOTA, WATCH_PERMIT, WATCH_RECORD, WATCH__COUNT };

/* the first column of a poll row says which kind of watch it answers */
static const char watch_tag[WATCH__COUNT] = {'q', 'p', 'r'};

/* A record reported orphaned, so it is reported once per owner it lost. */
struct orphan {
	char *key;
	int64_t token;
};

struct watch {
	struct watch *next;
	int64_t id;
	int64_t session_id;
	enum watch_kind kind;
	char *target; /* the quota key, permit id or record kind */
	/* false until a poll pushed the current state to the watcher (again
	 * after the session was detached: what changed meanwhile is lost) */
	bool primed;
	/* what the watcher was told last: quotas (limit, in_flight, held,
	 * uncertain, permits) and permits (token, owner_session) */
	bool exists;
	int64_t n[5];
	char *state, *phase;	/* permits */
	struct orphan *orphans; /* records: the last poll's, sorted by key */
	size_t norphans;
};

struct watch_registry {
	struct watch *list;
	int count;
	int64_t next_id;
	struct event *timer;
	bool poll_in_flight;
	uint64_t polls; /* statements sent */
};

static struct watch_registry *watch_reg(const struct agent *ag)
{
	return ag->watches;
}

static void forget_orphans(struct watch *w)
{
	for (size_t i = 0; i < w->norphans; i++)
		free(w->orphans[i].key);
	free(w->orphans);
	w->orphans = NULL;
	w->norphans = 0;
}

static void watch_free(struct watch *w)
{
	forget_orphans(w);
	free(w->target);
	free(w->state);
	free(w->phase);
	free(w);
}

int watches_count(const struct agent *ag)
{
	return watch_reg(ag) ? watch_reg(ag)->count : 0;
}

uint64_t watches_polls(const struct agent *ag)
{
	return watch_reg(ag) ? watch_reg(ag)->polls : 0;
}

/* Every watch method's answer: the watch, and how often it is read. */
struct watch_view {
	int64_t watch, poll_ms;
};

static const struct reply_col watch_cols[] = {
    REPLY_FIELD("watch", REPLY_FIELD_INT, struct watch_view, watch),
    REPLY_FIELD("poll_ms", REPLY_FIELD_INT, struct watch_view, poll_ms),
};
const struct reply_kind watch_reply = REPLY_KIND(watch_cols);

/* --- the methods ------------------------------------------------------ */

static void watch_method(struct request *req, enum watch_kind kind, const char *param)
{
	struct agent *ag = req->ag;
	struct watch_registry *rg = watch_reg(ag);
	int64_t session_id = req->conn->session->id;
	struct watch *found = NULL;
	char *target = NULL;
	int watched = 0;

	if (!rg) {
		req_fail(req, PGC_E_SHUTTING_DOWN, "the agent is shutting down");
		return;
	}
	if (!req_param_name(req, param, true, WATCH_TARGET_MAX, &target))
		return;
	for (struct watch *w = rg->list; w; w = w->next) {
		if (w->session_id != session_id)
			continue;
		watched++;
		if (w->kind == kind && strcmp(w->target, target) == 0)
			found = w;
	}
	if (found) {
		/* watching it again: the next poll pushes the current state again */
		found->primed = false;
		forget_orphans(found);
		free(target);
	} else {
		/* every watch is read at every poll: a session may keep only so many */
		if (watched >= ag->cfg.max_watches_per_session) {
			free(target);
			req_fail(req, PGC_E_BUSY,
				 "session %" PRId64 " already has %d watches "
				 "(max_watches_per_session); cancel one with watch.cancel",
				 session_id, watched);
			return;
		}
		found = calloc(1, sizeof(*found));
		if (!found) {
			free(target);
			req_fail(req, PGC_E_INTERNAL, "out of memory");
			return;
		}
		found->id = ++rg->next_id;
		found->session_id = session_id;
		found->kind = kind;
		found->target = target;
		found->next = rg->list;
		rg->list = found;
		rg->count++;
	}
	struct watch_view v = {.watch = found->id, .poll_ms = ag->cfg.watch_poll_ms};
	reply_pack_struct(req_result(req), &watch_reply, &v);
	req_done(req);
}

struct cancel_view {
	bool cancelled;
};

static const struct reply_col cancel_cols[] = {
    REPLY_FIELD("cancelled", REPLY_FIELD_BOOL, struct cancel_view, cancelled),
};
const struct reply_kind watch_cancel_reply = REPLY_KIND(cancel_cols);

void rpc_quota_watch(struct request *req)
{
	watch_method(req, WATCH_QUOTA, "key");
}

void rpc_permit_watch(struct request *req)
{
	watch_method(req, WATCH_PERMIT, "id");
}

void rpc_record_watch(struct request *req)
{
	watch_method(req, WATCH_RECORD, "kind");
}

void rpc_watch_cancel(struct request *req)
{
	struct watch_registry *rg = watch_reg(req->ag);
	int64_t id = 0;
	bool cancelled = false;

	if (!req_param_int(req, "watch", true, 1, INT64_MAX, &id, NULL))
		return;
	if (!rg) {
		req_fail(req, PGC_E_SHUTTING_DOWN, "the agent is shutting down");
		return;
	}
	/* only the caller's session's own: another session's id is unknown */
	for (struct watch **pp = &rg->list; *pp; pp = &(*pp)->next) {
		struct watch *w = *pp;
		if (w->id == id && w->session_id == req->conn->session->id) {
			*pp = w->next;
			watch_free(w);
			rg->count--;
			cancelled = true;
			break;
		}
	}
	struct cancel_view v = {.cancelled = cancelled};
	reply_pack_struct(req_result(req), &watch_cancel_reply, &v);
	req_done(req);
}

/* --- the poll --------------------------------------------------------- */

/*
 * One statement for every watch of the agent. Each branch reads by primary
 * key: quotas and permits by = ANY (the quota_status view's grouping key
 * takes the condition inside), records by their kind, the primary key's
 * prefix. Columns: tag, target, record key, five integers, four texts —
 *   q: limit, in_flight, held, uncertain, permits
 *   p: token, owner_session, state_at, phase_at, released_at;
 *      state, phase, owner_replica, uncertain_reason
 *   r: token, owner_session, owner_uid, updated_at; state, permit,
 *      owner_replica
 */
#define WATCH_POLL_SQL                                                                             \
	"SELECT 'q'::text, q.key::text, NULL::text, q.\"limit\"::bigint, q.in_flight, "            \
	"q.held::bigint, q.uncertain::bigint, q.permits::bigint, NULL::text, NULL::text, "         \
	"NULL::text, NULL::text "                                                                  \
	"FROM pgcoord.quota_status q WHERE q.key = ANY ($1::text[]) "                              \
	"UNION ALL "                                                                               \
	"SELECT 'p', p.id, NULL, p.token, p.owner_session, pgcoord.ms(p.state_at), "               \
	"pgcoord.ms(p.phase_at), pgcoord.ms(p.released_at), p.effective_state, p.phase, "          \
	"p.owner_replica, p.effective_reason "                                                     \
	"FROM pgcoord.permit_status p WHERE p.id = ANY ($2::text[]) "                              \
	"UNION ALL "                                                                               \
	"SELECT 'r', k.kind, o.key, o.token, o.owner_session, "                                    \
	"pgcoord.session_owner_uid(o.owner_session), o.updated_at, NULL, o.state, o.permit_id, "   \
	"o.owner_replica, NULL "                                                                   \
	"FROM unnest($3::text[]) AS k(kind) CROSS JOIN LATERAL ("                                  \
	"SELECT r.key, r.token, r.owner_session, r.updated_at, r.state, r.permit_id, "             \
	"r.owner_replica FROM pgcoord.record_status r "                                            \
	"WHERE r.kind = k.kind AND NOT r.terminal AND NOT r.owner_live "                           \
	"ORDER BY r.key LIMIT " WATCH_ORPHANS_PER_KIND_S ") o"
#define WATCH_STR_(x) #x
#define WATCH_STR(x) WATCH_STR_(x)
#define WATCH_ORPHANS_PER_KIND_S WATCH_STR(WATCH_ORPHANS_PER_KIND)

enum {
	COL_TAG,
	COL_TARGET,
	COL_KEY,
	COL_N1,
	COL_N2,
	COL_N3,
	COL_N4,
	COL_N5,
	COL_T1,
	COL_T2,
	COL_T3,
	COL_T4,
	POLL_COLS
};

/* A poll row, sortable by (tag, target, key) so each watch finds its rows
 * by binary search. */
struct rowref {
	char tag;
	const char *target, *key;
	int row;
};

static int rowref_cmp(const void *pa, const void *pb)
{
	const struct rowref *a = pa, *b = pb;
	int c;
	if (a->tag != b->tag)
		return a->tag < b->tag ? -1 : 1;
	if ((c = strcmp(a->target, b->target)) != 0)
		return c;
	return strcmp(a->key, b->key);
}

/* The index of the first row of (tag, target), or n when there is none. */
static size_t rows_find(const struct rowref *rows, size_t n, char tag, const char *target)
{
	size_t lo = 0, hi = n;
	struct rowref probe = {tag, target, "", 0};
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (rowref_cmp(&rows[mid], &probe) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < n && rows[lo].tag == tag && strcmp(rows[lo].target, target) == 0)
		return lo;
	return n;
}

/* A notification's own fields; the rest are cells of the poll's row
 * (none when the watched permit does not exist: row -1, each cell nil). */
struct note {
	int64_t watch;
	const char *target; /* the quota key, permit id or record kind */
	bool exists;
	int64_t limit, in_flight, held, uncertain, room, permits; /* quota.changed */
};

#define NOTE(key, name, type) REPLY_FIELD(key, type, struct note, name)

static const struct reply_col quota_changed_cols[] = {
    NOTE("watch", watch, REPLY_FIELD_INT),	   NOTE("key", target, REPLY_FIELD_STR),
    NOTE("exists", exists, REPLY_FIELD_BOOL),	   NOTE("limit", limit, REPLY_FIELD_INT),
    NOTE("in_flight", in_flight, REPLY_FIELD_INT), NOTE("held", held, REPLY_FIELD_INT),
    NOTE("uncertain", uncertain, REPLY_FIELD_INT), NOTE("room", room, REPLY_FIELD_INT),
    NOTE("permits", permits, REPLY_FIELD_INT),
};
const struct reply_kind quota_changed_params = REPLY_KIND(quota_changed_cols);

static const struct reply_col permit_changed_cols[] = {
    NOTE("watch", watch, REPLY_FIELD_INT),
    NOTE("id", target, REPLY_FIELD_STR),
    NOTE("exists", exists, REPLY_FIELD_BOOL),
    {"state", REPLY_STR, COL_T1, 0},
    {"phase", REPLY_STR, COL_T2, 0},
    {"token", REPLY_INT, COL_N1, 0},
    {"owner_session", REPLY_INT, COL_N2, 0},
    {"owner_replica", REPLY_STR, COL_T3, 0},
    {"uncertain_reason", REPLY_STR, COL_T4, 0},
    {"state_at", REPLY_INT, COL_N3, 0},
    {"phase_at", REPLY_INT, COL_N4, 0},
    {"released_at", REPLY_INT, COL_N5, 0},
};
const struct reply_kind permit_changed_params = REPLY_KIND(permit_changed_cols);

static const struct reply_col record_orphaned_cols[] = {
    NOTE("watch", watch, REPLY_FIELD_INT),   NOTE("kind", target, REPLY_FIELD_STR),
    {"key", REPLY_STR, COL_KEY, 0},	     {"state", REPLY_STR, COL_T1, 0},
    {"token", REPLY_INT, COL_N1, 0},	     {"owner_session", REPLY_INT, COL_N2, 0},
    {"owner_replica", REPLY_STR, COL_T3, 0}, {"owner_uid", REPLY_INT, COL_N3, 0},
    {"permit", REPLY_STR, COL_T2, 0},	     {"updated_at", REPLY_INT, COL_N4, 0},
};
const struct reply_kind record_orphaned_params = REPLY_KIND(record_orphaned_cols);

/* Pushes one notification, with the cells of res's row (-1: none). */
static void notify(struct conn *c, enum notice_id id, const struct note *nt, const PGresult *res,
		   int row)
{
	struct reply_src src = {.res = res, .row = row, .nrows = 1, .c = nt};

	conn_notify(c, id, &src);
}

static bool str_changed(char **saved, const PGresult *res, int row, int col)
{
	const char *v = row >= 0 && !PQgetisnull(res, row, col) ? PQgetvalue(res, row, col) : NULL;
	if ((!v && !*saved) || (v && *saved && strcmp(v, *saved) == 0))
		return false;
	free(*saved);
	*saved = v ? strdup(v) : NULL;
	return true;
}

static void poll_quota(struct watch *w, struct conn *c, const PGresult *res, int row)
{
	int64_t n[5] = {0};
	bool exists = row >= 0, changed;
	for (int i = 0; exists && i < 5; i++)
		n[i] = pgrow_int(res, row, COL_N1 + i);
	changed = exists != w->exists || memcmp(n, w->n, sizeof(n)) != 0;
	w->exists = exists;
	memcpy(w->n, n, sizeof(n));
	if (changed || !w->primed) {
		struct note nt = {.watch = w->id,
				  .target = w->target,
				  .exists = exists,
				  .limit = n[0],
				  .in_flight = n[1],
				  .held = n[2],
				  .uncertain = n[3],
				  /* a limit lowered below in_flight leaves no room */
				  .room = n[0] > n[1] ? n[0] - n[1] : 0,
				  .permits = n[4]};
		notify(c, NOTICE_QUOTA_CHANGED, &nt, NULL, -1);
	}
	w->primed = true;
}

static void poll_permit(struct watch *w, struct conn *c, const PGresult *res, int row)
{
	int64_t n[2] = {0};
	bool exists = row >= 0, changed;
	if (exists) {
		n[0] = pgrow_int(res, row, COL_N1);
		n[1] = pgrow_int(res, row, COL_N2);
	}
	/* the state, the phase, and who owns it under which token */
	changed = exists != w->exists || n[0] != w->n[0] || n[1] != w->n[1];
	changed |= str_changed(&w->state, res, row, COL_T1);
	changed |= str_changed(&w->phase, res, row, COL_T2);
	w->exists = exists;
	w->n[0] = n[0];
	w->n[1] = n[1];
	if (changed || !w->primed) {
		struct note nt = {.watch = w->id, .target = w->target, .exists = exists};
		notify(c, NOTICE_PERMIT_CHANGED, &nt, res, row);
	}
	w->primed = true;
}

static int orphan_cmp(const void *pa, const void *pb)
{
	const struct orphan *a = pa, *b = pb;
	int c = strcmp(a->key, b->key);
	return c ? c : (a->token > b->token) - (a->token < b->token);
}

/* rows[first..] are the watched kind's orphaned records, by key: pushes
 * those the watcher was not told of (a new owner that died again has a
 * new token), and keeps this poll's set. */
static void poll_record(struct watch *w, struct conn *c, const PGresult *res,
			const struct rowref *rows, size_t nrows, size_t first)
{
	size_t count = 0;
	while (first + count < nrows && rows[first + count].tag == watch_tag[WATCH_RECORD] &&
	       strcmp(rows[first + count].target, w->target) == 0)
		count++;
	struct orphan *now = count ? calloc(count, sizeof(*now)) : NULL;
	if (count && !now)
		return; /* out of memory: the next poll tries again */
	for (size_t i = 0; i < count; i++) {
		int row = rows[first + i].row;
		struct orphan probe = {(char *)rows[first + i].key, pgrow_int(res, row, COL_N1)};
		if (!w->primed || !w->orphans ||
		    !bsearch(&probe, w->orphans, w->norphans, sizeof(*w->orphans), orphan_cmp)) {
			struct note nt = {.watch = w->id, .target = w->target, .exists = true};
			notify(c, NOTICE_RECORD_ORPHANED, &nt, res, row);
		}
		now[i].key = strdup(probe.key);
		now[i].token = probe.token;
	}
	forget_orphans(w);
	w->orphans = now;
	w->norphans = count;
	for (size_t i = 0; i < count; i++)
		if (!now[i].key) { /* out of memory: report them again rather than never */
			forget_orphans(w);
			break;
		}
	if (w->orphans)
		qsort(w->orphans, w->norphans, sizeof(*w->orphans), orphan_cmp);
	w->primed = true;
}

static void poll_done(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;
	struct watch_registry *rg = watch_reg(ag);
	struct rowref *rows = NULL;
	size_t n;

	if (!rg)
		return; /* the agent is exiting */
	rg->poll_in_flight = false;
	if (!r->ok) {
		log_debug(&ag->log, "watches", "the watch poll failed: %s", r->message);
		return;
	}
	if (PQnfields(r->res) != POLL_COLS)
		return;
	n = (size_t)PQntuples(r->res);
	if (n && !(rows = calloc(n, sizeof(*rows))))
		return;
	for (size_t i = 0; i < n; i++) {
		rows[i].tag = PQgetvalue(r->res, (int)i, COL_TAG)[0];
		rows[i].target = PQgetvalue(r->res, (int)i, COL_TARGET);
		rows[i].key = PQgetvalue(r->res, (int)i, COL_KEY); /* "" for NULL */
		rows[i].row = (int)i;
	}
	if (n)
		qsort(rows, n, sizeof(*rows), rowref_cmp);
	for (struct watch *w = rg->list; w; w = w->next) {
		struct session *s = sessions_find(ag, w->session_id);
		if (!s || !s->conn)
			continue; /* detached: it hears the current state on resume */
		size_t at = rows_find(rows, n, watch_tag[w->kind], w->target);
		int row = at < n ? rows[at].row : -1;
		switch (w->kind) {
		case WATCH_QUOTA:
			poll_quota(w, s->conn, r->res, row);
			break;
		case WATCH_PERMIT:
			poll_permit(w, s->conn, r->res, row);
			break;
		default:
			poll_record(w, s->conn, r->res, rows, n, at);
			break;
		}
	}
	free(rows);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The distinct targets of one kind of watch as a Postgres text[] literal,
 * each element quoted and escaped. malloc'd; NULL when out of memory. */
static char *targets_literal(struct watch_registry *rg, enum watch_kind kind)
{
	size_t count = 0, cap = 3, len = 0;
	const char **v;
	char *out;

	for (struct watch *w = rg->list; w; w = w->next)
		if (w->kind == kind) {
			count++;
			cap += 2 * strlen(w->target) + 3;
		}
	v = calloc(count ? count : 1, sizeof(*v));
	out = malloc(cap);
	if (!v || !out) {
		free(v);
		free(out);
		return NULL;
	}
	count = 0;
	for (struct watch *w = rg->list; w; w = w->next)
		if (w->kind == kind)
			v[count++] = w->target;
	qsort(v, count, sizeof(*v), str_cmp);
	out[len++] = '{';
	for (size_t i = 0; i < count; i++) {
		if (i && strcmp(v[i], v[i - 1]) == 0)
			continue; /* many watchers, one element */
		if (len > 1)
			out[len++] = ',';
		out[len++] = '"';
		for (const char *p = v[i]; *p; p++) {
			if (*p == '"' || *p == '\\')
				out[len++] = '\\';
			out[len++] = *p;
		}
		out[len++] = '"';
	}
	out[len++] = '}';
	out[len] = '\0';
	free(v);
	return out;
}

/* Drops the watches of sessions that ended; a detached session's watches
 * stay (it may be resumed) but push the current state again on resume. */
static void prune(struct agent *ag, struct watch_registry *rg)
{
	for (struct watch **pp = &rg->list; *pp;) {
		struct watch *w = *pp;
		struct session *s = sessions_find(ag, w->session_id);
		if (!s || s->closing) {
			*pp = w->next;
			watch_free(w);
			rg->count--;
			continue;
		}
		if (!s->conn && w->primed) {
			w->primed = false;
			forget_orphans(w);
		}
		pp = &w->next;
	}
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	struct watch_registry *rg = watch_reg(ag);
	char *lits[WATCH__COUNT] = {NULL};
	bool ok = true;
	(void)fd;
	(void)what;

	prune(ag, rg);
	/* never more than one statement: a slow one makes the next poll wait */
	if (!rg->list || rg->poll_in_flight || !ag->id.registered)
		return;
	for (int k = 0; k < WATCH__COUNT; k++)
		ok &= (lits[k] = targets_literal(rg, (enum watch_kind)k)) != NULL;
	if (ok) {
		const char *params[WATCH__COUNT] = {lits[0], lits[1], lits[2]};
		if (db_query(ag->db, DB_LANE_REQUESTS, WATCH_POLL_SQL, WATCH__COUNT, params,
			     poll_done, ag)) {
			rg->poll_in_flight = true;
			rg->polls++;
		}
	}
	for (int k = 0; k < WATCH__COUNT; k++)
		free(lits[k]);
}

void watches_each_quota(const struct agent *ag, watches_quota_fn fn, void *arg)
{
	struct watch_registry *rg = watch_reg(ag);
	if (!rg)
		return;
	for (struct watch *w = rg->list; w; w = w->next) {
		if (w->kind != WATCH_QUOTA)
			continue;
		/* one call per key: skip it when an earlier watch has it */
		bool seen = false;
		for (struct watch *v = rg->list; v != w && !seen; v = v->next)
			seen = v->kind == WATCH_QUOTA && strcmp(v->target, w->target) == 0;
		if (seen)
			continue;
		struct watched_quota q = {.key = w->target};
		const struct watch *last = NULL;
		for (struct watch *v = w; v; v = v->next)
			if (v->kind == WATCH_QUOTA && strcmp(v->target, w->target) == 0) {
				q.watchers++;
				if (v->primed)
					last = v;
			}
		if (last) {
			q.read = true;
			q.exists = last->exists;
			q.limit = last->n[0];
			q.in_flight = last->n[1];
			q.uncertain = last->n[3];
		}
		fn(arg, &q);
	}
}

bool watches_start(struct agent *ag)
{
	struct watch_registry *rg = calloc(1, sizeof(*rg));
	if (!rg)
		return false;
	rg->timer = event_new(ag->base, -1, EV_PERSIST, poll_cb, ag);
	if (!rg->timer) {
		free(rg);
		return false;
	}
	ag->watches = rg;
	struct timeval tv = {ag->cfg.watch_poll_ms / 1000, (ag->cfg.watch_poll_ms % 1000) * 1000};
	event_add(rg->timer, &tv);
	return true;
}

void watches_finish(struct agent *ag)
{
	struct watch_registry *rg = watch_reg(ag);
	if (!rg)
		return;
	while (rg->list) {
		struct watch *w = rg->list;
		rg->list = w->next;
		watch_free(w);
	}
	event_free(rg->timer);
	free(rg);
	ag->watches = NULL;
}
