/*
 * db.h — asynchronous libpq on the agent's event loop.
 *
 * Two lanes of connections: REQUESTS (pool_size connections serving client
 * calls) and HEARTBEAT (one connection for heartbeats and lease renewals, so
 * liveness never queues behind traffic). Every query is one statement, sent
 * in libpq pipeline mode with a bound on its time in the database, so the
 * database itself stops a statement just before the agent would give up on
 * it. How a statement travels is the statement mode (statement_mode.h):
 * named, each connection prepares a statement's text once (up to
 * DB_PREPARED_MAX per connection) and keeps the bound as session settings;
 * named-pooled, the same statements but the bound set_config()'d local to
 * each transaction; unnamed (PgBouncer transaction pooling), each query is
 * an unnamed statement behind that local set_config(). The loop
 * never blocks on the database: connects are driven by PQconnectPoll,
 * results by PQconsumeInput/PQisBusy.
 */
#ifndef PGCOORD_AGENT_DB_H
#define PGCOORD_AGENT_DB_H

#include <event2/event.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "agent/log.h"
#include "agent/metrics.h"
#include "agent/replication.h"
#include "agent/sqlstate.h"
#include "agent/statement_mode.h"
#include "proto/codec.h"

/* Named statements one connection keeps (the agent has fewer texts than
 * this); texts past the cap run unnamed. */
#define DB_PREPARED_MAX 128

enum db_lane_id { DB_LANE_REQUESTS, DB_LANE_HEARTBEAT, DB_LANE__COUNT };

struct db_result {
	bool ok;		   /* the statement ran and returned tuples or OK */
	const PGresult *res;	   /* the result when ok (rows), or the error result */
	enum pgc_error_code error; /* when !ok: UNAVAILABLE, TIMEOUT or INTERNAL */
	const char *sqlstate;	   /* when !ok and the server answered; else NULL */
	const char *message;	   /* when !ok: one line for logs and clients */
	bool outcome_unknown;	   /* the statement may have committed (lost mid-flight) */
	/* the schema refused on purpose (SQLSTATE class PC): error and message
	 * are the answer for the client, and nothing changed */
	bool refusal;
};

/* Called exactly once per accepted query, from the event loop. */
typedef void (*db_done_fn)(const struct db_result *result, void *arg);

/* Told when the REQUESTS lane goes up (a connection is ready) or down. */
typedef void (*db_state_fn)(bool up, void *arg);

struct db_settings {
	const char *conninfo;
	int pool_size;
	int query_timeout_ms;
	int connect_timeout_ms;
	int reconnect_max_ms;
	/* fixed at start: not changed by db_update_timeouts */
	enum stmt_setting prepared_statements;
};

struct db;

struct db *db_create(struct event_base *base, const struct db_settings *settings,
		     struct logger *log, db_state_fn on_state, void *state_arg);
/* Fails queued and running queries with UNAVAILABLE, closes connections. Accepts NULL. */
void db_destroy(struct db *db);

/* Applies reloadable timeouts (query, connect, reconnect ceiling). */
void db_update_timeouts(struct db *db, const struct db_settings *settings);

/*
 * Queues one statement on a lane. Parameters are text (NULL = SQL NULL) and
 * are copied. Returns false, without calling done, when the lane has no
 * connection up (the caller answers `unavailable` at once: fail closed) or
 * its queue is full. The deadline (query_timeout_ms) covers queueing and
 * execution. The statement's server-side bound is what is left of it less
 * max(100 ms, 10 %): when that runs out the database rolls the statement
 * back and done gets TIMEOUT with outcome_unknown false, the connection
 * kept. Only if the database does not answer even then does the deadline
 * drop the connection (libpq cannot cancel without blocking) and done gets
 * TIMEOUT with outcome_unknown true.
 */
__attribute__((warn_unused_result)) bool db_query(struct db *db, enum db_lane_id lane,
						  const char *sql, int nparams,
						  const char *const *params, db_done_fn done,
						  void *arg);

/*
 * db_query for a statement that applies its server-side bound itself:
 * parameter bound_param (1-based; params[bound_param - 1] is ignored) is
 * set, when the statement is sent, to what is left of its deadline less
 * the margin, in ms, and no set_config() statement is sent before it in
 * the modes that send one per transaction. The heartbeat's statement, one
 * a second per agent, so a beat is one statement behind a pooler.
 */
__attribute__((warn_unused_result)) bool
db_query_bounding(struct db *db, enum db_lane_id lane, const char *sql, int nparams,
		  const char *const *params, int bound_param, db_done_fn done, void *arg);

/*
 * db_query for work done on a client's behalf: while it waits in the queue,
 * *abandoned turning true (its client hung up) drops it unsent, and done
 * gets UNAVAILABLE with outcome_unknown false. abandoned must stay valid
 * until done is called.
 */
__attribute__((warn_unused_result)) bool db_query_unless(struct db *db, enum db_lane_id lane,
							 const char *sql, int nparams,
							 const char *const *params, db_done_fn done,
							 void *arg, const bool *abandoned);

/*
 * Makes a statement's text and parameters only when a connection takes it
 * from the queue, so it can carry whatever was queued meanwhile (a group
 * of claims). *sql and the nparams strings of *params (NULL = SQL NULL)
 * are malloc'ed and become the lane's. Returns false when there is
 * nothing to send any more: done then gets UNAVAILABLE and nothing ran.
 */
typedef bool (*db_build_fn)(void *arg, char **sql, int *nparams, char ***params);

/*
 * db_query for a statement built late (db_build_fn). The deadline counts
 * from now, as for db_query: what joins the statement later shares it.
 */
__attribute__((warn_unused_result)) bool
db_query_built(struct db *db, enum db_lane_id lane, db_build_fn build, db_done_fn done, void *arg);

/* db_query_built whose deadline is within_ms from now (at most
 * query_timeout_ms): the rest of the time of work that already waited. */
__attribute__((warn_unused_result)) bool db_query_built_within(struct db *db, enum db_lane_id lane,
							       int within_ms, db_build_fn build,
							       db_done_fn done, void *arg);

bool db_lane_up(const struct db *db, enum db_lane_id lane);

/* libpq's reason (one line) the latest connection attempt failed or a
 * connection broke; "" when none has. Kept after recovery: read it while
 * a lane is down. */
const char *db_last_error(const struct db *db);

/* Counters for status and metrics. */
struct db_stats {
	unsigned long queries, failures, timeouts, reconnects;
	/* connections refused because the server was a standby */
	unsigned long standby_refusals;
	/* commits whose wait for the synchronous standby was cancelled */
	unsigned long sync_waits_cancelled;
	/* statements prepared (Parse of a named statement), statements run by
	 * name, and set_config() statements of the timeouts sent */
	unsigned long prepares, prepared_runs, bound_statements;
	/* queries sent again unnamed after their named statement went missing */
	unsigned long statements_resent;
	int connected[DB_LANE__COUNT];
	int queued[DB_LANE__COUNT];
	/* from queueing to the result (or failure), per lane */
	struct histogram latency[DB_LANE__COUNT];
};
void db_get_stats(const struct db *db, struct db_stats *out);

/* What the server of the latest checked connection said about replication
 * (checked false before the first connection). */
const struct replication_view *db_replication(const struct db *db);

/* The statement mode in use (with auto, what the connections have shown
 * so far), and whether a connection has seen a pooler in between. */
enum stmt_mode db_statement_mode(const struct db *db);
bool db_pooler_seen(const struct db *db);

#endif
