/*
 * db_internal.h — what the db files share; only they include it, after
 * agent/db.h (whose types it uses: including db.h here would make the two
 * a circle for the include graph). The lanes, queue and public calls are
 * db.c's; the rest of one connection's work is split by role, each file
 * calling only those below it (the lanes are reached back through
 * db->lane_pump and db->lane_update_up):
 *
 *   db_conn.c        connecting, the timer, the socket's events
 *   db_server.c      what the server is, checked on every new connection
 *   db_pipeline.c    one query's pipeline: sending it, reading its results
 *   db_link.c        waiting, flushing, losing a connection, reconnect backoff
 *   db_statements.c  named statements and the bounds each mode sends
 *   db_query.c       a query's latency, failure and freeing
 */
#ifndef PGCOORD_AGENT_DB_INTERNAL_H
#define PGCOORD_AGENT_DB_INTERNAL_H

#ifndef PGCOORD_AGENT_DB_H
#error "include agent/db.h before agent/db_internal.h"
#endif

#include <event2/event.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#define DB_QUEUE_MAX 4096
#define DB_BACKOFF_START_MS 100

/* CONN_CHECKING: connected, reading what the server is (replication.h)
 * before any request may use it */
enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_CHECKING, CONN_IDLE, CONN_BUSY };

struct db_query {
	struct db_query *next;
	struct db_lane *lane;
	struct db_conn *running_on; /* NULL while queued */
	char *sql;
	int nparams;
	char **params;
	db_done_fn done;
	void *arg;
	const bool *abandoned; /* when true before it is sent, it is not sent */
	db_build_fn build;     /* makes sql and params when a connection takes it */
	struct event *deadline;
	struct timespec queued_at; /* for the latency histogram */
	struct timespec due;	   /* queued_at + query_timeout_ms */
	/* > 0: the statement applies its own server-side bound, given as this
	 * parameter (1-based, ms as text) when it is sent; no separate
	 * statement carries it (db_query_bounding) */
	int bound_param;
};

/* A statement text a connection has prepared, under the name
 * pgc_<hash of the text>_<generation>_<index of it in the connection's
 * table> (statement_name): behind a pooler that (wrongly) hands the Bind to
 * another server session, a name found there is the same text. */
struct prepared {
	char *sql;
	unsigned hash;
};

struct db_conn {
	struct db_lane *lane;
	PGconn *pg;
	enum conn_state state;
	struct event *io;
	struct event *timer; /* reconnect backoff, or connect timeout */
	int backoff_ms;
	bool failing; /* logged this outage already: later attempts log at debug */
	struct db_query *query;
	PGresult *result; /* the answer kept for the query: its result or first error */
	int phase;	  /* statements of the pipeline whose results are all read */
	int query_phase;  /* the query's own statement's place in the pipeline */
	bool rolled_back; /* the server reported an error before the Sync */
	/* the server said the running commit stopped waiting for the
	 * synchronous standby: committed here, maybe not there */
	bool sync_wait_cancelled;
	struct replication_view seen; /* filled by the check on connect */
	/* named modes: what this session has prepared and set.
	 * Forgotten with the session (db_conn_forget_session). */
	struct prepared prepared[DB_PREPARED_MAX];
	int nprepared;
	unsigned generation;  /* in the names: a forgotten table never reuses one */
	int preparing;	      /* the slot the running query prepares, or -1 */
	int prepare_phase;    /* the Parse's place in the pipeline */
	bool prepare_ok;      /* the server answered that Parse */
	bool sent_named;      /* the running query's statement went by name */
	int session_bound_ms; /* statement_timeout and lock_timeout of the session; 0 unset */
	int pending_bound_ms; /* the session bound the running query sets, kept if it commits */
};

struct db_lane {
	struct db *db;
	enum db_lane_id id;
	struct db_conn *conns;
	int nconns;
	struct db_query *head, *tail;
	int queued;
	bool up;
};

struct db {
	struct event_base *base;
	struct logger *log;
	char *conninfo;
	int query_timeout_ms, connect_timeout_ms, reconnect_max_ms;
	enum stmt_setting setting; /* prepared_statements */
	enum stmt_mode mode;	   /* what it has led to so far; only ever moves down */
	bool pooler_seen, pooler_logged, lost_logged;
	struct db_lane lanes[DB_LANE__COUNT];
	db_state_fn on_state;
	void *state_arg;
	struct db_stats stats;
	struct replication_view replication; /* from the latest checked connection */
	unsigned rng;
	char last_error[512]; /* why the latest connection failed or broke, one line */
	/* db.c's lane functions, for the connection files to call back */
	void (*lane_pump)(struct db_lane *lane);
	void (*lane_update_up)(struct db_lane *lane);
};

extern const char *const db_lane_names[];

/* db.c: the queue and the lanes */
void db_lane_update_up(struct db_lane *lane);
void db_lane_pump(struct db_lane *lane);

/* db_query.c: one query's bookkeeping */
struct timeval db_ms_to_tv(int ms);
void db_query_observe(struct db_query *q);
void db_query_free(struct db_query *q);
void db_query_fail(struct db_query *q, enum pgc_error_code code, bool unknown, const char *message);

/* db_conn.c: one connection's events */
void db_conn_timer_cb(evutil_socket_t fd, short what, void *arg);
void db_conn_io_cb(evutil_socket_t fd, short what, void *arg);

/* db_link.c: what every part of a connection's life calls */
void db_one_line(char *buf, size_t len, const char *msg);
/* waits with the callback the connection's event was created with */
void db_conn_wait(struct db_conn *c, short what);
void db_conn_schedule_reconnect(struct db_conn *c);
void db_conn_lost(struct db_conn *c, const char *why);
void db_conn_connect_failed(struct db_conn *c);
void db_conn_connect_refused(struct db_conn *c, const char *why);
void db_conn_flush(struct db_conn *c);

/* db_server.c: the check of a new connection's server */
void db_conn_notice(void *arg, const PGresult *res);
void db_conn_check_start(struct db_conn *c);
void db_conn_check_read(struct db_conn *c);

/* db_pipeline.c: running one query */
void db_conn_run(struct db_conn *c, struct db_query *q);
void db_conn_read(struct db_conn *c);

/* db_statements.c: named statements and bounds */
void db_conn_forget_session(struct db_conn *c);
bool db_conn_lost_its_statements(struct db_conn *c, const char *sqlstate);
int db_bound_ms(const struct db_query *q, int query_timeout_ms);
bool db_conn_send_prepared(struct db_conn *c, struct db_query *q, int bound);
bool db_conn_send_unnamed(struct db_conn *c, struct db_query *q, int bound);

#endif
