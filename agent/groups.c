/*
 * groups.c — group admission; see groups.h.
 */
#include "agent/groups.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"

/* A bound on one statement's size: an intent may be 64 KiB. Members past
 * it ride the next statement, queued at once. */
#define GROUP_MAX_MEMBERS 256

/* How often a member Postgres stopped to break a deadlock is sent again. */
#define GROUP_DEADLOCK_RETRIES 3

struct member {
	struct member *next;
	struct request *req;
	void *ctx;
	char *args[GROUP_MAX_ARGS];
	int deadlocks;	     /* times its part was stopped to break a deadlock */
	struct timespec due; /* arrival + query_timeout_ms: its deadline */
	struct group_keys keys;
};

/* One statement: queued with no members, then built with what waited. */
struct batch {
	struct group *g;
	struct member **members;
	size_t n;
	bool built;
	struct batch *next_sent; /* built and not answered yet: g->sent */
};

/* The keys of a permit this agent admitted, until it is released. */
struct remembered {
	uint64_t id; /* group_key_hash of the permit id; 0 = empty */
	struct group_keys *keys;
};

/* Direct-mapped: a new id takes its slot from whatever was there, so the
 * memory is bounded and a forgotten id only goes unheld. */
#define GROUP_REMEMBERED 4096

struct group {
	struct agent *ag;
	const struct group_kind *kind;
	struct group *slow;		 /* takes the members this kind leaves (PCSLW) */
	struct member *head, *tail;	 /* waiting for the statement that is queued */
	struct member *held, *held_tail; /* share a key with a statement sent */
	struct batch *sent;		 /* built, not answered: their keys are in flight */
	struct remembered *remembered;	 /* GROUP_REMEMBERED slots, made on first use */
	bool queued;			 /* a statement is queued: newcomers ride it */
	struct event *requeue;		 /* queues the next statement for an overflow */
	struct event *expire;		 /* times out members held back (the bounds) */
	struct group_stats stats;
	/* members per statement, a moving average over the last few (weight
	 * 1/4 each), seeded by the first: the load the bound adapts to */
	double recent_members;
};

static void member_free(struct member *m)
{
	for (int i = 0; i < GROUP_MAX_ARGS; i++)
		free(m->args[i]);
	free(m);
}

static void member_fail(const struct group *g, struct member *m, const struct db_result *r)
{
	g->kind->fail(m->req, m->ctx, r);
	member_free(m);
}

static void fail_unavailable(const struct group *g, struct member *m, const char *message)
{
	struct db_result r = {0};
	r.error = PGC_E_UNAVAILABLE;
	r.message = message;
	member_fail(g, m, &r);
}

/* A Postgres array literal of one argument of every member: {"a",NULL,"b"}. */
static char *array_literal(struct member *const *members, size_t n, int arg)
{
	size_t cap = 3, len = 0;
	char *out;
	for (size_t i = 0; i < n; i++) {
		const char *v = members[i]->args[arg];
		cap += v ? 2 * strlen(v) + 3 : 5;
	}
	if (!(out = malloc(cap)))
		return NULL;
	out[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		const char *v = members[i]->args[arg];
		if (i)
			out[len++] = ',';
		if (!v) {
			memcpy(out + len, "NULL", 4);
			len += 4;
			continue;
		}
		out[len++] = '"';
		for (; *v; v++) {
			if (*v == '"' || *v == '\\')
				out[len++] = '\\';
			out[len++] = *v;
		}
		out[len++] = '"';
	}
	out[len++] = '}';
	out[len] = '\0';
	return out;
}

static void batch_done(const struct db_result *r, void *arg);
static void hand_to_slow(struct group *g, struct member *m);

static void queue_statement(struct group *g);
static void release_held(struct group *g);

/* Runs when a connection takes the statement: the group is what waited. */
static bool batch_build(void *arg, char **sql, int *nparams, char ***params)
{
	struct batch *b = arg;
	struct group *g = b->g;
	struct member *m;
	size_t cap = 0;

	b->built = true;
	g->queued = false;
	/* those a statement that just ended held ride this one, not the next */
	release_held(g);
	for (m = g->head; m && cap < GROUP_MAX_MEMBERS; m = m->next)
		cap++;
	b->members = calloc(cap ? cap : 1, sizeof(*b->members));
	while ((m = g->head) != NULL && b->n < cap) {
		g->head = m->next;
		if (!g->head)
			g->tail = NULL;
		m->next = NULL;
		if (!b->members) {
			fail_unavailable(g, m, "out of memory");
		} else if (m->req->conn->closed) {
			/* as db.c does for a lone statement: nobody reads the
			 * answer, so it is not run */
			fail_unavailable(g, m,
					 "the client closed its connection before the statement "
					 "was sent; nothing was done");
		} else {
			b->members[b->n++] = m;
		}
	}
	if (g->head)
		event_active(g->requeue, EV_TIMEOUT, 0);
	if (b->n == 0)
		return false;

	bool lone = b->n == 1 && g->kind->lone_sql;
	char **p = calloc((size_t)g->kind->nargs, sizeof(char *));
	char *text = strdup(lone ? g->kind->lone_sql : g->kind->sql);
	bool ok = p && text;
	for (int i = 0; ok && i < g->kind->nargs; i++) {
		if (lone) /* its own arguments: no array for Postgres to parse */
			ok = (p[i] = b->members[0]->args[i]) == NULL ||
			     (p[i] = strdup(p[i])) != NULL;
		else
			ok = (p[i] = array_literal(b->members, b->n, i)) != NULL;
	}
	if (!ok) {
		for (int i = 0; p && i < g->kind->nargs; i++)
			free(p[i]);
		free(p);
		free(text);
		for (size_t i = 0; i < b->n; i++)
			fail_unavailable(g, b->members[i], "out of memory");
		b->n = 0;
		return false;
	}
	b->next_sent = g->sent;
	g->sent = b;
	g->stats.groups++;
	g->stats.members += b->n;
	g->recent_members = g->stats.groups == 1
				? (double)b->n
				: g->recent_members + ((double)b->n - g->recent_members) / 4;
	if (b->n > g->stats.largest)
		g->stats.largest = b->n;
	*sql = text;
	*nparams = g->kind->nargs;
	*params = p;
	return true;
}

/* One member's own error, raised and rolled back inside the group, or a
 * refusal the set-based part answers in the same columns (PCSEX): a
 * deadlock goes again in the next group; anything else is answered through
 * the one SQLSTATE table (sqlstate.c), a refusal with the schema's message
 * and final, a timeout retryable. */
static void member_error(struct group *g, struct member *m, const PGresult *res, int row)
{
	char msg[512];
	struct db_result r = {0};

	if (strcmp(PQgetvalue(res, row, 1), "40P01") == 0 &&
	    m->deadlocks++ < GROUP_DEADLOCK_RETRIES && !m->req->conn->closed) {
		/* a deadlock between two groups, which two lone calls would
		 * not have met: nothing of its part stayed, so it goes again,
		 * first in the next group */
		m->next = g->head;
		g->head = m;
		if (!g->tail)
			g->tail = m;
		event_active(g->requeue, EV_TIMEOUT, 0);
		return;
	}
	r.sqlstate = PQgetvalue(res, row, 1);
	r.error = db_error_for_sqlstate(r.sqlstate);
	r.refusal = db_sqlstate_is_refusal(r.sqlstate);
	if (r.error == PGC_E_TIMEOUT)
		snprintf(msg, sizeof(msg),
			 "the statement ran out of its time in the database (%.200s; just under "
			 "query_timeout_ms) and was rolled back: nothing changed, retry",
			 PQgetvalue(res, row, 2));
	else
		snprintf(msg, sizeof(msg), "%s", PQgetvalue(res, row, 2));
	r.message = msg;
	if (r.error == PGC_E_INTERNAL)
		log_error(&g->ag->log, "db", "%s in a group failed: %s (SQLSTATE %s)",
			  g->kind->name, msg, r.sqlstate);
	member_fail(g, m, &r);
}

static void batch_done(const struct db_result *r, void *arg)
{
	struct batch *b = arg;
	struct group *g = b->g;

	for (struct batch **p = &g->sent; *p; p = &(*p)->next_sent) {
		if (*p == b) {
			*p = b->next_sent;
			break;
		}
	}
	if (!b->built) {
		/* failed in the queue (deadline, database down): everyone who
		 * was waiting for it gets that answer */
		struct member *m;
		g->queued = false;
		while ((m = g->head) != NULL) {
			g->head = m->next;
			member_fail(g, m, r);
		}
		g->tail = NULL;
	} else if (!r->ok && g->slow && r->sqlstate &&
		   (strcmp(r->sqlstate, "23505") == 0 || strcmp(r->sqlstate, "40001") == 0 ||
		    strcmp(r->sqlstate, "40P01") == 0)) {
		/* a duplicate id committed while the statement waited for a
		 * quota row (permits_pkey), a permit changed under it
		 * (serialization_failure) or a deadlock: nothing of it stayed,
		 * and the slow path judges each member on its own */
		for (size_t i = 0; i < b->n; i++)
			hand_to_slow(g, b->members[i]);
	} else if (!r->ok) {
		for (size_t i = 0; i < b->n; i++)
			member_fail(g, b->members[i], r);
	} else {
		int rows = PQntuples(r->res);
		for (int row = 0; row < rows; row++) {
			long idx = strtol(PQgetvalue(r->res, row, 0), NULL, 10);
			struct member *m;
			if (idx < 1 || (size_t)idx > b->n || !(m = b->members[idx - 1]))
				continue; /* not ours, or answered by an earlier row */
			b->members[idx - 1] = NULL;
			if (g->slow && !PQgetisnull(r->res, row, 1) &&
			    strcmp(PQgetvalue(r->res, row, 1), "PCSLW") == 0) {
				hand_to_slow(g, m);
			} else if (!PQgetisnull(r->res, row, 1)) {
				member_error(g, m, r->res, row);
			} else {
				g->kind->answer(m->req, m->ctx, r->res, row, 3);
				member_free(m);
			}
		}
		for (size_t i = 0; i < b->n; i++) {
			struct db_result missing = {0};
			if (!b->members[i])
				continue;
			missing.error = PGC_E_INTERNAL;
			missing.message = "the group statement returned no row for this call";
			member_fail(g, b->members[i], &missing);
		}
	}
	free(b->members);
	free(b);
	/* from the loop, not here: db_destroy calls this for every statement */
	g->stats.in_flight--;
	if (g->head || g->held)
		event_active(g->requeue, EV_TIMEOUT, 0);
}

/* Milliseconds from now until t (negative when past). */
static long long ms_until(const struct timespec *t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (long long)(t->tv_sec - now.tv_sec) * 1000 + (t->tv_nsec - now.tv_nsec) / 1000000;
}

/* Answers the members at the front of a list whose deadline has passed,
 * as db.c answers a statement that never left its queue. */
static void fail_past_due(const struct group *g, struct member **head, struct member **tail)
{
	struct member *m;
	while ((m = *head) != NULL && ms_until(&m->due) <= 0) {
		struct db_result r = {0};
		*head = m->next;
		if (!*head)
			*tail = NULL;
		r.error = PGC_E_TIMEOUT;
		r.message = "no database connection became free within query_timeout_ms";
		member_fail(g, m, &r);
	}
}

/* Answers the held members whose deadline has passed and arms the timer
 * for the next. */
static void expire_members(struct group *g)
{
	fail_past_due(g, &g->held, &g->held_tail);
	if (g->held) {
		long long ms = ms_until(&g->held->due);
		struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
		evtimer_add(g->expire, &tv);
	}
}

/* Whether m names a key that a statement sent and not answered names. */
static bool shares_key_in_flight(const struct group *g, const struct member *m)
{
	for (const struct batch *b = g->sent; b; b = b->next_sent) {
		for (size_t i = 0; i < b->n; i++) {
			const struct member *o = b->members[i];
			for (size_t k = 0; o && k < o->keys.n; k++)
				for (size_t j = 0; j < m->keys.n; j++)
					if (o->keys.hash[k] == m->keys.hash[j])
						return true;
		}
	}
	return false;
}

/* group_statements_max applies to m: that many statements are in flight
 * and one of them names a key of m's, so a statement of its own would
 * only queue on that key's row in the database. */
static bool held_by_key(const struct group *g, const struct member *m)
{
	int max = g->ag->cfg.group_statements_max;
	return max > 0 && g->stats.in_flight >= (uint64_t)max && shares_key_in_flight(g, m);
}

/* Whether the recent statements of this kind carried, on average, at
 * least group_kind_hold_members calls each: load that fills groups this
 * large keeps filling them, and one more commit beside the statement in
 * flight would only cost the database what a larger group saves. An
 * average over statements, not the one in flight: a burst's first call
 * goes alone in a statement of one, which says nothing of the load. */
static bool load_fills_groups(const struct group *g)
{
	int members = g->ag->cfg.group_kind_hold_members;
	return members > 0 && g->recent_members >= members;
}

/* group_kind_statements_max applies to a call arriving now: that many
 * statements of its kind are in flight and none is queued for it to ride,
 * so it waits for the next one and the groups grow with load instead of
 * the commits. Below that bound it also waits when the recent groups were
 * large (load_fills_groups): under light load (small groups) a second
 * statement runs beside the first, under heavy load the bound tightens to
 * one. Judged on arrival only: whoever it held goes with the
 * next statement queued. */
static bool held_by_kind(const struct group *g)
{
	int max = g->ag->cfg.group_kind_statements_max;
	if (max <= 0 || g->queued || g->stats.in_flight == 0)
		return false;
	return g->stats.in_flight >= (uint64_t)max || load_fills_groups(g);
}

static void append(struct member **head, struct member **tail, struct member *m)
{
	m->next = NULL;
	if (*tail)
		(*tail)->next = m;
	else
		*head = m;
	*tail = m;
}

/* m rides the statement queued when one of those in flight ends, or
 * times out as in the database queue. */
static void hold(struct group *g, struct member *m)
{
	append(&g->held, &g->held_tail, m);
	g->stats.held++;
	if (g->held == m)
		expire_members(g);
}

/* A member this kind's statement left to the slow path (nothing of it was
 * written): it joins the slow group's next statement, as a new call of
 * that kind would (held behind statements on its keys), with its own
 * deadline. From the loop: the slow group may be mid-answer itself. */
static void hand_to_slow(struct group *g, struct member *m)
{
	struct group *slow = g->slow;

	m->deadlocks = 0;
	if (held_by_key(slow, m)) {
		hold(slow, m);
		return;
	}
	append(&slow->head, &slow->tail, m);
	event_active(slow->requeue, EV_TIMEOUT, 0);
}

/* After a statement ends: the held members it no longer holds join the
 * next statement, all of them together when the bound is no longer
 * reached, as one statement carries what waited. */
static void release_held(struct group *g)
{
	struct member *m, *keep = NULL, *keep_tail = NULL;

	expire_members(g);
	while ((m = g->held) != NULL) {
		g->held = m->next;
		if (held_by_key(g, m))
			append(&keep, &keep_tail, m);
		else
			append(&g->head, &g->tail, m);
	}
	g->held = keep;
	g->held_tail = keep_tail;
}

static void queue_statement(struct group *g)
{
	struct batch *b;
	struct member *m;

	if (g->queued)
		return;
	/* a member sent again after a deadlock may be past its deadline */
	fail_past_due(g, &g->head, &g->tail);
	if (!g->head)
		return;
	b = calloc(1, sizeof(*b));
	if (b) {
		b->g = g;
		/* set first: an idle connection builds it before the call returns */
		g->queued = true;
		g->stats.in_flight++;
		/* the statement's deadline is its first member's, the earliest,
		 * however long that member was held */
		if (db_query_built_within(g->ag->db, DB_LANE_REQUESTS, (int)ms_until(&g->head->due),
					  batch_build, batch_done, b)) {
			if (g->stats.in_flight > g->stats.in_flight_peak)
				g->stats.in_flight_peak = g->stats.in_flight;
			return;
		}
		g->queued = false;
		g->stats.in_flight--;
		free(b);
	}
	while ((m = g->head) != NULL) {
		g->head = m->next;
		fail_unavailable(g, m, "the database is unreachable (or its queue is full); retry");
	}
	g->tail = NULL;
}

static void requeue_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	release_held(arg);
	queue_statement(arg);
}

static void expire_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	expire_members(arg);
}

void group_add(struct group *g, struct request *req, void *ctx, const char *const *args,
	       const struct group_keys *keys)
{
	struct member *m = calloc(1, sizeof(*m));
	bool ok = m != NULL;

	if (m) {
		int ms = g->ag->cfg.query_timeout_ms;
		m->req = req;
		m->ctx = ctx;
		if (keys)
			m->keys = *keys;
		clock_gettime(CLOCK_MONOTONIC, &m->due);
		m->due.tv_sec += ms / 1000;
		m->due.tv_nsec += (long)(ms % 1000) * 1000000;
		if (m->due.tv_nsec >= 1000000000) {
			m->due.tv_sec++;
			m->due.tv_nsec -= 1000000000;
		}
		for (int i = 0; ok && i < g->kind->nargs; i++)
			ok = !args[i] || (m->args[i] = strdup(args[i])) != NULL;
	}
	if (!ok) {
		struct db_result r = {0};
		r.error = PGC_E_INTERNAL;
		r.message = "out of memory";
		if (m)
			member_free(m);
		g->kind->fail(req, ctx, &r);
		return;
	}
	if (held_by_kind(g) || held_by_key(g, m)) {
		hold(g, m);
		return;
	}
	append(&g->head, &g->tail, m);
	queue_statement(g);
}

uint64_t group_key_hash(const char *s, size_t len)
{
	uint64_t h = 1469598103934665603ULL; /* FNV-1a */
	for (size_t i = 0; i < len; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ULL;
	}
	return h ? h : 1; /* 0 marks an empty slot */
}

void group_keys_add(struct group_keys *k, const char *key, size_t len)
{
	if (k->n < GROUP_MAX_KEYS)
		k->hash[k->n++] = group_key_hash(key, len);
}

void group_remember_keys(struct group *g, const char *id, const struct group_keys *keys)
{
	uint64_t h = group_key_hash(id, strlen(id));
	struct remembered *r;

	if (!g->remembered && !(g->remembered = calloc(GROUP_REMEMBERED, sizeof(*g->remembered))))
		return; /* forgotten: its release goes unheld */
	r = &g->remembered[h % GROUP_REMEMBERED];
	if (!r->keys && !(r->keys = malloc(sizeof(*r->keys)))) {
		r->id = 0;
		return;
	}
	r->id = h;
	*r->keys = *keys;
}

bool group_recall_keys(struct group *g, const char *id, struct group_keys *out)
{
	uint64_t h = group_key_hash(id, strlen(id));
	struct remembered *r;

	out->n = 0;
	if (!g->remembered)
		return false;
	r = &g->remembered[h % GROUP_REMEMBERED];
	if (r->id != h || !r->keys)
		return false;
	*out = *r->keys;
	r->id = 0; /* released: its slot is free again */
	return true;
}

struct group *group_create(struct agent *ag, const struct group_kind *kind, struct group *slow)
{
	struct group *g = calloc(1, sizeof(*g));
	if (!g || (slow && slow->kind->nargs != kind->nargs)) {
		free(g);
		return NULL;
	}
	g->ag = ag;
	g->kind = kind;
	g->slow = slow;
	g->requeue = event_new(ag->base, -1, 0, requeue_cb, g);
	g->expire = evtimer_new(ag->base, expire_cb, g);
	if (!g->requeue || !g->expire) {
		if (g->requeue)
			event_free(g->requeue);
		if (g->expire)
			event_free(g->expire);
		free(g);
		return NULL;
	}
	return g;
}

void group_destroy(struct group *g)
{
	if (!g)
		return;
	/* db_destroy answered every member that waited on a queued statement;
	 * what overflowed a group and waits to be queued is answered here */
	while (g->head) {
		struct member *m = g->head;
		g->head = m->next;
		fail_unavailable(g, m, "the agent is shutting down");
	}
	while (g->held) {
		struct member *m = g->held;
		g->held = m->next;
		fail_unavailable(g, m, "the agent is shutting down");
	}
	if (g->remembered)
		for (size_t i = 0; i < GROUP_REMEMBERED; i++)
			free(g->remembered[i].keys);
	free(g->remembered);
	event_free(g->requeue);
	event_free(g->expire);
	free(g);
}

void group_get_stats(const struct group *g, struct group_stats *out)
{
	*out = g->stats;
}

const char *group_name(const struct group *g)
{
	return g->kind->name;
}
