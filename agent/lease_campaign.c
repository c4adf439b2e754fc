/*
 * lease_campaign.c — the acquire-or-renew loop of each lease this agent's
 * sessions want, and the belief it keeps from the answers. See leases.h
 * for the belief rule.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/lease_belief.h"
#include "agent/lease_registry.h"
#include "agent/leases.h"
#include "agent/pgrow.h"
#include "agent/methods.h"
#include "agent/reply.h"
#include "agent/session_order.h"
#include "agent/session_registry.h"

static void after_ms(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	evtimer_add(ev, &tv);
}

static void tell(struct lease *l, struct change_note *note)
{
	struct session *s = sessions_find(l->ag, l->session_id);
	if (s && s->conn)
		lease_tell(s->conn, note);
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
	tell(l, &note);
	if (l->on_change)
		l->on_change(l->ag, true);
}

/* level: warn when leadership was lost, info when it was given up. */
void lease_end_belief(struct lease *l, enum log_level level, const char *reason,
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
	tell(l, &note);
	if (l->on_change)
		l->on_change(l->ag, false);
}

static void belief_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct lease *l = arg;
	(void)fd;
	(void)what;
	if (!l->leader || lease_belief_holds(true, l->belief_until, mono_ms())) {
		if (l->leader)
			after_ms(l->belief_timer, l->belief_until - mono_ms());
		return;
	}
	lease_end_belief(l, LOG_LEVEL_WARN,
			 "renewal overdue: the database did not confirm the lease in time", 0,
			 NULL);
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
	lease_attempt(l);
}

/* The columns of the lease_acquire statement (lease_attempt). */
enum { LA_LEADER, LA_EPOCH, LA_HOLDER_SESSION, LA_HOLDER_REPLICA, LA_EXPIRES_IN_MS, LA__COUNT };

/* lease.acquire's answer: the session's belief, and the row as the
 * database saw it. */
struct acquire_view {
	const char *name;
	bool leader, campaigning;
	int64_t epoch, valid_ms, valid_until_mono_ms, ttl_ms, expires_in_ms;
	struct lease_holder holder;
	const struct lease_holder *holder_or_nil;
};

#define ACQUIRE(key, t) REPLY_FIELD(#key, t, struct acquire_view, key)

static const struct reply_col acquire_cols[] = {
    ACQUIRE(name, REPLY_FIELD_STR),
    ACQUIRE(leader, REPLY_FIELD_BOOL),
    ACQUIRE(epoch, REPLY_FIELD_INT),
    ACQUIRE(valid_ms, REPLY_FIELD_INT),
    ACQUIRE(valid_until_mono_ms, REPLY_FIELD_INT),
    ACQUIRE(campaigning, REPLY_FIELD_BOOL),
    ACQUIRE(ttl_ms, REPLY_FIELD_INT),
    REPLY_NESTED_OR_NIL("holder", lease_holder_reply, struct acquire_view, holder_or_nil),
    ACQUIRE(expires_in_ms, REPLY_FIELD_INT),
};
const struct reply_kind lease_acquire_reply = REPLY_KIND(acquire_cols);

void lease_reply_acquire(struct request *req, struct lease *l, const struct db_result *r)
{
	uint64_t now = mono_ms();
	bool valid = lease_belief_holds(l->leader, l->belief_until, now);
	bool answered = r && r->ok && PQntuples(r->res);
	struct acquire_view v = {
	    .name = l->name,
	    .leader = l->leader,
	    .epoch = l->epoch,
	    .valid_ms = valid ? (int64_t)(l->belief_until - now) : 0,
	    .valid_until_mono_ms = valid ? (int64_t)l->belief_until : 0,
	    .campaigning = !l->leader && l->wait,
	    .ttl_ms = l->ttl_ms,
	    .expires_in_ms = answered ? pgrow_int(r->res, 0, LA_EXPIRES_IN_MS) : 0,
	};

	if (answered && !pgrow_null(r->res, 0, LA_HOLDER_SESSION))
		v.holder = (struct lease_holder){pgrow_int(r->res, 0, LA_HOLDER_SESSION),
						 pgrow_text(r->res, 0, LA_HOLDER_REPLICA)};
	else
		v.holder =
		    (struct lease_holder){l->leader ? l->session_id : 0, l->ag->cfg.replica_id};
	/* nobody holds it (session 0): nil, as in lease.changed */
	v.holder_or_nil = v.holder.session ? &v.holder : NULL;
	reply_pack_struct(req_result(req), &lease_acquire_reply, &v);
	req_done(req);
}

/* A lost campaign waits for the holder's expiry as the database measured
 * it, plus a jitter of up to a quarter of lease_retry_ms: failover after a
 * holder dies stays within its ttl and that jitter, and a candidate costs
 * one statement per expiry instead of one per lease_retry_ms. */
static uint64_t campaign_wait(struct lease *l, const PGresult *res)
{
	struct lease_registry *rg = lease_reg(l->ag);
	int retry = l->ag->cfg.lease_retry_ms;
	int64_t left = -1;
	if (!pgrow_null(res, 0, LA_HOLDER_SESSION) && !pgrow_null(res, 0, LA_EXPIRES_IN_MS))
		left = pgrow_int(res, 0, LA_EXPIRES_IN_MS);
	rg->rng = rg->rng * 1103515245u + 12345u;
	return lease_campaign_wait_ms(left, retry / 4, l->hand_back_poll_ms, retry, rg->rng >> 8);
}

/*
 * A held lease rides the beats when a beat's delay fits its margin: the
 * beat nearest its due time carries its renewal, up to half a beat early
 * or late, and its own timer waits half a beat past the due time, so a
 * beat that is skipped (one still in flight) or lost leaves the renewal to
 * its own statement then. Renewing half a beat late must still leave a
 * beat of margin before belief ends (ttl - renew), and a lease renewed
 * more often than every second beat keeps its own statements.
 */
static bool rides_beats(const struct lease *l)
{
	int beat_ms = l->ag->cfg.heartbeat_interval_ms;
	return beat_ms > 0 && l->renew_ms >= 2 * beat_ms &&
	       l->ttl_ms - 2 * l->renew_ms - beat_ms / 2 >= beat_ms;
}

/* The database confirmed the row ours, at l->epoch, by a statement sent at
 * sent: belief runs to that statement's deadline, and the next renewal is
 * due renew_ms after it. */
static void confirmed(struct lease *l, uint64_t sent, uint64_t now)
{
	uint64_t until = lease_belief_until(sent, l->ttl_ms, l->renew_ms);
	if (until > now) {
		l->belief_until = until;
		evtimer_del(l->belief_timer);
		after_ms(l->belief_timer, until - now);
		if (!l->leader) {
			belief_start(l);
		} else {
			struct change_note note = {l, true, "renewed", 0, NULL, true};
			tell(l, &note);
		}
	}
	l->renew_due = sent + (uint64_t)l->renew_ms;
	evtimer_del(l->timer);
	/* a lease the beats renew: its own statement only if they did not */
	after_ms(l->timer,
		 lease_belief_next_renewal_in(sent, l->renew_ms, now) +
		     (rides_beats(l) ? (uint64_t)l->ag->cfg.heartbeat_interval_ms / 2 : 0));
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
	if (!r->ok || PQntuples(r->res) != 1 || !pgrow_has_cols(r->res, LA__COUNT)) {
		if (req) {
			if (r->ok)
				req_fail(req, PGC_E_INTERNAL,
					 "lease_acquire returned %d rows of %d columns",
					 PQntuples(r->res), PQnfields(r->res));
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
	bool won = pgrow_bool(r->res, 0, LA_LEADER);
	int64_t epoch = pgrow_int(r->res, 0, LA_EPOCH);
	if (won) {
		if (l->leader && epoch != l->epoch)
			lease_end_belief(l, LOG_LEVEL_WARN,
					 "the lease lapsed and was re-acquired under a new epoch",
					 0, NULL);
		l->epoch = epoch;
		/* a lease just won rides the very next beat, which attaches it
		 * to the agent's row (0019): from then on it costs no write */
		l->attach = !l->leader;
		confirmed(l, sent, now);
	} else {
		const char *holder_replica = pgrow_text(r->res, 0, LA_HOLDER_REPLICA);
		int64_t holder = pgrow_int(r->res, 0, LA_HOLDER_SESSION);
		if (l->leader)
			lease_end_belief(l, LOG_LEVEL_WARN, "the lease is held by another session",
					 holder, holder_replica);
		l->epoch = epoch;
		if (l->wait)
			after_ms(l->timer, campaign_wait(l, r->res));
	}
	if (req)
		lease_reply_acquire(req, l, r);
	if (!l->leader && !l->wait && !l->dead)
		lease_drop(l);
}

/* One acquire-or-renew statement. Renewals of a held lease go on the
 * heartbeat connection so they never queue behind client traffic. */
void lease_attempt(struct lease *l)
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

/* --- renewals the heartbeat carries ----------------------------------- */

static bool due_at_this_beat(const struct lease *l, uint64_t now, int beat_ms)
{
	return l->leader && !l->in_flight && !l->dead && rides_beats(l) &&
	       (l->attach || l->renew_due <= now + (uint64_t)beat_ms / 2);
}

/* Appends v to a Postgres array literal being built in *out (quoted when
 * quote: a lease name is the client's text). */
static bool array_append(char **out, size_t *len, size_t *cap, const char *v, bool quote)
{
	size_t need = *len + 2 * strlen(v) + 5;
	if (need > *cap) {
		size_t cap2 = need * 2;
		char *grown = realloc(*out, cap2);
		if (!grown)
			return false;
		*out = grown;
		*cap = cap2;
	}
	char *o = *out;
	o[*len] = *len == 0 ? '{' : ',';
	(*len)++;
	if (quote)
		o[(*len)++] = '"';
	for (; *v; v++) {
		if (quote && (*v == '"' || *v == '\\'))
			o[(*len)++] = '\\';
		o[(*len)++] = *v;
	}
	if (quote)
		o[(*len)++] = '"';
	o[*len] = '\0';
	return true;
}

static void beat_clear(struct lease_beat *b)
{
	free(b->leases);
	free(b->names);
	free(b->sessions);
	free(b->epochs);
	free(b->ttls);
	memset(b, 0, sizeof(*b));
}

bool leases_beat_take(struct agent *ag, uint64_t now_ms, int beat_ms, struct lease_beat *b)
{
	struct lease_registry *rg = lease_reg(ag);
	size_t n = 0, len[4] = {0}, cap[4] = {0};
	char **lits[4] = {&b->names, &b->sessions, &b->epochs, &b->ttls};

	memset(b, 0, sizeof(*b));
	if (!rg)
		return true;
	for (struct lease *l = rg->leases; l; l = l->next)
		n += due_at_this_beat(l, now_ms, beat_ms);
	if (n == 0)
		return true;
	if (!(b->leases = calloc(n, sizeof(*b->leases))))
		return false;
	for (struct lease *l = rg->leases; l && b->n < n; l = l->next) {
		char session[24], epoch[24], ttl[24];
		if (!due_at_this_beat(l, now_ms, beat_ms))
			continue;
		snprintf(session, sizeof(session), "%" PRId64, l->session_id);
		snprintf(epoch, sizeof(epoch), "%" PRId64, l->epoch);
		snprintf(ttl, sizeof(ttl), "%d", l->ttl_ms);
		const char *v[4] = {l->name, session, epoch, ttl};
		for (int k = 0; k < 4; k++) {
			if (!array_append(lits[k], &len[k], &cap[k], v[k], k == 0)) {
				beat_clear(b);
				return false;
			}
		}
		b->leases[b->n++] = l;
	}
	for (int k = 0; k < 4; k++) {
		/* the closing brace: array_append left room for it */
		(*lits[k])[len[k]++] = '}';
		(*lits[k])[len[k]] = '\0';
	}
	for (size_t i = 0; i < b->n; i++)
		b->leases[i]->in_flight = true;
	return true;
}

void leases_beat_done(struct agent *ag, struct lease_beat *b, uint64_t sent_ms, const bool *renewed)
{
	uint64_t now = mono_ms();
	for (size_t i = 0; i < b->n; i++) {
		struct lease *l = b->leases[i];
		l->in_flight = false;
		l->attach = false;
		if (l->dead) {
			lease_settled(l);
			continue;
		}
		if (renewed && renewed[i]) {
			l->attempt_sent = sent_ms;
			confirmed(l, sent_ms, now);
		} else if (renewed) {
			/* not renewed in place: lease_acquire says what the row is
			 * now (lapsed, another holder's) and acts on it */
			evtimer_del(l->timer);
			lease_attempt(l);
		} else if (l->leader) {
			/* a failed beat proves nothing: belief runs out on its own
			 * deadline unless the lease's own renewal succeeds first */
			evtimer_del(l->timer);
			after_ms(l->timer, (uint64_t)l->renew_ms / 3);
		}
	}
	(void)ag;
	beat_clear(b);
}

struct lease *lease_new(struct agent *ag, const char *name, int64_t session_id, int ttl_ms,
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
	l->hand_back_poll_ms = ag->cfg.lease_retry_ms;
	l->timer = evtimer_new(ag->base, timer_cb, l);
	l->belief_timer = evtimer_new(ag->base, belief_timer_cb, l);
	if (!l->name || !l->timer || !l->belief_timer) {
		lease_free(l);
		return NULL;
	}
	l->next = lease_reg(ag)->leases;
	lease_reg(ag)->leases = l;
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
	/* the janitor's duties can wait out a hand-back: no polling for one */
	l->hand_back_poll_ms = 0;
	lease_attempt(l);
	return true;
}

void leases_session_ending(struct agent *ag, int64_t session_id, const char *reason,
			   enum log_level level)
{
	struct lease_registry *r = lease_reg(ag);
	if (!r)
		return;
	for (struct lease *l = r->leases, *next; l; l = next) {
		next = l->next;
		if (l->session_id != session_id)
			continue;
		lease_end_belief(l, level, reason, 0, NULL);
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
	struct lease_registry *r = lease_reg(ag);
	if (!r)
		return;
	while (r->leases) {
		lease_end_belief(r->leases, LOG_LEVEL_INFO, reason, 0, NULL); /* a shutdown */
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

bool leases_start(struct agent *ag)
{
	struct lease_registry *rg = calloc(1, sizeof(*rg));
	if (!rg)
		return false;
	rg->poll_timer = event_new(ag->base, -1, EV_PERSIST, lease_watch_poll_cb, ag);
	rg->rerun = event_new(ag->base, -1, 0, session_order_rerun_cb, ag);
	if (!rg->poll_timer || !rg->rerun) {
		if (rg->poll_timer)
			event_free(rg->poll_timer);
		free(rg);
		return false;
	}
	rg->rng = (uint32_t)mono_ms() ^ ((uint32_t)getpid() << 12);
	ag->leases = rg;
	struct timeval tv = {ag->cfg.lease_retry_ms / 1000, (ag->cfg.lease_retry_ms % 1000) * 1000};
	event_add(rg->poll_timer, &tv);
	return true;
}

void leases_finish(struct agent *ag)
{
	struct lease_registry *rg = lease_reg(ag);
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
