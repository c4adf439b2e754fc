/*
 * db_statements.c — what a query's pipeline sends in each statement mode:
 * the bound in the database (statement_timeout and lock_timeout, per
 * session or per transaction), the named statements a connection has
 * prepared, and what a lost named statement means. Separate from
 * db_pipeline.c, which sends and reads whatever this decides.
 */
#include "agent/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/db_internal.h"

/* A new session has nothing prepared and no timeouts set. */
void db_conn_forget_session(struct db_conn *c)
{
	for (int i = 0; i < c->nprepared; i++)
		free(c->prepared[i].sql);
	c->nprepared = 0;
	c->generation++;
	c->preparing = -1;
	c->session_bound_ms = 0;
	c->pending_bound_ms = 0;
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
bool db_conn_lost_its_statements(struct db_conn *c, const char *sqlstate)
{
	struct db *db = c->lane->db;

	if (!c->sent_named || !stmt_sqlstate_lost_statement(sqlstate))
		return false;
	stmt_log_lost(db->log, &db->lost_logged, db->setting, sqlstate);
	db->mode = stmt_mode_after_lost(db->setting, db->mode);
	db_conn_forget_session(c);
	return true;
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
int db_bound_ms(const struct db_query *q, int query_timeout_ms)
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

/*
 * A statement that applies its own bound (db_query_bounding) gets it as its
 * parameter now, at send time, as a separate bound statement would have.
 * False when out of memory.
 */
static bool fill_own_bound(struct db_query *q, int ms)
{
	char bound[32], *copy;
	snprintf(bound, sizeof(bound), "%d", ms);
	if (!(copy = strdup(bound)))
		return false;
	free(q->params[q->bound_param - 1]);
	q->params[q->bound_param - 1] = copy;
	return true;
}

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
bool db_conn_send_prepared(struct db_conn *c, struct db_query *q, int bound)
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
	if (q->bound_param > 0) {
		if (!fill_own_bound(q, bound))
			return false;
	} else if (!in_session || bound < session - db_margin_ms(db->query_timeout_ms) / 2) {
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
 * lock_timeout, local to the transaction, then the statement, unnamed (a
 * statement that applies its own bound: the statement alone). No SET, no
 * named statements: nothing outlives the transaction, which keeps
 * PgBouncer's transaction pooling safe.
 */
bool db_conn_send_unnamed(struct db_conn *c, struct db_query *q, int bound)
{
	if (q->bound_param > 0) {
		c->query_phase = 0;
		if (!fill_own_bound(q, bound))
			return false;
	} else {
		c->query_phase = 1;
		if (!conn_send_bound(c, local_bound_sql, bound))
			return false;
	}
	return PQsendQueryParams(c->pg, q->sql, q->nparams, NULL, (const char *const *)q->params,
				 NULL, NULL, 0);
}
