/*
 * db_query.c — one query's bookkeeping, which every db file needs and
 * which needs none of them: its latency, its failure answer, freeing it.
 */
#include "agent/db.h"

#include <stdlib.h>
#include <time.h>

#include "agent/db_internal.h"

struct timeval db_ms_to_tv(int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	return tv;
}

/* Records how long q took, from db_query() to now, in its lane's histogram. */
void db_query_observe(struct db_query *q)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double s = (double)(now.tv_sec - q->queued_at.tv_sec) +
		   (double)(now.tv_nsec - q->queued_at.tv_nsec) / 1e9;
	histogram_observe(&q->lane->db->stats.latency[q->lane->id], s);
}

void db_query_free(struct db_query *q)
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

void db_query_fail(struct db_query *q, enum pgc_error_code code, bool unknown, const char *message)
{
	struct db_result r = {0};
	r.ok = false;
	r.error = code;
	r.message = message;
	r.outcome_unknown = unknown;
	q->lane->db->stats.failures++;
	if (code == PGC_E_TIMEOUT)
		q->lane->db->stats.timeouts++;
	db_query_observe(q);
	q->done(&r, q->arg);
	db_query_free(q);
}
