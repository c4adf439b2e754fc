/*
 * test_lease_belief.c — the leader-belief rule (agent/lease_belief.c) on
 * made-up CLOCK_MONOTONIC times: when belief starts and ends, how renew
 * and ttl set the deadline, and the clock's edges.
 */
#include <criterion/criterion.h>
#include <stdint.h>

#include "agent/lease_belief.h"

/* ttl 9 s renewed every 3 s: believed 6 s past each confirmed send */
#define TTL 9000
#define RENEW 3000

Test(lease_belief, a_confirmed_renewal_believes_until_send_plus_ttl_minus_renew)
{
	uint64_t sent = 1000000;
	uint64_t until = lease_belief_until(sent, TTL, RENEW);
	cr_assert_eq(until, sent + TTL - RENEW);
	/* the database keeps the row until sent + ttl at the earliest: belief
	 * ends a whole renew interval before anyone else could acquire */
	cr_assert_eq(sent + TTL - until, (uint64_t)RENEW);
}

Test(lease_belief, belief_starts_only_when_the_answer_comes_before_its_deadline)
{
	uint64_t sent = 50000, until = lease_belief_until(sent, TTL, RENEW);
	/* an answer at sent + 10 ms: believed, with almost the whole margin */
	cr_assert(lease_belief_holds(true, until, sent + 10));
	cr_assert_eq(lease_belief_left(true, until, sent + 10), (uint64_t)(TTL - RENEW - 10));
	/* an answer that took longer than ttl − renew proves nothing usable */
	cr_assert_not(lease_belief_holds(true, until, until));
	cr_assert_not(lease_belief_holds(true, until, until + 1));
	cr_assert_eq(lease_belief_left(true, until, until + 1), 0);
}

Test(lease_belief, belief_ends_exactly_at_its_deadline)
{
	uint64_t until = lease_belief_until(0, TTL, RENEW);
	cr_assert(lease_belief_holds(true, until, until - 1));
	cr_assert_eq(lease_belief_left(true, until, until - 1), 1);
	cr_assert_not(lease_belief_holds(true, until, until), "holds strictly before the deadline");
	cr_assert_eq(lease_belief_left(true, until, until), 0);
}

Test(lease_belief, no_belief_without_leadership_whatever_the_deadline)
{
	cr_assert_not(lease_belief_holds(false, UINT64_MAX, 0));
	cr_assert_eq(lease_belief_left(false, UINT64_MAX, 0), 0);
	/* a deadline never set (0) never holds, even at the clock's start */
	cr_assert_not(lease_belief_holds(true, 0, 0));
}

Test(lease_belief, each_renewal_moves_the_deadline_from_its_own_send_time)
{
	uint64_t first = lease_belief_until(10000, TTL, RENEW);
	uint64_t second = lease_belief_until(10000 + RENEW, TTL, RENEW);
	cr_assert_eq(second - first, (uint64_t)RENEW);
	/* a renewal whose answer never came moves nothing: belief runs out at
	 * the first deadline, one renew interval after the lost renewal's send */
	cr_assert_not(lease_belief_holds(true, first, 10000 + TTL - RENEW));
}

Test(lease_belief, the_next_renewal_is_due_renew_after_the_last_send)
{
	cr_assert_eq(lease_belief_next_renewal_in(1000, RENEW, 1000), (uint64_t)RENEW);
	cr_assert_eq(lease_belief_next_renewal_in(1000, RENEW, 1500), (uint64_t)RENEW - 500);
	/* an answer slower than the interval: renew at once */
	cr_assert_eq(lease_belief_next_renewal_in(1000, RENEW, 1000 + RENEW), 0);
	cr_assert_eq(lease_belief_next_renewal_in(1000, RENEW, 1000 + 2 * RENEW), 0);
}

Test(lease_belief, the_smallest_and_largest_accepted_intervals)
{
	/* lease.acquire accepts renew_ms from ttl/10 to ttl/2 */
	cr_assert_eq(lease_belief_until(0, 1000, 100), 900);
	cr_assert_eq(lease_belief_until(0, 600000, 300000), 300000);
}

Test(lease_belief, an_interval_with_no_margin_gives_no_belief)
{
	/* renew >= ttl would believe past the row's expiry: never */
	cr_assert_eq(lease_belief_until(7000, TTL, TTL), 7000);
	cr_assert_eq(lease_belief_until(7000, TTL, TTL + 1), 7000);
	cr_assert_eq(lease_belief_until(7000, 0, 0), 7000);
	cr_assert_eq(lease_belief_until(7000, TTL, -1), 7000);
	cr_assert_not(lease_belief_holds(true, lease_belief_until(7000, TTL, TTL), 7000));
}

Test(lease_belief, large_monotonic_times_do_not_overflow)
{
	/* CLOCK_MONOTONIC counts from boot; a host up for years is far from
	 * uint64 limits, but the arithmetic must stay exact up there too */
	uint64_t sent = UINT64_MAX - 1000000;
	uint64_t until = lease_belief_until(sent, TTL, RENEW);
	cr_assert_eq(until - sent, (uint64_t)(TTL - RENEW));
	cr_assert(lease_belief_holds(true, until, sent));
	cr_assert_eq(lease_belief_left(true, until, sent), (uint64_t)(TTL - RENEW));
	cr_assert_eq(lease_belief_next_renewal_in(sent, RENEW, sent + 1), (uint64_t)RENEW - 1);
}

Test(lease_belief, a_lost_campaign_waits_for_the_holders_expiry_and_a_jitter)
{
	cr_assert_eq(lease_campaign_wait_ms(9000, 250, 0, 1000, 0), 9000);
	cr_assert_eq(lease_campaign_wait_ms(9000, 250, 0, 1000, 250), 9250);
	cr_assert_eq(lease_campaign_wait_ms(9000, 250, 0, 1000, 251), 9000, "jitter wraps");
	cr_assert_eq(lease_campaign_wait_ms(9000, 0, 0, 1000, 77), 9000, "no jitter");
}

Test(lease_belief, a_poll_for_hand_backs_caps_the_wait)
{
	cr_assert_eq(lease_campaign_wait_ms(9000, 250, 1000, 1000, 100), 1000);
	cr_assert_eq(lease_campaign_wait_ms(300, 250, 1000, 1000, 100), 400, "expiry first");
}

Test(lease_belief, a_lapsed_or_unknown_expiry_retries_after_the_fallback)
{
	cr_assert_eq(lease_campaign_wait_ms(0, 250, 0, 1000, 100), 1000);
	cr_assert_eq(lease_campaign_wait_ms(-1, 250, 0, 1000, 100), 1000);
}
