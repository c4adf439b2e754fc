/*
 * leases.c — lease.* methods, belief tracking, campaigns and watches.
 * See leases.h for the belief rule.
 */
#include "agent/leases.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/methods.h"
#include "agent/sessions.h"

#define LEASE_NAME_MAX 200
#define LEASE_TTL_MIN 1000
#define LEASE_TTL_MAX 600000

struct lease {
	struct lease *next;
	struct agent *ag;
	char *name;
	int64_t session_id;
	int ttl_ms, renew_ms;
	bool wait;   /* keep campaigning until won or released */
	bool leader; /* the agent's belief */
	int64_t epoch;
	uint64_t belief_until; /* CLOCK_MONOTONIC ms */
	bool in_flight;
	bool dead; /* dropped while a statement ran: freed when it returns */
	uint64_t attempt_sent;
	struct event *timer;	    /* next renewal or campaign attempt */
	struct event *belief_timer; /* belief deadline */
	struct request *pending;    /* a lease.acquire waiting for this attempt */
	void (*on_change)(struct agent *ag, bool leader); /* internal leases */
	struct parked *parked; /* dead: requests to run once its statement returns */
};

/* A request for a lease whose previous statement still runs. */
struct parked {
	struct parked *next;
	struct request *req;
};

struct lease_watch {
	struct lease_watch *next;
	int64_t session_id;
	char *name;
	bool primed; /* the first poll only records what it saw */
	int64_t epoch;
	int64_t holder;
};

struct lease_registry {
	struct lease *leases;
	/*
	 * Dropped leases whose statement still runs (an attempt, or the
	 * lease.release itself). Statements of one session's lease go to the
	 * database one at a time: the pool would let a later one overtake an
	 * earlier one, so a renewal sent before a release could take the
	 * lease back after the hand-back committed, and a release sent before
	 * an acquire could free the row the acquire just renewed. Requests
	 * that find their lease here are parked on it and run again (`ready`,
	 * from the `rerun` event) when it returns.
	 */
	struct lease *dying;
	struct parked *ready;
	struct event *rerun;
	struct lease_watch *watches;
	struct event *poll_timer;
	bool poll_in_flight;
};

static void attempt(struct lease *l);

static struct lease_registry *reg(struct agent *ag)
{
	return ag->leases;
}

static struct lease *find(struct agent *ag, const char *name, int64_t session_id)
{
	for (struct lease *l = reg(ag)->leases; l; l = l->next)
		if (!l->dead && l->session_id == session_id && strcmp(l->name, name) == 0)
			return l;
	return NULL;
}

static void lease_free(struct lease *l)
{
	if (l->timer)
		event_free(l->timer);
	if (l->belief_timer)
		event_free(l->belief_timer);
	free(l->name);
	free(l);
}

/* Unlinks l; frees it now, or (on the dying list) when its running
 * statement returns. */
static void lease_drop(struct lease *l)
{
	struct lease_registry *rg = reg(l->ag);
	struct lease **pp = &rg->leases;
	while (*pp && *pp != l)
		pp = &(*pp)->next;
	if (*pp)
		*pp = l->next;
	evtimer_del(l->timer);
	evtimer_del(l->belief_timer);
	l->dead = true;
	if (!l->in_flight) {
		lease_free(l);
		return;
	}
	l->next = rg->dying;
	rg->dying = l;
}

/* A dying lease of session_id named name (any name when NULL). */
static struct lease *dying_for(struct agent *ag, int64_t session_id, const char *name)
{
	for (struct lease *l = reg(ag)->dying; l; l = l->next)
		if (l->session_id == session_id && (!name || strcmp(l->name, name) == 0))
			return l;
	return NULL;
}

/* A dying lease's statement returned: its parked requests run again. */
static void lease_settled(struct lease *l)
{
	struct lease_registry *rg = reg(l->ag);
	struct lease **pp = &rg->dying;
	while (*pp && *pp != l)
		pp = &(*pp)->next;
	if (*pp)
		*pp = l->next;
	if (l->parked) {
		struct parked **tail = &rg->ready;
		while (*tail)
			tail = &(*tail)->next;
		*tail = l->parked;
		/* from the loop, never inside the database callback that got here */
		event_active(rg->rerun, EV_TIMEOUT, 1);
	}
	lease_free(l);
}

static void rerun_cb(evutil_socket_t fd, short what, void *arg)
{
	struct lease_registry *rg = reg(arg);
	(void)fd;
	(void)what;
	while (rg->ready) {
		struct parked *p = rg->ready;
		struct request *req = p->req;
		rg->ready = p->next;
		free(p);
		/* the session may have ended while the request waited */
		if ((req->method->flags & M_SESSION) && !req_need_session(req))
			continue;
		req->method->fn(req);
	}
}

bool leases_busy(struct agent *ag, int64_t session_id, const char *name)
{
	return ag->leases && dying_for(ag, session_id, name) != NULL;
}

bool leases_park_if_busy(struct agent *ag, int64_t session_id, const char *name,
			 struct request *req)
{
	struct lease *l = ag->leases ? dying_for(ag, session_id, name) : NULL;
	struct parked *p, **tail;
	if (!l || !(p = calloc(1, sizeof(*p))))
		return false;
	p->req = req;
	for (tail = &l->parked; *tail; tail = &(*tail)->next)
		;
	*tail = p;
	return true;
}

static void after_ms(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	evtimer_add(ev, &tv);
}

struct change_note {
	const struct lease *l;
	bool leader;
	const char *reason;
	int64_t holder_session;
	const char *holder_replica;
	bool renewed;
};

static void fill_change(msgpack_packer *pk, void *arg)
{
	const struct change_note *n = arg;
	uint64_t now = mono_ms();
	bool valid = n->leader && n->l->belief_until > now;
	msgpack_pack_map(pk, n->renewed ? 5 : 8);
	pgc_pack_kv_str(pk, "name", n->l->name);
	pgc_pack_kv_int(pk, "epoch", n->l->epoch);
	pgc_pack_kv_bool(pk, "leader", n->leader);
	pgc_pack_kv_int(pk, "valid_ms", valid ? (int64_t)(n->l->belief_until - now) : 0);
	/* the same deadline on the host's CLOCK_MONOTONIC, which a client on
	 * this host shares: it bounds the client's belief even when this
	 * message waited in our output after valid_ms was computed */
	pgc_pack_kv_int(pk, "valid_until_mono_ms", valid ? (int64_t)n->l->belief_until : 0);
	if (n->renewed)
		return;
	pgc_pack_kv_int(pk, "session", n->l->session_id);
	pgc_pack_cstr(pk, "holder");
	if (n->holder_session) {
		msgpack_pack_map(pk, 2);
		pgc_pack_kv_int(pk, "session", n->holder_session);
		pgc_pack_kv_str(pk, "replica_id", n->holder_replica);
	} else {
		msgpack_pack_nil(pk);
	}
	pgc_pack_kv_str(pk, "reason", n->reason);
}

static void tell(struct lease *l, const char *method, struct change_note *note)
{
	struct session *s = sessions_find(l->ag, l->session_id);
	if (s && s->conn)
		conn_notify(s->conn, method, fill_change, note);
}

/* The lease name is the client's: escaped, so it cannot forge a line. */
static void lease_log_kv(const struct lease *l, char *kv, size_t len)
{
	kv[0] = '\0';
	log_kv_str(kv, len, "lease", l->name);
	log_kv_int(kv, len, "session", l->session_id);
	log_kv_int(kv, len, "epoch", l->epoch);
}

static void belief_start(struct lease *l)
{
	struct change_note note = {l,	 true, "acquired", l->session_id, l->ag->cfg.replica_id,
				   false};
	char kv[4 * LEASE_NAME_MAX + 80]; /* room for a fully escaped name */
	l->leader = true;
	lease_log_kv(l, kv, sizeof(kv));
	log_write(&l->ag->log, LOG_LEVEL_INFO, "leases", kv, "leadership belief starts");
	tell(l, "lease.changed", &note);
	if (l->on_change)
		l->on_change(l->ag, true);
}

/* level: warn when leadership was lost, info when it was given up. */
static void belief_end(struct lease *l, enum log_level level, const char *reason,
		       int64_t holder_session, const char *holder_replica)
{
	struct change_note note = {l, false, reason, holder_session, holder_replica, false};
	char kv[4 * LEASE_NAME_MAX + 80]; /* room for a fully escaped name */
	if (!l->leader)
		return;
	l->leader = false;
	evtimer_del(l->belief_timer);
	lease_log_kv(l, kv, sizeof(kv));
	log_write(&l->ag->log, level, "leases", kv, "leadership belief ends: %s", reason);
	tell(l, "lease.changed", &note);
	if (l->on_change)
		l->on_change(l->ag, false);
}

static void belief_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct lease *l = arg;
	(void)fd;
	(void)what;
	if (!l->leader || mono_ms() < l->belief_until) {
		if (l->leader)
			after_ms(l->belief_timer, l->belief_until - mono_ms());
		return;
	}
	belief_end(l, LOG_LEVEL_WARN,
		   "renewal overdue: the database did not confirm the lease in time", 0, NULL);
	if (!l->wait) {
		lease_drop(l);
		return;
	}
	/* keep campaigning: the row may still be ours once the database answers */
	if (!l->in_flight) {
		evtimer_del(l->timer);
		after_ms(l->timer, 0);
	}
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct lease *l = arg;
	(void)fd;
	(void)what;
	attempt(l);
}

static void reply_acquire(struct request *req, struct lease *l, const struct db_result *r)
{
	uint64_t now = mono_ms();
	msgpack_packer *pk = req_result(req);
	bool valid = l->leader && l->belief_until > now;
	msgpack_pack_map(pk, 9);
	pgc_pack_kv_str(pk, "name", l->name);
	pgc_pack_kv_bool(pk, "leader", l->leader);
	pgc_pack_kv_int(pk, "epoch", l->epoch);
	pgc_pack_kv_int(pk, "valid_ms", valid ? (int64_t)(l->belief_until - now) : 0);
	pgc_pack_kv_int(pk, "valid_until_mono_ms", valid ? (int64_t)l->belief_until : 0);
	pgc_pack_kv_bool(pk, "campaigning", !l->leader && l->wait);
	pgc_pack_kv_int(pk, "ttl_ms", l->ttl_ms);
	pgc_pack_cstr(pk, "holder");
	if (r && r->ok && !PQgetisnull(r->res, 0, 2)) {
		msgpack_pack_map(pk, 2);
		pgc_pack_kv_int(pk, "session", strtoll(PQgetvalue(r->res, 0, 2), NULL, 10));
		pgc_pack_kv_str(pk, "replica_id", PQgetvalue(r->res, 0, 3));
	} else if (l->leader) {
		msgpack_pack_map(pk, 2);
		pgc_pack_kv_int(pk, "session", l->session_id);
		pgc_pack_kv_str(pk, "replica_id", l->ag->cfg.replica_id);
	} else {
		msgpack_pack_nil(pk);
	}
	pgc_pack_kv_int(
	    pk, "expires_in_ms",
	    r && r->ok && PQntuples(r->res) ? strtoll(PQgetvalue(r->res, 0, 4), NULL, 10) : 0);
	req_done(req);
}

static void attempt_done(const struct db_result *r, void *arg)
{
	struct lease *l = arg;
	struct agent *ag = l->ag;
	struct request *req = l->pending;
	uint64_t now = mono_ms(), sent = l->attempt_sent;

	l->in_flight = false;
	l->pending = NULL;
	if (l->dead) {
		if (req)
			req_fail(req, PGC_E_CONFLICT, "the lease was released meanwhile");
		lease_settled(l);
		return;
	}
	if (!r->ok || PQntuples(r->res) != 1) {
		if (req) {
			if (r->ok)
				req_fail(req, PGC_E_INTERNAL, "lease_acquire returned no row");
			else
				req_fail_db(req, r);
		}
		if (!l->wait && !l->leader) {
			lease_drop(l);
			return;
		}
		/* a failed renewal proves nothing: belief runs out on its own
		 * deadline unless a retry succeeds first */
		after_ms(l->timer,
			 (uint64_t)(l->leader ? l->renew_ms / 3 : ag->cfg.lease_retry_ms));
		return;
	}
	bool won = strcmp(PQgetvalue(r->res, 0, 0), "t") == 0;
	int64_t epoch = strtoll(PQgetvalue(r->res, 0, 1), NULL, 10);
	if (won) {
		uint64_t until = sent + (uint64_t)(l->ttl_ms - l->renew_ms);
		bool was = l->leader;
		if (was && epoch != l->epoch)
			belief_end(l, LOG_LEVEL_WARN,
				   "the lease lapsed and was re-acquired under a new epoch", 0,
				   NULL);
		l->epoch = epoch;
		if (until > now) {
			l->belief_until = until;
			evtimer_del(l->belief_timer);
			after_ms(l->belief_timer, until - now);
			if (!l->leader) {
				belief_start(l);
			} else {
				struct change_note note = {l, true, "renewed", 0, NULL, true};
				tell(l, "lease.renewed", &note);
			}
		}
		uint64_t next = sent + (uint64_t)l->renew_ms;
		after_ms(l->timer, next > now ? next - now : 0);
	} else {
		const char *holder_replica = PQgetvalue(r->res, 0, 3);
		int64_t holder =
		    PQgetisnull(r->res, 0, 2) ? 0 : strtoll(PQgetvalue(r->res, 0, 2), NULL, 10);
		if (l->leader)
			belief_end(l, LOG_LEVEL_WARN, "the lease is held by another session",
				   holder, holder_replica);
		l->epoch = epoch;
		if (l->wait)
			after_ms(l->timer, (uint64_t)ag->cfg.lease_retry_ms);
	}
	if (req)
		reply_acquire(req, l, r);
	if (!l->leader && !l->wait && !l->dead)
		lease_drop(l);
}

/* One acquire-or-renew statement. Renewals of a held lease go on the
 * heartbeat connection so they never queue behind client traffic. */
static void attempt(struct lease *l)
{
	struct agent *ag = l->ag;
	char session[24], inc[24], ttl[24];

	if (l->in_flight || l->dead)
		return;
	snprintf(session, sizeof(session), "%" PRId64, l->session_id);
	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	snprintf(ttl, sizeof(ttl), "%d", l->ttl_ms);
	const char *params[5] = {l->name, session, ag->cfg.replica_id, inc, ttl};
	l->attempt_sent = mono_ms();
	if (db_query(ag->db, l->leader ? DB_LANE_HEARTBEAT : DB_LANE_REQUESTS,
		     "SELECT leader, epoch, holder_session, holder_replica, expires_in_ms "
		     "FROM pgcoord.lease_acquire($1, $2, $3, $4, $5)",
		     5, params, attempt_done, l)) {
		l->in_flight = true;
		return;
	}
	/* database down: answer now, try again later */
	if (l->pending) {
		struct request *req = l->pending;
		l->pending = NULL;
		req_fail(req, PGC_E_UNAVAILABLE, "the database is unreachable; retry");
	}
	if (l->wait || l->leader)
		after_ms(l->timer,
			 (uint64_t)(l->leader ? l->renew_ms / 3 : ag->cfg.lease_retry_ms));
	else
		lease_drop(l);
}

static struct lease *lease_new(struct agent *ag, const char *name, int64_t session_id, int ttl_ms,
			       int renew_ms)
{
	struct lease *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->ag = ag;
	l->name = strdup(name);
	l->session_id = session_id;
	l->ttl_ms = ttl_ms;
	l->renew_ms = renew_ms;
	l->timer = evtimer_new(ag->base, timer_cb, l);
	l->belief_timer = evtimer_new(ag->base, belief_timer_cb, l);
	if (!l->name || !l->timer || !l->belief_timer) {
		lease_free(l);
		return NULL;
	}
	l->next = reg(ag)->leases;
	reg(ag)->leases = l;
	return l;
}

/* --- public helpers -------------------------------------------------- */

bool leases_campaign_internal(struct agent *ag, const char *name, int64_t session_id, int ttl_ms,
			      void (*on_change)(struct agent *ag, bool leader))
{
	struct lease *l = lease_new(ag, name, session_id, ttl_ms, ttl_ms / 3);
	if (!l)
		return false;
	l->wait = true;
	l->on_change = on_change;
	attempt(l);
	return true;
}

bool leases_believes(struct agent *ag, const char *name, int64_t session_id)
{
	struct lease *l = find(ag, name, session_id);
	return l && l->leader && mono_ms() < l->belief_until;
}

void leases_session_ending(struct agent *ag, int64_t session_id, const char *reason,
			   enum log_level level)
{
	struct lease_registry *r = reg(ag);
	if (!r)
		return;
	for (struct lease *l = r->leases, *next; l; l = next) {
		next = l->next;
		if (l->session_id != session_id)
			continue;
		belief_end(l, level, reason, 0, NULL);
		lease_drop(l);
	}
	for (struct lease_watch **pp = &r->watches; *pp;) {
		struct lease_watch *w = *pp;
		if (w->session_id == session_id) {
			*pp = w->next;
			free(w->name);
			free(w);
		} else {
			pp = &w->next;
		}
	}
}

void leases_end_all(struct agent *ag, const char *reason)
{
	struct lease_registry *r = reg(ag);
	if (!r)
		return;
	while (r->leases) {
		belief_end(r->leases, LOG_LEVEL_INFO, reason, 0, NULL); /* a shutdown */
		lease_drop(r->leases);
	}
}

int leases_held_count(const struct agent *ag)
{
	int n = 0;
	if (!ag->leases)
		return 0;
	for (struct lease *l = ag->leases->leases; l; l = l->next)
		n += l->leader;
	return n;
}

/* --- lease.acquire --------------------------------------------------- */

static bool read_name(struct request *req, char **name)
{
	return req_param_name(req, "name", true, LEASE_NAME_MAX, name);
}

/* The session's campaigns that wait and have not won. */
static int campaigns_of(struct agent *ag, int64_t session_id)
{
	int n = 0;
	for (struct lease *l = reg(ag)->leases; l; l = l->next)
		n += !l->dead && l->session_id == session_id && l->wait && !l->leader;
	return n;
}

void rpc_lease_acquire(struct request *req)
{
	struct agent *ag = req->ag;
	int64_t session_id = req->conn->session->id;
	int64_t ttl = ag->cfg.lease_ttl_ms, renew = 0;
	bool wait = false, has_renew = false;
	char *name = NULL;
	struct lease *l;

	if (!read_name(req, &name))
		return;
	if (strncmp(name, LEASE_RESERVED_PREFIX, strlen(LEASE_RESERVED_PREFIX)) == 0) {
		req_fail(req, PGC_E_INVALID_PARAMS, "lease names starting with \"%s\" are reserved",
			 LEASE_RESERVED_PREFIX);
		free(name);
		return;
	}
	if (!req_param_int(req, "ttl_ms", false, LEASE_TTL_MIN, LEASE_TTL_MAX, &ttl, NULL) ||
	    !req_param_int(req, "renew_ms", false, 1, LEASE_TTL_MAX, &renew, &has_renew) ||
	    !req_param_bool(req, "wait", false, &wait, NULL)) {
		free(name);
		return;
	}
	if (leases_park_if_busy(ag, session_id, name, req)) {
		free(name);
		return;
	}
	if (!has_renew)
		renew = ttl / 3;
	/* renewing at least twice per ttl leaves room for one lost renewal;
	 * renewing too often only loads the database */
	if (renew < ttl / 10 || renew > ttl / 2) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "renew_ms must lie between ttl_ms/10 and ttl_ms/2 (%lld..%lld)",
			 (long long)(ttl / 10), (long long)(ttl / 2));
		free(name);
		return;
	}
	l = find(ag, name, session_id);
	/* each waiting campaign polls the database until won: a session may
	 * keep only so many */
	if (wait && !(l && (l->wait || l->leader)) &&
	    campaigns_of(ag, session_id) >= ag->cfg.max_lease_campaigns_per_session) {
		req_fail(req, PGC_E_BUSY,
			 "session %" PRId64 " already waits on %d lease campaigns "
			 "(max_lease_campaigns_per_session); release one or acquire without wait",
			 session_id, ag->cfg.max_lease_campaigns_per_session);
		free(name);
		return;
	}
	if (l) {
		free(name);
		l->wait = wait;
		if (l->leader || l->in_flight || l->pending) {
			reply_acquire(req, l, NULL);
			return;
		}
		evtimer_del(l->timer);
		l->pending = req;
		attempt(l);
		return;
	}
	l = lease_new(ag, name, session_id, (int)ttl, (int)renew);
	free(name);
	if (!l) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return;
	}
	l->wait = wait;
	l->pending = req;
	attempt(l);
}

/* --- lease.release --------------------------------------------------- */

static void released(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct lease *tomb = req->ctx;
	if (!r->ok) {
		req_fail_db(req, r);
	} else {
		msgpack_packer *pk = req_result(req);
		msgpack_pack_map(pk, 1);
		pgc_pack_kv_bool(pk, "released", strcmp(PQgetvalue(r->res, 0, 0), "t") == 0);
		req_done(req);
	}
	if (tomb)
		lease_settled(tomb);
}

void rpc_lease_release(struct request *req)
{
	struct agent *ag = req->ag;
	int64_t session_id = req->conn->session->id;
	char *name = NULL, session[24];
	struct lease *l;

	if (!read_name(req, &name))
		return;
	/* belief ends before the hand-back is even sent */
	l = find(ag, name, session_id);
	if (l) {
		belief_end(l, LOG_LEVEL_INFO, "released by its holder", 0, NULL);
		lease_drop(l);
	}
	/* ...which goes after the lease's statement still running */
	if (leases_park_if_busy(ag, session_id, name, req)) {
		free(name);
		return;
	}
	/* a dying lease of its own holds the name while the release runs */
	struct lease *tomb = calloc(1, sizeof(*tomb));
	if (tomb && (tomb->name = strdup(name)) != NULL) {
		tomb->ag = ag;
		tomb->session_id = session_id;
		tomb->dead = tomb->in_flight = true;
		tomb->next = reg(ag)->dying;
		reg(ag)->dying = tomb;
	} else {
		free(tomb);
		tomb = NULL;
	}
	req->ctx = tomb;
	snprintf(session, sizeof(session), "%" PRId64, session_id);
	const char *params[3] = {name, session, "released by holder"};
	if (!req_query(req, "SELECT released FROM pgcoord.lease_release($1, $2, $3)", 3, params,
		       released) &&
	    tomb)
		lease_settled(tomb);
	free(name);
}

/* --- lease.status / lease.list --------------------------------------- */

#define LEASE_COLUMNS                                                                              \
	"SELECT name, epoch, holder_session, holder_replica, "                                     \
	"greatest(pgcoord.ms(expires_at) - pgcoord.ms(now()), 0), ttl_ms, "                        \
	"pgcoord.ms(acquired_at), pgcoord.ms(renewed_at), "                                        \
	"holder_session IS NOT NULL AND expires_at > now() "                                       \
	"FROM pgcoord.leases "

static void pack_lease_row(struct request *req, msgpack_packer *pk, const PGresult *res, int i)
{
	uint64_t now = mono_ms();
	int64_t holder = PQgetisnull(res, i, 2) ? 0 : strtoll(PQgetvalue(res, i, 2), NULL, 10);
	bool held = strcmp(PQgetvalue(res, i, 8), "t") == 0;
	/*
	 * A caller with a session hears its own belief. One without (an
	 * operator's pgcoordctl) hears this agent's belief for the holding
	 * session when that session is this agent's, its janitor's say;
	 * otherwise it would read "leader false" for a lease this host leads.
	 */
	int64_t believer = req->conn->session ? req->conn->session->id : held ? holder : 0;
	struct lease *mine = believer ? find(req->ag, PQgetvalue(res, i, 0), believer) : NULL;
	bool believe = mine && mine->leader && mine->belief_until > now;

	msgpack_pack_map(pk, 9);
	pgc_pack_kv_str(pk, "name", PQgetvalue(res, i, 0));
	pgc_pack_kv_int(pk, "epoch", strtoll(PQgetvalue(res, i, 1), NULL, 10));
	pgc_pack_cstr(pk, "holder");
	if (held) {
		msgpack_pack_map(pk, 2);
		pgc_pack_kv_int(pk, "session", holder);
		pgc_pack_kv_str(pk, "replica_id", PQgetvalue(res, i, 3));
	} else {
		msgpack_pack_nil(pk);
	}
	pgc_pack_kv_int(pk, "expires_in_ms", strtoll(PQgetvalue(res, i, 4), NULL, 10));
	pgc_pack_kv_int(pk, "ttl_ms", strtoll(PQgetvalue(res, i, 5), NULL, 10));
	pgc_pack_kv_int(pk, "acquired_at", strtoll(PQgetvalue(res, i, 6), NULL, 10));
	pgc_pack_kv_int(pk, "renewed_at", strtoll(PQgetvalue(res, i, 7), NULL, 10));
	pgc_pack_kv_bool(pk, "leader", believe);
	pgc_pack_kv_int(pk, "valid_ms", believe ? (int64_t)(mine->belief_until - now) : 0);
}

static void status_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (PQntuples(r->res) == 0) {
		char *name = NULL;
		const msgpack_object *o = pgc_map_get(req->params, "name");
		name = pgc_obj_strdup(o);
		req_fail(req, PGC_E_NOT_FOUND, "no lease named \"%s\" was ever acquired",
			 name ? name : "");
		free(name);
		return;
	}
	pack_lease_row(req, req_result(req), r->res, 0);
	req_done(req);
}

void rpc_lease_status(struct request *req)
{
	struct agent *ag = req->ag;
	char *name = NULL;
	bool watch = false;

	if (!read_name(req, &name))
		return;
	if (!req_param_bool(req, "watch", false, &watch, NULL)) {
		free(name);
		return;
	}
	if (watch) {
		if (!req->conn->session) {
			free(name);
			req_fail(req, PGC_E_NO_SESSION, "watching a lease needs a session");
			return;
		}
		bool known = false;
		int watched = 0;
		for (struct lease_watch *w = reg(ag)->watches; w; w = w->next) {
			if (w->session_id != req->conn->session->id)
				continue;
			watched++;
			known |= strcmp(w->name, name) == 0;
		}
		/* every watch is polled: a session may keep only so many */
		if (!known && watched >= ag->cfg.max_lease_watches_per_session) {
			req_fail(req, PGC_E_BUSY,
				 "session %" PRId64 " already watches %d leases "
				 "(max_lease_watches_per_session)",
				 req->conn->session->id, watched);
			free(name);
			return;
		}
		struct lease_watch *w = known ? NULL : calloc(1, sizeof(*w));
		if (w && (w->name = strdup(name)) != NULL) {
			w->session_id = req->conn->session->id;
			w->next = reg(ag)->watches;
			reg(ag)->watches = w;
		} else {
			free(w);
		}
	}
	const char *params[1] = {name};
	req_query(req, LEASE_COLUMNS "WHERE name = $1", 1, params, status_done);
	free(name);
}

static void list_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_fit(req, r->res, "read the leases one at a time with lease.status"))
		return;
	int n = PQntuples(r->res);
	msgpack_packer *pk = req_result(req);
	msgpack_pack_map(pk, 1);
	pgc_pack_cstr(pk, "leases");
	msgpack_pack_array(pk, (size_t)n);
	for (int i = 0; i < n; i++)
		pack_lease_row(req, pk, r->res, i);
	req_done(req);
}

void rpc_lease_list(struct request *req)
{
	req_query(req, LEASE_COLUMNS "ORDER BY name", 0, NULL, list_done);
}

/* --- watches --------------------------------------------------------- */

static void poll_done(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;
	struct lease_registry *rg = reg(ag);
	rg->poll_in_flight = false;
	if (!r->ok)
		return;
	for (int i = 0; i < PQntuples(r->res); i++) {
		const char *name = PQgetvalue(r->res, i, 0);
		int64_t epoch = strtoll(PQgetvalue(r->res, i, 1), NULL, 10);
		bool held = strcmp(PQgetvalue(r->res, i, 8), "t") == 0;
		int64_t holder = held ? strtoll(PQgetvalue(r->res, i, 2), NULL, 10) : 0;
		for (struct lease_watch *w = rg->watches; w; w = w->next) {
			if (strcmp(w->name, name) != 0)
				continue;
			bool changed = w->primed && (w->epoch != epoch || w->holder != holder);
			w->primed = true;
			w->epoch = epoch;
			w->holder = holder;
			struct session *s = sessions_find(ag, w->session_id);
			/* a watcher that holds the lease hears of its own belief
			 * from belief_start/belief_end; this is for the others
			 * (tmp has no deadline: it would say leader, valid_ms 0) */
			if (!changed || !s || !s->conn || leases_believes(ag, name, w->session_id))
				continue;
			struct lease tmp = {.name = (char *)name,
					    .epoch = epoch,
					    .session_id = w->session_id,
					    .ag = ag};
			struct change_note note = {&tmp,
						   false,
						   "holder changed",
						   holder,
						   held ? PQgetvalue(r->res, i, 3) : NULL,
						   false};
			conn_notify(s->conn, "lease.changed", fill_change, &note);
		}
	}
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	struct lease_registry *rg = reg(ag);
	size_t cap = 3, n = 0;
	(void)fd;
	(void)what;

	if (!rg->watches || rg->poll_in_flight || !ag->id.registered)
		return;
	/* a Postgres text[] literal with every name quoted and escaped */
	for (struct lease_watch *w = rg->watches; w; w = w->next)
		cap += 2 * strlen(w->name) + 4;
	char *arr = malloc(cap);
	if (!arr)
		return;
	arr[n++] = '{';
	for (struct lease_watch *w = rg->watches; w; w = w->next) {
		if (n > 1)
			arr[n++] = ',';
		arr[n++] = '"';
		for (const char *p = w->name; *p; p++) {
			if (*p == '"' || *p == '\\')
				arr[n++] = '\\';
			arr[n++] = *p;
		}
		arr[n++] = '"';
	}
	arr[n++] = '}';
	arr[n] = '\0';
	const char *params[1] = {arr};
	if (db_query(ag->db, DB_LANE_REQUESTS, LEASE_COLUMNS "WHERE name = ANY ($1::text[])", 1,
		     params, poll_done, ag))
		rg->poll_in_flight = true;
	free(arr);
}

bool leases_start(struct agent *ag)
{
	struct lease_registry *rg = calloc(1, sizeof(*rg));
	if (!rg)
		return false;
	rg->poll_timer = event_new(ag->base, -1, EV_PERSIST, poll_cb, ag);
	rg->rerun = event_new(ag->base, -1, 0, rerun_cb, ag);
	if (!rg->poll_timer || !rg->rerun) {
		if (rg->poll_timer)
			event_free(rg->poll_timer);
		free(rg);
		return false;
	}
	ag->leases = rg;
	struct timeval tv = {ag->cfg.lease_retry_ms / 1000, (ag->cfg.lease_retry_ms % 1000) * 1000};
	event_add(rg->poll_timer, &tv);
	return true;
}

void leases_finish(struct agent *ag)
{
	struct lease_registry *rg = reg(ag);
	if (!rg)
		return;
	while (rg->leases) {
		struct lease *l = rg->leases;
		rg->leases = l->next;
		if (l->pending) {
			struct request *req = l->pending;
			l->pending = NULL;
			req_fail(req, PGC_E_SHUTTING_DOWN, "the agent is shutting down");
		}
		/* in-flight statements were failed by db_destroy already */
		l->in_flight = false;
		lease_free(l);
	}
	/* what waited for those statements finds the agent gone */
	while (rg->dying)
		lease_settled(rg->dying);
	while (rg->ready) {
		struct parked *p = rg->ready;
		rg->ready = p->next;
		req_fail(p->req, PGC_E_SHUTTING_DOWN, "the agent is shutting down");
		free(p);
	}
	event_free(rg->rerun);
	while (rg->watches) {
		struct lease_watch *w = rg->watches;
		rg->watches = w->next;
		free(w->name);
		free(w);
	}
	event_free(rg->poll_timer);
	free(rg);
	ag->leases = NULL;
}
