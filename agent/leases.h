/*
 * leases.h — leadership leases held by this agent's sessions (guarantee 7).
 *
 * The agent believes a session leads only until
 *   send time of its last successful renewal + ttl − renew interval
 * on CLOCK_MONOTONIC. The row in the database expires no earlier than
 * send time + ttl, so belief always ends before anyone else can acquire.
 * A renewal whose answer never came is never assumed to have succeeded.
 */
#ifndef PGCOORD_AGENT_LEASES_H
#define PGCOORD_AGENT_LEASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/log.h"

struct agent;
struct lease;

#define LEASE_RESERVED_PREFIX "pgcoord."

/* Campaign for `name` on behalf of an internal session (the janitor's),
 * forever. on_change is told when belief starts or ends. */
__attribute__((warn_unused_result)) bool
leases_campaign_internal(struct agent *ag, const char *name, int64_t session_id, int ttl_ms,
			 void (*on_change)(struct agent *ag, bool leader));

/* True while the agent believes session_id leads name. */
bool leases_believes(struct agent *ag, const char *name, int64_t session_id);

/* The session is ending: every belief it holds ends now (clients are told
 * lease.changed leader=false) and its campaigns and watches stop. The
 * database hand-back is done by whoever ends the session. level: how the
 * ends are logged, info for a close the client asked for. */
void leases_session_ending(struct agent *ag, int64_t session_id, const char *reason,
			   enum log_level level);

/* Shutdown: every belief ends now, before the database hand-back. */
void leases_end_all(struct agent *ag, const char *reason);

/* Polls watched leases; started at registration. */
__attribute__((warn_unused_result)) bool leases_start(struct agent *ag);
void leases_finish(struct agent *ag);

/*
 * The renewals a heartbeat carries in its statement (agent_beat): the held
 * leases whose renewal falls due before the next beat. Each is in flight
 * from leases_beat_take until leases_beat_done, like a renewal statement
 * of its own; one the beat did not renew goes to lease_acquire at once.
 */
struct lease_beat {
	struct lease **leases;
	size_t n;
	/* agent_beat's lease arguments, as Postgres array literals */
	char *names, *sessions, *epochs, *ttls;
};

/* Fills b (empty when no renewal is due); false when out of memory, with
 * b empty. beat_ms: the heartbeat interval. */
__attribute__((warn_unused_result)) bool leases_beat_take(struct agent *ag, uint64_t now_ms,
							  int beat_ms, struct lease_beat *b);

/* The beat sent at sent_ms was answered: renewed[i] for b's i-th lease,
 * renewed NULL when the beat failed (its renewals prove nothing). Empties
 * b. */
void leases_beat_done(struct agent *ag, struct lease_beat *b, uint64_t sent_ms,
		      const bool *renewed);

/* Counts for agent.status. */
int leases_held_count(const struct agent *ag);

#endif
