/*
 * permits_internal.h — what the permit.* files share: a call's context,
 * the parameters every method reads alike, and the audit trail's actors
 * (permits.c). Private to permits.c and the permit_*.c files.
 */
#ifndef PGCOORD_AGENT_PERMITS_INTERNAL_H
#define PGCOORD_AGENT_PERMITS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/cursor.h"
#include "agent/reply.h"

struct request;

#define PERMIT_ID_MAX 200
#define PERMIT_KEY_MAX 200

/* permit.update's phases, which permit.list filters by too */
extern const char *const permit_phase_names[];

/* What a handler keeps for its database callback (req_ctx_alloc). */
struct permit_call {
	char *id;
	bool override;
	/* permit.claim: the requested quotas, sorted by key */
	struct claim_quota *quotas;
	size_t nquotas;
	char *keys_lit, *weights_lit;  /* the quotas as Postgres array literals */
	struct claim_pending *pending; /* a denied or queued answer, while it waits */
	struct page page;	       /* permit.list */
};

struct claim_quota {
	const char *key; /* borrows from the request frame */
	size_t len;
	int64_t weight;
};

/* A denied or queued claim's answer while it waits for who holds the
 * room (claim_holders.c): the fields its reply table takes from the
 * claim's row, copied, since that row is gone when the read returns. */
struct claim_pending {
	bool queued; /* the quota and its numbers come from the read too */
	bool track;  /* queued by this session: waiters_track before the answer */
	int64_t owner;
	const char *status; /* "denied" or "queued" */
	const char *id;
	const char *quota;			  /* denied: key, below */
	int64_t limit, in_flight, weight;	  /* denied */
	int64_t position, queued_at, deadline_at; /* queued */
	bool mine;				  /* queued */
	int64_t now_at;
	char key[PERMIT_KEY_MAX + 1]; /* denied: the quota, also for the holders' cache */
};

/* Sends p (malloc'd; taken over) after one read of the holders of the
 * quota that keeps the claim out: a denied one's p->key, or for a queued
 * one the first of the claim's quotas without room. The answer leaves
 * without the holders when the read fails: the claim's outcome stands. */
void claim_holders_send(struct request *req, struct permit_call *call, struct claim_pending *p);

/* Frees what a call points to; the request frees the call. */
void permit_call_free(void *ctx);
/* The audit trail's actor for a call made through a session. */
void permit_session_actor(struct request *req, char *buf, size_t len);
/* The actor of an admin override: the peer's uid from SO_PEERCRED. */
void permit_operator_actor(struct request *req, char *buf, size_t len);
/* Reads the required, non-empty permit id. */
bool permit_param_id(struct request *req, char **id);
/* Reads a text parameter that must say something (reason, evidence). */
bool permit_param_text(struct request *req, const char *key, bool required, char **out);
/* override: true is for admins only; the reply names why it was refused. */
bool permit_param_override(struct request *req, bool *override);
/* An admin override, audited in the log too: who, which permit, what now. */
void permit_log_override(struct request *req, const char *id, const char *what, const char *state);

#endif
