/*
 * metrics_store.h — the layout of the agent's counters and histograms,
 * shared by metrics.c (which counts) and metrics_render.c (which reads
 * them out). Includes nothing of the agent: the bottom of the graph.
 */
#ifndef PGCOORD_AGENT_METRICS_STORE_H
#define PGCOORD_AGENT_METRICS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/codec.h"

#define METRICS_BUCKETS 15

/* Upper bounds of the latency buckets, in seconds (+Inf is implicit). */
extern const double metrics_bucket_le[METRICS_BUCKETS];

/* A latency histogram with fixed buckets; zero-initialized is empty. */
struct histogram {
	uint64_t bucket[METRICS_BUCKETS]; /* not cumulative: one count per bucket */
	uint64_t count;			  /* every observation, +Inf included */
	double sum_s;
};

void histogram_observe(struct histogram *h, double seconds);

enum claim_result { CLAIM_ADMITTED, CLAIM_HELD, CLAIM_DENIED, CLAIM__COUNT };
extern const char *const metrics_claim_names[CLAIM__COUNT];

#define OUTCOMES PGC_E__COUNT /* 0 = ok, then the wire errors */

struct rpc_series {
	uint64_t count;
	struct histogram latency;
};

struct metrics {
	size_t nmethods;
	const char *(*method_name)(size_t i);
	/* [method][outcome]; method nmethods is "unknown" */
	struct rpc_series *rpc;
	uint64_t claims[CLAIM__COUNT];
	uint64_t sessions_lost_keepalive;
	bool uncertain_valid;
	int64_t uncertain, uncertain_oldest_ms;
	uint64_t uncertain_read_ms;
};

#endif
