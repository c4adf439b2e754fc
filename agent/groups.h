/*
 * groups.h — group admission: calls of one kind (permit.claim,
 * permit.release) that wait in the agent at the same moment go to the
 * database as ONE statement, so they share one transaction and one commit
 * flush.
 *
 * A group is whatever is queued when a pool connection takes it: the first
 * member queues a statement whose text is made only then (db_query_built),
 * and every member that arrives before that joins it. Nobody waits for a
 * group to fill. The statement takes one array per argument, element i for
 * member i (1-based, arrival order), and answers rows that begin with
 * (member, sqlstate, message): sqlstate NULL and the member's own columns
 * after, or the error that member's part raised (its part alone rolled
 * back). A group of one runs kind->lone_sql instead, when the kind has one:
 * the member's own arguments (no arrays) and the same columns, without the
 * group function's frame around the one call, whose error is then the
 * statement's. Replies leave after
 * the commit, at the Sync. A group that fails as a whole (connection lost,
 * deadline) answers every member with that failure, as one statement of
 * its own would have been answered. The group's deadline is its first
 * member's, the earliest.
 *
 * A kind may judge only the common calls and leave the others (err_state
 * 'PCSLW', nothing written) to a slow group of a general kind with the same
 * arguments (group_create), which takes them as new calls of its own:
 * claims and releases each go by one SQL statement first and by the group
 * functions after (0022_claim_release_fast.sql).
 *
 * On a hot key, parallel statements only queue on its row lock in the
 * database, each with its own commit flush. So a member that finds
 * group_statements_max statements of its kind in flight (queued or
 * running; 0 = never hold) AND names a quota key that one of the sent
 * ones names waits in the agent and rides the next statement, queued as
 * soon as one ends. A member that shares no key with what is in flight
 * goes at once, whatever the bound. A claim names its quotas; a release
 * names those its permit was admitted with, remembered by the release
 * group (a bounded map; an id it forgot names none). A member waits only
 * for statements already in flight, never for a group to fill, and times
 * out at its own deadline as in the database queue.
 *
 * On spread keys the same holds for the commits: with group_kind_statements_max
 * statements of a kind in flight (0 = no such bound) and none queued, any
 * new member of that kind waits in the agent and rides the next statement,
 * queued as soon as one ends, so groups grow with load and the commits do
 * not. The bound adapts to load: below it, a new member also waits for
 * the statement in flight when the recent statements of its kind carried
 * group_kind_hold_members members each on average (load that fills groups
 * this large gains more from a larger group than from another commit
 * beside it), and goes at once beside it under lighter load. A member that finds nothing of its
 * kind in flight goes at once.
 */
#ifndef PGCOORD_AGENT_GROUPS_H
#define PGCOORD_AGENT_GROUPS_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "agent/db.h"

struct agent;
struct request;
struct evbuffer;

#define GROUP_MAX_ARGS 16

struct group_kind {
	const char *name; /* "claim": the metrics' label */
	const char *sql;  /* $1..$nargs are arrays, one element per member */
	/* A group of one, or NULL: $1..$nargs are the member's own
	 * arguments, not arrays; the same columns, with no group function
	 * around the lone call. */
	const char *lone_sql;
	int nargs;
	/* Answers one member from row `row` of res, its own columns from
	 * `col` on. ctx is the handler's request context (req_ctx_alloc):
	 * the request frees it when it ends. */
	void (*answer)(struct request *req, void *ctx, const PGresult *res, int row, int col);
	/* Answers one member whose part, or whole group, failed. */
	void (*fail)(struct request *req, void *ctx, const struct db_result *r);
};

struct group;

/*
 * slow (or NULL) takes the members whose row answers err_state 'PCSLW':
 * kind judged only the common members and wrote nothing of the others,
 * and slow's kind, with the same arguments, judges them (a fast path in
 * front of a general one). A statement of kind that fails as a whole on
 * a unique violation, a serialization failure or a deadlock hands every
 * member to slow too.
 */
struct group *group_create(struct agent *ag, const struct group_kind *kind, struct group *slow);
/* After db_destroy (which answers every member still waiting), a fast
 * group before its slow one. Accepts NULL. */
void group_destroy(struct group *g);

/* The quota keys a member names, as hashes: two keys whose hashes collide
 * only make a call wait that need not have. */
#define GROUP_MAX_KEYS 32
struct group_keys {
	size_t n;
	uint64_t hash[GROUP_MAX_KEYS];
};
uint64_t group_key_hash(const char *s, size_t len);
void group_keys_add(struct group_keys *k, const char *key, size_t len);

/*
 * Adds req to the group being formed, with its kind->nargs arguments as
 * text (copied; NULL = SQL NULL), the quota keys it names (NULL = none)
 * and ctx for its answer. When the database is down, answers `unavailable`
 * through kind->fail at once.
 */
void group_add(struct group *g, struct request *req, void *ctx, const char *const *args,
	       const struct group_keys *keys);

/* The keys of permit `id`, admitted by this agent, for its release;
 * group_recall_keys gives them once (false and none when forgotten). */
void group_remember_keys(struct group *g, const char *id, const struct group_keys *keys);
bool group_recall_keys(struct group *g, const char *id, struct group_keys *out);

/* Groups sent and members they carried, for /metrics; statements in
 * flight now and at most, and members that waited for one to end. */
struct group_stats {
	uint64_t groups, members, largest;
	uint64_t in_flight, in_flight_peak, held;
};
void group_get_stats(const struct group *g, struct group_stats *out);
const char *group_name(const struct group *g);

#endif
