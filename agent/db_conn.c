/*
 * db_conn.c — one database connection's life: connecting (PQconnectPoll
 * on the loop), reconnecting with backoff, losing it mid-query, and
 * handing its socket's events to the connect, the server check or the
 * running query. Separate from db.c, which queues queries onto lanes.
 */
#include "agent/db.h"

#include <stdio.h>

#include "agent/db_internal.h"

static void conn_start_connect(struct db_conn *c);

/* Single-line message from libpq, which likes "\n\t" and trailing newlines. */
void db_one_line(char *buf, size_t len, const char *msg)
{
	log_one_line(buf, len, msg && msg[0] ? msg : "unknown error");
}

/*
 * Waits for what on the connection's socket. The event persists, so a wait
 * that is already armed for the same socket and events is left alone:
 * re-arming it would cost two epoll_ctl calls, several times per query.
 */
void db_conn_wait(struct db_conn *c, short what)
{
	int fd = PQsocket(c->pg);

	what |= EV_PERSIST;
	if (event_pending(c->io, EV_READ | EV_WRITE, NULL) && event_get_fd(c->io) == fd &&
	    event_get_events(c->io) == what)
		return;
	event_del(c->io);
	event_assign(c->io, c->lane->db->base, fd, what, db_conn_io_cb, c);
	event_add(c->io, NULL);
}

void db_conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct db_conn *c = arg;
	(void)fd;
	(void)what;
	if (c->state == CONN_DOWN) {
		conn_start_connect(c);
	} else if (c->state == CONN_CONNECTING || c->state == CONN_CHECKING) {
		log_warn(c->lane->db->log, "db", "connection attempt timed out after %d ms",
			 c->lane->db->connect_timeout_ms);
		db_conn_connect_failed(c);
	}
}

/* Schedules the next connection attempt with exponential backoff and ±20%
 * jitter, so a fleet does not reconnect in lockstep after an outage. */
void db_conn_schedule_reconnect(struct db_conn *c)
{
	struct db *db = c->lane->db;
	int delay = c->backoff_ms;
	db->rng = db->rng * 1103515245u + 12345u;
	delay += (int)((long)delay * (long)((db->rng >> 16) % 41) / 100) - delay / 5;
	c->backoff_ms =
	    c->backoff_ms * 2 > db->reconnect_max_ms ? db->reconnect_max_ms : c->backoff_ms * 2;
	c->state = CONN_DOWN;
	struct timeval tv = db_ms_to_tv(delay < 0 ? 0 : delay);
	evtimer_add(c->timer, &tv);
}

/* The connection broke: whatever ran on it may or may not have committed. */
void db_conn_lost(struct db_conn *c, const char *why)
{
	struct db *db = c->lane->db;
	struct db_query *q = c->query;
	char msg[512], answer[512] = "";
	enum pgc_error_code code = PGC_E_UNAVAILABLE;

	db_one_line(msg, sizeof(msg), why);
	snprintf(db->last_error, sizeof(db->last_error), "%s", msg);
	log_warn(db->log, "db", "%s connection lost: %s", db_lane_names[c->lane->id], msg);
	/* An error the server reported for the bounds or the statement means
	 * its transaction rolled back (the commit comes only at the Sync), as
	 * when a backend is terminated mid-statement: that outcome is known.
	 * Only a loss after the statement succeeded leaves it unknown. */
	if (q && c->rolled_back && c->result && !c->sync_wait_cancelled) {
		const char *sqlstate = PQresultErrorField(c->result, PG_DIAG_SQLSTATE);
		code = db_error_for_sqlstate(sqlstate);
		db_one_line(answer, sizeof(answer),
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
	db_conn_schedule_reconnect(c);
	db_lane_update_up(c->lane);
	if (q) {
		q->running_on = NULL;
		if (answer[0])
			db_query_fail(q, code == PGC_E_INTERNAL ? PGC_E_UNAVAILABLE : code, false,
				      answer);
		else
			db_query_fail(q, PGC_E_UNAVAILABLE, true,
				      "the database connection was lost while the request ran; its "
				      "outcome is unknown, retry with the same ids");
	}
}

void db_conn_connect_failed(struct db_conn *c)
{
	db_conn_connect_refused(c, c->pg ? PQerrorMessage(c->pg) : "out of memory");
}

/* The attempt failed, or reached a server the agent must not use: drop it
 * and try again with backoff. */
void db_conn_connect_refused(struct db_conn *c, const char *why)
{
	struct db *db = c->lane->db;
	char msg[512];

	db_one_line(msg, sizeof(msg), why);
	snprintf(db->last_error, sizeof(db->last_error), "%s", msg);
	log_write(db->log, c->failing ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN, "db", NULL,
		  "cannot connect %s connection: %s (retrying with backoff)",
		  db_lane_names[c->lane->id], msg);
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
	db_conn_schedule_reconnect(c);
}

static void conn_connect_step(struct db_conn *c)
{
	switch (PQconnectPoll(c->pg)) {
	case PGRES_POLLING_READING:
		db_conn_wait(c, EV_READ);
		return;
	case PGRES_POLLING_WRITING:
		db_conn_wait(c, EV_WRITE);
		return;
	case PGRES_POLLING_OK:
		if (PQsetnonblocking(c->pg, 1) != 0 || !PQenterPipelineMode(c->pg)) {
			db_conn_connect_failed(c);
			return;
		}
		PQsetNoticeReceiver(c->pg, db_conn_notice, c);
		/* the connect timer keeps running: it bounds the check too */
		db_conn_check_start(c);
		return;
	default:
		db_conn_connect_failed(c);
		return;
	}
}

static void conn_start_connect(struct db_conn *c)
{
	struct db *db = c->lane->db;

	db_conn_forget_session(c);
	c->pg = PQconnectStart(db->conninfo);
	if (!c->pg || PQstatus(c->pg) == CONNECTION_BAD) {
		db_conn_connect_failed(c);
		return;
	}
	c->state = CONN_CONNECTING;
	struct timeval tv = db_ms_to_tv(db->connect_timeout_ms);
	evtimer_add(c->timer, &tv);
	/* libpq: start as if PQconnectPoll had asked to write */
	db_conn_wait(c, EV_WRITE);
}

void db_conn_flush(struct db_conn *c)
{
	int r = PQflush(c->pg);
	if (r < 0)
		db_conn_lost(c, PQerrorMessage(c->pg));
	else if (r > 0)
		db_conn_wait(c, EV_READ | EV_WRITE);
	else
		db_conn_wait(c, EV_READ);
}

void db_conn_io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct db_conn *c = arg;
	(void)fd;

	switch (c->state) {
	case CONN_CONNECTING:
		conn_connect_step(c);
		break;
	case CONN_CHECKING:
		db_conn_check_read(c);
		break;
	case CONN_BUSY:
		if (what & EV_READ) {
			if (!PQconsumeInput(c->pg)) {
				db_conn_lost(c, PQerrorMessage(c->pg));
				return;
			}
		}
		if (PQflush(c->pg) != 0) {
			if (PQstatus(c->pg) == CONNECTION_BAD)
				db_conn_lost(c, PQerrorMessage(c->pg));
			else
				db_conn_flush(c);
			return;
		}
		/* what the socket held is in: reading again would only cost
		 * a recv() that finds nothing */
		db_conn_read(c);
		break;
	case CONN_IDLE:
		/* an idle connection only becomes readable when the server
		 * speaks: a termination notice or EOF */
		if (!PQconsumeInput(c->pg) || PQstatus(c->pg) == CONNECTION_BAD) {
			db_conn_lost(c, PQerrorMessage(c->pg));
			return;
		}
		for (PGnotify *n; (n = PQnotifies(c->pg)) != NULL;)
			PQfreemem(n);
		db_conn_wait(c, EV_READ);
		break;
	case CONN_DOWN:
		break;
	}
}
