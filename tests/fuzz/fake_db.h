/*
 * fake_db.h — what the dispatch fuzz target uses to steer tests/fuzz/fake_db.c,
 * the stand-in linked in place of agent/db.c. Queries queue in the fake and
 * are answered only when the target says so, from the event loop's point of
 * view (never from inside db_query), as the real one does.
 */
#ifndef PGCOORD_TESTS_FUZZ_FAKE_DB_H
#define PGCOORD_TESTS_FUZZ_FAKE_DB_H

#include <stdbool.h>
#include <stddef.h>

struct db;

enum fake_answer {
	FAKE_ROW,	  /* one row of canned cells */
	FAKE_UNAVAILABLE, /* the connection was lost: outcome unknown */
	FAKE_REFUSAL,	  /* the schema refused (SQLSTATE class PC) */
	FAKE_NO_ROWS,	  /* ran, returned nothing */
	FAKE_LANE_DOWN,	  /* no connection: db_query refuses at once */
	FAKE_TIMEOUT,	  /* query_timeout_ms passed */
	FAKE_ROWS,	  /* three rows */
	FAKE_CYCLE,	  /* each query the next of the above, lane down excepted */
};

/* How the following queries are answered; seed picks the canned cells. */
void fake_db_set(struct db *db, enum fake_answer answer, unsigned seed);

/* Answers the oldest queued query. False when none is queued. */
bool fake_db_answer_one(struct db *db);

size_t fake_db_queued(const struct db *db);

#endif
