/*
 * quota_why.h — the columns of pgcoord.quota_why (migrations/0012_quota_why.sql),
 * read by quota.why (quota_why.c) and by a denied or queued claim's answer
 * (claim_holders.c), so the two cannot disagree on them.
 */
#ifndef PGCOORD_AGENT_QUOTA_WHY_H
#define PGCOORD_AGENT_QUOTA_WHY_H

/* Columns of pgcoord.quota_why, in order. */
enum {
	QW_PART,
	QW_KEY,
	QW_LIMIT,
	QW_IN_FLIGHT,
	QW_WAITING,
	QW_HOLDERS,
	QW_HIDDEN,
	QW_UNCERTAIN_WEIGHT,
	QW_HEAD_ID,
	QW_HEAD_WEIGHT,
	QW_HEAD_WAITED,
	QW_ID,
	QW_WEIGHT,
	QW_STATE,
	QW_PHASE,
	QW_OWNER_REPLICA,
	QW_OWNER_SESSION,
	QW_HELD_MS,
	QW_STATE_MS,
	QW_REASON,
	QW_NOW,
	QW__COUNT
};

#endif
