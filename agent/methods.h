/*
 * methods.h — every RPC handler, by module. dispatch.c maps wire names to
 * these; PROTOCOL.md documents each.
 */
#ifndef PGCOORD_AGENT_METHODS_H
#define PGCOORD_AGENT_METHODS_H

struct request;
struct group_kind;
struct reply_kind;

/* agent_rpc.c */
void rpc_agent_hello(struct request *req);
void rpc_agent_ping(struct request *req);
void rpc_agent_status(struct request *req);
extern const struct reply_kind agent_hello_reply, agent_ping_reply, agent_status_reply;

/* sessions.c */
void rpc_session_open(struct request *req);
void rpc_session_keepalive(struct request *req);
void rpc_session_close(struct request *req);
extern const struct reply_kind session_open_reply, session_keepalive_reply, session_close_reply;

/* leases.c */
void rpc_lease_acquire(struct request *req);
void rpc_lease_release(struct request *req);
void rpc_lease_status(struct request *req);
void rpc_lease_list(struct request *req);
extern const struct reply_kind lease_release_reply, lease_status_reply, lease_list_reply;
/* lease_campaign.c */
extern const struct reply_kind lease_acquire_reply;

/* fleet.c */
void rpc_fleet_agents(struct request *req);
void rpc_fleet_sessions(struct request *req);
extern const struct reply_kind fleet_agents_reply, fleet_sessions_reply;

/* quotas.c */
void rpc_quota_set(struct request *req);
void rpc_quota_get(struct request *req);
void rpc_quota_list(struct request *req);
extern const struct reply_kind quota_set_reply, quota_get_reply, quota_list_reply;

/* quota_why.c */
void rpc_quota_why(struct request *req);
extern const struct reply_kind quota_why_reply;

/* permit_claim.c, permit_lifecycle.c, permit_release.c, permit_reads.c */
void rpc_permit_claim(struct request *req);
void rpc_permit_update(struct request *req);
void rpc_permit_mark_uncertain(struct request *req);
void rpc_permit_resolve(struct request *req);
void rpc_permit_release(struct request *req);
void rpc_permit_get(struct request *req);
void rpc_permit_list(struct request *req);
void rpc_permit_history(struct request *req);
void rpc_permit_check(struct request *req);
void rpc_permit_cancel(struct request *req);
/* how claims and releases are grouped (groups.h) */
extern const struct group_kind permit_claim_group_kind, permit_release_group_kind;
extern const struct group_kind permit_claim_fast_kind, permit_release_fast_kind;
extern const struct reply_kind permit_get_reply, permit_history_reply, permit_check_reply,
    permit_list_reply;
extern const struct reply_kind permit_update_reply, permit_marked_reply, permit_resolved_reply,
    permit_release_reply;
/* permit.claim, one table per answer: permit_claim.c (admitted, held),
 * claim_holders.c (denied, queued; *_unread when the holders' read failed) */
extern const struct reply_kind permit_granted_reply, permit_denied_reply,
    permit_denied_unread_reply, permit_queued_reply, permit_queued_unread_reply;
/* waiters.c */
extern const struct reply_kind permit_cancel_reply;

/* record_writes.c, record_reads.c, record_recovery.c */
void rpc_record_put(struct request *req);
void rpc_record_update(struct request *req);
void rpc_record_settle(struct request *req);
void rpc_record_get(struct request *req);
void rpc_record_list(struct request *req);
void rpc_record_recover(struct request *req);
/* records.c: put; update and settle; get */
extern const struct reply_kind record_put_reply, record_write_reply, record_get_reply,
    record_list_reply;
/* record_recovery.c: liveness read, or not */
extern const struct reply_kind recovery_reply, recovery_unread_reply;

/* watches.c */
void rpc_quota_watch(struct request *req);
void rpc_permit_watch(struct request *req);
void rpc_record_watch(struct request *req);
void rpc_watch_cancel(struct request *req);
extern const struct reply_kind watch_reply, watch_cancel_reply;

#endif
