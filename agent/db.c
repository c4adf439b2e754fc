/*
 * db.c — asynchronous libpq connection lanes; see db.h.
 */
#include "agent/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
	 * Forgotten with the session (conn_forget_session). */
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
};

static const char *const lane_names[] = {"requests", "heartbeat"};

static void conn_io_cb(evutil_socket_t fd, short what, void *arg);
static void conn_start_connect(struct db_conn *c);
static void lane_pump(struct db_lane *lane);
static void conn_connect_failed(struct db_conn *c);
static void conn_connect_refused(struct db_conn *c, const char *why);
static void conn_run(struct db_conn *c, struct db_query *q);

static struct timeval ms_to_tv(int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	return tv;
}

/* Single-line message from libpq, which likes "\n\t" and trailing newlines. */
static void one_line(char *buf, size_t len, const char *msg)
{
	log_one_line(buf, len, msg && msg[0] ? msg : "unknown error");
}

/* Records how long q took, from db_query() to now, in its lane's histogram. */
static void query_observe(struct db_query *q)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double s = (double)(now.tv_sec - q->queued_at.tv_sec) +
		   (double)(now.tv_nsec - q->queued_at.tv_nsec) / 1e9;
	histogram_observe(&q->lane->db->stats.latency[q->lane->id], s);
}

static void query_free(struct db_query *q)
{
	if (!q)
		return;
	if (q->deadline)
		event_free(q->deadline);
	for (int i = 0; i < q->nparams; i++)
		free(q->params[i]);
	free(q->params);
	free(q->sql);
	free(q);
}

static void query_fail(struct db_query *q, enum pgc_error_code code, bool unknown,
		       const char *message)
{
	struct db_result r = {0};
	r.ok = false;
	r.error = code;
	r.message = message;
	r.outcome_unknown = unknown;
	q->lane->db->stats.failures++;
	if (code == PGC_E_TIMEOUT)
		q->lane->db->stats.timeouts++;
	query_observe(q);
	q->done(&r, q->arg);
	query_free(q);
}

static void queue_remove(struct db_lane *lane, struct db_query *q)
{
	struct db_query **pp = &lane->head, *prev = NULL;
	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		if (*pp == q) {
			*pp = q->next;
			if (lane->tail == q)
				lane->tail = prev;
			lane->queued--;
			q->next = NULL;
			return;
		}
	}
}

static struct db_query *queue_pop(struct db_lane *lane)
{
	struct db_query *q = lane->head;
	if (q) {
		lane->head = q->next;
		if (!lane->head)
			lane->tail = NULL;
		lane->queued--;
		q->next = NULL;
	}
	return q;
}

static void lane_update_up(struct db_lane *lane)
{
	bool up = false;
	for (int i = 0; i < lane->nconns; i++)
		up |= lane->conns[i].state == CONN_IDLE || lane->conns[i].state == CONN_BUSY;
	if (up == lane->up)
		return;
	lane->up = up;
	log_write(lane->db->log, up ? LOG_LEVEL_INFO : LOG_LEVEL_WARN, "db", NULL,
		  "%s connections %s", lane_names[lane->id], up ? "up" : "down");
	if (!up) {
		/* fail closed: nothing waits for a database that is gone */
		struct db_query *q;
		while ((q = queue_pop(lane)) != NULL)
			query_fail(q, PGC_E_UNAVAILABLE, false,
				   "the database connection was lost before the request ran");
	}
	if (lane->id == DB_LANE_REQUESTS && lane->db->on_state)
		lane->db->on_state(up, lane->db->state_arg);
}

/*
 * Waits for what on the connection's socket. The event persists, so a wait
 * that is already armed for the same socket and events is left alone:
 * re-arming it would cost two epoll_ctl calls, several times per query.
 */
static void conn_wait(struct db_conn *c, short what)
{
	int fd = PQsocket(c->pg);

	what |= EV_PERSIST;
	if (event_pending(c->io, EV_READ | EV_WRITE, NULL) && event_get_fd(c->io) == fd &&
	    event_get_events(c->io) == what)
		return;
	event_del(c->io);
	event_assign(c->io, c->lane->db->base, fd, what, conn_io_cb, c);
	event_add(c->io, NULL);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct db_conn *c = arg;
	(void)fd;
	(void)what;
	if (c->state == CONN_DOWN) {
		conn_start_connect(c);
	} else if (c->state == CONN_CONNECTING || c->state == CONN_CHECKING) {
		log_warn(c->lane->db->log, "db", "connection attempt timed out after %d ms",
			 c->lane->db->connect_timeout_ms);
		conn_connect_failed(c);
	}
}

/* Schedules the next connection attempt with exponential backoff and ±20%
 * jitter, so a fleet does not reconnect in lockstep after an outage. */
static void conn_schedule_reconnect(struct db_conn *c)
{
	struct db *db = c->lane->db;
	int delay = c->backoff_ms;
	db->rng = db->rng * 1103515245u + 12345u;
	delay += (int)((long)delay * (long)((db->rng >> 16) % 41) / 100) - delay / 5;
	c->backoff_ms =
	    c->backoff_ms * 2 > db->reconnect_max_ms ? db->reconnect_max_ms : c->backoff_ms * 2;
	c->state = CONN_DOWN;
	struct timeval tv = ms_to_tv(delay < 0 ? 0 : delay);
	evtimer_add(c->timer, &tv);
}

/* The connection broke: whatever ran on it may or may not have committed. */
static void conn_lost(struct db_conn *c, const char *why)
{
	struct db *db = c->lane->db;
	struct db_query *q = c->query;
	char msg[512], answer[512] = "";
	enum pgc_error_code code = PGC_E_UNAVAILABLE;

	one_line(msg, sizeof(msg), why);
	snprintf(db->last_error, sizeof(db->last_error), "%s", msg);
	log_warn(db->log, "db", "%s connection lost: %s", lane_names[c->lane->id], msg);
	/* An error the server reported for the bounds or the statement means
	 * its transaction rolled back (the commit comes only at the Sync), as
	 * when a backend is terminated mid-statement: that outcome is known.
	 * Only a loss after the statement succeeded leaves it unknown. */
	if (q && c->rolled_back && c->result && !c->sync_wait_cancelled) {
		const char *sqlstate = PQresultErrorField(c->result, PG_DIAG_SQLSTATE);
		code = db_error_for_sqlstate(sqlstate);
		one_line(answer, sizeof(answer),
			 PQresultErrorField(c->result, PG_DIAG_MESSAGE_PRIMARY));
	}
	event_del(c->io);
	if (c->result) {
		PQclear(c->result);
		c->result = NULL;
	}
	PQfinish(c->pg);
	c->pg = NULL;
	c->query = NULL;
	c->state = CONN_DOWN;
	c->backoff_ms = DB_BACKOFF_START_MS;
	db->stats.reconnects++;
	conn_schedule_reconnect(c);
	lane_update_up(c->lane);
	if (q) {
		q->running_on = NULL;
		if (answer[0])
			query_fail(q, code == PGC_E_INTERNAL ? PGC_E_UNAVAILABLE : code, false,
				   answer);
		else
			query_fail(q, PGC_E_UNAVAILABLE, true,
				   "the database connection was lost while the request ran; its "
				   "outcome is unknown, retry with the same ids");
	}
}

static void conn_connect_failed(struct db_conn *c)
{
	conn_connect_refused(c, c->pg ? PQerrorMessage(c->pg) : "out of memory");
}

/* The attempt failed, or reached a server the agent must not use: drop it
 * and try again with backoff. */
static void conn_connect_refused(struct db_conn *c, const char *why)
{
	struct db *db = c->lane->db;
	char msg[512];

	one_line(msg, sizeof(msg), why);
	snprintf(db->last_error, sizeof(db->last_error), "%s", msg);
	log_write(db->log, c->failing ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN, "db", NULL,
		  "cannot connect %s connection: %s (retrying with backoff)",
		  lane_names[c->lane->id], msg);
	c->failing = true;
	event_del(c->io);
	evtimer_del(c->timer);
	if (c->result) {
		PQclear(c->result);
		c->result = NULL;
	}
	PQfinish(c->pg);
	c->pg = NULL;
	c->state = CONN_DOWN;
	conn_schedule_reconnect(c);
}

/*
 * PostgreSQL warns when a commit stops waiting for the synchronous standby
 * (a cancel, a statement timeout, a terminated backend): the transaction
 * is committed on this server but maybe on no standby, so a failover could
 * undo it. The query's answer must then not be an acknowledgement.
 */
static void conn_notice(void *arg, const PGresult *res)
{
	struct db_conn *c = arg;
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	if (!c->query || !replication_notice_is_cancelled_wait(msg))
		return;
	c->sync_wait_cancelled = true;
	c->lane->db->stats.sync_waits_cancelled++;
	log_warn(c->lane->db->log, "db",
		 "a commit stopped waiting for the synchronous standby (%s): it is not "
		 "acknowledged to the client, who is told to retry",
		 msg);
}

/*
 * What the server is, read once on every new connection before any request
 * runs on it, in the same pipeline mode as requests. A standby is refused
 * (never used for decisions, even if the conninfo lacks
 * target_session_attrs=read-write or a pooler hides which server it is).
 * pg_stat_replication hides sync_state from roles without pg_read_all_stats:
 * then the attached standbys are unknown.
 */
static void conn_check_start(struct db_conn *c)
{
	static const char check_sql[] =
	    "SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'), "
	    "current_setting('synchronous_commit'), "
	    "(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')), "
	    "(SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL), "
	    "pg_backend_pid()";

	c->state = CONN_CHECKING;
	c->phase = 0;
	c->result = NULL;
	if (!PQsendQueryParams(c->pg, check_sql, 0, NULL, NULL, NULL, NULL, 0) ||
	    !PQpipelineSync(c->pg)) {
		conn_connect_failed(c);
		return;
	}
	int r = PQflush(c->pg);
	if (r < 0)
		conn_connect_failed(c);
	else
		conn_wait(c, r > 0 ? EV_READ | EV_WRITE : EV_READ);
}

/* The check's answer is in: refuse a standby, note what a primary says,
 * and open the connection to requests. */
static void conn_check_done(struct db_conn *c)
{
	struct db *db = c->lane->db;
	PGresult *res = c->result;
	struct replication_view *v = &c->seen;
	char line[512];

	c->result = NULL;
	if (!res || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
	    PQnfields(res) != 6) {
		snprintf(line, sizeof(line), "cannot read what the server is: %s",
			 res ? PQresultErrorMessage(res) : "no answer");
		PQclear(res);
		conn_connect_refused(c, line);
		return;
	}
	memset(v, 0, sizeof(*v));
	v->checked = true;
	snprintf(v->server, sizeof(v->server), "%s:%s", PQhost(c->pg), PQport(c->pg));
	v->in_recovery = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	snprintf(v->standby_names, sizeof(v->standby_names), "%s", PQgetvalue(res, 0, 1));
	snprintf(v->synchronous_commit, sizeof(v->synchronous_commit), "%s", PQgetvalue(res, 0, 2));
	long sync = atol(PQgetvalue(res, 0, 3)), hidden = atol(PQgetvalue(res, 0, 4));
	v->sync_standbys = sync == 0 && hidden > 0 ? -1 : (int)sync;
	/* A pooler gives its client a BackendKeyData of its own: the server
	 * session the check ran on is not the connection's, and what a
	 * session keeps (settings, named statements) may go to other clients
	 * or be gone by the next transaction. */
	int server_pid = atoi(PQgetvalue(res, 0, 5));
	PQclear(res);
	if (server_pid != PQbackendPID(c->pg)) {
		db->pooler_seen = true;
		db->mode = stmt_mode_after_pooler(db->setting, db->mode);
		stmt_log_pooler(db->log, &db->pooler_logged, db->setting, db->mode, server_pid,
				PQbackendPID(c->pg));
	}
	evtimer_del(c->timer);
	if (v->in_recovery) {
		db->stats.standby_refusals++;
		snprintf(line, sizeof(line),
			 "%s is a standby (in recovery, read-only): not used for decisions",
			 v->server);
		conn_connect_refused(c, line);
		return;
	}
	if (replication_changed(&db->replication, v)) {
		db->replication = *v;
		replication_describe(v, line, sizeof(line));
		log_write(db->log, replication_failover_safe(v) ? LOG_LEVEL_INFO : LOG_LEVEL_WARN,
			  "db", NULL, "replication: %s", line);
	}
	if (c->failing)
		log_info(db->log, "db", "%s connection re-established", lane_names[c->lane->id]);
	c->failing = false;
	c->backoff_ms = DB_BACKOFF_START_MS;
	c->state = CONN_IDLE;
	conn_wait(c, EV_READ);
	lane_update_up(c->lane);
	lane_pump(c->lane);
}

/* Reads the check's results, as conn_read does a query's. */
static void conn_check_read(struct db_conn *c)
{
	if (!PQconsumeInput(c->pg) || (PQflush(c->pg) < 0)) {
		conn_connect_failed(c);
		return;
	}
	while (!PQisBusy(c->pg)) {
		PGresult *res = PQgetResult(c->pg);
		if (!res) {
			if (PQstatus(c->pg) == CONNECTION_BAD) {
				conn_connect_failed(c);
				return;
			}
			continue;
		}
		ExecStatusType st = PQresultStatus(res);
		if (st == PGRES_PIPELINE_SYNC) {
			PQclear(res);
			conn_check_done(c);
			return;
		}
		if (!c->result ||
		    (st != PGRES_TUPLES_OK && PQresultStatus(c->result) == PGRES_TUPLES_OK)) {
			PQclear(c->result);
			c->result = res;
		} else {
			PQclear(res);
		}
	}
	conn_wait(c, EV_READ);
}

static void conn_connect_step(struct db_conn *c)
{
	switch (PQconnectPoll(c->pg)) {
	case PGRES_POLLING_READING:
		conn_wait(c, EV_READ);
		return;
	case PGRES_POLLING_WRITING:
		conn_wait(c, EV_WRITE);
		return;
	case PGRES_POLLING_OK:
		if (PQsetnonblocking(c->pg, 1) != 0 || !PQenterPipelineMode(c->pg)) {
			conn_connect_failed(c);
			return;
		}
		PQsetNoticeReceiver(c->pg, conn_notice, c);
		/* the connect timer keeps running: it bounds the check too */
		conn_check_start(c);
		return;
	default:
		conn_connect_failed(c);
		return;
	}
}

/* A new session has nothing prepared and no timeouts set. */
static void conn_forget_session(struct db_conn *c)
{
	for (int i = 0; i < c->nprepared; i++)
		free(c->prepared[i].sql);
	c->nprepared = 0;
	c->generation++;
	c->preparing = -1;
	c->session_bound_ms = 0;
	c->pending_bound_ms = 0;
}

static void conn_start_connect(struct db_conn *c)
{
	struct db *db = c->lane->db;

	conn_forget_session(c);
	c->pg = PQconnectStart(db->conninfo);
	if (!c->pg || PQstatus(c->pg) == CONNECTION_BAD) {
		conn_connect_failed(c);
		return;
	}
	c->state = CONN_CONNECTING;
	struct timeval tv = ms_to_tv(db->connect_timeout_ms);
	evtimer_add(c->timer, &tv);
	/* libpq: start as if PQconnectPoll had asked to write */
	conn_wait(c, EV_WRITE);
}

/*
 * 26000 (no such prepared statement) or 42P05 (already exists) on a named
 * statement means the server session is not the one the agent prepared on:
 * a transaction pooler hands each transaction to any server connection.
 * The table is forgotten (a new generation of names), so a session that is
 * really this one's recovers. With auto the db goes unnamed for good and
 * the caller sends the query again: its pipeline was one implicit
 * transaction that ended at the failed Parse or Bind, so nothing of it ran.
 * With on the log says what to set.
 */
static bool conn_lost_its_statements(struct db_conn *c, const char *sqlstate)
{
	struct db *db = c->lane->db;

	if (!c->sent_named || !stmt_sqlstate_lost_statement(sqlstate))
		return false;
	stmt_log_lost(db->log, &db->lost_logged, db->setting, sqlstate);
	db->mode = stmt_mode_after_lost(db->setting, db->mode);
	conn_forget_session(c);
	return true;
}

static void conn_finish_query(struct db_conn *c)
{
	struct db_query *q = c->query;
	PGresult *res = c->result;
	struct db_result r = {0};
	char msg[512];

	c->query = NULL;
	c->result = NULL;
	q->running_on = NULL;
	c->state = CONN_IDLE;
	conn_wait(c, EV_READ);

	ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
	bool resend = false;
	bool committed = st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK;
	if (c->preparing >= 0 && !c->prepare_ok) {
		/* its Parse never ran (an earlier error) or failed: not prepared */
		free(c->prepared[c->preparing].sql);
		c->nprepared--;
	}
	c->preparing = -1;
	/* a session-level set_config() rolls back with its transaction */
	if (committed && c->pending_bound_ms)
		c->session_bound_ms = c->pending_bound_ms;
	c->pending_bound_ms = 0;
	r.res = res;
	if (c->sync_wait_cancelled) {
		/* committed here, perhaps not on the standby a failover would
		 * promote: not an acknowledgement. A retry with the same ids
		 * commits a write again (the session row lock of permit_claim,
		 * record_put, lease_acquire), which waits for the standby. */
		r.ok = false;
		r.error = PGC_E_UNAVAILABLE;
		r.outcome_unknown = true;
		r.message = "the commit was not confirmed by the synchronous standby (its wait was "
			    "cancelled) and could be lost on a failover; retry with the same ids";
		c->lane->db->stats.failures++;
	} else if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
		r.ok = true;
	} else {
		r.sqlstate = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
		one_line(msg, sizeof(msg),
			 res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : "no result");
		r.message = msg;
		r.error = db_error_for_sqlstate(r.sqlstate);
		r.refusal = db_sqlstate_is_refusal(r.sqlstate);
		if (conn_lost_its_statements(c, r.sqlstate)) {
			/* nothing ran past the failed Parse or Bind: retryable,
			 * and with auto sent again unnamed, unseen by the caller */
			r.error = PGC_E_UNAVAILABLE;
			resend = c->lane->db->mode == STMT_MODE_UNNAMED &&
				 !(q->abandoned && *q->abandoned);
		} else if (r.error == PGC_E_TIMEOUT) {
			/* the server's words, e.g. "canceling statement due to
			 * statement timeout", as they were */
			char why[sizeof(msg)];
			memcpy(why, msg, sizeof(why));
			snprintf(msg, sizeof(msg),
				 "the statement ran out of its time in the database (%.200s; just "
				 "under query_timeout_ms) and was rolled back: nothing changed, "
				 "retry",
				 why);
		}
		/* an error reply means the statement's transaction rolled back */
		r.outcome_unknown = false;
		/* a refusal is the schema answering, not the database failing */
		if (!r.refusal && !resend)
			c->lane->db->stats.failures++;
		if (r.error == PGC_E_INTERNAL)
			log_error(c->lane->db->log, "db", "statement failed: %s (SQLSTATE %s)", msg,
				  r.sqlstate ? r.sqlstate : "none");
	}
	if (resend) {
		/* the same text and parameters (a built group is not built
		 * again), under the same deadline, on this connection */
		PQclear(res);
		c->lane->db->stats.statements_resent++;
		conn_run(c, q);
		return;
	}
	query_observe(q);
	q->done(&r, q->arg);
	PQclear(res);
	query_free(q);
	lane_pump(c->lane);
}

/*
 * A query is a pipeline (conn_run): the bounds and the Parse when it sends
 * them, the statement, the Sync. libpq hands back each statement's results followed by a NULL,
 * then PGRES_PIPELINE_SYNC once the implicit transaction has ended. The
 * answer is kept from the first error, else from the statement's first
 * result, and given only at the Sync: an error committing at the Sync must
 * still turn an OK into a failure.
 */
static void conn_read(struct db_conn *c)
{
	while (!PQisBusy(c->pg)) {
		PGresult *res = PQgetResult(c->pg);
		if (!res) {
			c->phase++; /* the end of one statement's results */
			continue;
		}
		ExecStatusType st = PQresultStatus(res);
		if (st == PGRES_PIPELINE_SYNC) {
			PQclear(res);
			conn_finish_query(c);
			return;
		}
		bool error = st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE ||
			     st == PGRES_NONFATAL_ERROR;
		bool kept_error = c->result && PQresultStatus(c->result) != PGRES_TUPLES_OK &&
				  PQresultStatus(c->result) != PGRES_COMMAND_OK;
		if (error && !PQresultErrorField(res, PG_DIAG_SQLSTATE) &&
		    PQstatus(c->pg) == CONNECTION_BAD) {
			/* libpq's own report of a broken connection: the commit
			 * may have been under way */
			PQclear(res);
			conn_lost(c, PQerrorMessage(c->pg));
			return;
		}
		if (!error && c->preparing >= 0 && c->phase == c->prepare_phase)
			c->prepare_ok = st == PGRES_COMMAND_OK;
		if (error && !kept_error) {
			PQclear(c->result);
			c->result = res;
			c->rolled_back = PQresultErrorField(res, PG_DIAG_SQLSTATE) != NULL;
		} else if (!error && st != PGRES_PIPELINE_ABORTED && c->phase == c->query_phase &&
			   !c->result) {
			c->result = res;
		} else {
			PQclear(res);
		}
	}
	conn_wait(c, EV_READ);
}

static void conn_flush(struct db_conn *c)
{
	int r = PQflush(c->pg);
	if (r < 0)
		conn_lost(c, PQerrorMessage(c->pg));
	else if (r > 0)
		conn_wait(c, EV_READ | EV_WRITE);
	else
		conn_wait(c, EV_READ);
}

static void conn_io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct db_conn *c = arg;
	(void)fd;

	switch (c->state) {
	case CONN_CONNECTING:
		conn_connect_step(c);
		break;
	case CONN_CHECKING:
		conn_check_read(c);
		break;
	case CONN_BUSY:
		if (what & EV_READ) {
			if (!PQconsumeInput(c->pg)) {
				conn_lost(c, PQerrorMessage(c->pg));
				return;
			}
		}
		if (PQflush(c->pg) != 0) {
			if (PQstatus(c->pg) == CONNECTION_BAD)
				conn_lost(c, PQerrorMessage(c->pg));
			else
				conn_flush(c);
			return;
		}
		/* what the socket held is in: reading again would only cost
		 * a recv() that finds nothing */
		conn_read(c);
		break;
	case CONN_IDLE:
		/* an idle connection only becomes readable when the server
		 * speaks: a termination notice or EOF */
		if (!PQconsumeInput(c->pg) || PQstatus(c->pg) == CONNECTION_BAD) {
			conn_lost(c, PQerrorMessage(c->pg));
			return;
		}
		for (PGnotify *n; (n = PQnotifies(c->pg)) != NULL;)
			PQfreemem(n);
		conn_wait(c, EV_READ);
		break;
	case CONN_DOWN:
		break;
	}
}

/* The margin the database keeps before the agent's deadline: max(100 ms,
 * 10 %) of query_timeout_ms, at most half of it. */
static int db_margin_ms(int query_timeout_ms)
{
	int margin = query_timeout_ms / 10 > 100 ? query_timeout_ms / 10 : 100;
	return margin > query_timeout_ms / 2 ? query_timeout_ms / 2 : margin;
}

/*
 * The statement's server-side bound: what is left of its deadline less the
 * margin, so the database gives up, rolls back and answers before the
 * agent's own deadline would have to drop the connection with the outcome
 * unknown.
 */
static int db_bound_ms(const struct db_query *q, int query_timeout_ms)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	long long left = (long long)(q->due.tv_sec - now.tv_sec) * 1000 +
			 (q->due.tv_nsec - now.tv_nsec) / 1000000;
	left -= db_margin_ms(query_timeout_ms);
	return left < 1 ? 1 : (int)left; /* 0 would mean no bound at all */
}

static const char local_bound_sql[] = "SELECT set_config('statement_timeout', $1, true), "
				      "set_config('lock_timeout', $2, true)";
static const char session_bound_sql[] = "SELECT set_config('statement_timeout', $1, false), "
					"set_config('lock_timeout', $2, false)";

/* Queues a set_config() statement of both timeouts at ms. */
static bool conn_send_bound(struct db_conn *c, const char *sql, int ms)
{
	char bound[32];
	const char *bounds[2] = {bound, bound};

	snprintf(bound, sizeof(bound), "%dms", ms);
	c->lane->db->stats.bound_statements++;
	return PQsendQueryParams(c->pg, sql, 2, NULL, bounds, NULL, NULL, 0);
}

static unsigned text_hash(const char *s)
{
	unsigned h = 2166136261u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

static void statement_name(char *buf, size_t len, const struct db_conn *c, int slot)
{
	snprintf(buf, len, "pgc_%08x_%u_%d", c->prepared[slot].hash, c->generation, slot);
}

/* The slot of sql in the connection's table; -1 when it is not there. */
static int conn_find_prepared(const struct db_conn *c, const char *sql, unsigned hash)
{
	for (int i = 0; i < c->nprepared; i++)
		if (c->prepared[i].hash == hash && strcmp(c->prepared[i].sql, sql) == 0)
			return i;
	return -1;
}

/*
 * In the named mode, the session keeps statement_timeout and
 * lock_timeout at the bound of a query that did not wait in the queue
 * (query_timeout_ms less the margin), set once per connection, again after
 * a reload changes it. A query that waited less than half the margin runs
 * under that session bound: the database gives up at most that much later
 * than the query's own bound, still at least half the margin before the
 * agent's deadline, so its answer still means "rolled back". A query that
 * waited longer sends its own, smaller bound local to its transaction, as
 * every query does in the other modes (named-pooled: session settings
 * would stay with a server connection the pooler lends to others). Each
 * text is Parsed once per connection, in the pipeline of its first use,
 * then only Bound and run.
 */
static bool conn_send_prepared(struct db_conn *c, struct db_query *q, int bound)
{
	struct db *db = c->lane->db;
	bool in_session = db->mode == STMT_MODE_NAMED;
	int session = db->query_timeout_ms - db_margin_ms(db->query_timeout_ms);
	unsigned hash = text_hash(q->sql);
	int phase = 0, slot;
	char name[40];

	if (in_session && c->session_bound_ms != session) {
		if (!conn_send_bound(c, session_bound_sql, session))
			return false;
		c->pending_bound_ms = session;
		phase++;
	}
	if (!in_session || bound < session - db_margin_ms(db->query_timeout_ms) / 2) {
		if (!conn_send_bound(c, local_bound_sql, bound))
			return false;
		phase++;
	}
	slot = conn_find_prepared(c, q->sql, hash);
	if (slot < 0 && c->nprepared < DB_PREPARED_MAX &&
	    (c->prepared[c->nprepared].sql = strdup(q->sql)) != NULL) {
		slot = c->nprepared++;
		c->prepared[slot].hash = hash;
		statement_name(name, sizeof(name), c, slot);
		if (!PQsendPrepare(c->pg, name, q->sql, q->nparams, NULL))
			return false;
		c->preparing = slot;
		c->prepare_phase = phase++;
		db->stats.prepares++;
	}
	c->query_phase = phase;
	if (slot < 0) /* past the cap: unnamed */
		return PQsendQueryParams(c->pg, q->sql, q->nparams, NULL,
					 (const char *const *)q->params, NULL, NULL, 0);
	statement_name(name, sizeof(name), c, slot);
	db->stats.prepared_runs++;
	c->sent_named = true;
	return PQsendQueryPrepared(c->pg, name, q->nparams, (const char *const *)q->params, NULL,
				   NULL, 0);
}

/*
 * The unnamed mode: set_config() of statement_timeout and
 * lock_timeout, local to the transaction, then the statement, unnamed. No
 * SET, no named statements: nothing outlives the transaction, which keeps
 * PgBouncer's transaction pooling safe.
 */
static bool conn_send_unnamed(struct db_conn *c, struct db_query *q, int bound)
{
	c->query_phase = 1;
	return conn_send_bound(c, local_bound_sql, bound) &&
	       PQsendQueryParams(c->pg, q->sql, q->nparams, NULL, (const char *const *)q->params,
				 NULL, NULL, 0);
}

/*
 * Sends q as one pipeline ending in one Sync, so its statements run in a
 * single implicit transaction and one round trip. The server arms
 * statement_timeout when a protocol message starts and disarms it after
 * each Execute (PostgreSQL 13+), so the statement's own Parse or Bind
 * starts a timer with the value in force; lock_timeout is read at every
 * lock wait.
 */
static void conn_run(struct db_conn *c, struct db_query *q)
{
	struct db *db = c->lane->db;
	int bound = db_bound_ms(q, db->query_timeout_ms);

	c->query = q;
	c->phase = 0;
	c->rolled_back = false;
	c->sync_wait_cancelled = false;
	c->preparing = -1;
	c->prepare_ok = false;
	c->sent_named = false;
	c->pending_bound_ms = 0;
	q->running_on = c;
	c->state = CONN_BUSY;
	db->stats.queries++;
	if (db->mode == STMT_MODE_UNNAMED && c->nprepared)
		conn_forget_session(c); /* what it prepared is of no more use */
	if (!(db->mode == STMT_MODE_UNNAMED ? conn_send_unnamed(c, q, bound)
					    : conn_send_prepared(c, q, bound)) ||
	    !PQpipelineSync(c->pg)) {
		conn_lost(c, PQerrorMessage(c->pg));
		return;
	}
	conn_flush(c);
}

static void lane_pump(struct db_lane *lane)
{
	for (int i = 0; i < lane->nconns && lane->head; i++) {
		if (lane->conns[i].state != CONN_IDLE)
			continue;
		struct db_query *q = queue_pop(lane);
		/* Its client hung up before the statement was sent: nobody will
		 * read the answer, and running it now could commit an attempt
		 * whose outcome the client never saw behind a later answer it
		 * did see (a retry of the same id on a new connection). */
		while (q && q->abandoned && *q->abandoned) {
			query_fail(q, PGC_E_UNAVAILABLE, false,
				   "the client closed its connection before the statement was "
				   "sent; nothing was done");
			q = queue_pop(lane);
		}
		if (q && q->build && !q->build(q->arg, &q->sql, &q->nparams, &q->params)) {
			/* nothing left to send (every member was answered) */
			query_fail(q, PGC_E_UNAVAILABLE, false, "nothing to send");
			i--; /* this connection is still idle */
			continue;
		}
		if (q)
			conn_run(&lane->conns[i], q);
	}
}

static void query_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct db_query *q = arg;
	struct db_conn *c = q->running_on;
	(void)fd;
	(void)what;

	if (!c) {
		queue_remove(q->lane, q);
		query_fail(q, PGC_E_TIMEOUT, false,
			   "no database connection became free within query_timeout_ms");
		return;
	}
	/* Cancelling needs a blocking PQcancel; dropping the connection ends
	 * the statement just as surely (the server rolls it back unless the
	 * commit was already under way, hence "unknown"). */
	log_warn(q->lane->db->log, "db", "statement exceeded query_timeout_ms (%d ms)",
		 q->lane->db->query_timeout_ms);
	c->query = NULL;
	q->running_on = NULL;
	event_del(c->io);
	if (c->result) {
		PQclear(c->result);
		c->result = NULL;
	}
	PQfinish(c->pg);
	c->pg = NULL;
	c->backoff_ms = 0;
	conn_schedule_reconnect(c);
	c->backoff_ms = DB_BACKOFF_START_MS;
	lane_update_up(c->lane);
	query_fail(q, PGC_E_TIMEOUT, true,
		   "the database did not answer within query_timeout_ms; the outcome is unknown, "
		   "retry with the same ids");
}

bool db_query(struct db *db, enum db_lane_id lane_id, const char *sql, int nparams,
	      const char *const *params, db_done_fn done, void *arg)
{
	return db_query_unless(db, lane_id, sql, nparams, params, done, arg, NULL);
}

bool db_query_unless(struct db *db, enum db_lane_id lane_id, const char *sql, int nparams,
		     const char *const *params, db_done_fn done, void *arg, const bool *abandoned)
{
	struct db_lane *lane = &db->lanes[lane_id];
	struct db_query *q;

	if (!lane->up || lane->queued >= DB_QUEUE_MAX)
		return false;
	q = calloc(1, sizeof(*q));
	if (!q)
		return false;
	q->lane = lane;
	q->done = done;
	q->arg = arg;
	q->abandoned = abandoned;
	clock_gettime(CLOCK_MONOTONIC, &q->queued_at);
	q->due = q->queued_at;
	q->due.tv_sec += db->query_timeout_ms / 1000;
	q->due.tv_nsec += (long)(db->query_timeout_ms % 1000) * 1000000;
	if (q->due.tv_nsec >= 1000000000) {
		q->due.tv_sec++;
		q->due.tv_nsec -= 1000000000;
	}
	q->nparams = nparams;
	q->sql = strdup(sql);
	q->params = nparams ? calloc((size_t)nparams, sizeof(char *)) : NULL;
	q->deadline = evtimer_new(db->base, query_deadline_cb, q);
	if (!q->sql || (nparams && !q->params) || !q->deadline)
		goto oom;
	for (int i = 0; i < nparams; i++) {
		if (params[i] && !(q->params[i] = strdup(params[i])))
			goto oom;
	}
	struct timeval tv = ms_to_tv(db->query_timeout_ms);
	evtimer_add(q->deadline, &tv);
	if (lane->tail)
		lane->tail->next = q;
	else
		lane->head = q;
	lane->tail = q;
	lane->queued++;
	lane_pump(lane);
	return true;
oom:
	query_free(q);
	return false;
}

bool db_query_built(struct db *db, enum db_lane_id lane_id, db_build_fn build, db_done_fn done,
		    void *arg)
{
	return db_query_built_within(db, lane_id, db->query_timeout_ms, build, done, arg);
}

bool db_query_built_within(struct db *db, enum db_lane_id lane_id, int within_ms, db_build_fn build,
			   db_done_fn done, void *arg)
{
	struct db_lane *lane = &db->lanes[lane_id];
	struct db_query *q;

	if (within_ms > db->query_timeout_ms)
		within_ms = db->query_timeout_ms;
	if (within_ms < 1)
		within_ms = 1;

	if (!lane->up || lane->queued >= DB_QUEUE_MAX)
		return false;
	q = calloc(1, sizeof(*q));
	if (!q)
		return false;
	q->lane = lane;
	q->done = done;
	q->arg = arg;
	q->build = build;
	clock_gettime(CLOCK_MONOTONIC, &q->queued_at);
	q->due = q->queued_at;
	q->due.tv_sec += within_ms / 1000;
	q->due.tv_nsec += (long)(within_ms % 1000) * 1000000;
	if (q->due.tv_nsec >= 1000000000) {
		q->due.tv_sec++;
		q->due.tv_nsec -= 1000000000;
	}
	q->deadline = evtimer_new(db->base, query_deadline_cb, q);
	if (!q->deadline) {
		query_free(q);
		return false;
	}
	struct timeval tv = ms_to_tv(within_ms);
	evtimer_add(q->deadline, &tv);
	if (lane->tail)
		lane->tail->next = q;
	else
		lane->head = q;
	lane->tail = q;
	lane->queued++;
	lane_pump(lane);
	return true;
}

bool db_lane_up(const struct db *db, enum db_lane_id lane)
{
	return db->lanes[lane].up;
}

const char *db_last_error(const struct db *db)
{
	return db->last_error;
}

void db_get_stats(const struct db *db, struct db_stats *out)
{
	*out = db->stats;
	for (int l = 0; l < DB_LANE__COUNT; l++) {
		out->connected[l] = 0;
		for (int i = 0; i < db->lanes[l].nconns; i++) {
			enum conn_state st = db->lanes[l].conns[i].state;
			out->connected[l] += st == CONN_IDLE || st == CONN_BUSY;
		}
		out->queued[l] = db->lanes[l].queued;
	}
}

void db_update_timeouts(struct db *db, const struct db_settings *s)
{
	db->query_timeout_ms = s->query_timeout_ms;
	db->connect_timeout_ms = s->connect_timeout_ms;
	db->reconnect_max_ms = s->reconnect_max_ms;
}

struct db *db_create(struct event_base *base, const struct db_settings *s, struct logger *log,
		     db_state_fn on_state, void *state_arg)
{
	struct db *db = calloc(1, sizeof(*db));
	if (!db)
		return NULL;
	db->base = base;
	db->log = log;
	db->on_state = on_state;
	db->state_arg = state_arg;
	db->rng = (unsigned)time(NULL) ^ (unsigned)getpid();
	db->conninfo = strdup(s->conninfo ? s->conninfo : "");
	db->setting = s->prepared_statements;
	db->mode = stmt_mode_initial(db->setting);
	db_update_timeouts(db, s);
	if (!db->conninfo)
		goto fail;
	for (int l = 0; l < DB_LANE__COUNT; l++) {
		struct db_lane *lane = &db->lanes[l];
		lane->db = db;
		lane->id = (enum db_lane_id)l;
		lane->nconns = l == DB_LANE_REQUESTS ? s->pool_size : 1;
		lane->conns = calloc((size_t)lane->nconns, sizeof(struct db_conn));
		if (!lane->conns)
			goto fail;
		for (int i = 0; i < lane->nconns; i++) {
			struct db_conn *c = &lane->conns[i];
			c->lane = lane;
			c->preparing = -1;
			c->backoff_ms = DB_BACKOFF_START_MS;
			c->io = event_new(base, -1, 0, conn_io_cb, c);
			c->timer = evtimer_new(base, conn_timer_cb, c);
			if (!c->io || !c->timer)
				goto fail;
			/* first attempts right away, from the loop */
			struct timeval now = {0, 0};
			evtimer_add(c->timer, &now);
		}
	}
	return db;
fail:
	db_destroy(db);
	return NULL;
}

void db_destroy(struct db *db)
{
	if (!db)
		return;
	for (int l = 0; l < DB_LANE__COUNT; l++) {
		struct db_lane *lane = &db->lanes[l];
		struct db_query *q;
		while ((q = queue_pop(lane)) != NULL)
			query_fail(q, PGC_E_UNAVAILABLE, false, "the agent is shutting down");
		for (int i = 0; lane->conns && i < lane->nconns; i++) {
			struct db_conn *c = &lane->conns[i];
			if (c->query) {
				struct db_query *running = c->query;
				c->query = NULL;
				running->running_on = NULL;
				query_fail(running, PGC_E_UNAVAILABLE, true,
					   "the agent is shutting down");
			}
			if (c->result)
				PQclear(c->result);
			conn_forget_session(c);
			if (c->io)
				event_free(c->io);
			if (c->timer)
				event_free(c->timer);
			PQfinish(c->pg);
		}
		free(lane->conns);
	}
	free(db->conninfo);
	free(db);
}

const struct replication_view *db_replication(const struct db *db)
{
	return &db->replication;
}

enum stmt_mode db_statement_mode(const struct db *db)
{
	return db->mode;
}

bool db_pooler_seen(const struct db *db)
{
	return db->pooler_seen;
}
