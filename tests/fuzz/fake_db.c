/*
 * fake_db.c — agent/db.c's interface without a database, for the dispatch
 * fuzz target: handlers' parameter checks, authorisation and reply building
 * run against canned rows, refusals, timeouts and a database that is down.
 * Linked before the agent's static library, so db.c's object is never
 * pulled in (nor the db_*.c files', which only db.c calls): every function
 * db.h declares must be defined here (a missing one shows up as a
 * duplicate-symbol link error).
 */
#include "agent/db.h"
#include "tests/fuzz/fake_db.h"

#include <stdlib.h>
#include <string.h>

#define FAKE_COLUMNS 40
#define FAKE_QUEUE_MAX 4096 /* the real lanes' queue bound */

struct fake_query {
	struct fake_query *next;
	db_done_fn done;
	void *arg;
	const bool *abandoned;
	db_build_fn build; /* db_query_built: made when answered, as when sent */
};

struct db {
	struct fake_query *head, *tail;
	size_t queued;
	enum fake_answer answer;
	unsigned seed;
	unsigned answered; /* for FAKE_CYCLE and the cells */
	struct db_stats stats;
};

/* Cells the handlers compare against, numbers at their edges, and junk. */
static const char *const cells[] = {
    "1",
    "t",
    "f",
    "0",
    NULL,
    "admitted",
    "denied",
    "held",
    "released",
    "uncertain",
    "conflict",
    "forbidden",
    "invalid",
    "mismatch",
    "not_found",
    "ok",
    "session_expired",
    "unknown_quota",
    "queued",
    "already_released",
    "retired",
    "cancelled",
    "-1",
    "9223372036854775807",
    "",
    "{}",
    "{1,2}",
    "deadbeef",
    "running",
    "gone",
    "reserved",
};
#define NCELLS (sizeof(cells) / sizeof(cells[0]))

static const char *const refusals[] = {"PCNFD", "PCFEN", "PCCFL", "PCFBD", "PCSEX", "PCINV"};

struct db *db_create(struct event_base *base, const struct db_settings *settings,
		     struct logger *log, db_state_fn on_state, void *state_arg)
{
	(void)base, (void)settings, (void)log, (void)on_state, (void)state_arg;
	return calloc(1, sizeof(struct db));
}

void fake_db_set(struct db *db, enum fake_answer answer, unsigned seed)
{
	db->answer = answer;
	db->seed = seed;
}

size_t fake_db_queued(const struct db *db)
{
	return db->queued;
}

static enum fake_answer next_answer(struct db *db)
{
	if (db->answer != FAKE_CYCLE)
		return db->answer;
	static const enum fake_answer cycle[] = {FAKE_ROW,     FAKE_UNAVAILABLE, FAKE_REFUSAL,
						 FAKE_NO_ROWS, FAKE_TIMEOUT,	 FAKE_ROWS};
	return cycle[(db->seed + db->answered) % (sizeof(cycle) / sizeof(cycle[0]))];
}

static PGresult *canned_rows(struct db *db, int nrows)
{
	PGresAttDesc cols[FAKE_COLUMNS];
	char names[FAKE_COLUMNS][8];
	PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);

	if (!res)
		return NULL;
	memset(cols, 0, sizeof(cols));
	for (int c = 0; c < FAKE_COLUMNS; c++) {
		snprintf(names[c], sizeof(names[c]), "c%d", c);
		cols[c].name = names[c];
		cols[c].typid = 25; /* text */
		cols[c].typlen = -1;
		cols[c].atttypmod = -1;
	}
	if (!PQsetResultAttrs(res, FAKE_COLUMNS, cols))
		goto fail;
	for (int r = 0; r < nrows; r++) {
		for (int c = 0; c < FAKE_COLUMNS; c++) {
			const char *v = cells[(db->seed + db->answered * 3 + (unsigned)r * 5 +
					       (unsigned)c * 7) %
					      NCELLS];
			/* PQsetvalue takes a NULL value as SQL NULL */
			if (!PQsetvalue(res, r, c, (char *)v, v ? (int)strlen(v) : -1))
				goto fail;
		}
	}
	return res;
fail:
	PQclear(res);
	return NULL;
}

/* Runs q's callback with the answer the fake is set to give, then frees q. */
static void answer(struct db *db, struct fake_query *q)
{
	struct db_result r = {0};
	PGresult *res = NULL;
	enum fake_answer a = next_answer(db);

	if (q->build) {
		char *sql = NULL, **params = NULL;
		int nparams = 0;
		bool any = q->build(q->arg, &sql, &nparams, &params);
		for (int i = 0; i < nparams; i++)
			free(params[i]);
		free(params);
		free(sql);
		if (!any) {
			r.error = PGC_E_UNAVAILABLE;
			r.message = "nothing to send";
			a = FAKE_LANE_DOWN;
		}
	}
	if (q->abandoned && *q->abandoned) {
		r.error = PGC_E_UNAVAILABLE;
		r.message = "the client hung up before the statement was sent";
		a = FAKE_LANE_DOWN; /* answered below as not sent */
	}
	switch (a) {
	case FAKE_ROW:
	case FAKE_NO_ROWS:
	case FAKE_ROWS:
		res = canned_rows(db, a == FAKE_ROW ? 1 : a == FAKE_ROWS ? 3 : 0);
		if (res) {
			r.ok = true;
			r.res = res;
			break;
		}
		/* fall through: out of memory reads as a lost connection */
	case FAKE_UNAVAILABLE:
		r.error = PGC_E_UNAVAILABLE;
		r.message = "server closed the connection unexpectedly";
		r.outcome_unknown = true;
		break;
	case FAKE_REFUSAL:
		res = PQmakeEmptyPGresult(NULL, PGRES_FATAL_ERROR);
		r.res = res;
		r.sqlstate =
		    refusals[(db->seed + db->answered) % (sizeof(refusals) / sizeof(refusals[0]))];
		r.error = db_error_for_sqlstate(r.sqlstate);
		r.refusal = true;
		r.message = "refused by the schema";
		break;
	case FAKE_TIMEOUT:
		r.error = PGC_E_TIMEOUT;
		r.message = "no answer within query_timeout_ms";
		r.outcome_unknown = true;
		break;
	default: /* not sent */
		r.error = PGC_E_UNAVAILABLE;
		if (!r.message)
			r.message = "the agent is shutting down";
		break;
	}
	db->answered++;
	db->stats.queries++;
	q->done(&r, q->arg);
	PQclear(res);
	free(q);
}

bool fake_db_answer_one(struct db *db)
{
	struct fake_query *q = db->head;

	if (!q)
		return false;
	db->head = q->next;
	if (!db->head)
		db->tail = NULL;
	db->queued--;
	answer(db, q);
	return true;
}

void db_destroy(struct db *db)
{
	if (!db)
		return;
	db->answer = FAKE_LANE_DOWN; /* what is still queued fails, as in db.c */
	while (fake_db_answer_one(db))
		;
	free(db);
}

void db_update_timeouts(struct db *db, const struct db_settings *settings)
{
	(void)db, (void)settings;
}

bool db_query_unless(struct db *db, enum db_lane_id lane, const char *sql, int nparams,
		     const char *const *params, db_done_fn done, void *arg, const bool *abandoned)
{
	struct fake_query *q;

	(void)sql, (void)nparams, (void)params;
	if (!db_lane_up(db, lane) || db->queued >= FAKE_QUEUE_MAX)
		return false;
	q = calloc(1, sizeof(*q));
	if (!q)
		return false;
	q->done = done;
	q->arg = arg;
	q->abandoned = abandoned;
	if (db->tail)
		db->tail->next = q;
	else
		db->head = q;
	db->tail = q;
	db->queued++;
	return true;
}

bool db_query(struct db *db, enum db_lane_id lane, const char *sql, int nparams,
	      const char *const *params, db_done_fn done, void *arg)
{
	return db_query_unless(db, lane, sql, nparams, params, done, arg, NULL);
}

bool db_query_bounding(struct db *db, enum db_lane_id lane, const char *sql, int nparams,
		       const char *const *params, int bound_param, db_done_fn done, void *arg)
{
	(void)bound_param;
	return db_query_unless(db, lane, sql, nparams, params, done, arg, NULL);
}

bool db_query_built(struct db *db, enum db_lane_id lane, db_build_fn build, db_done_fn done,
		    void *arg)
{
	if (!db_query_unless(db, lane, NULL, 0, NULL, done, arg, NULL))
		return false;
	db->tail->build = build;
	return true;
}

/* The fake has no deadlines: within_ms changes nothing. */
bool db_query_built_within(struct db *db, enum db_lane_id lane, int within_ms, db_build_fn build,
			   db_done_fn done, void *arg)
{
	(void)within_ms;
	return db_query_built(db, lane, build, done, arg);
}

bool db_lane_up(const struct db *db, enum db_lane_id lane)
{
	(void)lane;
	return db->answer != FAKE_LANE_DOWN;
}

const char *db_last_error(const struct db *db)
{
	return db->answer == FAKE_LANE_DOWN ? "the fake database is down" : "";
}

void db_get_stats(const struct db *db, struct db_stats *out)
{
	*out = db->stats;
	out->connected[DB_LANE_REQUESTS] = db_lane_up(db, DB_LANE_REQUESTS);
	out->queued[DB_LANE_REQUESTS] = (int)db->queued;
}

/* Never checked: the fake has no server to ask. */
const struct replication_view *db_replication(const struct db *db)
{
	static const struct replication_view unchecked = {0};
	(void)db;
	return &unchecked;
}

/* The fake keeps no statements, so it reports the mode nothing changes. */
enum stmt_mode db_statement_mode(const struct db *db)
{
	(void)db;
	return STMT_MODE_NAMED;
}

bool db_pooler_seen(const struct db *db)
{
	(void)db;
	return false;
}
