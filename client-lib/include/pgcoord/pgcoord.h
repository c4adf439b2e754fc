/*
 * libpgcoord — the C client of pgcoord-agent.
 *
 * One `pgcoord` handle is one connection to the agent's Unix socket and at
 * most one session. Calls are synchronous and take a timeout; a handle is not
 * thread-safe (use one per thread). Notifications the agent pushes
 * (lease.changed, session.suspended, session.lost, …) are queued while a call
 * waits and handed to the notification callback by pgcoord_poll().
 *
 * Timeouts: every timeout_ms is in milliseconds of CLOCK_MONOTONIC; a
 * negative value waits forever, 0 does not wait (a call then nearly always
 * ends in PGCOORD_E_CALL_TIMEOUT).
 *
 * Event loops: use pgcoord_send / pgcoord_flush / pgcoord_consume (below),
 * or wait for pgcoord_fd() to become readable, then call
 * pgcoord_poll(c, 0, NULL). Notifications that arrive while a call (or
 * pgcoord_lease_refresh) reads the socket are queued
 * inside the library and do NOT make pgcoord_fd() readable again, so also
 * call pgcoord_poll(c, 0, NULL) after each of those.
 *
 * ABI rules: the handle is opaque, only pgcoord_* symbols are exported, the
 * error enum is append-only, and no struct crosses the boundary by value.
 */
#ifndef PGCOORD_PGCOORD_H
#define PGCOORD_PGCOORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PGCOORD_DEFAULT_SOCKET "/run/pgcoord/agent.sock"

typedef struct pgcoord pgcoord;

/*
 * Errors. Values 1..99 are the agent's wire error codes (see PROTOCOL.md);
 * values from 100 are raised by the library itself. Append only.
 */
typedef enum pgcoord_err {
	PGCOORD_OK = 0,
	PGCOORD_E_INVALID_REQUEST = 1,
	PGCOORD_E_METHOD_NOT_FOUND = 2,
	PGCOORD_E_INVALID_PARAMS = 3,
	PGCOORD_E_UNAVAILABLE = 4,
	PGCOORD_E_TIMEOUT = 5,
	PGCOORD_E_BUSY = 6,
	PGCOORD_E_NOT_FOUND = 7,
	PGCOORD_E_FORBIDDEN = 8,
	PGCOORD_E_NO_SESSION = 9,
	PGCOORD_E_SESSION_EXPIRED = 10,
	PGCOORD_E_CONFLICT = 11,
	PGCOORD_E_FENCED = 12,
	PGCOORD_E_SUPERSEDED = 13,
	PGCOORD_E_SHUTTING_DOWN = 14,
	PGCOORD_E_INTERNAL = 15,
	PGCOORD_E_TOO_LARGE = 16,

	PGCOORD_E_CONNECT = 100,      /* could not connect to the agent's socket */
	PGCOORD_E_IO = 101,	      /* the connection failed or was closed mid-call */
	PGCOORD_E_CALL_TIMEOUT = 102, /* no reply within the call's timeout; outcome unknown */
	PGCOORD_E_PROTOCOL = 103,     /* the agent sent something that is not MessagePack-RPC */
	PGCOORD_E_NOMEM = 104,
	PGCOORD_E_ARG = 105,	 /* a bad argument to a library function */
	PGCOORD_E_CLOSED = 106,	 /* the handle's connection is already closed */
	PGCOORD_E_EXPIRED = 107, /* a queued claim left the queue unadmitted: nothing is held */
} pgcoord_err;

/* A static, human-readable description of err. Never NULL. */
const char *pgcoord_strerror(pgcoord_err err);

/*
 * True for errors where retrying the same call with the same ids is the
 * right move: the agent's unavailable, timeout, busy and shutting_down, and
 * the library's PGCOORD_E_CALL_TIMEOUT (no reply in time; the outcome is
 * unknown, retry on the same handle) and PGCOORD_E_IO (the connection
 * failed and the handle is closed: connect a new handle, resume the session
 * with pgcoord_session_resume() within its grace period, then retry).
 */
bool pgcoord_err_retryable(pgcoord_err err);

/* The wire name of an agent error code ("unavailable", "not_found", …, as
 * PROTOCOL.md spells them); NULL for PGCOORD_OK and the library's own
 * codes (100 and up). */
const char *pgcoord_err_name(pgcoord_err err);

/*
 * Connects to the agent at socket_path (NULL = PGCOORD_DEFAULT_SOCKET, or
 * $PGCOORD_SOCKET_PATH when set) within timeout_ms. On success *out owns a
 * new handle; release it with pgcoord_close(). On failure *out is NULL, the
 * return says what failed (PGCOORD_E_CONNECT; PGCOORD_E_ARG for a path that
 * does not fit a socket address; PGCOORD_E_NOMEM) and errno holds the cause
 * (ENOENT: no socket there, ECONNREFUSED: no agent listens, EACCES: this
 * user may not connect, ETIMEDOUT: the agent took no connection within
 * timeout_ms, …). A connect refused with EAGAIN (the agent's accept queue
 * is full, a burst of connects) is retried with a short growing backoff
 * (1 ms doubling to 50 ms) until timeout_ms. There is no handle to ask
 * pgcoord_last_message() of.
 */
pgcoord_err pgcoord_connect(const char *socket_path, int timeout_ms, pgcoord **out);

/* Closes the connection and frees the handle. Accepts NULL. The session, if
 * any, stays resumable on the agent for its grace period. */
void pgcoord_close(pgcoord *c);

/* The agent's (or library's) message for the last failed call on c; "" if none. */
const char *pgcoord_last_message(const pgcoord *c);

/* The socket's file descriptor, to wait for readability in an event loop
 * (see "Event loops" above: queued notifications do not make it readable);
 * -1 once the connection is closed. Do not read from it or close it. */
int pgcoord_fd(const pgcoord *c);

/*
 * The generic call. params is a MessagePack-encoded map (or NULL/0 for no
 * parameters). On PGCOORD_OK, *result (when result is non-NULL) receives a
 * malloc'd MessagePack encoding of the result, to be freed with
 * pgcoord_free(). On an agent error the return is its code and
 * pgcoord_last_message() has its text.
 */
pgcoord_err pgcoord_call(pgcoord *c, const char *method, const void *params, size_t params_len,
			 int timeout_ms, void **result, size_t *result_len);

void pgcoord_free(void *p);

/*
 * One page of a paged list (PROTOCOL.md, "Paging"): lease.list,
 * quota.list, fleet.agents, fleet.sessions, permit.list or record.list.
 * params is the list's filters as a MessagePack-encoded map (NULL/0 for
 * none; a limit or cursor in it is replaced), limit the page size (0: the
 * method's default; over its cap the agent answers
 * PGCOORD_E_INVALID_PARAMS), cursor NULL for the first page or the
 * *next_cursor of the page before. *result is the page's result map as for
 * pgcoord_call; *next_cursor (next_cursor may be NULL) a malloc'd string
 * to pass on (free with pgcoord_free), NULL after the last page. Walk a list:
 *
 *     char *cur = NULL;
 *     do { char *next; pgcoord_list_page(c, "quota.list", NULL, 0, 0, cur,
 *          ms, &res, &len, &next); …; pgcoord_free(cur); cur = next; } while (cur);
 *
 * The whole-list calls (pgcoord_lease_list, pgcoord_quota_list and their
 * typed forms, pgcoord_fleet_agents_get, pgcoord_fleet_sessions_get)
 * follow every page themselves and answer one list, as before paging;
 * pgcoord_permit_list and pgcoord_record_list (and their typed forms)
 * answer the first page (up to 1000, with truncated) as they always did.
 */
pgcoord_err pgcoord_list_page(pgcoord *c, const char *method, const void *params, size_t params_len,
			      int64_t limit, const char *cursor, int timeout_ms, void **result,
			      size_t *result_len, char **next_cursor);

/*
 * Every page of one of those lists, followed with pages of 1000 under one
 * timeout for the whole walk, answered as one result map: the rows of
 * every page in order, the other keys of the last page, next_cursor nil
 * and truncated false. The list may change between pages (PROTOCOL.md,
 * "Paging"). PGCOORD_E_ARG for a method that is not a paged list.
 */
pgcoord_err pgcoord_list_all(pgcoord *c, const char *method, const void *params, size_t params_len,
			     int timeout_ms, void **result, size_t *result_len);

/* --- notifications ---------------------------------------------------- */

/*
 * Called once per pushed notification, from pgcoord_poll() only. params is
 * the MessagePack-encoded params map, valid during the call. The callback
 * may make calls on the handle (notifications those queue are delivered in
 * the same pgcoord_poll), but must not pgcoord_close() it: close after
 * pgcoord_poll returns.
 */
typedef void (*pgcoord_notify_fn)(void *user, const char *method, const void *params,
				  size_t params_len);

void pgcoord_set_notify(pgcoord *c, pgcoord_notify_fn fn, void *user);

/*
 * Delivers queued notifications, then waits up to timeout_ms (0 = do not
 * wait, negative = forever) for more and delivers those. Returns the number
 * delivered in *delivered (may be NULL). PGCOORD_E_IO when the agent closed
 * the connection (everything it sent before is delivered first),
 * PGCOORD_E_CLOSED when it was closed already.
 */
pgcoord_err pgcoord_poll(pgcoord *c, int timeout_ms, int *delivered);

/* --- non-blocking calls, for event loops ----------------------------------
 *
 * pgcoord_send queues a request and returns at once; its answer comes to
 * fn from pgcoord_consume. Any number may be in flight on one handle,
 * each named by its msgid. The loop:
 *
 *   poll pgcoord_fd(c) for POLLIN, and POLLOUT while pgcoord_want_write(c);
 *   on POLLOUT call pgcoord_flush(c); on POLLIN call pgcoord_consume(c).
 *
 * Nothing here blocks: what the socket does not take (EAGAIN, a partial
 * write) stays queued in the handle, in order, and pgcoord_flush writes
 * more of it; a reply or notification read only in part waits in the
 * handle for the rest. The synchronous calls may be mixed in: they first
 * write what is queued (within their timeout), and replies to sent
 * requests that arrive meanwhile are kept for pgcoord_consume.
 */

/*
 * The answer to a pgcoord_send. err is PGCOORD_OK with result (the
 * MessagePack-encoded result, valid during the call), or the agent's
 * error with its message, or PGCOORD_E_IO / PGCOORD_E_CLOSED when the
 * connection ended first (the outcome is then unknown, as for
 * PGCOORD_E_CALL_TIMEOUT). fn may make calls on c, but must not close it.
 */
typedef void (*pgcoord_reply_fn)(void *user, uint32_t msgid, pgcoord_err err, const void *result,
				 size_t result_len, const char *message);

/*
 * Queues the request method(params) (params: one MessagePack map, or
 * NULL/0), tries to write it, and returns without waiting. *msgid (may be
 * NULL) receives its id. On PGCOORD_OK fn (not NULL) will be called once,
 * from pgcoord_consume, unless the handle is closed first (pgcoord_close
 * drops pending answers without calling fn). PGCOORD_E_IO when the socket
 * failed: the handle is then closed, and pgcoord_consume answers this and
 * every other request in flight with PGCOORD_E_IO. params are copied.
 */
pgcoord_err pgcoord_send(pgcoord *c, const char *method, const void *params, size_t params_len,
			 pgcoord_reply_fn fn, void *user, uint32_t *msgid);

/* Writes what the socket takes of the queued requests, without waiting.
 * PGCOORD_OK also when some remain (see pgcoord_want_write); PGCOORD_E_IO
 * when the socket failed (the handle is closed). */
pgcoord_err pgcoord_flush(pgcoord *c);

/* True while requests wait to be written: poll for POLLOUT, then flush. */
bool pgcoord_want_write(const pgcoord *c);

/*
 * Reads what the socket has, without waiting, then calls fn for each
 * answered pgcoord_send and delivers the queued notifications (as
 * pgcoord_poll(c, 0, …) does). *completed (may be NULL) receives the
 * number of answers delivered. When the connection ended, every request
 * still unanswered gets fn with PGCOORD_E_IO, and the return is
 * PGCOORD_E_IO (then PGCOORD_E_CLOSED on later calls).
 */
pgcoord_err pgcoord_consume(pgcoord *c, int *completed);

/* --- agent and session ------------------------------------------------ */

pgcoord_err pgcoord_ping(pgcoord *c, int timeout_ms);

/*
 * agent.status as a struct (PROTOCOL.md, agent.status), allocated by the
 * library with its strings; free it with pgcoord_agent_status_free (NULL
 * accepted). Fields may be appended, never reordered. Prefer it to
 * decoding pgcoord_call(c, "agent.status", …) yourself.
 */
struct pgcoord_agent_status {
	const char *replica_id;
	int64_t incarnation;
	const char *host;
	int64_t pid;
	const char *version;
	const char *state; /* "starting", "serving", "stopping", "superseded" */
	bool db_up;	   /* the agent's request lane to the database is up */
	bool registered;
	int64_t schema_version, schema_required;
	int64_t sessions, connections, leases_held;
	bool janitor; /* this agent runs the fleet's janitor now */
	int64_t uptime_ms;
	int64_t last_heartbeat_ms_ago; /* -1 before the first */
	int64_t db_reconnects, db_queries, db_failures;
	int64_t watches, watch_polls, waiters;
	int64_t db_standby_refusals, db_sync_waits_cancelled;
	const char *failover;		/* replication.failover: "safe", "at_risk", "unknown" */
	const char *replication_detail; /* replication.detail; NULL: none */
	int64_t sync_standbys;		/* -1: unknown */
};

/* Never touches the database. On PGCOORD_OK *out owns the status. */
pgcoord_err pgcoord_agent_status_get(pgcoord *c, int timeout_ms, struct pgcoord_agent_status **out);
void pgcoord_agent_status_free(struct pgcoord_agent_status *s);

/*
 * fleet.agents and fleet.sessions as structs (PROTOCOL.md), for operators'
 * views of the whole fleet; no session needed. Allocated by the library,
 * owning their strings: free each list with its free function (NULL
 * accepted). Fields may be appended, never reordered. Times are ms since
 * the epoch by the database clock; -1 where the agent sent none.
 */
struct pgcoord_agent_info {
	const char *replica_id;
	int64_t incarnation; /* the latest */
	const char *host;
	int64_t pid;
	const char *version;
	int64_t started_at, heartbeat_at, expires_at;
	int64_t stopped_at; /* -1 while running */
	bool live;
};

struct pgcoord_agent_list {
	size_t count;
	const struct pgcoord_agent_info *agents; /* every registered replica_id */
	int64_t now_at;				 /* 0 when the list is empty */
};

pgcoord_err pgcoord_fleet_agents_get(pgcoord *c, int timeout_ms, struct pgcoord_agent_list **out);
void pgcoord_agent_list_free(struct pgcoord_agent_list *l);

struct pgcoord_session_info {
	int64_t session;
	const char *name; /* "pgcoord-agent" for an agent's own session */
	const char *replica_id;
	int64_t incarnation;
	int64_t opened_at, expires_at;
	int64_t owner_uid; /* -1: none recorded */
};

struct pgcoord_session_list {
	size_t count;
	const struct pgcoord_session_info *sessions; /* the live sessions of the fleet */
	int64_t now_at;
};

pgcoord_err pgcoord_fleet_sessions_get(pgcoord *c, int timeout_ms,
				       struct pgcoord_session_list **out);
void pgcoord_session_list_free(struct pgcoord_session_list *l);

/* Opens a session named name (free text, for operators). *session_id may be NULL. */
pgcoord_err pgcoord_session_open(pgcoord *c, const char *name, int timeout_ms, int64_t *session_id);

/* Re-attaches a session this agent still holds in its grace period. Only the
 * uid that opened it (or an admin) may: PGCOORD_E_FORBIDDEN otherwise. */
pgcoord_err pgcoord_session_resume(pgcoord *c, int64_t session_id, int timeout_ms);

pgcoord_err pgcoord_session_close(pgcoord *c, int timeout_ms);

/* The session this handle has open, or 0. */
int64_t pgcoord_session_id(const pgcoord *c);

/*
 * Application liveness (PROTOCOL.md, "Keepalive"). Sets the keepalive_ms
 * that later pgcoord_session_open / pgcoord_session_resume calls on c ask
 * for: 0 (the default) for none, otherwise 100..600000 (PGCOORD_E_ARG
 * outside). A session opened with it must call pgcoord_session_keepalive()
 * at least every keepalive_ms; when it does not, the agent declares the
 * session lost (session.lost, reason "keepalive missed"), stops renewing
 * its leases (they lapse after every belief ended: the leader steps down
 * by itself) and its permits follow their on_owner_loss rule.
 *
 * Call pgcoord_session_keepalive() from the thread or loop that does the
 * application's work, where a deadlock or a stall also stops it. The
 * library never sends keepalives by itself: a hidden timer would keep a
 * hung application's session, and its leadership, alive.
 */
pgcoord_err pgcoord_set_session_keepalive(pgcoord *c, int keepalive_ms);

/* session.keepalive: proves the application is alive and restarts the
 * agent's clock. *next_due_ms (may be NULL) receives the milliseconds
 * within which the next one is due (0 without keepalive_ms).
 * PGCOORD_E_SESSION_EXPIRED: the session is lost (a keepalive came late,
 * or the database dropped it); open a new one. */
pgcoord_err pgcoord_session_keepalive(pgcoord *c, int timeout_ms, int64_t *next_due_ms);

/* --- quotas and permits (PROTOCOL.md, "Permits") -------------------------- */

/*
 * A permit is a grant of weight on one or more quotas, named by an id the
 * caller chooses (its idempotency key: a retry with the same id, through any
 * agent, finds the original grant and never takes a second slot). Calls
 * marked "owner" need an open session; the permit belongs to it.
 */

/* How a claim came out. */
typedef enum pgcoord_claim_status {
	PGCOORD_CLAIM_ADMITTED = 1, /* a new permit: this call took the slot(s) */
	PGCOORD_CLAIM_HELD = 2,	    /* the id had a permit already: the original grant, unchanged */
	PGCOORD_CLAIM_DENIED = 3,   /* a quota had no room; nothing changed */
	PGCOORD_CLAIM_QUEUED = 4,   /* waiting in the fleet-wide queue (wait_ms > 0): the
				       outcome comes as permit.admitted or permit.expired */
} pgcoord_claim_status;

/* The outcome of a claim (opaque); read it with the pgcoord_claim_* accessors. */
typedef struct pgcoord_claim pgcoord_claim;

/* pgcoord_claim_opts.flags: in-process work, released when its session
 * dies (by default a dead owner's permit stays counted, uncertain). */
#define PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS 0x1u

/* pgcoord_claim_opts.limit for "this claim sets no limit". */
#define PGCOORD_NO_LIMIT (-1)

/*
 * What a claim asks for. Start from PGCOORD_CLAIM_OPTS_INIT (or
 * pgcoord_claim_opts_init) and set the fields you need: `size` tells the
 * library which fields this caller was built with, so fields appended in
 * later versions keep their defaults for older callers. The struct and what
 * it points to are only read during the call.
 *
 *   keys, weights, nquotas  claim weights[i] (weights NULL: 1 each) of quota
 *                           keys[i] for i < nquotas, all or nothing
 *   intent, intent_len      stored with the permit in the same transaction
 *                           (NULL: none), up to 64 KiB
 *   limit                   >= 0 also sets the (single) quota's limit,
 *                           creating it if needed (from a non-admin: only
 *                           creating it; an existing limit stays);
 *                           PGCOORD_NO_LIMIT (the default) leaves it
 *   flags                   PGCOORD_CLAIM_RELEASE_ON_OWNER_LOSS
 *   wait_ms                 0 (the default): answer at once; 1..3600000:
 *                           when there is no room (or others wait), queue
 *                           for up to that long (PGCOORD_CLAIM_QUEUED).
 *                           Its session then receives permit.admitted
 *                           {id, token, …} or permit.expired {id, reason}
 *                           through the notification callback
 */
struct pgcoord_claim_opts {
	size_t size; /* sizeof(struct pgcoord_claim_opts) as the caller knew it */
	const char *const *keys;
	const int32_t *weights;
	size_t nquotas;
	const void *intent;
	size_t intent_len;
	int64_t limit;
	unsigned flags;
	/* Appended fields: read only when size covers them. */
	int64_t wait_ms;
};

#define PGCOORD_CLAIM_OPTS_INIT                                                                    \
	{                                                                                          \
		.size = sizeof(struct pgcoord_claim_opts), .limit = PGCOORD_NO_LIMIT               \
	}

/* Sets *opts to PGCOORD_CLAIM_OPTS_INIT. */
void pgcoord_claim_opts_init(struct pgcoord_claim_opts *opts);

/*
 * Owner. Claims as permit `id` (1..200 bytes) what opts asks for. On
 * PGCOORD_OK, *out owns the outcome (free it with pgcoord_claim_free); a
 * denial is PGCOORD_OK with status DENIED. PGCOORD_E_UNAVAILABLE /
 * _TIMEOUT / _CALL_TIMEOUT mean "not known to be admitted": retry with the
 * same id. PGCOORD_E_NOT_FOUND names a quota that does not exist;
 * PGCOORD_E_CONFLICT an id already used by another claim or already
 * released, or one that belongs to another uid (the message names only
 * the id: choose another). PGCOORD_E_ARG for opts NULL, without quotas, or with a size
 * smaller than the first version's.
 */
pgcoord_err pgcoord_permit_claim(pgcoord *c, const char *id, const struct pgcoord_claim_opts *opts,
				 int timeout_ms, pgcoord_claim **out);

pgcoord_claim_status pgcoord_claim_get_status(const pgcoord_claim *cl);
/* The fencing token of the grant (admitted or held); 0 when denied. */
int64_t pgcoord_claim_get_token(const pgcoord_claim *cl);
/* The session that owns the grant; 0 when denied. */
int64_t pgcoord_claim_get_owner_session(const pgcoord_claim *cl);
/* True when the grant belongs to this handle's session (a retry through
 * another session finds it owned by the first). */
bool pgcoord_claim_is_mine(const pgcoord_claim *cl);
/* For a denial: the quota that refused, its limit and in_flight at that
 * moment. NULL / -1 otherwise. The string lives as long as cl. */
const char *pgcoord_claim_denied_quota(const pgcoord_claim *cl);
int64_t pgcoord_claim_denied_limit(const pgcoord_claim *cl);
int64_t pgcoord_claim_denied_in_flight(const pgcoord_claim *cl);
/* For a queued claim: its place in line (1 = next) and when its wait ends
 * (ms since the epoch, database clock) at the time of the answer; 0
 * otherwise. */
int64_t pgcoord_claim_queue_position(const pgcoord_claim *cl);
int64_t pgcoord_claim_queue_deadline_at(const pgcoord_claim *cl);

/* Who holds the room a denied or queued claim did not get (PROTOCOL.md,
 * permit.claim: "Who holds the room"): the quota (for a queued claim, the
 * one it waits for), its limit, in_flight, waiting claims, and how many of
 * its open permits the caller may not see (another uid's, unless the
 * caller is an admin). False, the outputs untouched, for a grant, or when
 * the answer did not carry them (an older agent, or its read of them
 * failed). Any output may be NULL; *quota lives as long as cl. */
bool pgcoord_claim_room(const pgcoord_claim *cl, const char **quota, int64_t *limit,
			int64_t *in_flight, int64_t *waiting, int64_t *hidden);

/* One of the quota's largest open permits the caller may see. */
typedef struct pgcoord_holder {
	const char *id;
	int64_t weight;		   /* on this quota */
	const char *state;	   /* "held" or "uncertain" */
	const char *owner_replica; /* NULL when no session owns it */
	int64_t owner_session;	   /* -1 when no session owns it */
	int64_t age_ms;		   /* since its claim */
	const char *reason;	   /* an uncertain one's; NULL otherwise */
} pgcoord_holder;

/* The holders of pgcoord_claim_room, largest first, at most 5: how many
 * (0 when not told, or none the caller may see), and the i-th (NULL past
 * the end). Each lives as long as cl. */
size_t pgcoord_claim_holder_count(const pgcoord_claim *cl);
const pgcoord_holder *pgcoord_claim_holder_at(const pgcoord_claim *cl, size_t i);
/* Accepts NULL. */
void pgcoord_claim_free(pgcoord_claim *cl);

/* How pgcoord_permit_cancel found the id. */
typedef enum pgcoord_cancel_status {
	PGCOORD_CANCEL_CANCELLED = 1, /* it was waiting and left the queue */
	PGCOORD_CANCEL_ADMITTED = 2,  /* admitted already: the session holds a permit */
	PGCOORD_CANCEL_HELD = 3,      /* a permit is held: release it to give it up */
	PGCOORD_CANCEL_RELEASED = 4,  /* admitted and released already */
} pgcoord_cancel_status;

/*
 * Owner. Takes a queued claim out of the queue. When it was admitted
 * before the cancel arrived, the session owns a permit (ADMITTED / HELD):
 * release it with pgcoord_permit_release. PGCOORD_E_NOT_FOUND when the id
 * is neither queued nor a permit. *status may be NULL.
 */
pgcoord_err pgcoord_permit_cancel(pgcoord *c, const char *id, int timeout_ms,
				  pgcoord_cancel_status *status);

/*
 * The outcome of a queued claim, as the agent pushes it to the session that
 * queued it: permit.admitted (kind ADMITTED: the session now holds permit
 * id) or permit.expired (kind EXPIRED: it left the queue unadmitted, the id
 * is free again). Allocated by the library; fields may be appended, never
 * reordered. Strings are NUL-terminated; a field the message lacks is NULL
 * or -1.
 */
typedef enum pgcoord_permit_event_kind {
	PGCOORD_PERMIT_ADMITTED = 1,
	PGCOORD_PERMIT_EXPIRED = 2,
} pgcoord_permit_event_kind;

struct pgcoord_permit_event {
	pgcoord_permit_event_kind kind;
	const char *id;
	/* ADMITTED: the grant, as permit.claim would have answered it. */
	int64_t token;
	const char *state; /* "held" */
	const char *phase; /* "reserved" */
	int64_t owner_session;
	const char *owner_replica;
	int64_t created_at; /* ms since the epoch, database clock */
	int64_t queued_ms;  /* how long it waited */
	/* EXPIRED: "wait_ms elapsed", "cancelled", "the id was retired by a
	 * release"; from pgcoord_permit_await also "the await timed out" (it
	 * cancelled the claim). NULL for ADMITTED. */
	const char *reason;
	int64_t now_at; /* when the agent answered, database clock */
};

/*
 * Called from pgcoord_poll() for each permit.admitted and permit.expired,
 * instead of the raw notification callback, with the message decoded; ev
 * is valid during the call. The same rules as for pgcoord_notify_fn apply.
 * A message that does not decode goes to the raw callback as it came.
 */
typedef void (*pgcoord_permit_event_fn)(void *user, const struct pgcoord_permit_event *ev);

void pgcoord_set_permit_events(pgcoord *c, pgcoord_permit_event_fn fn, void *user);

/*
 * Owner. Waits up to timeout_ms for the outcome of the claim queued as id
 * (pgcoord_permit_claim answered PGCOORD_CLAIM_QUEUED on this handle). The
 * matching permit.admitted / permit.expired is taken here and not handed
 * to any callback; other notifications stay queued for pgcoord_poll().
 * On PGCOORD_OK and PGCOORD_E_EXPIRED *out owns the outcome (free it with
 * pgcoord_permit_event_free); otherwise *out is NULL.
 *
 *   PGCOORD_OK          admitted: this session holds permit id (token,
 *                       owner_session in *out). Release it with
 *                       pgcoord_permit_release when done, as any permit.
 *   PGCOORD_E_EXPIRED   it left the queue unadmitted (*out's reason):
 *                       nothing is held and the id is free.
 *   timeout             when nothing came by timeout_ms, the await sends
 *                       permit.cancel (waiting up to 5 s more for its
 *                       answer). Cancelled: PGCOORD_E_EXPIRED, reason "the
 *                       await timed out". Admitted before the cancel
 *                       arrived: PGCOORD_OK as above — the caller OWNS the
 *                       permit and must use or release it. Its
 *                       permit.admitted may still come later through the
 *                       callbacks: it repeats this admission.
 *   other errors        of permit.cancel (PGCOORD_E_CALL_TIMEOUT,
 *                       PGCOORD_E_IO, …): the outcome is unknown; the
 *                       claim may still wait or have been admitted. Call
 *                       pgcoord_permit_cancel(id) again (on a resumed
 *                       session after PGCOORD_E_IO) until it answers: on
 *                       ADMITTED / HELD release the permit.
 */
pgcoord_err pgcoord_permit_await(pgcoord *c, const char *id, int timeout_ms,
				 struct pgcoord_permit_event **out);

/* Accepts NULL. */
void pgcoord_permit_event_free(struct pgcoord_permit_event *ev);

typedef enum pgcoord_phase {
	PGCOORD_PHASE_RESERVED = 0,
	PGCOORD_PHASE_DISPATCHED = 1,
	PGCOORD_PHASE_RUNNING = 2,
} pgcoord_phase;

/* Owner. Moves the permit's phase forward (never back: PGCOORD_E_CONFLICT). */
pgcoord_err pgcoord_permit_update(pgcoord *c, const char *id, pgcoord_phase phase, int timeout_ms);

/* Owner. The owner lost sight of the work (say, its connector dropped before
 * confirming): the permit stays counted, marked uncertain with reason. */
pgcoord_err pgcoord_permit_mark_uncertain(pgcoord *c, const char *id, const char *reason,
					  int timeout_ms);

typedef enum pgcoord_outcome {
	PGCOORD_OUTCOME_RUNNING = 0, /* the work was observed running: adopt the permit */
	PGCOORD_OUTCOME_GONE = 1,    /* the work was observed gone: release the permit */
} pgcoord_outcome;

/* Flag of resolve and release: an audited admin override (root, the agent's
 * user, admin_uids, admin_group); no session needed. */
#define PGCOORD_OVERRIDE 0x1u

/*
 * Settles a permit on observed evidence (required, non-empty). Without
 * PGCOORD_OVERRIDE it needs a session and works on permits of the caller's
 * uid (any, for an admin) that are uncertain or the session's own; RUNNING
 * makes the session the owner.
 */
pgcoord_err pgcoord_permit_resolve(pgcoord *c, const char *id, pgcoord_outcome outcome,
				   const char *evidence, unsigned flags, int timeout_ms);

/*
 * Owner (or PGCOORD_OVERRIDE). Releases the permit; idempotent: *released
 * (may be NULL) is true only when this call released it. An uncertain
 * permit is released by resolving it GONE, or by an override. reason may be
 * NULL. Without PGCOORD_OVERRIDE, an id that has no permit is retired
 * (PGCOORD_E_NOT_FOUND): any attempt of a claim of it, even one still on its
 * way, is then refused. Release an id given up after an unknown outcome.
 */
pgcoord_err pgcoord_permit_release(pgcoord *c, const char *id, unsigned flags, const char *reason,
				   int timeout_ms, bool *released);

/*
 * The same two calls with options structs. Start from
 * PGCOORD_RESOLVE_OPTS_INIT / PGCOORD_RELEASE_OPTS_INIT (or the _init
 * functions) and set what you need; `size` as for pgcoord_claim_opts.
 * PGCOORD_E_ARG for opts NULL or of a size this library does not know,
 * and (resolve) for evidence NULL.
 *
 *   evidence  what was observed (required, non-empty)
 *   reason    why it is released (NULL: none)
 *   flags     PGCOORD_OVERRIDE
 */
struct pgcoord_resolve_opts {
	size_t size; /* sizeof(struct pgcoord_resolve_opts) as the caller knew it */
	const char *evidence;
	unsigned flags;
};

#define PGCOORD_RESOLVE_OPTS_INIT                                                                  \
	{                                                                                          \
		.size = sizeof(struct pgcoord_resolve_opts)                                        \
	}

void pgcoord_resolve_opts_init(struct pgcoord_resolve_opts *opts);

pgcoord_err pgcoord_permit_resolve_with(pgcoord *c, const char *id, pgcoord_outcome outcome,
					const struct pgcoord_resolve_opts *opts, int timeout_ms);

struct pgcoord_release_opts {
	size_t size; /* sizeof(struct pgcoord_release_opts) as the caller knew it */
	const char *reason;
	unsigned flags;
};

#define PGCOORD_RELEASE_OPTS_INIT                                                                  \
	{                                                                                          \
		.size = sizeof(struct pgcoord_release_opts)                                        \
	}

void pgcoord_release_opts_init(struct pgcoord_release_opts *opts);

pgcoord_err pgcoord_permit_release_with(pgcoord *c, const char *id,
					const struct pgcoord_release_opts *opts, int timeout_ms,
					bool *released);

/*
 * Reads: the MessagePack-encoded result map in *result (free with
 * pgcoord_free), as PROTOCOL.md describes for permit.get, permit.list (quota
 * and state filter when non-NULL), permit.history and quota.list. Prefer
 * the typed forms below (pgcoord_permit_info_get, pgcoord_permit_list_get,
 * pgcoord_permit_history_get, pgcoord_quota_list_get); these stay for
 * fields the structs do not carry.
 */
pgcoord_err pgcoord_permit_get(pgcoord *c, const char *id, int timeout_ms, void **result,
			       size_t *result_len);
pgcoord_err pgcoord_permit_list(pgcoord *c, const char *quota, const char *state, int timeout_ms,
				void **result, size_t *result_len);
pgcoord_err pgcoord_permit_history(pgcoord *c, const char *id, int timeout_ms, void **result,
				   size_t *result_len);
pgcoord_err pgcoord_quota_list(pgcoord *c, int timeout_ms, void **result, size_t *result_len);

/*
 * Typed forms of permit.get and quota.list (the raw ones above stay the
 * escape hatch for fields these do not carry). The structs are allocated
 * by the library and own their strings: free each with its free function
 * (NULL accepted). Fields may be appended, never reordered. Times are ms
 * since the epoch by the database clock; -1 where the agent sent none.
 */
struct pgcoord_permit_info {
	const char *id;
	int64_t token;
	const char *state;	   /* "held", "uncertain", "released" */
	const char *phase;	   /* "reserved", "dispatched", "running" */
	int64_t owner_session;	   /* 0: none */
	const char *owner_replica; /* NULL: none */
	bool owner_live;
	const char *on_owner_loss;    /* "uncertain" or "release" */
	const char *uncertain_reason; /* NULL unless uncertain */
	size_t nquotas;
	const char *const *quota_keys;
	const int32_t *quota_weights;
	const void *intent; /* NULL: none, or redacted */
	size_t intent_len;
	bool redacted; /* another uid's permit: intent withheld */
	int64_t created_at, phase_at, state_at, released_at;
	int64_t now_at;
};

/* permit.get as a struct; PGCOORD_E_NOT_FOUND for an unknown id. On
 * PGCOORD_OK *out owns it. */
pgcoord_err pgcoord_permit_info_get(pgcoord *c, const char *id, int timeout_ms,
				    struct pgcoord_permit_info **out);
void pgcoord_permit_info_free(struct pgcoord_permit_info *p);

struct pgcoord_quota_info {
	const char *key;
	int64_t limit;
	int64_t in_flight; /* held + uncertain */
	int64_t held, uncertain;
	int64_t available;     /* max(limit - in_flight, 0) */
	int64_t permits;       /* how many permits count */
	int64_t lapse_after_s; /* -1: no lapse policy */
	int64_t created_at, updated_at;
};

struct pgcoord_quota_list {
	size_t count;
	const struct pgcoord_quota_info *rows; /* ordered by key */
	int64_t now_at;
};

/* quota.get as a struct (prefer it to pgcoord_quota_get's out-params);
 * PGCOORD_E_NOT_FOUND when the quota does not exist. On PGCOORD_OK *out
 * owns it: free it with pgcoord_quota_info_free (NULL accepted). */
pgcoord_err pgcoord_quota_info_get(pgcoord *c, const char *key, int timeout_ms,
				   struct pgcoord_quota_info **out);
void pgcoord_quota_info_free(struct pgcoord_quota_info *q);

/* quota.list as structs. On PGCOORD_OK *out owns them. */
pgcoord_err pgcoord_quota_list_get(pgcoord *c, int timeout_ms, struct pgcoord_quota_list **out);
void pgcoord_quota_list_free(struct pgcoord_quota_list *l);

struct pgcoord_permit_list {
	size_t count;
	/* ordered by id; intent is NULL in each */
	const struct pgcoord_permit_info *const *permits;
	bool truncated; /* more matched than the agent's limit (1000): page with
			 * pgcoord_list_page */
	int64_t now_at;
};

/* permit.list as structs (quota and state filter when non-NULL; released
 * permits only with state "released"). On PGCOORD_OK *out owns them. */
pgcoord_err pgcoord_permit_list_get(pgcoord *c, const char *quota, const char *state,
				    int timeout_ms, struct pgcoord_permit_list **out);
void pgcoord_permit_list_free(struct pgcoord_permit_list *l);

/* One row of a permit's audit trail (PROTOCOL.md, permit.history). */
struct pgcoord_permit_history_event {
	int64_t seq;
	const char *event;	   /* "admitted", "phase", "uncertain", "released", … */
	const char *quota;	   /* NULL: the event moved no quota */
	int64_t delta;		   /* what it added to quota's in_flight */
	const char *actor;	   /* who did it, as the agent recorded it; NULL: unknown */
	const char *reason;	   /* NULL: none */
	const char *state, *phase; /* the permit after the event */
	int64_t at;
};

struct pgcoord_permit_history {
	const char *id;
	size_t count;
	const struct pgcoord_permit_history_event *events; /* oldest first */
	int64_t now_at;
};

/* permit.history as structs; PGCOORD_E_NOT_FOUND for an unknown id. On
 * PGCOORD_OK *out owns it. */
pgcoord_err pgcoord_permit_history_get(pgcoord *c, const char *id, int timeout_ms,
				       struct pgcoord_permit_history **out);
void pgcoord_permit_history_free(struct pgcoord_permit_history *h);

/* Verifies the ledger's conservation in one snapshot: *ok (may be NULL) is
 * false when some quota's counter disagrees with its permits or audit, or
 * went over its limit. result (may be NULL) as for the reads above;
 * pgcoord_permit_check_get below is its typed form. */
pgcoord_err pgcoord_permit_check(pgcoord *c, int timeout_ms, bool *ok, void **result,
				 size_t *result_len);

/* permit.check as a struct: one row per quota that breaks conservation,
 * and one per queue whose head should have been admitted. */
struct pgcoord_check_violation {
	const char *key;
	int64_t limit, in_flight, permit_weights, audit_sum;
	const char *problem;
};

struct pgcoord_check_stall {
	const char *key;
	const char *head_id;
	int64_t head_age_ms;
};

struct pgcoord_check_report {
	bool ok;	/* conservation holds (stalled queues aside) */
	int64_t quotas; /* how many were checked */
	size_t nviolations;
	const struct pgcoord_check_violation *violations;
	size_t nstalled;
	const struct pgcoord_check_stall *stalled_queues;
	int64_t now_at;
};

/* On PGCOORD_OK *out owns the report: free it with
 * pgcoord_check_report_free (NULL accepted). */
pgcoord_err pgcoord_permit_check_get(pgcoord *c, int timeout_ms, struct pgcoord_check_report **out);
void pgcoord_check_report_free(struct pgcoord_check_report *r);

/* Admin. Sets key's limit (creating the quota); lapse_after_s: -1 keeps the
 * policy, 0 turns it off, > 0 lets the janitor release permits uncertain
 * for longer than that. */
pgcoord_err pgcoord_quota_set(pgcoord *c, const char *key, int32_t limit, int32_t lapse_after_s,
			      int timeout_ms);

/* A quota's numbers by one database snapshot; each out-param may be NULL. */
pgcoord_err pgcoord_quota_get(pgcoord *c, const char *key, int timeout_ms, int64_t *limit,
			      int64_t *in_flight, int64_t *held, int64_t *uncertain);

/* --- leader leases (PROTOCOL.md, "Leases") ----------------------------- */

/*
 * A lease names a singleton job; one session at a time leads it, and each
 * change of leader draws a new epoch (use it as a fencing token). The agent
 * renews a lease it won every ttl/3 and believes its session leads only
 * until send time of the last confirmed renewal + ttl − ttl/3, which is
 * before the row can expire for anyone else.
 *
 * This handle keeps its own copy of that belief: a deadline per lease on
 * CLOCK_MONOTONIC, set from the agent's lease.changed and lease.renewed
 * notifications (consumed here and still handed to the notification
 * callback) and from acquire results, each dated by when the message was
 * provably not yet in this process's socket — so the local deadline is never
 * later than the agent's, however late the application reads. The belief
 * ends at that deadline even when nothing arrives (an agent frozen by
 * SIGSTOP, a database that stopped answering), and at once on lease.changed
 * leader=false, lease release, session close or loss, or a broken
 * connection. pgcoord_lease_is_leader() is the question to ask before every
 * step of leader-only work; stop the work when it says false.
 */

/*
 * Needs a session. Takes lease `name` (1..200 bytes, not starting with
 * "pgcoord.") or, when the session holds it, answers the current belief.
 * ttl_ms: 1000..600000, or 0 for the agent's lease_ttl_ms. Without wait, one
 * attempt. With wait, the agent keeps campaigning for the session every
 * lease_retry_ms until it wins (a lease.changed leader=true arrives; ask
 * pgcoord_lease_is_leader) or pgcoord_lease_release() is called; the call
 * itself returns at once. *leader (may be NULL): leading now. *epoch (may
 * be NULL): the lease's epoch as the agent saw it — this session's fencing
 * token when *leader, the current holder's otherwise. Both are zeroed on
 * failure. PGCOORD_E_INVALID_PARAMS for a bad or reserved name or ttl.
 */
pgcoord_err pgcoord_lease_acquire(pgcoord *c, const char *name, int ttl_ms, bool wait,
				  int timeout_ms, bool *leader, int64_t *epoch);

/*
 * pgcoord_lease_acquire with an options struct: start from
 * PGCOORD_LEASE_OPTS_INIT (or pgcoord_lease_opts_init); `size` as for
 * pgcoord_claim_opts. PGCOORD_E_ARG for opts NULL or of a size this library
 * does not know.
 *
 *   ttl_ms  1000..600000, or 0 (the default) for the agent's lease_ttl_ms
 *   wait    keep campaigning until the session wins or releases
 */
struct pgcoord_lease_opts {
	size_t size; /* sizeof(struct pgcoord_lease_opts) as the caller knew it */
	int ttl_ms;
	bool wait;
};

#define PGCOORD_LEASE_OPTS_INIT                                                                    \
	{                                                                                          \
		.size = sizeof(struct pgcoord_lease_opts)                                          \
	}

void pgcoord_lease_opts_init(struct pgcoord_lease_opts *opts);

pgcoord_err pgcoord_lease_acquire_with(pgcoord *c, const char *name,
				       const struct pgcoord_lease_opts *opts, int timeout_ms,
				       bool *leader, int64_t *epoch);

/*
 * Needs a session. Ends the local belief at once, before anything is sent,
 * then stops any campaign and hands the lease back so a campaigner wins on
 * its next try. *released (may be NULL) is true when the session held the
 * row. Safe to retry.
 */
pgcoord_err pgcoord_lease_release(pgcoord *c, const char *name, int timeout_ms, bool *released);

/*
 * Reads, no session needed: on PGCOORD_OK *result (may be NULL) receives the
 * MessagePack-encoded result map (free with pgcoord_free): lease.status's
 * {name, epoch, holder: {session, replica_id} | nil, expires_in_ms, ttl_ms,
 * acquired_at, renewed_at, leader, valid_ms} (leader/valid_ms: the agent's
 * belief for this handle's session), and lease.list's {leases: [...]}.
 * lease.status answers PGCOORD_E_NOT_FOUND for a name never acquired.
 * Decisions belong to pgcoord_lease_is_leader, not to these snapshots.
 */
pgcoord_err pgcoord_lease_status(pgcoord *c, const char *name, int timeout_ms, void **result,
				 size_t *result_len);
pgcoord_err pgcoord_lease_list(pgcoord *c, int timeout_ms, void **result, size_t *result_len);

/*
 * The typed forms of lease.status and lease.list (prefer them to the raw
 * ones above), allocated by the library, owning their strings; free each
 * with its free function (NULL accepted). Fields may be appended, never
 * reordered. Times are ms since the epoch by the database clock; -1 where
 * the agent sent none.
 */
struct pgcoord_lease_info {
	const char *name;
	int64_t epoch;
	int64_t holder_session;	    /* 0: nobody holds it */
	const char *holder_replica; /* the holder's agent; NULL: nobody */
	int64_t expires_in_ms;
	int64_t ttl_ms;
	int64_t acquired_at, renewed_at;
	bool leader;	  /* the agent's belief, as for lease.status */
	int64_t valid_ms; /* 0 when not leader */
};

pgcoord_err pgcoord_lease_info_get(pgcoord *c, const char *name, int timeout_ms,
				   struct pgcoord_lease_info **out);
void pgcoord_lease_info_free(struct pgcoord_lease_info *l);

struct pgcoord_lease_list {
	size_t count;
	const struct pgcoord_lease_info *leases; /* ordered by name */
};

pgcoord_err pgcoord_lease_list_get(pgcoord *c, int timeout_ms, struct pgcoord_lease_list **out);
void pgcoord_lease_list_free(struct pgcoord_lease_list *l);

/*
 * True only while the last lease.changed (or acquire result) for name said
 * this session leads and the local deadline lies ahead on CLOCK_MONOTONIC.
 * Never does I/O and never changes the handle: it compares the belief's
 * deadline with the clock, so it is cheap to ask before every step and
 * safe from any point of an event loop. A pushed end of leadership counts
 * once the library has read it: every call, pgcoord_poll and
 * pgcoord_lease_refresh read what the agent sent. Even when nothing is read,
 * the belief ends at its deadline. False for NULL arguments and on a closed
 * handle.
 */
bool pgcoord_lease_is_leader(const pgcoord *c, const char *name);

/* The belief left, in ms (0 when not leading), as pgcoord_lease_is_leader
 * would judge it: the longest a step may take that must end while leading.
 * No I/O. */
int64_t pgcoord_lease_valid_ms(const pgcoord *c, const char *name);

/* The epoch (fencing token) of the current belief; 0 when not leading. No
 * I/O. */
int64_t pgcoord_lease_epoch(const pgcoord *c, const char *name);

/*
 * The explicit I/O behind the belief: takes in what the agent has already
 * sent, without waiting, so a pushed lease.changed leader=false or
 * session.lost ends the belief now (the notifications are queued for
 * pgcoord_poll, not delivered). PGCOORD_E_IO when the connection failed
 * (the handle is then closed, which ends every belief; see
 * pgcoord_last_message), PGCOORD_E_PROTOCOL for a frame that is not
 * MessagePack-RPC, PGCOORD_E_CLOSED when it was closed already.
 */
pgcoord_err pgcoord_lease_refresh(pgcoord *c);

/*
 * The ttl the agent holds name with for this session, as the last
 * pgcoord_lease_acquire result said (the agent's default when ttl_ms was 0);
 * 0 before one, or after the lease was released or the session ended. The
 * agent renews every ttl/3 and its belief ends ttl/3 before the row can
 * expire: work that must stop before anyone else can lead has that long
 * after pgcoord_lease_is_leader turns false.
 */
int64_t pgcoord_lease_ttl_ms(const pgcoord *c, const char *name);

/* --- records and recovery (PROTOCOL.md, "Records and recovery") ---------- */

/*
 * A record is a unit of work the caller drives, named by (kind, key): each
 * 1..200 bytes. It belongs to the session that put it; the agent stamps the
 * owner from the connection, no call names one. Only the owner changes it,
 * and only while its session is live. When an owner session dies, any live
 * session's recovery adopts the record (and the permit its work holds),
 * which draws a new fencing token: the former owner's later writes get
 * PGCOORD_E_FENCED. Calls marked "owner" need an open session.
 */

/* A record as the agent returned it (opaque); read it with the
 * pgcoord_record_get_* accessors, free it with pgcoord_record_free. */
typedef struct pgcoord_record pgcoord_record;

/*
 * Owner. Creates record (kind, key) in state (1..64 bytes) owned by this
 * handle's session, with data (may be NULL; up to 64 KiB) and the permit
 * its work holds (may be NULL; a permit of this session that still counts).
 * A retry with the same content answers the record (*created false); any
 * other put of an existing record is PGCOORD_E_CONFLICT (PGCOORD_E_FENCED
 * when it was adopted away from this session). *created and *token may be
 * NULL; *token is the record's fencing token.
 */
pgcoord_err pgcoord_record_put(pgcoord *c, const char *kind, const char *key, const char *state,
			       const void *data, size_t data_len, const char *permit,
			       int timeout_ms, bool *created, int64_t *token);

/*
 * What a put or an update writes, for pgcoord_record_put_with and
 * pgcoord_record_update_with (prefer these to the long argument lists).
 * Start from PGCOORD_RECORD_OPTS_INIT (or pgcoord_record_opts_init): `size`
 * tells the library which fields this caller was built with, as for
 * pgcoord_claim_opts. Only read during the call.
 *
 *   state            put: required; update: NULL keeps it
 *   data, data_len   NULL: none (put) or unchanged (update); up to 64 KiB
 *   permit           put only: the permit the record's work holds (NULL: none)
 *   token            update only: > 0 also requires it to be the record's
 *                    current token; put: must be 0
 */
struct pgcoord_record_opts {
	size_t size; /* sizeof(struct pgcoord_record_opts) as the caller knew it */
	const char *state;
	const void *data;
	size_t data_len;
	const char *permit;
	int64_t token;
};

#define PGCOORD_RECORD_OPTS_INIT                                                                   \
	{                                                                                          \
		.size = sizeof(struct pgcoord_record_opts)                                         \
	}

/* Sets *opts to PGCOORD_RECORD_OPTS_INIT. */
void pgcoord_record_opts_init(struct pgcoord_record_opts *opts);

/* pgcoord_record_put with its writes in opts; PGCOORD_E_ARG also for opts
 * NULL, a size smaller than the first version's, or a token. */
pgcoord_err pgcoord_record_put_with(pgcoord *c, const char *kind, const char *key,
				    const struct pgcoord_record_opts *opts, int timeout_ms,
				    bool *created, int64_t *token);

/* pgcoord_record_update with its writes in opts; PGCOORD_E_ARG also for
 * opts NULL, a size smaller than the first version's, or a permit. */
pgcoord_err pgcoord_record_update_with(pgcoord *c, const char *kind, const char *key,
				       const struct pgcoord_record_opts *opts, int timeout_ms);

/*
 * Owner. Changes the state (NULL keeps it) and/or data (NULL keeps it; give
 * at least one). token > 0 also requires it to be the record's current
 * token. PGCOORD_E_FENCED: the record was adopted from this session (the
 * message says by whom and when) — stop its work. PGCOORD_E_CONFLICT: it
 * is settled. PGCOORD_E_SESSION_EXPIRED: this session is no longer live.
 */
pgcoord_err pgcoord_record_update(pgcoord *c, const char *kind, const char *key, const char *state,
				  const void *data, size_t data_len, int64_t token, int timeout_ms);

/* Owner. Ends the record in state (terminal: recovery never adopts it, and
 * nothing changes it again). Errors as for pgcoord_record_update. */
pgcoord_err pgcoord_record_settle(pgcoord *c, const char *kind, const char *key, const char *state,
				  int64_t token, int timeout_ms);

/* One record; PGCOORD_E_NOT_FOUND when there is none. On PGCOORD_OK *out
 * owns it. */
pgcoord_err pgcoord_record_get(pgcoord *c, const char *kind, const char *key, int timeout_ms,
			       pgcoord_record **out);

const char *pgcoord_record_get_kind(const pgcoord_record *r);
const char *pgcoord_record_get_key(const pgcoord_record *r);
const char *pgcoord_record_get_state(const pgcoord_record *r);
bool pgcoord_record_get_terminal(const pgcoord_record *r);
/* The data (*len its size), or NULL when the record has none. */
const void *pgcoord_record_get_data(const pgcoord_record *r, size_t *len);
/* The permit the record's work holds, or NULL. */
const char *pgcoord_record_get_permit(const pgcoord_record *r);
int64_t pgcoord_record_get_owner_session(const pgcoord_record *r);
/* Whether the owner session was live when the agent answered. */
bool pgcoord_record_get_owner_live(const pgcoord_record *r);
int64_t pgcoord_record_get_token(const pgcoord_record *r);
/* The dead session the record was last adopted from, or 0. */
int64_t pgcoord_record_get_adopted_from(const pgcoord_record *r);
/* Accepts NULL. */
void pgcoord_record_free(pgcoord_record *r);

/* pgcoord_record_list flags. */
#define PGCOORD_RECORDS_OPEN 0x1u	/* only records not settled */
#define PGCOORD_RECORDS_DEAD_OWNER 0x2u /* only records whose owner is not live */
#define PGCOORD_RECORDS_LIVE_OWNER 0x4u /* only records whose owner is live */

/* Records of kind (NULL: all) and owner session (0: any), filtered by
 * flags, ordered by kind and key: *result receives record.list's result map
 * {records: [...], truncated, now_at} (free with pgcoord_free). */
pgcoord_err pgcoord_record_list(pgcoord *c, const char *kind, int64_t owner, unsigned flags,
				int timeout_ms, void **result, size_t *result_len);

/* record.list as records (prefer it to the raw form above); read each with
 * the pgcoord_record_get_* accessors. */
struct pgcoord_record_list {
	size_t count;
	const pgcoord_record *const *records; /* ordered by kind and key */
	bool truncated;			      /* more matched than the agent's limit (1000) */
	int64_t now_at;
};

/* Filters as for pgcoord_record_list. On PGCOORD_OK *out owns the list and
 * its records: free it with pgcoord_record_list_free (NULL accepted), not
 * each record. */
pgcoord_err pgcoord_record_list_get(pgcoord *c, const char *kind, int64_t owner, unsigned flags,
				    int timeout_ms, struct pgcoord_record_list **out);
void pgcoord_record_list_free(struct pgcoord_record_list *l);

/* The outcome of a recovery (opaque); read it with pgcoord_recovery_*. */
typedef struct pgcoord_recovery pgcoord_recovery;

/* pgcoord_record_recover flag: only say what a recovery would adopt now;
 * changes nothing and needs no session. */
#define PGCOORD_RECOVER_DRY_RUN 0x1u

/*
 * Owner (unless PGCOORD_RECOVER_DRY_RUN). Adopts for this handle's session
 * up to limit (0: the agent's default, 1000) open records of the given
 * kinds (kinds NULL or nkinds 0: every kind) whose owner session is not
 * live by the database clock, with the permits their work holds (they stay
 * uncertain until resolved with pgcoord_permit_resolve). Records of live
 * owners are left alone, whatever the state of their clients or agents.
 * Safe to run on every replica at once: each record is adopted exactly once.
 *
 * When liveness cannot be read (the database is down, the query failed),
 * nothing is adopted and the call still returns PGCOORD_OK:
 * pgcoord_recovery_liveness_read() is false and _reason() says why — treat
 * it as "nothing recovered yet" and try again later. An error return means
 * the call was refused (PGCOORD_E_SESSION_EXPIRED: this session is not
 * live) or its outcome is unknown (PGCOORD_E_TIMEOUT, PGCOORD_E_CALL_TIMEOUT:
 * what it adopted, if it committed, belongs to this session — see
 * pgcoord_record_list with this session as owner; recovering again is safe).
 * On PGCOORD_OK *out owns the outcome.
 */
pgcoord_err pgcoord_record_recover(pgcoord *c, const char *const *kinds, size_t nkinds,
				   int32_t limit, unsigned flags, int timeout_ms,
				   pgcoord_recovery **out);

/*
 * What a recovery takes, for pgcoord_record_recover_with (prefer it to the
 * long argument list above). Start from PGCOORD_RECOVER_OPTS_INIT (or
 * pgcoord_recover_opts_init); `size` as for pgcoord_claim_opts.
 *
 *   kinds, nkinds   only these kinds (NULL / 0: every kind)
 *   limit           at most this many records (0: the agent's default)
 *   flags           PGCOORD_RECOVER_DRY_RUN
 */
struct pgcoord_recover_opts {
	size_t size; /* sizeof(struct pgcoord_recover_opts) as the caller knew it */
	const char *const *kinds;
	size_t nkinds;
	int32_t limit;
	unsigned flags;
};

#define PGCOORD_RECOVER_OPTS_INIT                                                                  \
	{                                                                                          \
		.size = sizeof(struct pgcoord_recover_opts)                                        \
	}

/* Sets *opts to PGCOORD_RECOVER_OPTS_INIT. */
void pgcoord_recover_opts_init(struct pgcoord_recover_opts *opts);

/* pgcoord_record_recover with its choices in opts; PGCOORD_E_ARG also for
 * opts NULL or a size smaller than the first version's. */
pgcoord_err pgcoord_record_recover_with(pgcoord *c, const struct pgcoord_recover_opts *opts,
					int timeout_ms, pgcoord_recovery **out);

bool pgcoord_recovery_liveness_read(const pgcoord_recovery *rv);
/* Why liveness could not be read, or NULL when it was. */
const char *pgcoord_recovery_reason(const pgcoord_recovery *rv);
/* How many records were adopted (with PGCOORD_RECOVER_DRY_RUN: would be). */
size_t pgcoord_recovery_count(const pgcoord_recovery *rv);
/* The i-th of them, as it is after the recovery (owned by rv; NULL past the
 * end). */
const pgcoord_record *pgcoord_recovery_record(const pgcoord_recovery *rv, size_t i);
/* Open records of those kinds left alone because their (other) owner is
 * live; -1 when liveness was not read. */
int64_t pgcoord_recovery_left_alone(const pgcoord_recovery *rv);
/* Open records of dead owners not taken by this call (past the limit, or
 * being taken by a concurrent recovery): recover again while > 0. -1 when
 * liveness was not read. */
int64_t pgcoord_recovery_remaining(const pgcoord_recovery *rv);
/* The agent's whole result map, MessagePack-encoded (owned by rv), for what
 * the accessors do not give (the permits and their states). */
const void *pgcoord_recovery_result(const pgcoord_recovery *rv, size_t *len);
/* Accepts NULL. */
void pgcoord_recovery_free(pgcoord_recovery *rv);

/* --- watches ------------------------------------------------------------
 *
 * A session may watch a quota, a permit or a kind of record. The agent
 * reads every watch once per watch_poll_ms and pushes, through the
 * notification callback, only what changed (the first read pushes the
 * current state): quota.changed {watch, key, exists, limit, in_flight,
 * held, uncertain, room, permits}, permit.changed {watch, id, exists, state,
 * phase, token, owner_session, …} and record.orphaned {watch, kind, key,
 * owner_session, owner_uid, …} (see PROTOCOL.md, "Watches"). Each needs a
 * session; PGCOORD_E_BUSY past the agent's max_watches_per_session.
 * Watching what the session watches already answers the same *watch_id.
 */

pgcoord_err pgcoord_quota_watch(pgcoord *c, const char *key, int timeout_ms, int64_t *watch_id);
pgcoord_err pgcoord_permit_watch(pgcoord *c, const char *id, int timeout_ms, int64_t *watch_id);
/* Open records of kind whose owner session is no longer live. */
pgcoord_err pgcoord_record_watch(pgcoord *c, const char *kind, int timeout_ms, int64_t *watch_id);
/* Ends one of the session's watches; *cancelled (may be NULL) is false when
 * watch_id was not one of them. */
pgcoord_err pgcoord_watch_cancel(pgcoord *c, int64_t watch_id, int timeout_ms, bool *cancelled);

#ifdef __cplusplus
}
#endif

#endif
