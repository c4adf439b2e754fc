/*
 * db_conn.c — one database connection's events: connecting (PQconnectPoll
 * on the loop), its timer (the next attempt, or the attempt's timeout),
 * and handing its socket's events to the connect, the server check
 * (db_server.c) or the running query (db_pipeline.c). What those call
 * back (waiting, losing the connection, reconnecting) is db_link.c, below
 * them all. Separate from db.c, which queues queries onto lanes.
 */
#include "agent/db.h"

#include <stdio.h>

#include "agent/db_internal.h"

static void conn_start_connect(struct db_conn *c);

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
