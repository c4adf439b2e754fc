/*
 * db_link.c — what every part of a connection's life calls: waiting on its
 * socket, flushing, losing it mid-query, refusing an attempt, and the next
 * attempt's backoff. It calls nothing above it (the socket's events go to
 * the callback db_create gave the event, the lane's state through
 * db->lane_update_up), so db_conn.c, db_server.c and db_pipeline.c can
 * all call it without a circle.
 */
#include "agent/db.h"

#include <stdio.h>

#include "agent/db_internal.h"

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
	event_assign(c->io, c->lane->db->base, fd, what, event_get_callback(c->io), c);
	event_add(c->io, NULL);
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
	c->lane->db->lane_update_up(c->lane);
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
