/*
 * session_order.h — per-session statement ordering. Statements of one
 * session's lease go to the database one at a time: the pool would let a
 * later one overtake an earlier one, so a hand-back sent meanwhile could
 * run before a renewal still in flight, which would then take the lease
 * back. Lease and session requests ask here before they send.
 */
#ifndef PGCOORD_AGENT_SESSION_ORDER_H
#define PGCOORD_AGENT_SESSION_ORDER_H

#include <stdbool.h>
#include <stdint.h>

struct agent;
struct request;

/*
 * True while a statement of a lease of session_id that was ended (released,
 * or its session ending) still runs; name NULL means any of its leases. A
 * hand-back sent meanwhile could run before it on another connection, and
 * that statement would then take the lease back.
 */
bool leases_busy(struct agent *ag, int64_t session_id, const char *name);

/* When leases_busy(): keeps req and runs its method again once that
 * statement returned, and returns true. False: go ahead now. */
bool leases_park_if_busy(struct agent *ag, int64_t session_id, const char *name,
			 struct request *req);

#endif
