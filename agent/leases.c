/*
 * leases.c — the lease.* methods. Campaigns and belief live in
 * lease_campaign.c, watches in lease_watch.c.
 */
#include "agent/leases.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/lease_registry.h"
#include "agent/methods.h"
#include "agent/pgrow.h"
#include "agent/cursor.h"
#include "agent/reply.h"
#include "agent/session_order.h"
#include "agent/session_registry.h"

#define LEASE_TTL_MIN 1000
#define LEASE_TTL_MAX 600000

/* --- lease.acquire --------------------------------------------------- */

static bool read_name(struct request *req, char **name)
{
	return req_param_name(req, "name", true, LEASE_NAME_MAX, name);
}

/* The session's campaigns that wait and have not won. */
static int campaigns_of(struct agent *ag, int64_t session_id)
{
	int n = 0;
	for (struct lease *l = lease_reg(ag)->leases; l; l = l->next)
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
	l = lease_find(ag, name, session_id);
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
			lease_reply_acquire(req, l, NULL);
			return;
		}
		evtimer_del(l->timer);
		l->pending = req;
		lease_attempt(l);
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
	lease_attempt(l);
}

/* --- lease.release --------------------------------------------------- */

/* What lease.release keeps for its callback. */
struct release_call {
	struct lease *tomb; /* holds the name while the release runs, or NULL */
};

static const struct reply_col release_cols[] = {
    {"released", REPLY_BOOL, 0},
};
const struct reply_kind lease_release_reply = REPLY_KIND(release_cols);

static void released(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	/* settled after the answer, which frees the request's context */
	struct lease *tomb = ((const struct release_call *)req->ctx)->tomb;
	if (!r->ok) {
		req_fail_db(req, r);
	} else {
		reply_pack_row(req_result(req), &lease_release_reply, r->res, 0, 0);
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
	l = lease_find(ag, name, session_id);
	if (l) {
		lease_end_belief(l, LOG_LEVEL_INFO, "released by its holder", 0, NULL);
		lease_drop(l);
	}
	/* ...which goes after the lease's statement still running */
	if (leases_park_if_busy(ag, session_id, name, req)) {
		free(name);
		return;
	}
	struct release_call *call = req_ctx_alloc(req, sizeof(*call), NULL);
	if (!call) {
		free(name);
		return;
	}
	/* a dying lease of its own holds the name while the release runs */
	struct lease *tomb = calloc(1, sizeof(*tomb));
	if (tomb && (tomb->name = strdup(name)) != NULL) {
		tomb->ag = ag;
		tomb->session_id = session_id;
		tomb->dead = tomb->in_flight = true;
		tomb->next = lease_reg(ag)->dying;
		lease_reg(ag)->dying = tomb;
	} else {
		free(tomb);
		tomb = NULL;
	}
	call->tomb = tomb;
	snprintf(session, sizeof(session), "%" PRId64, session_id);
	const char *params[3] = {name, session, "released by holder"};
	if (!req_query(req, "SELECT released FROM pgcoord.lease_release($1, $2, $3)", 3, params,
		       released) &&
	    tomb)
		lease_settled(tomb);
	free(name);
}

/* --- lease.status / lease.list --------------------------------------- */

/* The caller's belief and the holder, beside the row's cells. */
struct lease_view {
	const struct lease_holder *holder;
	bool leader;
	int64_t valid_ms;
};

/* A lease as lease.status (and each of lease.list) answers it. */
static const struct reply_col lease_cols[] = {
    {"name", REPLY_STR, LC_NAME, 0},
    {"epoch", REPLY_INT, LC_EPOCH, 0},
    {"holder_session", REPLY_HIDDEN, LC_HOLDER_SESSION, 0},
    {"holder_replica", REPLY_HIDDEN, LC_HOLDER_REPLICA, 0},
    {"expires_in_ms", REPLY_INT, LC_EXPIRES_IN_MS, 0},
    {"ttl_ms", REPLY_INT, LC_TTL_MS, 0},
    {"acquired_at", REPLY_INT, LC_ACQUIRED_AT, 0},
    {"renewed_at", REPLY_INT, LC_RENEWED_AT, 0},
    {"held", REPLY_HIDDEN, LC_HELD, 0},
    REPLY_NESTED_OR_NIL("holder", lease_holder_reply, struct lease_view, holder),
    REPLY_FIELD("leader", REPLY_FIELD_BOOL, struct lease_view, leader),
    REPLY_FIELD("valid_ms", REPLY_FIELD_INT, struct lease_view, valid_ms),
};
const struct reply_kind lease_status_reply = REPLY_KIND(lease_cols);

static void pack_lease_row(struct request *req, msgpack_packer *pk, const PGresult *res, int i)
{
	uint64_t now = mono_ms();
	int64_t holder = pgrow_int(res, i, LC_HOLDER_SESSION);
	bool held = pgrow_bool(res, i, LC_HELD);
	/*
	 * A caller with a session hears its own belief. One without (an
	 * operator's pgcoordctl) hears this agent's belief for the holding
	 * session when that session is this agent's, its janitor's say;
	 * otherwise it would read "leader false" for a lease this host leads.
	 */
	int64_t believer = req->conn->session ? req->conn->session->id : held ? holder : 0;
	struct lease *mine =
	    believer ? lease_find(req->ag, pgrow_text(res, i, LC_NAME), believer) : NULL;
	bool believe = mine && mine->leader && mine->belief_until > now;
	struct lease_holder h = {held ? holder : 0, pgrow_text(res, i, LC_HOLDER_REPLICA)};
	struct lease_view v = {
	    .holder = h.session ? &h : NULL,
	    .leader = believe,
	    .valid_ms = believe ? (int64_t)(mine->belief_until - now) : 0,
	};
	struct reply_src src = {.res = res, .row = i, .nrows = 1, .c = &v};

	reply_pack(pk, &lease_status_reply, &src);
}

static void status_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &lease_status_reply, r->res, 0))
		return;
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
		for (struct lease_watch *w = lease_reg(ag)->watches; w; w = w->next) {
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
			w->next = lease_reg(ag)->watches;
			lease_reg(ag)->watches = w;
		} else {
			free(w);
		}
	}
	const char *params[1] = {name};
	req_query(req, LEASE_COLUMNS "WHERE name = $1", 1, params, status_done);
	free(name);
}

/* Each lease with the caller's belief (pack_lease_row). */
static void pack_leases(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	const struct page_view *v = field;

	msgpack_pack_array(pk, (size_t)src->nrows);
	for (int i = 0; i < src->nrows; i++)
		pack_lease_row(v->req, pk, src->res, i);
}

static const struct reply_col list_cols[] = {
    REPLY_CALL_ROWS("leases", lease_status_reply, pack_leases),
    PAGE_NEXT_CURSOR,
};
const struct reply_kind lease_list_reply = REPLY_KIND(list_cols);

/* lease.list pages by name (the leases' primary key) */
static const struct cursor_kind lease_cursor = {'l', 1, 200, false};

static void list_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const struct page *pg = req->ctx;
	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &lease_status_reply, r->res, 0) ||
	    !req_rows_fit(req, r->res, "ask for a smaller page with limit"))
		return;
	int n = PQntuples(r->res);
	/* the statement asked for one row more than a page: another page follows */
	bool more = n > pg->limit;
	if (more)
		n = (int)pg->limit;
	struct page_view v = {.req = req};
	if (!page_view_cursor(req, &v, &lease_cursor, r->res, more ? n - 1 : -1,
			      (const int[]){LC_NAME}))
		return;
	struct reply_src src = {.res = r->res, .row = 0, .nrows = n, .c = &v};
	reply_pack(req_result(req), &lease_list_reply, &src);
	free(v.next_cursor);
	req_done(req);
}

void rpc_lease_list(struct request *req)
{
	struct page *pg = req_page_ctx(req, &lease_cursor, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX);
	if (!pg)
		return;
	const char *params[2] = {page_after(pg, 0), pg->fetch};
	req_query(req, LEASE_COLUMNS "WHERE name > $1 ORDER BY name LIMIT $2::integer", 2, params,
		  list_done);
}
