/*
 * lease_belief.c — see lease_belief.h.
 */
#include "agent/lease_belief.h"

uint64_t lease_belief_until(uint64_t sent_ms, int ttl_ms, int renew_ms)
{
	if (ttl_ms <= 0 || renew_ms < 0 || renew_ms >= ttl_ms)
		return sent_ms;
	return sent_ms + (uint64_t)(ttl_ms - renew_ms);
}

bool lease_belief_holds(bool leader, uint64_t until_ms, uint64_t now_ms)
{
	return leader && now_ms < until_ms;
}

uint64_t lease_belief_left(bool leader, uint64_t until_ms, uint64_t now_ms)
{
	return lease_belief_holds(leader, until_ms, now_ms) ? until_ms - now_ms : 0;
}

uint64_t lease_belief_next_renewal_in(uint64_t sent_ms, int renew_ms, uint64_t now_ms)
{
	uint64_t next = sent_ms + (uint64_t)(renew_ms > 0 ? renew_ms : 0);
	return next > now_ms ? next - now_ms : 0;
}

uint64_t lease_campaign_wait_ms(int64_t expires_in_ms, int jitter_ms, int poll_ms, int fallback_ms,
				uint32_t rnd)
{
	uint64_t wait;
	if (expires_in_ms <= 0)
		return fallback_ms > 0 ? (uint64_t)fallback_ms : 0;
	wait = (uint64_t)expires_in_ms + (jitter_ms > 0 ? rnd % ((uint32_t)jitter_ms + 1) : 0);
	if (poll_ms > 0 && wait > (uint64_t)poll_ms)
		wait = (uint64_t)poll_ms;
	return wait;
}
