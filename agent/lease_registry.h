/*
 * lease_registry.h — the state the lease files share; only they include
 * it: the leases this agent's sessions campaign for or believe they hold,
 * the dropped ones whose statement still runs, and the watched names.
 *
 *   lease_table.c     finding, dropping, freeing; lease.changed's body
 *   session_order.c   one statement at a time per session's lease
 *   lease_watch.c     polls watched leases
 *   lease_campaign.c  acquire/renew loops, belief start and end
 *   leases.c          the lease.* methods
 *
 * Each calls only the ones listed above it (the include-graph test reads
 * the calls from the objects).
 */
#ifndef PGCOORD_AGENT_LEASE_REGISTRY_H
#define PGCOORD_AGENT_LEASE_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include <msgpack.h>

#include "agent/agent.h"
#include "agent/log.h"

struct db_result;
struct request;
struct reply_kind;

#define LEASE_NAME_MAX 200

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
	uint64_t renew_due;	    /* a leader's next renewal, CLOCK_MONOTONIC ms */
	bool attach;		    /* just won: the next beat attaches it to the agent's row */
	struct event *timer;	    /* next renewal or campaign attempt */
	struct event *belief_timer; /* belief deadline */
	struct request *pending;    /* a lease.acquire waiting for this attempt */
	void (*on_change)(struct agent *ag, bool leader); /* internal leases */
	/* a losing campaign looks again at least this often, to see a
	 * hand-back before the holder's expiry; 0: at the expiry only */
	int hand_back_poll_ms;
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
	uint32_t rng; /* campaign jitter */
};

struct change_note {
	const struct lease *l;
	bool leader;
	const char *reason;
	int64_t holder_session;
	const char *holder_replica;
	bool renewed;
};

#define LEASE_COLUMNS                                                                              \
	"SELECT name, epoch, holder_session, holder_replica, "                                     \
	"greatest(pgcoord.ms(expires_at) - pgcoord.ms(now()), 0), ttl_ms, "                        \
	"coalesce(pgcoord.ms(acquired_at), 0), coalesce(pgcoord.ms(renewed_at), 0), "              \
	"holder_session IS NOT NULL AND expires_at > now() "                                       \
	"FROM pgcoord.leases "

/* The columns of LEASE_COLUMNS, for reading them by name. */
enum {
	LC_NAME,
	LC_EPOCH,
	LC_HOLDER_SESSION,
	LC_HOLDER_REPLICA,
	LC_EXPIRES_IN_MS,
	LC_TTL_MS,
	LC_ACQUIRED_AT,
	LC_RENEWED_AT,
	LC_HELD,
};

/* lease_table.c */
/* A lease's holder as the wire spells it: {session, replica_id}, or nil
 * when session is 0 (nobody holds it). */
struct lease_holder {
	int64_t session;
	const char *replica_id;
};
extern const struct reply_kind lease_holder_reply;
struct lease_registry *lease_reg(struct agent *ag);
struct lease *lease_find(struct agent *ag, const char *name, int64_t session_id);
void lease_free(struct lease *l);
void lease_drop(struct lease *l);
/* Pushes lease.changed (or, for a renewal, lease.renewed) to c. */
struct conn;
void lease_tell(struct conn *c, const struct change_note *n);

/* lease_campaign.c */
void lease_end_belief(struct lease *l, enum log_level level, const char *reason,
		      int64_t holder_session, const char *holder_replica);
void lease_attempt(struct lease *l);
void lease_reply_acquire(struct request *req, struct lease *l, const struct db_result *r);
struct lease *lease_new(struct agent *ag, const char *name, int64_t session_id, int ttl_ms,
			int renew_ms);

/* session_order.c */
void lease_settled(struct lease *l);
void session_order_rerun_cb(evutil_socket_t fd, short what, void *arg);

/* lease_watch.c */
void lease_watch_poll_cb(evutil_socket_t fd, short what, void *arg);

#endif
