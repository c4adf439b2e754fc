/*
 * lease_table.c — the registry the lease files share (lease_registry.h):
 * finding, dropping and freeing its leases, believing, and how a lease is
 * spelled in lease.changed and lease.renewed. It calls no other lease file, so the ones
 * above it (session_order.c, lease_watch.c, lease_campaign.c, leases.c)
 * reach one another only downward.
 */
#include <stdlib.h>
#include <string.h>

#include "agent/conn.h"
#include "agent/lease_belief.h"
#include "agent/lease_registry.h"
#include "agent/leases.h"
#include "agent/reply.h"

struct lease_registry *lease_reg(struct agent *ag)
{
	return ag->leases;
}

struct lease *lease_find(struct agent *ag, const char *name, int64_t session_id)
{
	for (struct lease *l = lease_reg(ag)->leases; l; l = l->next)
		if (!l->dead && l->session_id == session_id && strcmp(l->name, name) == 0)
			return l;
	return NULL;
}

void lease_free(struct lease *l)
{
	if (l->timer)
		event_free(l->timer);
	if (l->belief_timer)
		event_free(l->belief_timer);
	free(l->name);
	free(l);
}

/* Unlinks l; frees it now, or (on the dying list) when its running
 * statement returns. */
void lease_drop(struct lease *l)
{
	struct lease_registry *rg = lease_reg(l->ag);
	struct lease **pp = &rg->leases;
	while (*pp && *pp != l)
		pp = &(*pp)->next;
	if (*pp)
		*pp = l->next;
	evtimer_del(l->timer);
	evtimer_del(l->belief_timer);
	l->dead = true;
	if (!l->in_flight) {
		lease_free(l);
		return;
	}
	l->next = rg->dying;
	rg->dying = l;
}

static const struct reply_col holder_cols[] = {
    REPLY_FIELD("session", REPLY_FIELD_INT, struct lease_holder, session),
    REPLY_FIELD("replica_id", REPLY_FIELD_STR, struct lease_holder, replica_id),
};
const struct reply_kind lease_holder_reply = REPLY_KIND(holder_cols);

/* lease.changed and lease.renewed, as they are sent. */
struct change_view {
	const char *name;
	int64_t epoch;
	bool leader;
	int64_t valid_ms;
	/* the same deadline on the host's CLOCK_MONOTONIC, which a client on
	 * this host shares: it bounds the client's belief even when this
	 * message waited in our output after valid_ms was computed */
	int64_t valid_until_mono_ms;
	int64_t session;
	const struct lease_holder *holder; /* NULL: nobody holds it */
	const char *reason;
};

#define CHANGE(key, type) REPLY_FIELD(#key, type, struct change_view, key)
#define BELIEF                                                                                     \
	CHANGE(name, REPLY_FIELD_STR), CHANGE(epoch, REPLY_FIELD_INT),                             \
	    CHANGE(leader, REPLY_FIELD_BOOL), CHANGE(valid_ms, REPLY_FIELD_INT),                   \
	    CHANGE(valid_until_mono_ms, REPLY_FIELD_INT)

static const struct reply_col changed_cols[] = {
    BELIEF,
    CHANGE(session, REPLY_FIELD_INT),
    REPLY_NESTED_OR_NIL("holder", lease_holder_reply, struct change_view, holder),
    CHANGE(reason, REPLY_FIELD_STR),
};
const struct reply_kind lease_changed_params = REPLY_KIND(changed_cols);

/* a renewal only moves the belief's deadline */
static const struct reply_col renewed_cols[] = {BELIEF};
const struct reply_kind lease_renewed_params = REPLY_KIND(renewed_cols);

void lease_tell(struct conn *c, const struct change_note *n)
{
	uint64_t now = mono_ms();
	bool valid = lease_belief_holds(n->leader, n->l->belief_until, now);
	struct lease_holder h = {n->holder_session, n->holder_replica};
	struct change_view v = {
	    .name = n->l->name,
	    .epoch = n->l->epoch,
	    .leader = n->leader,
	    .valid_ms = valid ? (int64_t)(n->l->belief_until - now) : 0,
	    .valid_until_mono_ms = valid ? (int64_t)n->l->belief_until : 0,
	    .session = n->l->session_id,
	    .holder = n->holder_session ? &h : NULL,
	    .reason = n->reason,
	};

	conn_notify_struct(c, n->renewed ? NOTICE_LEASE_RENEWED : NOTICE_LEASE_CHANGED, &v);
}

bool leases_believes(struct agent *ag, const char *name, int64_t session_id)
{
	struct lease *l = lease_find(ag, name, session_id);
	return l && lease_belief_holds(l->leader, l->belief_until, mono_ms());
}
