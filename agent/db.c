/*
 * db.c — asynchronous libpq connection lanes; see db.h. The lanes, their
 * queues and deadlines, and every call db.h declares; what one connection
 * does is in the db_*.c files (db_internal.h), which call nothing here:
 * they reach a lane through db->lane_pump and db->lane_update_up.
 */
#include "agent/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/db_internal.h"

const char *const db_lane_names[] = {"requests", "heartbeat"};

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

void db_lane_update_up(struct db_lane *lane)
{
	bool up = false;
	for (int i = 0; i < lane->nconns; i++)
		up |= lane->conns[i].state == CONN_IDLE || lane->conns[i].state == CONN_BUSY;
	if (up == lane->up)
		return;
	lane->up = up;
	log_write(lane->db->log, up ? LOG_LEVEL_INFO : LOG_LEVEL_WARN, "db", NULL,
		  "%s connections %s", db_lane_names[lane->id], up ? "up" : "down");
	if (!up) {
		/* fail closed: nothing waits for a database that is gone */
		struct db_query *q;
		while ((q = queue_pop(lane)) != NULL)
			db_query_fail(q, PGC_E_UNAVAILABLE, false,
				      "the database connection was lost before the request ran");
	}
	if (lane->id == DB_LANE_REQUESTS && lane->db->on_state)
		lane->db->on_state(up, lane->db->state_arg);
}

void db_lane_pump(struct db_lane *lane)
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
			db_query_fail(q, PGC_E_UNAVAILABLE, false,
				      "the client closed its connection before the statement was "
				      "sent; nothing was done");
			q = queue_pop(lane);
		}
		if (q && q->build && !q->build(q->arg, &q->sql, &q->nparams, &q->params)) {
			/* nothing left to send (every member was answered) */
			db_query_fail(q, PGC_E_UNAVAILABLE, false, "nothing to send");
			i--; /* this connection is still idle */
			continue;
		}
		if (q)
			db_conn_run(&lane->conns[i], q);
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
		db_query_fail(q, PGC_E_TIMEOUT, false,
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
	db_conn_schedule_reconnect(c);
	c->backoff_ms = DB_BACKOFF_START_MS;
	db_lane_update_up(c->lane);
	db_query_fail(
	    q, PGC_E_TIMEOUT, true,
	    "the database did not answer within query_timeout_ms; the outcome is unknown, "
	    "retry with the same ids");
}

bool db_query(struct db *db, enum db_lane_id lane_id, const char *sql, int nparams,
	      const char *const *params, db_done_fn done, void *arg)
{
	return db_query_unless(db, lane_id, sql, nparams, params, done, arg, NULL);
}

/* Queues one statement (db_query, db_query_unless, db_query_bounding). */
static bool query_queue(struct db *db, enum db_lane_id lane_id, const char *sql, int nparams,
			const char *const *params, int bound_param, db_done_fn done, void *arg,
			const bool *abandoned)
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
	q->bound_param = bound_param;
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
	struct timeval tv = db_ms_to_tv(db->query_timeout_ms);
	evtimer_add(q->deadline, &tv);
	if (lane->tail)
		lane->tail->next = q;
	else
		lane->head = q;
	lane->tail = q;
	lane->queued++;
	db_lane_pump(lane);
	return true;
oom:
	db_query_free(q);
	return false;
}

bool db_query_unless(struct db *db, enum db_lane_id lane_id, const char *sql, int nparams,
		     const char *const *params, db_done_fn done, void *arg, const bool *abandoned)
{
	return query_queue(db, lane_id, sql, nparams, params, 0, done, arg, abandoned);
}

bool db_query_bounding(struct db *db, enum db_lane_id lane_id, const char *sql, int nparams,
		       const char *const *params, int bound_param, db_done_fn done, void *arg)
{
	if (bound_param < 1 || bound_param > nparams)
		return false;
	return query_queue(db, lane_id, sql, nparams, params, bound_param, done, arg, NULL);
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
		db_query_free(q);
		return false;
	}
	struct timeval tv = db_ms_to_tv(within_ms);
	evtimer_add(q->deadline, &tv);
	if (lane->tail)
		lane->tail->next = q;
	else
		lane->head = q;
	lane->tail = q;
	lane->queued++;
	db_lane_pump(lane);
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
	/* the connection files reach the lanes through these, not by name */
	db->lane_pump = db_lane_pump;
	db->lane_update_up = db_lane_update_up;
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
			c->io = event_new(base, -1, 0, db_conn_io_cb, c);
			c->timer = evtimer_new(base, db_conn_timer_cb, c);
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
			db_query_fail(q, PGC_E_UNAVAILABLE, false, "the agent is shutting down");
		for (int i = 0; lane->conns && i < lane->nconns; i++) {
			struct db_conn *c = &lane->conns[i];
			if (c->query) {
				struct db_query *running = c->query;
				c->query = NULL;
				running->running_on = NULL;
				db_query_fail(running, PGC_E_UNAVAILABLE, true,
					      "the agent is shutting down");
			}
			if (c->result)
				PQclear(c->result);
			db_conn_forget_session(c);
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
