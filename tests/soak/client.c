/*
 * client.c — one soak client: a forked process with one libpgcoord handle to
 * its agent, driving a workload and writing every operation to its own
 * history file (history/<name>.jsonl): start and end on CLOCK_MONOTONIC, the
 * outcome (ok: the agent answered; failed: it certainly did nothing;
 * unknown: it may have), ids, tokens and epochs.
 *
 * Roles:
 *   permits  claims against the tight quotas (one hot key), phase updates,
 *            releases, marks of uncertainty and their resolutions, fleet-wide
 *            sweeps of uncertain permits, and deliberate retries of the same
 *            id: after errors, after a reply it cut off itself, through
 *            another agent, and plain duplicates. Some claims wait in the
 *            hot quota's queue (wait_ms): their permit.admitted /
 *            permit.expired notifications are recorded, a few cancelled.
 *   lease    campaigns for one lease and records each interval during which
 *            libpgcoord said it led (pgcoord_lease_valid_ms > 0). Every
 *            second lease worker opens its sessions with keepalive_ms,
 *            keeps them alive from its loop, and now and then hangs while
 *            it leads (a "hang" op): its session must be lost and its lease
 *            lapse only after its belief ended.
 *   records  puts records (some naming a permit), updates, settles, and
 *            recovers dead owners' records.
 */
#include "soak.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>
#include <pgcoord/pgcoord.h>

#include "proto/codec.h"

#define MAX_HELD 16
#define MAX_ORPHANS 64
#define MAX_TRIES 40
#define MAX_WAITS 6
/* waiting claims: this share of claims queue on the hot quota for a while
 * (-DWAIT_SHARE=0 builds a driver without them, to compare runs) */
#ifndef WAIT_SHARE
#define WAIT_SHARE 0.2
#endif
#define WAIT_MIN_MS 1000
#define WAIT_MAX_MS 6000
/* how long after its deadline a waiter whose outcome we were not told is
 * asked about (a notification is lost while the session resumes) */
#define WAIT_ASK_AFTER_MS 1500
/* keepalive_ms of the lease workers that use one; a hang lasts longer */
#define KEEPALIVE_MS 2000
#define HANG_EXTRA_MIN_MS 1500
#define HANG_EXTRA_MAX_MS 3000

static volatile sig_atomic_t stop_flag;

static void on_term(int sig)
{
	(void)sig;
	stop_flag = 1;
}

struct permit {
	char id[96];
	int nkeys;
	const char *keys[2];
	int32_t w[2];
	int64_t token;
	int phase;	    /* 0 reserved, 1 dispatched, 2 running */
	int64_t next_us;    /* next step (phase or release) */
	int64_t release_us; /* planned end */
	bool uncertain;	    /* marked by us: resolve at next_us */
	int tries;	    /* orphans: resolve attempts */
};

/* A claim of ours waiting in the queue: admitted or expired by notification,
 * or asked about (cancelled) at ask_us. */
struct waiter {
	struct permit p;
	int64_t ask_us;
	bool cancel; /* ask_us is a deliberate cancel, before the deadline */
};

struct cl {
	const struct client_spec *sp;
	const struct soak_cfg *cfg;
	struct soak_rng rng;
	struct hist h;
	pgcoord *c;
	int64_t session;
	bool session_lost;
	int64_t backoff_ms;
	uint64_t seq;
	struct permit held[MAX_HELD];
	int nheld;
	struct permit orphans[MAX_ORPHANS]; /* claimed by an earlier session of ours */
	int norphans;
	struct waiter waits[MAX_WAITS];
	int nwaits;
	pgcoord *x; /* a handle to another agent, for cross-agent retries */
	int64_t x_session;
};

/* --- outcomes ------------------------------------------------------------- */

static const char *err_code(pgcoord_err e)
{
	switch (e) {
	case PGCOORD_OK:
		return NULL;
	case PGCOORD_E_INVALID_REQUEST:
		return "invalid_request";
	case PGCOORD_E_METHOD_NOT_FOUND:
		return "method_not_found";
	case PGCOORD_E_INVALID_PARAMS:
		return "invalid_params";
	case PGCOORD_E_UNAVAILABLE:
		return "unavailable";
	case PGCOORD_E_TIMEOUT:
		return "timeout";
	case PGCOORD_E_BUSY:
		return "busy";
	case PGCOORD_E_NOT_FOUND:
		return "not_found";
	case PGCOORD_E_FORBIDDEN:
		return "forbidden";
	case PGCOORD_E_NO_SESSION:
		return "no_session";
	case PGCOORD_E_SESSION_EXPIRED:
		return "session_expired";
	case PGCOORD_E_CONFLICT:
		return "conflict";
	case PGCOORD_E_FENCED:
		return "fenced";
	case PGCOORD_E_SUPERSEDED:
		return "superseded";
	case PGCOORD_E_SHUTTING_DOWN:
		return "shutting_down";
	case PGCOORD_E_INTERNAL:
		return "internal";
	case PGCOORD_E_TOO_LARGE:
		return "too_large";
	case PGCOORD_E_CONNECT:
		return "connect";
	case PGCOORD_E_IO:
		return "io";
	case PGCOORD_E_CALL_TIMEOUT:
		return "call_timeout";
	case PGCOORD_E_PROTOCOL:
		return "protocol";
	case PGCOORD_E_NOMEM:
		return "nomem";
	case PGCOORD_E_ARG:
		return "arg";
	case PGCOORD_E_CLOSED:
		return "closed";
	case PGCOORD_E_EXPIRED:
		return "expired";
	}
	return "?";
}

/*
 * ok: the agent answered; failed: it certainly changed nothing (it refused,
 * or the request never left); unknown: it may have acted (the database or
 * the connection failed while the request was out).
 */
static const char *outcome(pgcoord_err e)
{
	switch (e) {
	case PGCOORD_OK:
		return "ok";
	case PGCOORD_E_UNAVAILABLE:
	case PGCOORD_E_TIMEOUT:
	case PGCOORD_E_INTERNAL:
	case PGCOORD_E_IO:
	case PGCOORD_E_CALL_TIMEOUT:
	case PGCOORD_E_PROTOCOL:
		return "unknown";
	default:
		return "failed";
	}
}

static bool conn_broken(pgcoord_err e)
{
	return e == PGCOORD_E_IO || e == PGCOORD_E_CLOSED || e == PGCOORD_E_PROTOCOL ||
	       e == PGCOORD_E_CONNECT || e == PGCOORD_E_SHUTTING_DOWN || e == PGCOORD_E_SUPERSEDED;
}

static bool session_gone_err(pgcoord_err e)
{
	return e == PGCOORD_E_SESSION_EXPIRED || e == PGCOORD_E_NO_SESSION;
}

/* Starts an "op" line; the caller adds fields and calls hist_end. */
static void rec(struct cl *cl, const char *op, int64_t t0, pgcoord_err err, int64_t session)
{
	struct hist *h = &cl->h;

	hist_begin(h, "op");
	hist_str(h, "c", cl->sp->name);
	hist_int(h, "a", cl->sp->agent);
	hist_int(h, "s", session);
	hist_str(h, "op", op);
	hist_int(h, "t0", t0);
	hist_int(h, "t1", soak_now_us());
	hist_str(h, "out", outcome(err));
	if (err != PGCOORD_OK) {
		hist_str(h, "err", err_code(err));
		if (cl->c && err < 100)
			hist_str(h, "msg", pgcoord_last_message(cl->c));
	}
}

static bool running(struct cl *cl)
{
	return !stop_flag && soak_now_us() < cl->sp->end_us;
}

static void pause_ms(struct cl *cl, int64_t ms)
{
	int64_t left = (cl->sp->end_us - soak_now_us()) / 1000;

	soak_sleep_ms(ms < left ? ms : left, &stop_flag);
}

static void backoff(struct cl *cl)
{
	cl->backoff_ms = cl->backoff_ms ? cl->backoff_ms * 2 : 50;
	if (cl->backoff_ms > 1000)
		cl->backoff_ms = 1000;
	pause_ms(cl, soak_rand_range(&cl->rng, cl->backoff_ms / 2, cl->backoff_ms));
}

/* --- connection and session ---------------------------------------------- */

static void waiter_admitted(struct cl *cl, const char *id, int64_t token);
static void waiter_remove_id(struct cl *cl, const char *id);

/* permit.admitted / permit.expired: the outcome of one of our waiting claims. */
static void on_wait_note(struct cl *cl, const char *method, const msgpack_object *params)
{
	const msgpack_object *o = pgc_map_get(params, "id");
	char id[96];
	int64_t token = 0;
	bool admitted = !strcmp(method, "permit.admitted");

	if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= sizeof(id))
		return;
	memcpy(id, o->via.str.ptr, o->via.str.size);
	id[o->via.str.size] = '\0';
	hist_begin(&cl->h, "note");
	hist_str(&cl->h, "c", cl->sp->name);
	hist_int(&cl->h, "s", cl->session);
	hist_str(&cl->h, "note", method);
	hist_int(&cl->h, "t", soak_now_us());
	hist_str(&cl->h, "id", id);
	if (admitted && pgc_obj_int64(pgc_map_get(params, "token"), &token))
		hist_int(&cl->h, "tok", token);
	if (!admitted && (o = pgc_map_get(params, "reason")) && o->type == MSGPACK_OBJECT_STR) {
		char why[96];
		size_t n = o->via.str.size < sizeof(why) - 1 ? o->via.str.size : sizeof(why) - 1;

		memcpy(why, o->via.str.ptr, n);
		why[n] = '\0';
		hist_str(&cl->h, "why", why);
	}
	hist_end(&cl->h);
	if (admitted)
		waiter_admitted(cl, id, token);
	else
		waiter_remove_id(cl, id);
}

static void on_note(void *user, const char *method, const void *params, size_t len)
{
	struct cl *cl = user;
	msgpack_unpacked u;
	size_t off = 0;
	int64_t s = 0;

	if (!strcmp(method, "permit.admitted") || !strcmp(method, "permit.expired")) {
		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, params, len, &off) == MSGPACK_UNPACK_SUCCESS)
			on_wait_note(cl, method, &u.data);
		msgpack_unpacked_destroy(&u);
		return;
	}
	if (strcmp(method, "session.lost") != 0)
		return;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, len, &off) == MSGPACK_UNPACK_SUCCESS &&
	    pgc_obj_int64(pgc_map_get(&u.data, "session"), &s) && s == cl->session) {
		cl->session_lost = true;
		hist_begin(&cl->h, "note");
		hist_str(&cl->h, "c", cl->sp->name);
		hist_int(&cl->h, "s", s);
		hist_str(&cl->h, "note", "session.lost");
		hist_int(&cl->h, "t", soak_now_us());
		hist_end(&cl->h);
	}
	msgpack_unpacked_destroy(&u);
}

/* Our session is gone: what it held is now the system's to sort out (it
 * turns uncertain, or is released for on_owner_loss = release); we keep
 * the ids to resolve them later with evidence. */
static void session_gone(struct cl *cl)
{
	for (int i = 0; i < cl->nheld; i++) {
		if (cl->norphans == MAX_ORPHANS) {
			memmove(&cl->orphans[0], &cl->orphans[1],
				sizeof(cl->orphans[0]) * (MAX_ORPHANS - 1));
			cl->norphans--;
		}
		cl->orphans[cl->norphans] = cl->held[i];
		cl->orphans[cl->norphans].tries = 0;
		cl->orphans[cl->norphans].next_us = soak_now_us() + 1000000;
		cl->norphans++;
	}
	/* its waiters left the queue with it, unless admitted just before:
	 * resolving finds out (not_found when never admitted) */
	for (int i = 0; i < cl->nwaits && cl->norphans < MAX_ORPHANS; i++) {
		cl->orphans[cl->norphans] = cl->waits[i].p;
		cl->orphans[cl->norphans].tries = 0;
		cl->orphans[cl->norphans].next_us = soak_now_us() + 1000000;
		cl->norphans++;
	}
	cl->nheld = 0;
	cl->nwaits = 0;
	cl->session = 0;
	cl->session_lost = false;
}

static void drop_conn(struct cl *cl)
{
	pgcoord_close(cl->c);
	cl->c = NULL;
}

/* Connected, with a session (resumed when we had one); false when not yet. */
/* Every second lease worker of an agent lives under keepalive_ms. */
static bool uses_keepalive(const struct cl *cl)
{
	return cl->sp->role == ROLE_LEASE && cl->sp->index % 2 == 1;
}

static bool ensure(struct cl *cl)
{
	const struct soak_cfg *cfg = cl->cfg;
	pgcoord_err err;
	int64_t t0;

	if (cl->session_lost) {
		drop_conn(cl);
		session_gone(cl);
	}
	if (cl->c && pgcoord_fd(cl->c) >= 0 && cl->session)
		return true;
	if (!cl->c || pgcoord_fd(cl->c) < 0) {
		drop_conn(cl);
		t0 = soak_now_us();
		err = pgcoord_connect(cfg->sockets[cl->sp->agent], 1000, &cl->c);
		if (err != PGCOORD_OK) {
			rec(cl, "connect", t0, err, cl->session);
			hist_end(&cl->h);
			cl->c = NULL;
			backoff(cl);
			return false;
		}
		pgcoord_set_notify(cl->c, on_note, cl);
		if (uses_keepalive(cl))
			(void)pgcoord_set_session_keepalive(cl->c, KEEPALIVE_MS);
		if (cl->session) {
			t0 = soak_now_us();
			err = pgcoord_session_resume(cl->c, cl->session, cfg->call_timeout_ms);
			rec(cl, "resume", t0, err, cl->session);
			hist_end(&cl->h);
			if (err == PGCOORD_OK) {
				cl->backoff_ms = 0;
				return true;
			}
			if (!strcmp(outcome(err), "failed") && !conn_broken(err)) {
				session_gone(cl);
			} else {
				drop_conn(cl);
				backoff(cl);
				return false;
			}
		}
	}
	t0 = soak_now_us();
	err = pgcoord_session_open(cl->c, cl->sp->name, cfg->call_timeout_ms, &cl->session);
	rec(cl, "open", t0, err, cl->session);
	hist_end(&cl->h);
	if (err != PGCOORD_OK) {
		cl->session = 0;
		drop_conn(cl);
		backoff(cl);
		return false;
	}
	cl->backoff_ms = 0;
	return true;
}

/* After a failed call: repairs what the error says is broken. */
static void after_error(struct cl *cl, pgcoord_err err)
{
	if (session_gone_err(err))
		cl->session_lost = true;
	else if (conn_broken(err))
		drop_conn(cl);
}

/* --- permits --------------------------------------------------------------- */

static void keys_json(const struct permit *p, char *keys, size_t ks, char *w, size_t ws)
{
	size_t a = 0, b = 0;

	a += (size_t)snprintf(keys + a, ks - a, "[");
	b += (size_t)snprintf(w + b, ws - b, "[");
	for (int i = 0; i < p->nkeys; i++) {
		a += (size_t)snprintf(keys + a, ks - a, "%s\"%s\"", i ? "," : "", p->keys[i]);
		b += (size_t)snprintf(w + b, ws - b, "%s%d", i ? "," : "", p->w[i]);
	}
	snprintf(keys + a, ks - a, "]");
	snprintf(w + b, ws - b, "]");
}

static void held_add(struct cl *cl, const struct permit *p)
{
	for (int i = 0; i < cl->nheld; i++)
		if (!strcmp(cl->held[i].id, p->id))
			return;
	if (cl->nheld == MAX_HELD)
		return; /* cannot happen: claims stop at MAX_HELD - 1 */
	cl->held[cl->nheld++] = *p;
}

static void held_remove(struct cl *cl, int i)
{
	cl->held[i] = cl->held[--cl->nheld];
}

static void orphan_remove(struct cl *cl, int i)
{
	cl->orphans[i] = cl->orphans[--cl->norphans];
}

/* How long a granted permit lives: mostly short, some long. */
static void plan_life(struct cl *cl, struct permit *p)
{
	int64_t now = soak_now_us();
	int64_t life = soak_chance(&cl->rng, 0.1) ? soak_rand_range(&cl->rng, 2000, 8000)
						  : soak_rand_range(&cl->rng, 50, 1500);

	p->phase = 0;
	p->uncertain = false;
	p->release_us = now + life * 1000;
	p->next_us = now + life * 1000 / 3;
}

/*
 * One claim call on handle c (session sess), recorded. kind: "first", "retry",
 * "dup" (a duplicate after a grant), "lost" (we cut the reply off), "xagent"
 * (a duplicate through another agent). On OK, fills status, token and mine.
 */
static pgcoord_err claim_once(struct cl *cl, pgcoord *c, int64_t sess, const struct permit *p,
			      unsigned flags, int64_t wait_ms, const char *kind, int attempt,
			      int timeout_ms, pgcoord_claim_status *status, int64_t *token,
			      bool *mine)
{
	char intent[128], kj[96], wj[32];
	pgcoord_claim *out = NULL;
	int64_t t0 = soak_now_us();
	pgcoord_err err;

	snprintf(intent, sizeof(intent), "soak intent of %s", p->id);
	err = pgcoord_permit_claim(
	    c, p->id,
	    &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
					 .keys = p->keys,
					 .weights = p->w,
					 .nquotas = (size_t)p->nkeys,
					 .intent = intent,
					 .intent_len = strlen(intent),
					 .limit = PGCOORD_NO_LIMIT,
					 .flags = flags,
					 .wait_ms = wait_ms},
	    timeout_ms, &out);
	keys_json(p, kj, sizeof(kj), wj, sizeof(wj));
	/* rec() reads the last message from cl->c; use c's own */
	hist_begin(&cl->h, "op");
	hist_str(&cl->h, "c", cl->sp->name);
	hist_int(&cl->h, "a", c == cl->x ? (cl->sp->agent + 1) % cl->cfg->agents : cl->sp->agent);
	hist_int(&cl->h, "s", sess);
	hist_str(&cl->h, "op", "claim");
	hist_int(&cl->h, "t0", t0);
	hist_int(&cl->h, "t1", soak_now_us());
	hist_str(&cl->h, "out", outcome(err));
	if (err != PGCOORD_OK) {
		hist_str(&cl->h, "err", err_code(err));
		if (err < 100)
			hist_str(&cl->h, "msg", pgcoord_last_message(c));
	}
	hist_str(&cl->h, "id", p->id);
	hist_raw(&cl->h, "keys", kj);
	hist_raw(&cl->h, "w", wj);
	hist_str(&cl->h, "kind", kind);
	hist_int(&cl->h, "try", attempt);
	hist_bool(&cl->h, "rel_on_loss", flags & PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS);
	if (wait_ms)
		hist_int(&cl->h, "wait", wait_ms);
	if (err == PGCOORD_OK) {
		*status = pgcoord_claim_get_status(out);
		*token = pgcoord_claim_get_token(out);
		*mine = pgcoord_claim_is_mine(out);
		hist_str(&cl->h, "st",
			 *status == PGCOORD_CLAIM_ADMITTED ? "admitted"
			 : *status == PGCOORD_CLAIM_HELD   ? "held"
			 : *status == PGCOORD_CLAIM_QUEUED ? "queued"
							   : "denied");
		if (*status == PGCOORD_CLAIM_QUEUED) {
			hist_bool(&cl->h, "mine", *mine);
			hist_int(&cl->h, "owner", pgcoord_claim_get_owner_session(out));
			hist_int(&cl->h, "pos", pgcoord_claim_queue_position(out));
			hist_int(&cl->h, "dl", pgcoord_claim_queue_deadline_at(out));
		} else if (*status != PGCOORD_CLAIM_DENIED) {
			hist_int(&cl->h, "tok", *token);
			hist_bool(&cl->h, "mine", *mine);
			hist_int(&cl->h, "owner", pgcoord_claim_get_owner_session(out));
		} else {
			hist_str(&cl->h, "dq", pgcoord_claim_denied_quota(out));
			hist_int(&cl->h, "dlimit", pgcoord_claim_denied_limit(out));
			hist_int(&cl->h, "dinflight", pgcoord_claim_denied_in_flight(out));
		}
	}
	hist_end(&cl->h);
	pgcoord_claim_free(out);
	return err;
}

/* A handle with a session on the next agent, for cross-agent duplicates. */
static bool ensure_x(struct cl *cl)
{
	if (cl->x && pgcoord_fd(cl->x) >= 0 && cl->x_session)
		return true;
	pgcoord_close(cl->x);
	cl->x = NULL;
	cl->x_session = 0;
	if (pgcoord_connect(cl->cfg->sockets[(cl->sp->agent + 1) % cl->cfg->agents], 500, &cl->x) !=
	    PGCOORD_OK)
		return false;
	if (pgcoord_session_open(cl->x, "soak-xagent", cl->cfg->call_timeout_ms, &cl->x_session) !=
	    PGCOORD_OK) {
		pgcoord_close(cl->x);
		cl->x = NULL;
		cl->x_session = 0;
		return false;
	}
	return true;
}

/* Releases id, which we no longer claim, in case an attempt of ours whose
 * reply we never got admitted it (or still will). */
static void give_up(struct cl *cl, const char *id)
{
	bool released = false;
	pgcoord_err err;
	int64_t t0;

	for (int attempt = 0; attempt < 5; attempt++) {
		if (!ensure(cl))
			return; /* a new session: the old one's permits go to the janitor */
		t0 = soak_now_us();
		err =
		    pgcoord_permit_release(cl->c, id, 0, "soak: given up after an unknown outcome",
					   cl->cfg->call_timeout_ms, &released);
		rec(cl, "release", t0, err, cl->session);
		hist_str(&cl->h, "id", id);
		hist_str(&cl->h, "kind", "give_up");
		if (err == PGCOORD_OK)
			hist_bool(&cl->h, "rel", released);
		hist_end(&cl->h);
		if (strcmp(outcome(err), "unknown"))
			return;
		after_error(cl, err);
	}
}

/* --- waiting claims --------------------------------------------------------- */

static void waiter_add(struct cl *cl, const struct permit *p, int64_t wait_ms)
{
	struct waiter *w;
	int64_t now = soak_now_us();

	if (cl->nwaits == MAX_WAITS)
		return; /* cannot happen: claims stop before */
	w = &cl->waits[cl->nwaits++];
	w->p = *p;
	/* a few are cancelled while they wait; the others are asked about
	 * only when no outcome came by their deadline */
	w->cancel = soak_chance(&cl->rng, 0.1);
	w->ask_us = now + (w->cancel ? soak_rand_range(&cl->rng, 100, wait_ms * 3 / 4)
				     : wait_ms + WAIT_ASK_AFTER_MS) *
			      1000;
}

static void waiter_remove(struct cl *cl, int i)
{
	cl->waits[i] = cl->waits[--cl->nwaits];
}

static void waiter_remove_id(struct cl *cl, const char *id)
{
	for (int i = 0; i < cl->nwaits; i++)
		if (!strcmp(cl->waits[i].p.id, id)) {
			waiter_remove(cl, i);
			return;
		}
}

/* Admitted from the queue: now a permit of ours like any other. */
static void waiter_admitted(struct cl *cl, const char *id, int64_t token)
{
	for (int i = 0; i < cl->nwaits; i++)
		if (!strcmp(cl->waits[i].p.id, id)) {
			struct permit p = cl->waits[i].p;

			waiter_remove(cl, i);
			p.token = token;
			plan_life(cl, &p);
			held_add(cl, &p);
			return;
		}
}

/* Cancels waiter i: deliberately, or to learn the outcome of a wait that
 * was not told (an admission found so becomes held, to be released). */
static void do_cancel(struct cl *cl, int i)
{
	struct waiter w = cl->waits[i];
	pgcoord_cancel_status cs = 0;
	int64_t t0 = soak_now_us();
	pgcoord_err err = pgcoord_permit_cancel(cl->c, w.p.id, cl->cfg->call_timeout_ms, &cs);

	rec(cl, "cancel", t0, err, cl->session);
	hist_str(&cl->h, "id", w.p.id);
	hist_str(&cl->h, "kind", w.cancel ? "cancel" : "ask");
	if (err == PGCOORD_OK)
		hist_str(&cl->h, "st",
			 cs == PGCOORD_CANCEL_CANCELLED	 ? "cancelled"
			 : cs == PGCOORD_CANCEL_ADMITTED ? "admitted"
			 : cs == PGCOORD_CANCEL_HELD	 ? "held"
							 : "released");
	hist_end(&cl->h);
	if (err == PGCOORD_OK && (cs == PGCOORD_CANCEL_ADMITTED || cs == PGCOORD_CANCEL_HELD)) {
		waiter_remove(cl, i);
		plan_life(cl, &w.p);
		held_add(cl, &w.p);
	} else if (err == PGCOORD_OK || !strcmp(outcome(err), "failed")) {
		waiter_remove(cl, i);
		if (session_gone_err(err))
			cl->session_lost = true;
	} else {
		after_error(cl, err);
		cl->waits[i].ask_us = soak_now_us() + 200000;
	}
}

static void do_claim(struct cl *cl)
{
	const struct soak_cfg *cfg = cl->cfg;
	struct permit p;
	double r = (double)(soak_rand(&cl->rng) % 1000) / 1000.0;
	unsigned flags = soak_chance(&cl->rng, 0.1) ? PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS : 0;
	bool lose = soak_chance(&cl->rng, 0.04);
	/* a waiting claim queues on the hot quota instead of being denied */
	int64_t wait_ms = soak_chance(&cl->rng, WAIT_SHARE)
			      ? soak_rand_range(&cl->rng, WAIT_MIN_MS, WAIT_MAX_MS)
			      : 0;
	pgcoord_claim_status st = PGCOORD_CLAIM_DENIED;
	int64_t token = 0;
	bool mine = false;
	pgcoord_err err;

	memset(&p, 0, sizeof(p));
	snprintf(p.id, sizeof(p.id), "%s-%" PRIu64, cl->sp->name, ++cl->seq);
	if (r < 0.4 || wait_ms) {
		p.nkeys = 1;
		p.keys[0] = soak_quotas[0].key;
		p.w[0] = 1;
	} else if (r < 0.6) {
		p.nkeys = 1;
		p.keys[0] = soak_quotas[1].key;
		p.w[0] = (int32_t)soak_rand_range(&cl->rng, 1, 2);
	} else if (r < 0.8) {
		p.nkeys = 1;
		p.keys[0] = soak_quotas[2].key;
		p.w[0] = (int32_t)soak_rand_range(&cl->rng, 1, 2);
	} else {
		p.nkeys = 2; /* in key order */
		p.keys[0] = soak_quotas[1].key;
		p.keys[1] = soak_quotas[2].key;
		p.w[0] = 1;
		p.w[1] = 1;
	}

	bool answered = false, unknown = false;

	for (int attempt = 0; attempt < MAX_TRIES && running(cl); attempt++) {
		if (!ensure(cl)) {
			attempt--;
			continue;
		}
		const char *kind = attempt == 0 ? (lose ? "lost" : "first") : "retry";
		err =
		    claim_once(cl, cl->c, cl->session, &p, flags, wait_ms, kind, attempt,
			       attempt == 0 && lose ? 1 : cfg->call_timeout_ms, &st, &token, &mine);
		if (err == PGCOORD_OK) {
			answered = true;
			break;
		}
		unknown |= !strcmp(outcome(err), "unknown");
		if (attempt == 0 && lose) {
			/* the reply is on its way: cut the connection so it is lost,
			 * then retry the same id on a new one */
			drop_conn(cl);
			continue;
		}
		if (!pgcoord_err_retryable(err) && !conn_broken(err) && !session_gone_err(err))
			return; /* conflict, not_found, …: recorded; nothing to hold */
		after_error(cl, err);
		if (!conn_broken(err) && !session_gone_err(err))
			backoff(cl);
	}
	if (unknown && (!answered || st == PGCOORD_CLAIM_DENIED)) {
		/* An attempt whose outcome we never learned may still commit
		 * after the answer we got: a permit behind a refusal. Giving up
		 * on the id means releasing it (the seed's rule). */
		give_up(cl, p.id);
		return;
	}
	if (st == PGCOORD_CLAIM_DENIED || !running(cl))
		return;
	if (st == PGCOORD_CLAIM_QUEUED) {
		if (mine) /* else queued by an earlier session of ours, which took it along */
			waiter_add(cl, &p, wait_ms);
		return;
	}
	p.token = token;
	plan_life(cl, &p);
	if (!mine) {
		/* granted to an earlier session of ours (the first attempt landed
		 * before that session ended): sort it out as an orphan */
		if (cl->norphans < MAX_ORPHANS) {
			p.next_us = soak_now_us() + 500000;
			cl->orphans[cl->norphans++] = p;
		}
		return;
	}
	held_add(cl, &p);
	/* duplicates: the same right again, same token, never a second slot */
	if (soak_chance(&cl->rng, 0.08)) {
		(void)claim_once(cl, cl->c, cl->session, &p, flags, wait_ms, "dup", 0,
				 cfg->call_timeout_ms, &st, &token, &mine);
	}
	if (cfg->agents > 1 && soak_chance(&cl->rng, 0.03) && ensure_x(cl)) {
		err = claim_once(cl, cl->x, cl->x_session, &p, flags, wait_ms, "xagent", 0,
				 cfg->call_timeout_ms, &st, &token, &mine);
		if (err != PGCOORD_OK) {
			pgcoord_close(cl->x);
			cl->x = NULL;
		}
	}
}

static void do_release(struct cl *cl, int i)
{
	struct permit p = cl->held[i];
	bool released = false;
	pgcoord_err err;
	int64_t t0;

	for (int attempt = 0; attempt < MAX_TRIES && running(cl); attempt++) {
		if (!ensure(cl))
			return; /* session replaced: p went to the orphans */
		t0 = soak_now_us();
		err = pgcoord_permit_release(cl->c, p.id, 0, "soak: work done",
					     cl->cfg->call_timeout_ms, &released);
		rec(cl, "release", t0, err, cl->session);
		hist_str(&cl->h, "id", p.id);
		hist_int(&cl->h, "try", attempt);
		if (err == PGCOORD_OK)
			hist_bool(&cl->h, "rel", released);
		hist_end(&cl->h);
		if (err == PGCOORD_OK || !strcmp(outcome(err), "failed")) {
			if (session_gone_err(err)) {
				cl->session_lost = true;
				return;
			}
			break;
		}
		after_error(cl, err);
		if (!conn_broken(err))
			backoff(cl);
	}
	for (int j = 0; j < cl->nheld; j++)
		if (!strcmp(cl->held[j].id, p.id)) {
			held_remove(cl, j);
			break;
		}
	/* a duplicate release: idempotent, never a second decrement */
	if (soak_chance(&cl->rng, 0.1) && cl->c && pgcoord_fd(cl->c) >= 0) {
		t0 = soak_now_us();
		err = pgcoord_permit_release(cl->c, p.id, 0, "soak: duplicate release",
					     cl->cfg->call_timeout_ms, &released);
		rec(cl, "release", t0, err, cl->session);
		hist_str(&cl->h, "id", p.id);
		hist_str(&cl->h, "kind", "dup");
		if (err == PGCOORD_OK)
			hist_bool(&cl->h, "rel", released);
		hist_end(&cl->h);
		after_error(cl, err);
	}
}

static const char *const phase_names[] = {"reserved", "dispatched", "running"};

static void do_phase(struct cl *cl, int i)
{
	struct permit *p = &cl->held[i];
	int64_t t0 = soak_now_us();
	pgcoord_err err;

	err = pgcoord_permit_update(cl->c, p->id, (pgcoord_phase)(p->phase + 1),
				    cl->cfg->call_timeout_ms);
	rec(cl, "update", t0, err, cl->session);
	hist_str(&cl->h, "id", p->id);
	hist_str(&cl->h, "phase", phase_names[p->phase + 1]);
	hist_end(&cl->h);
	if (err == PGCOORD_OK) {
		p->phase++;
		p->next_us = p->phase < 2 ? (p->release_us + soak_now_us()) / 2 : p->release_us;
	} else if (err == PGCOORD_E_CONFLICT || err == PGCOORD_E_FORBIDDEN ||
		   err == PGCOORD_E_NOT_FOUND) {
		/* no longer ours to drive (the checker judges whether it should be) */
		held_remove(cl, i);
	} else {
		after_error(cl, err);
		p->next_us = soak_now_us() + 100000;
	}
}

static void do_mark(struct cl *cl, int i)
{
	struct permit *p = &cl->held[i];
	int64_t t0 = soak_now_us();
	pgcoord_err err;

	err = pgcoord_permit_mark_uncertain(cl->c, p->id, "soak: the connector lost sight of it",
					    cl->cfg->call_timeout_ms);
	rec(cl, "mark", t0, err, cl->session);
	hist_str(&cl->h, "id", p->id);
	hist_end(&cl->h);
	if (err == PGCOORD_OK) {
		p->uncertain = true;
		p->next_us = soak_now_us() + soak_rand_range(&cl->rng, 200, 3000) * 1000;
	} else if (err == PGCOORD_E_CONFLICT || err == PGCOORD_E_FORBIDDEN ||
		   err == PGCOORD_E_NOT_FOUND) {
		held_remove(cl, i);
	} else {
		after_error(cl, err);
	}
}

/*
 * Resolves id with evidence; running adopts it into our session. Returns the
 * call's error; *gone_for_good when it is no longer anyone's to resolve.
 */
static pgcoord_err resolve(struct cl *cl, const char *id, bool running_, const char *why)
{
	char evidence[160];
	int64_t t0 = soak_now_us();
	pgcoord_err err;

	snprintf(evidence, sizeof(evidence), "soak: %s observed the work %s (%s)", cl->sp->name,
		 running_ ? "running" : "gone", why);
	err = pgcoord_permit_resolve(cl->c, id,
				     running_ ? PGCOORD_OUTCOME_RUNNING : PGCOORD_OUTCOME_GONE,
				     evidence, 0, cl->cfg->call_timeout_ms);
	rec(cl, "resolve", t0, err, cl->session);
	hist_str(&cl->h, "id", id);
	hist_str(&cl->h, "outcome", running_ ? "running" : "gone");
	hist_str(&cl->h, "why", why);
	hist_end(&cl->h);
	return err;
}

/* Our own mark, now settled: running takes it back, gone releases it. */
static void do_resolve_own(struct cl *cl, int i)
{
	struct permit *p = &cl->held[i];
	bool run = soak_chance(&cl->rng, 0.6);
	pgcoord_err err = resolve(cl, p->id, run, "own mark");

	if (err == PGCOORD_OK && run) {
		p->uncertain = false;
		p->next_us = soak_now_us() + 100000;
	} else if (err == PGCOORD_OK || !strcmp(outcome(err), "failed")) {
		if (session_gone_err(err))
			cl->session_lost = true;
		else
			held_remove(cl, i);
	} else {
		after_error(cl, err);
	}
}

/* A permit of an earlier session of ours: once uncertain, resolve it. */
static void do_orphan(struct cl *cl, int i)
{
	struct permit p = cl->orphans[i];
	bool run = soak_chance(&cl->rng, 0.5);
	pgcoord_err err = resolve(cl, p.id, run, "earlier session");

	if (err == PGCOORD_OK) {
		orphan_remove(cl, i);
		if (run && cl->nheld < MAX_HELD) {
			plan_life(cl, &p);
			held_add(cl, &p);
		}
	} else if (err == PGCOORD_E_FORBIDDEN && ++cl->orphans[i].tries < 20) {
		/* its old session is still live (resume grace): later */
		cl->orphans[i].next_us = soak_now_us() + 1000000;
	} else {
		if (!strcmp(outcome(err), "unknown"))
			after_error(cl, err);
		if (session_gone_err(err))
			cl->session_lost = true;
		orphan_remove(cl, i);
	}
}

/* Fleet-wide: a few uncertain permits, resolved on (simulated) evidence. */
static void do_sweep(struct cl *cl)
{
	void *res = NULL;
	size_t len = 0, off = 0;
	int64_t t0 = soak_now_us();
	pgcoord_err err =
	    pgcoord_permit_list(cl->c, NULL, "uncertain", cl->cfg->call_timeout_ms, &res, &len);
	msgpack_unpacked u;
	const msgpack_object *arr;
	char ids[4][sizeof(((struct permit *)0)->id)];
	int n = 0;

	rec(cl, "list_uncertain", t0, err, cl->session);
	if (err != PGCOORD_OK) {
		hist_end(&cl->h);
		after_error(cl, err);
		return;
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, res, len, &off) == MSGPACK_UNPACK_SUCCESS &&
	    (arr = pgc_map_get(&u.data, "permits")) && arr->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < arr->via.array.size && n < 4; i++) {
			const char *s;
			size_t sl;

			if (soak_chance(&cl->rng, 0.5) &&
			    pgc_obj_str(pgc_map_get(&arr->via.array.ptr[i], "id"), &s, &sl) &&
			    sl < sizeof(ids[0])) {
				memcpy(ids[n], s, sl);
				ids[n++][sl] = '\0';
			}
		}
		hist_int(&cl->h, "n", arr->via.array.size);
	}
	hist_end(&cl->h);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);
	for (int i = 0; i < n && running(cl); i++) {
		/* adopting is a claim on our session's slot budget too */
		bool run = cl->nheld < MAX_HELD - 2 && soak_chance(&cl->rng, 0.3);

		err = resolve(cl, ids[i], run, "fleet sweep");
		if (err != PGCOORD_OK) {
			if (!strcmp(outcome(err), "unknown") || session_gone_err(err)) {
				after_error(cl, err);
				return;
			}
			continue;
		}
		if (run) {
			/* we own it now; its quotas are not known here, and the
			 * release path needs only the id */
			struct permit p;

			memset(&p, 0, sizeof(p));
			memcpy(p.id, ids[i], sizeof(p.id));
			plan_life(cl, &p);
			p.phase = 2;
			held_add(cl, &p);
		}
	}
}

static void permits_step(struct cl *cl)
{
	int64_t now = soak_now_us();

	/* due work first: planned ends, phase steps, our marks */
	for (int i = 0; i < cl->nheld; i++) {
		struct permit *p = &cl->held[i];

		if (p->next_us > now)
			continue;
		if (p->uncertain)
			do_resolve_own(cl, i);
		else if (p->release_us <= now)
			do_release(cl, i);
		else if (p->phase < 2)
			do_phase(cl, i);
		else
			continue;
		return;
	}
	for (int i = 0; i < cl->norphans; i++)
		if (cl->orphans[i].next_us <= now) {
			do_orphan(cl, i);
			return;
		}
	for (int i = 0; i < cl->nwaits; i++)
		if (cl->waits[i].ask_us <= now) {
			do_cancel(cl, i);
			return;
		}

	double r = (double)(soak_rand(&cl->rng) % 10000) / 10000.0;

	if (r < 0.55) {
		if (cl->nheld + cl->nwaits < MAX_HELD - 2 && cl->nwaits < MAX_WAITS)
			do_claim(cl);
	} else if (r < 0.58) {
		for (int i = 0; i < cl->nheld; i++)
			if (!cl->held[i].uncertain && cl->held[i].release_us > now + 200000) {
				do_mark(cl, i);
				break;
			}
	} else if (r < 0.585) {
		do_sweep(cl);
	}
}

/* At the end: hand back what we hold, close the session. */
static void permits_finish(struct cl *cl)
{
	if (!cl->c || pgcoord_fd(cl->c) < 0 || !cl->session)
		return;
	/* waiters leave the queue; one admitted meanwhile is released below */
	while (cl->nwaits > 0) {
		int n = cl->nwaits;

		cl->waits[0].cancel = true;
		do_cancel(cl, 0);
		if (cl->nwaits == n)
			return; /* no answer: the session's end takes them */
	}
	for (int i = 0; i < cl->nheld; i++) {
		bool released;
		int64_t t0 = soak_now_us();
		pgcoord_err err;

		if (cl->held[i].uncertain)
			err = resolve(cl, cl->held[i].id, false, "shutting down");
		else {
			err = pgcoord_permit_release(cl->c, cl->held[i].id, 0, "soak: the end",
						     cl->cfg->call_timeout_ms, &released);
			rec(cl, "release", t0, err, cl->session);
			hist_str(&cl->h, "id", cl->held[i].id);
			if (err == PGCOORD_OK)
				hist_bool(&cl->h, "rel", released);
			hist_end(&cl->h);
		}
		if (err != PGCOORD_OK && strcmp(outcome(err), "failed"))
			return;
	}
	cl->nheld = 0;
}

/* --- leases ------------------------------------------------------------------ */

/*
 * A belief interval: from the first moment libpgcoord said this session
 * leads, to the moment it said so no more (or the deadline it gave, if
 * that came first). Written when it ends.
 */
struct belief {
	bool on;
	int64_t t0, until, epoch, session;
};

static void belief_end(struct cl *cl, struct belief *b, const char *lease, int64_t now,
		       const char *why)
{
	if (!b->on)
		return;
	hist_begin(&cl->h, "belief");
	hist_str(&cl->h, "c", cl->sp->name);
	hist_int(&cl->h, "a", cl->sp->agent);
	hist_int(&cl->h, "s", b->session);
	hist_str(&cl->h, "lease", lease);
	hist_int(&cl->h, "epoch", b->epoch);
	hist_int(&cl->h, "t0", b->t0);
	hist_int(&cl->h, "t1", now < b->until ? now : b->until);
	hist_str(&cl->h, "why", why);
	hist_end(&cl->h);
	hist_flush(&cl->h);
	b->on = false;
}

static void lease_loop(struct cl *cl)
{
	const struct soak_cfg *cfg = cl->cfg;
	struct belief b = {0};
	char lease[32];
	bool campaigning = false;
	int64_t hold_until = 0, next_acquire = 0, next_keepalive = 0, t0, now;
	pgcoord_err err;

	soak_lease_name(cl->sp->index % cfg->leases, lease, sizeof(lease));
	while (running(cl)) {
		if (!cl->c || pgcoord_fd(cl->c) < 0 || cl->session_lost) {
			belief_end(cl, &b, lease, soak_now_us(), "connection or session lost");
			campaigning = false;
		}
		if (!ensure(cl))
			continue;
		now = soak_now_us();
		if (!campaigning && now >= next_acquire) {
			bool leader = false;
			int64_t epoch = 0;

			t0 = soak_now_us();
			err = pgcoord_lease_acquire(cl->c, lease, cfg->lease_ttl_ms, true,
						    cfg->call_timeout_ms, &leader, &epoch);
			rec(cl, "lease_acquire", t0, err, cl->session);
			hist_str(&cl->h, "lease", lease);
			if (err == PGCOORD_OK) {
				hist_bool(&cl->h, "leader", leader);
				hist_int(&cl->h, "epoch", epoch);
			}
			hist_end(&cl->h);
			if (err == PGCOORD_OK) {
				campaigning = true;
			} else {
				after_error(cl, err);
				next_acquire = soak_now_us() + 200000;
				continue;
			}
		}
		(void)pgcoord_poll(cl->c, 20, NULL);
		if (uses_keepalive(cl) && soak_now_us() >= next_keepalive) {
			/* from the loop that does the work, as an application should */
			t0 = soak_now_us();
			err = pgcoord_session_keepalive(cl->c, cfg->call_timeout_ms, NULL);
			rec(cl, "keepalive", t0, err, cl->session);
			hist_end(&cl->h);
			next_keepalive = soak_now_us() + KEEPALIVE_MS / 3 * 1000;
			if (err != PGCOORD_OK) {
				after_error(cl, err);
				continue;
			}
		}
		if (uses_keepalive(cl) && b.on && soak_rand_range(&cl->rng, 0, 149) == 0) {
			/* hang while leading: no poll, no keepalive */
			int64_t ms = KEEPALIVE_MS + soak_rand_range(&cl->rng, HANG_EXTRA_MIN_MS,
								    HANG_EXTRA_MAX_MS);
			t0 = soak_now_us();
			pause_ms(cl, ms);
			rec(cl, "hang", t0, PGCOORD_OK, cl->session);
			hist_int(&cl->h, "ka", KEEPALIVE_MS);
			hist_end(&cl->h);
			hist_flush(&cl->h);
		}
		/* what the library believes now, as an application would ask it */
		now = soak_now_us();
		int64_t valid = pgcoord_lease_valid_ms(cl->c, lease);
		int64_t epoch = valid > 0 ? pgcoord_lease_epoch(cl->c, lease) : 0;
		if (valid > 0 && epoch > 0) {
			if (b.on && epoch != b.epoch)
				belief_end(cl, &b, lease, now, "new epoch");
			if (!b.on) {
				b.on = true;
				b.t0 = now;
				b.epoch = epoch;
				b.session = cl->session;
				hold_until = now + soak_rand_range(&cl->rng, 2000, 15000) * 1000;
			}
			b.until = now + valid * 1000;
		} else {
			belief_end(cl, &b, lease, now, "the library says not leader");
		}
		if (b.on && now > hold_until) {
			/* hand it back: belief ends before the release is sent */
			bool released = false;

			belief_end(cl, &b, lease, soak_now_us(), "released");
			t0 = soak_now_us();
			err = pgcoord_lease_release(cl->c, lease, cfg->call_timeout_ms, &released);
			rec(cl, "lease_release", t0, err, cl->session);
			hist_str(&cl->h, "lease", lease);
			if (err == PGCOORD_OK)
				hist_bool(&cl->h, "released", released);
			hist_end(&cl->h);
			if (err != PGCOORD_OK)
				after_error(cl, err);
			campaigning = false;
			next_acquire = soak_now_us() + soak_rand_range(&cl->rng, 200, 1500) * 1000;
		}
	}
	belief_end(cl, &b, lease, soak_now_us(), "end of the run");
	if (cl->c && pgcoord_fd(cl->c) >= 0 && cl->session)
		(void)pgcoord_lease_release(cl->c, lease, cfg->call_timeout_ms, NULL);
}

/* --- records ------------------------------------------------------------------ */

#define RECORD_KIND "soak.job"
#define MAX_RECORDS 16

struct record {
	char key[64];
	char permit[96]; /* the permit its work holds, or "" */
	int64_t token;
	int step; /* 0 queued, 1 running: next is update, then settle */
	int64_t next_us;
	bool adopted; /* by our recovery: its permit is uncertain until we resolve it */
};

struct records {
	struct record r[MAX_RECORDS];
	int n;
	uint64_t seq;
};

static void record_drop(struct records *rs, int i)
{
	rs->r[i] = rs->r[--rs->n];
}

static void rec_record(struct cl *cl, const char *op, int64_t t0, pgcoord_err err, const char *key,
		       int64_t token)
{
	rec(cl, op, t0, err, cl->session);
	hist_str(&cl->h, "rkind", RECORD_KIND);
	if (key)
		hist_str(&cl->h, "key", key);
	if (token)
		hist_int(&cl->h, "token", token);
}

/* A permit for a record's work, on the roomier quota; "" when denied. */
static void record_permit(struct cl *cl, char *id, size_t size)
{
	struct permit p;
	pgcoord_claim_status st = PGCOORD_CLAIM_DENIED;
	int64_t token;
	bool mine;

	id[0] = '\0';
	memset(&p, 0, sizeof(p));
	snprintf(p.id, sizeof(p.id), "%s-r%" PRIu64, cl->sp->name, ++cl->seq);
	p.nkeys = 1;
	p.keys[0] = soak_quotas[2].key;
	p.w[0] = 1;
	if (claim_once(cl, cl->c, cl->session, &p, 0, 0, "first", 0, cl->cfg->call_timeout_ms, &st,
		       &token, &mine) == PGCOORD_OK &&
	    st == PGCOORD_CLAIM_ADMITTED)
		snprintf(id, size, "%s", p.id);
}

static void record_put(struct cl *cl, struct records *rs)
{
	struct record r;
	char data[96];
	bool created = false;
	int64_t token = 0, t0;
	pgcoord_err err;

	memset(&r, 0, sizeof(r));
	snprintf(r.key, sizeof(r.key), "%s-%" PRIu64, cl->sp->name, ++rs->seq);
	if (soak_chance(&cl->rng, 0.4))
		record_permit(cl, r.permit, sizeof(r.permit));
	snprintf(data, sizeof(data), "soak work item %s", r.key);
	for (int attempt = 0; attempt < 10 && running(cl); attempt++) {
		if (!ensure(cl))
			return;
		t0 = soak_now_us();
		err = pgcoord_record_put(cl->c, RECORD_KIND, r.key, "queued", data, strlen(data),
					 r.permit[0] ? r.permit : NULL, cl->cfg->call_timeout_ms,
					 &created, &token);
		rec_record(cl, "record_put", t0, err, r.key, token);
		if (r.permit[0])
			hist_str(&cl->h, "permit", r.permit);
		hist_int(&cl->h, "try", attempt);
		if (err == PGCOORD_OK)
			hist_bool(&cl->h, "created", created);
		hist_end(&cl->h);
		if (err == PGCOORD_OK) {
			r.token = token;
			r.next_us = soak_now_us() + soak_rand_range(&cl->rng, 100, 3000) * 1000;
			if (rs->n < MAX_RECORDS)
				rs->r[rs->n++] = r;
			return;
		}
		if (!strcmp(outcome(err), "failed") && !conn_broken(err)) {
			if (session_gone_err(err))
				cl->session_lost = true;
			return;
		}
		after_error(cl, err); /* unknown: the same put again is answered */
		if (!conn_broken(err))
			backoff(cl);
	}
}

/* The owner drives its record: queued -> running -> settled "done". */
static void record_step(struct cl *cl, struct records *rs, int i)
{
	struct record *r = &rs->r[i];
	int64_t t0 = soak_now_us();
	pgcoord_err err;

	if (r->step == 0)
		err = pgcoord_record_update(cl->c, RECORD_KIND, r->key, "running", NULL, 0,
					    r->token, cl->cfg->call_timeout_ms);
	else
		err = pgcoord_record_settle(cl->c, RECORD_KIND, r->key, "done", r->token,
					    cl->cfg->call_timeout_ms);
	rec_record(cl, r->step == 0 ? "record_update" : "record_settle", t0, err, r->key, r->token);
	hist_end(&cl->h);
	if (err == PGCOORD_OK) {
		if (r->step++ == 0) {
			r->next_us = soak_now_us() + soak_rand_range(&cl->rng, 100, 3000) * 1000;
			return;
		}
		if (r->permit[0]) {
			bool released;

			t0 = soak_now_us();
			err = pgcoord_permit_release(cl->c, r->permit, 0, "soak: record settled",
						     cl->cfg->call_timeout_ms, &released);
			rec(cl, "release", t0, err, cl->session);
			hist_str(&cl->h, "id", r->permit);
			if (err == PGCOORD_OK)
				hist_bool(&cl->h, "rel", released);
			hist_end(&cl->h);
			if (err == PGCOORD_E_CONFLICT) {
				/* uncertain (it came with an adopted record):
				 * the work is done, so it is gone */
				(void)resolve(cl, r->permit, false, "record settled");
			}
		}
		record_drop(rs, i);
	} else if (err == PGCOORD_E_FENCED || err == PGCOORD_E_CONFLICT ||
		   err == PGCOORD_E_NOT_FOUND || err == PGCOORD_E_FORBIDDEN) {
		/* adopted away from us (our session was declared dead) or
		 * settled: no longer ours to drive */
		record_drop(rs, i);
	} else {
		after_error(cl, err);
		r->next_us = soak_now_us() + 200000;
	}
}

/* Adopts dead owners' records and drives them to the end. */
static void record_recover(struct cl *cl, struct records *rs)
{
	const char *kinds[] = {RECORD_KIND};
	pgcoord_recovery *rv = NULL;
	int64_t t0 = soak_now_us();
	pgcoord_err err;
	size_t n = 0;
	char keys[1024] = "[";
	size_t kl = 1;

	err = pgcoord_record_recover(cl->c, kinds, 1, 8, 0, cl->cfg->call_timeout_ms, &rv);
	if (err == PGCOORD_OK) {
		n = pgcoord_recovery_count(rv);
		for (size_t i = 0; i < n; i++) {
			const pgcoord_record *r = pgcoord_recovery_record(rv, i);
			const char *permit = pgcoord_record_get_permit(r);

			kl += (size_t)snprintf(
			    keys + kl, sizeof(keys) - kl, "%s[\"%s\",%" PRId64 ",%" PRId64 "]",
			    i ? "," : "", pgcoord_record_get_key(r), pgcoord_record_get_token(r),
			    pgcoord_record_get_adopted_from(r));
			if (kl >= sizeof(keys) - 2)
				break;
			if (rs->n < MAX_RECORDS) {
				struct record *x = &rs->r[rs->n++];

				memset(x, 0, sizeof(*x));
				snprintf(x->key, sizeof(x->key), "%s", pgcoord_record_get_key(r));
				if (permit)
					snprintf(x->permit, sizeof(x->permit), "%s", permit);
				x->token = pgcoord_record_get_token(r);
				x->step = strcmp(pgcoord_record_get_state(r), "queued") ? 1 : 0;
				x->next_us = soak_now_us() + 100000;
				x->adopted = true;
			}
		}
	}
	snprintf(keys + (kl < sizeof(keys) - 2 ? kl : sizeof(keys) - 2), 2, "]");
	rec_record(cl, "record_recover", t0, err, NULL, 0);
	if (err == PGCOORD_OK) {
		hist_int(&cl->h, "n", (int64_t)n);
		hist_bool(&cl->h, "liveness_read", pgcoord_recovery_liveness_read(rv));
		hist_int(&cl->h, "left_alone", pgcoord_recovery_left_alone(rv));
		hist_int(&cl->h, "remaining", pgcoord_recovery_remaining(rv));
		hist_raw(&cl->h, "adopted", keys);
	}
	hist_end(&cl->h);
	pgcoord_recovery_free(rv);
	if (err != PGCOORD_OK)
		after_error(cl, err);
	/* the permits that came along are uncertain: we run that work now */
	for (int i = 0; i < rs->n; i++)
		if (rs->r[i].adopted) {
			rs->r[i].adopted = false;
			if (!rs->r[i].permit[0])
				continue;
			pgcoord_err e = resolve(cl, rs->r[i].permit, true, "record recovered");

			if (e != PGCOORD_OK && strcmp(outcome(e), "failed"))
				break;
		}
}

static void records_loop(struct cl *cl)
{
	struct records rs;

	memset(&rs, 0, sizeof(rs));
	while (running(cl)) {
		if (cl->c && pgcoord_fd(cl->c) >= 0)
			(void)pgcoord_poll(cl->c, 0, NULL);
		if (cl->session_lost || !cl->c || pgcoord_fd(cl->c) < 0) {
			if (cl->session_lost)
				rs.n = 0; /* a new session: the old one's records go to recovery */
		}
		if (!ensure(cl))
			continue;
		int64_t now = soak_now_us();
		int due = -1;

		for (int i = 0; i < rs.n; i++)
			if (rs.r[i].next_us <= now) {
				due = i;
				break;
			}
		if (due >= 0)
			record_step(cl, &rs, due);
		else if (soak_chance(&cl->rng, 0.15))
			record_recover(cl, &rs);
		else if (rs.n < MAX_RECORDS - 4)
			record_put(cl, &rs);
		pause_ms(cl, soak_rand_exp(&cl->rng, cl->cfg->think_ms * 2));
	}
}

/* --- the process ------------------------------------------------------------ */

int client_main(const struct client_spec *spec)
{
	struct cl cl;
	char path[768];
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	memset(&cl, 0, sizeof(cl));
	cl.sp = spec;
	cl.cfg = spec->cfg;
	cl.rng.s = soak_derive_seed(spec->cfg->seed,
				    1000 + (uint64_t)spec->agent * 100 + (uint64_t)spec->index);
	snprintf(path, sizeof(path), "%s/history/%s.jsonl", spec->cfg->out_dir, spec->name);
	if (!hist_open(&cl.h, path)) {
		fprintf(stderr, "soak client %s: cannot write %s: %s\n", spec->name, path,
			strerror(errno));
		return 1;
	}
	if (spec->role == ROLE_LEASE) {
		lease_loop(&cl);
	} else if (spec->role == ROLE_RECORDS) {
		records_loop(&cl);
	} else {
		while (running(&cl)) {
			if (cl.c && pgcoord_fd(cl.c) >= 0)
				(void)pgcoord_poll(cl.c, 0, NULL);
			if (!ensure(&cl))
				continue;
			permits_step(&cl);
			pause_ms(&cl, soak_rand_exp(&cl.rng, cl.cfg->think_ms));
		}
	}
	stop_flag = 0; /* the end is ours to finish cleanly */
	cl.sp = spec;
	permits_finish(&cl);
	if (cl.c && pgcoord_fd(cl.c) >= 0 && cl.session)
		(void)pgcoord_session_close(cl.c, cl.cfg->call_timeout_ms);
	pgcoord_close(cl.c);
	pgcoord_close(cl.x);
	hist_close(&cl.h);
	return 0;
}
