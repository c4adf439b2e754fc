/*
 * replication.c — judging a server's replication settings; see
 * replication.h.
 */
#include "agent/replication.h"

#include <stdio.h>
#include <string.h>

/* The synchronous_commit levels whose commit waits for the synchronous
 * standby (off and local do not). */
static bool commit_waits_for_standby(const char *level)
{
	return strcmp(level, "on") == 0 || strcmp(level, "remote_write") == 0 ||
	       strcmp(level, "remote_apply") == 0;
}

bool replication_failover_safe(const struct replication_view *v)
{
	return v->checked && !v->in_recovery && v->standby_names[0] != '\0' &&
	       commit_waits_for_standby(v->synchronous_commit);
}

const char *replication_failover_word(const struct replication_view *v)
{
	if (!v->checked)
		return "unknown";
	return replication_failover_safe(v) ? "safe" : "at_risk";
}

void replication_describe(const struct replication_view *v, char *buf, size_t len)
{
	char attached[64];

	if (!v->checked) {
		snprintf(buf, len, "not checked yet (no database connection so far)");
		return;
	}
	if (v->sync_standbys < 0)
		snprintf(attached, sizeof(attached), "attached synchronous standbys unknown");
	else
		snprintf(attached, sizeof(attached), "%d synchronous standby%s attached",
			 v->sync_standbys, v->sync_standbys == 1 ? "" : "s");
	if (v->standby_names[0] == '\0')
		snprintf(buf, len,
			 "%s: synchronous_standby_names is empty, so commits do not wait for a "
			 "standby; acknowledged grants can be lost if a standby is promoted",
			 v->server);
	else if (!commit_waits_for_standby(v->synchronous_commit))
		snprintf(
		    buf, len,
		    "%s: synchronous_commit is %s, so commits do not wait for the "
		    "synchronous standby (%s); acknowledged grants can be lost if a standby is "
		    "promoted",
		    v->server, v->synchronous_commit, v->standby_names);
	else if (v->sync_standbys == 0)
		snprintf(buf, len,
			 "%s: commits wait for a synchronous standby (%s) but none is attached: "
			 "they stall until one is",
			 v->server, v->standby_names);
	else
		snprintf(
		    buf, len,
		    "%s: commits wait for a synchronous standby (synchronous_standby_names %s, "
		    "synchronous_commit %s), %s",
		    v->server, v->standby_names, v->synchronous_commit, attached);
}

bool replication_changed(const struct replication_view *a, const struct replication_view *b)
{
	return a->checked != b->checked || a->in_recovery != b->in_recovery ||
	       a->sync_standbys != b->sync_standbys || strcmp(a->server, b->server) != 0 ||
	       strcmp(a->standby_names, b->standby_names) != 0 ||
	       strcmp(a->synchronous_commit, b->synchronous_commit) != 0;
}

bool replication_notice_is_cancelled_wait(const char *message)
{
	/* "canceling wait for synchronous replication due to user request",
	 * "canceling the wait for synchronous replication and terminating
	 * connection due to administrator command" (src/backend/replication/
	 * syncrep.c); the server's messages are English unless lc_messages
	 * says otherwise, which the agent does not set */
	return message && (strstr(message, "wait for synchronous replication") != NULL);
}
