/*
 * replication.h — what the database server the agent reached says about
 * failover: whether it is a primary, and whether its commits wait for a
 * synchronous standby. Read on every new connection (db.c) and shown to the
 * operator (agent.status, /metrics, /status, a warning in the log).
 *
 * A grant is acknowledged after its commit; if that commit lives only on
 * the primary (no synchronous standby, or synchronous_commit off or local),
 * promoting a standby can lose it. With synchronous_standby_names set and
 * synchronous_commit on, remote_write or remote_apply, the commit returns
 * only once a synchronous standby has it, so a failover to that standby
 * keeps it.
 */
#ifndef PGCOORD_AGENT_REPLICATION_H
#define PGCOORD_AGENT_REPLICATION_H

#include <stdbool.h>
#include <stddef.h>

struct replication_view {
	bool checked;		     /* false until a connection was checked */
	char server[128];	     /* host:port of the server it describes */
	bool in_recovery;	     /* pg_is_in_recovery(): a standby */
	char standby_names[128];     /* synchronous_standby_names */
	char synchronous_commit[16]; /* the agent's effective synchronous_commit */
	int sync_standbys;	     /* attached sync/quorum standbys; -1 unknown */
};

/* True when every acknowledged commit is on a synchronous standby too:
 * synchronous_standby_names is set and synchronous_commit waits for it. */
bool replication_failover_safe(const struct replication_view *v);

/* One line for the log and for clients: why grants are or are not safe on
 * a failover, and whether a synchronous standby is attached. */
void replication_describe(const struct replication_view *v, char *buf, size_t len);

/* The wire and metrics word: "safe", "at_risk", or "unknown" before the
 * first check. */
const char *replication_failover_word(const struct replication_view *v);

/* True when a and b differ in what replication_describe would say. */
bool replication_changed(const struct replication_view *a, const struct replication_view *b);

/* The WARNING PostgreSQL sends when a commit stops waiting for the
 * synchronous standby (a cancel, a statement timeout or a terminated
 * backend): the commit stays, locally, unreplicated. */
bool replication_notice_is_cancelled_wait(const char *message);

#endif
