/*
 * db_pipeline.c — one query on one connection: sent as a pipeline ending
 * in one Sync, its results read as they come, and the answer given at the
 * Sync. Separate from db_statements.c, which decides what the pipeline
 * holds in each statement mode.
 */
#include "agent/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/db_internal.h"

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
	db_conn_wait(c, EV_READ);

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
		db_one_line(msg, sizeof(msg),
			    res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : "no result");
		r.message = msg;
		r.error = db_error_for_sqlstate(r.sqlstate);
		r.refusal = db_sqlstate_is_refusal(r.sqlstate);
		if (db_conn_lost_its_statements(c, r.sqlstate)) {
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
		db_conn_run(c, q);
		return;
	}
	db_query_observe(q);
	q->done(&r, q->arg);
	PQclear(res);
	db_query_free(q);
	c->lane->db->lane_pump(c->lane);
}

/*
 * A query is a pipeline (db_conn_run): the bounds and the Parse when it sends
 * them, the statement, the Sync. libpq hands back each statement's results followed by a NULL,
 * then PGRES_PIPELINE_SYNC once the implicit transaction has ended. The
 * answer is kept from the first error, else from the statement's first
 * result, and given only at the Sync: an error committing at the Sync must
 * still turn an OK into a failure.
 */
void db_conn_read(struct db_conn *c)
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
			db_conn_lost(c, PQerrorMessage(c->pg));
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
	db_conn_wait(c, EV_READ);
}

/*
 * Sends q as one pipeline ending in one Sync, so its statements run in a
 * single implicit transaction and one round trip. The server arms
 * statement_timeout when a protocol message starts and disarms it after
 * each Execute (PostgreSQL 13+), so the statement's own Parse or Bind
 * starts a timer with the value in force; lock_timeout is read at every
 * lock wait.
 */
void db_conn_run(struct db_conn *c, struct db_query *q)
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
		db_conn_forget_session(c); /* what it prepared is of no more use */
	if (!(db->mode == STMT_MODE_UNNAMED ? db_conn_send_unnamed(c, q, bound)
					    : db_conn_send_prepared(c, q, bound)) ||
	    !PQpipelineSync(c->pg)) {
		db_conn_lost(c, PQerrorMessage(c->pg));
		return;
	}
	db_conn_flush(c);
}
