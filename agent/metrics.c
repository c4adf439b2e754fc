/*
 * metrics.c — see metrics.h.
 */
#include "agent/metrics.h"

#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/metrics_store.h"

/* From half a millisecond (a ping) to ten seconds (past any sane
 * query_timeout_ms); a slower observation lands in +Inf. */
const double metrics_bucket_le[METRICS_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
};

const char *const metrics_claim_names[CLAIM__COUNT] = {"admitted", "held", "denied"};

void histogram_observe(struct histogram *h, double seconds)
{
	h->count++;
	h->sum_s += seconds;
	for (int i = 0; i < METRICS_BUCKETS; i++) {
		if (seconds <= metrics_bucket_le[i]) {
			h->bucket[i]++;
			return;
		}
	}
}

struct metrics *metrics_create(size_t nmethods, const char *(*method_name)(size_t i))
{
	struct metrics *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->nmethods = nmethods;
	m->method_name = method_name;
	m->rpc = calloc((nmethods + 1) * OUTCOMES, sizeof(*m->rpc));
	if (!m->rpc) {
		free(m);
		return NULL;
	}
	return m;
}

void metrics_destroy(struct metrics *m)
{
	if (!m)
		return;
	free(m->rpc);
	free(m);
}

void metrics_rpc(struct metrics *m, int method, int outcome, double seconds)
{
	if (!m)
		return;
	if (method < 0 || (size_t)method >= m->nmethods)
		method = (int)m->nmethods;
	if (outcome < 0 || outcome >= OUTCOMES)
		outcome = PGC_E_INTERNAL;
	struct rpc_series *s = &m->rpc[(size_t)method * OUTCOMES + (size_t)outcome];
	s->count++;
	histogram_observe(&s->latency, seconds);
}

void metrics_session_lost_keepalive(struct agent *ag)
{
	if (ag->metrics)
		ag->metrics->sessions_lost_keepalive++;
}

void metrics_claim_result(struct agent *ag, const char *status)
{
	if (!ag->metrics || !status)
		return;
	for (int i = 0; i < CLAIM__COUNT; i++) {
		if (strcmp(status, metrics_claim_names[i]) == 0) {
			ag->metrics->claims[i]++;
			return;
		}
	}
}

void metrics_set_uncertain(struct metrics *m, int64_t count, int64_t oldest_age_ms,
			   uint64_t read_at_ms)
{
	if (!m)
		return;
	m->uncertain_valid = true;
	m->uncertain = count;
	m->uncertain_oldest_ms = oldest_age_ms;
	m->uncertain_read_ms = read_at_ms;
}

bool metrics_get_uncertain(const struct metrics *m, uint64_t now_ms, uint64_t max_age_ms,
			   int64_t *count, int64_t *oldest_age_ms)
{
	if (!m || !m->uncertain_valid || now_ms - m->uncertain_read_ms > max_age_ms)
		return false;
	*count = m->uncertain;
	*oldest_age_ms = m->uncertain_oldest_ms;
	return true;
}
