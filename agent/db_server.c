/*
 * db_server.c — what the server behind a new connection is, read before
 * any request may use it: a standby is refused, a primary's replication
 * settings become the view db_replication() gives, and a pooler in between
 * moves the statement mode. Also the notice that a commit stopped waiting
 * for the synchronous standby. Separate so db_conn.c is only the
 * connection's life.
 */
#include "agent/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/db_internal.h"

/*
 * PostgreSQL warns when a commit stops waiting for the synchronous standby
 * (a cancel, a statement timeout, a terminated backend): the transaction
 * is committed on this server but maybe on no standby, so a failover could
 * undo it. The query's answer must then not be an acknowledgement.
 */
void db_conn_notice(void *arg, const PGresult *res)
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
void db_conn_check_start(struct db_conn *c)
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
		db_conn_connect_failed(c);
		return;
	}
	int r = PQflush(c->pg);
	if (r < 0)
		db_conn_connect_failed(c);
	else
		db_conn_wait(c, r > 0 ? EV_READ | EV_WRITE : EV_READ);
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
		db_conn_connect_refused(c, line);
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
		db_conn_connect_refused(c, line);
		return;
	}
	if (replication_changed(&db->replication, v)) {
		db->replication = *v;
		replication_describe(v, line, sizeof(line));
		log_write(db->log, replication_failover_safe(v) ? LOG_LEVEL_INFO : LOG_LEVEL_WARN,
			  "db", NULL, "replication: %s", line);
	}
	if (c->failing)
		log_info(db->log, "db", "%s connection re-established", db_lane_names[c->lane->id]);
	c->failing = false;
	c->backoff_ms = DB_BACKOFF_START_MS;
	c->state = CONN_IDLE;
	db_conn_wait(c, EV_READ);
	c->lane->db->lane_update_up(c->lane);
	c->lane->db->lane_pump(c->lane);
}

/* Reads the check's results, as db_conn_read does a query's. */
void db_conn_check_read(struct db_conn *c)
{
	if (!PQconsumeInput(c->pg) || (PQflush(c->pg) < 0)) {
		db_conn_connect_failed(c);
		return;
	}
	while (!PQisBusy(c->pg)) {
		PGresult *res = PQgetResult(c->pg);
		if (!res) {
			if (PQstatus(c->pg) == CONNECTION_BAD) {
				db_conn_connect_failed(c);
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
	db_conn_wait(c, EV_READ);
}
