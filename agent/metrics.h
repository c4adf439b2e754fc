/*
 * metrics.h — the agent's counters and latency histograms: a sink that
 * any module may call and that calls nothing (metrics_render.h reads them
 * out in the Prometheus text format, version 0.0.4).
 *
 * Label values come only from fixed sets — the method table, the wire error
 * names, the database lanes, the claim outcomes — so the number of series is
 * bounded whatever clients send: a request for a method that does not exist
 * is counted as method="unknown".
 */
#ifndef PGCOORD_AGENT_METRICS_H
#define PGCOORD_AGENT_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/metrics_store.h"

struct agent;
struct metrics;

/* Counters sized for the method table: nmethods methods whose names
 * method_name(i) gives (static strings). NULL when out of memory. */
__attribute__((warn_unused_result)) struct metrics *
metrics_create(size_t nmethods, const char *(*method_name)(size_t i));
/* Accepts NULL. */
void metrics_destroy(struct metrics *m);

/*
 * One answered request: method is its index in the method table, or -1 for
 * a request that named no known method (or could not be parsed); outcome 0
 * is success, otherwise an enum pgc_error_code. Accepts m == NULL.
 */
void metrics_rpc(struct metrics *m, int method, int outcome, double seconds);

/* A permit.claim's result as the database decided it: "admitted", "held" or
 * "denied" (anything else is ignored). Called by permit_claim.c. */
void metrics_claim_result(struct agent *ag, const char *status);

/* A session was declared lost because its client missed session.keepalive
 * (keepalive.c). */
void metrics_session_lost_keepalive(struct agent *ag);

/* The fleet-wide count of uncertain permits (and the age of the oldest),
 * read from the database by the HTTP layer at most once a second. */
void metrics_set_uncertain(struct metrics *m, int64_t count, int64_t oldest_age_ms,
			   uint64_t read_at_ms);
/* True (with the values) when a reading newer than max_age_ms exists. */
bool metrics_get_uncertain(const struct metrics *m, uint64_t now_ms, uint64_t max_age_ms,
			   int64_t *count, int64_t *oldest_age_ms);

#endif
