/*
 * lease_belief.h — the arithmetic of leadership belief (guarantee 7), on
 * CLOCK_MONOTONIC milliseconds (mono_ms()) and nothing else: no clock is
 * read here, so the rule can be tested on made-up times.
 *
 * A renewal sent at `sent` that the database confirmed keeps the row ours
 * until at least sent + ttl (the database's own clock starts later). The
 * agent believes only until sent + ttl − renew: one renew interval of
 * margin, so belief ends before anyone else can acquire, even when the
 * next renewal is lost. Belief holds strictly before its deadline.
 */
#ifndef PGCOORD_AGENT_LEASE_BELIEF_H
#define PGCOORD_AGENT_LEASE_BELIEF_H

#include <stdbool.h>
#include <stdint.h>

/* The deadline a confirmed renewal sent at sent_ms allows. A renew
 * interval not below the ttl leaves no margin: no belief (sent_ms). */
uint64_t lease_belief_until(uint64_t sent_ms, int ttl_ms, int renew_ms);

/* True while a leader's belief with this deadline holds at now_ms. */
bool lease_belief_holds(bool leader, uint64_t until_ms, uint64_t now_ms);

/* What is left of that belief at now_ms (valid_ms on the wire); 0 when
 * it does not hold. */
uint64_t lease_belief_left(bool leader, uint64_t until_ms, uint64_t now_ms);

/* How long from now_ms until the renewal after one sent at sent_ms is
 * due; 0 when it is due already. */
uint64_t lease_belief_next_renewal_in(uint64_t sent_ms, int renew_ms, uint64_t now_ms);

/*
 * When a campaign that lost should try again. The database told it how
 * long the holder's row has left (expires_in_ms, by the database clock);
 * the row cannot be taken before then, so trying earlier only costs a
 * statement. It tries at expiry plus a jitter (rnd % (jitter_ms + 1)), so
 * a fleet of candidates does not arrive in one instant. A row that has
 * lapsed already (or could not be read, < 0) is tried after fallback_ms.
 * poll_ms > 0 caps the wait: a candidate that must also notice a hand-back
 * before the expiry looks again that often; 0 waits for the expiry alone.
 */
uint64_t lease_campaign_wait_ms(int64_t expires_in_ms, int jitter_ms, int poll_ms, int fallback_ms,
				uint32_t rnd);

#endif
