/*
 * notices.c — see notices.h: the names and params tables of the
 * notifications, in one list.
 */
#include "agent/notices.h"

#include "agent/reply.h"

/* agent.db_down, agent.db_up: {} */
static const struct reply_kind no_params = {NULL, 0};

static const struct {
	const char *method;
	const struct reply_kind *params;
} notices[NOTICE__COUNT] = {
    [NOTICE_LEASE_CHANGED] = {"lease.changed", &lease_changed_params},
    [NOTICE_LEASE_RENEWED] = {"lease.renewed", &lease_renewed_params},
    [NOTICE_SESSION_SUSPENDED] = {"session.suspended", &session_event_params},
    [NOTICE_SESSION_RESTORED] = {"session.restored", &session_event_params},
    [NOTICE_SESSION_LOST] = {"session.lost", &session_lost_params},
    [NOTICE_AGENT_DB_DOWN] = {"agent.db_down", &no_params},
    [NOTICE_AGENT_DB_UP] = {"agent.db_up", &no_params},
    [NOTICE_QUOTA_CHANGED] = {"quota.changed", &quota_changed_params},
    [NOTICE_PERMIT_CHANGED] = {"permit.changed", &permit_changed_params},
    [NOTICE_PERMIT_ADMITTED] = {"permit.admitted", &permit_admitted_params},
    [NOTICE_PERMIT_EXPIRED] = {"permit.expired", &permit_expired_params},
    [NOTICE_RECORD_ORPHANED] = {"record.orphaned", &record_orphaned_params},
};

const char *notice_method(enum notice_id id)
{
	return (unsigned)id < NOTICE__COUNT ? notices[id].method : NULL;
}

const struct reply_kind *notice_params(enum notice_id id)
{
	return (unsigned)id < NOTICE__COUNT ? notices[id].params : NULL;
}
