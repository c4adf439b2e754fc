/*
 * notices.h — every notification the agent pushes, by name, with the
 * table its params are packed from (reply.h). conn_notify takes one of
 * these, so a notification cannot go out under a name or with params
 * that are not declared here; unit-dispatch holds each table to the
 * params of its row in proto/PROTOCOL.md ("Notifications").
 */
#ifndef PGCOORD_AGENT_NOTICES_H
#define PGCOORD_AGENT_NOTICES_H

#include <stddef.h>

struct reply_kind;

enum notice_id {
	NOTICE_LEASE_CHANGED,
	NOTICE_LEASE_RENEWED,
	NOTICE_SESSION_SUSPENDED,
	NOTICE_SESSION_RESTORED,
	NOTICE_SESSION_LOST,
	NOTICE_AGENT_DB_DOWN,
	NOTICE_AGENT_DB_UP,
	NOTICE_QUOTA_CHANGED,
	NOTICE_PERMIT_CHANGED,
	NOTICE_PERMIT_ADMITTED,
	NOTICE_PERMIT_EXPIRED,
	NOTICE_RECORD_ORPHANED,
	NOTICE__COUNT
};

/* The wire name ("quota.changed"), and the table of its params. */
const char *notice_method(enum notice_id id);
const struct reply_kind *notice_params(enum notice_id id);

/* The params tables, next to the code that fills their sources. */
/* lease_table.c */
extern const struct reply_kind lease_changed_params, lease_renewed_params;
/* identity.c: session.suspended and session.restored */
extern const struct reply_kind session_event_params;
/* sessions.c */
extern const struct reply_kind session_lost_params;
/* watches.c */
extern const struct reply_kind quota_changed_params, permit_changed_params, record_orphaned_params;
/* waiters.c */
extern const struct reply_kind permit_admitted_params, permit_expired_params;

#endif
