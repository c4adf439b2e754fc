/*
 * ctl_watch.h — `pgcoordctl watch` (one line per change until interrupted)
 * and `pgcoordctl wait quota KEY --room N` (returns once the quota has that
 * much room), both on the agent's watches (PROTOCOL.md, "Watches").
 */
#ifndef PGCOORD_CTL_WATCH_H
#define PGCOORD_CTL_WATCH_H

#include <stdbool.h>
#include <stdint.h>

/* Exit status of wait when --timeout passed first (0..4 as for every
 * command). */
#define CTL_WAIT_EXIT_TIMEOUT 5

struct ctl_watch_options {
	const char *socket_path;
	int call_timeout_ms; /* connect and each call */
	bool json;	     /* one JSON object per event instead of key=value */
	const char *what;    /* "quota", "permit" or "records" */
	const char *target;  /* its key, id or kind */
	int64_t room;	     /* wait: the room the quota must have */
	int wait_ms;	     /* wait: give up after this long; < 0 waits forever */
};

/*
 * Opens a session, watches the target and prints each notification the
 * agent pushes for it (and about the session or the database) as one line,
 * flushed at once, until SIGINT/SIGTERM (exit 0). The session is closed
 * before returning. Exits 1 when the agent refuses the watch or the session
 * is lost, 3 when the agent cannot be reached, 4 when the connection fails.
 */
int ctl_watch(const struct ctl_watch_options *opt);

/* Watches quota `target` and exits 0 as soon as it exists with room >=
 * opt->room, CTL_WAIT_EXIT_TIMEOUT after wait_ms; otherwise as ctl_watch. */
int ctl_wait(const struct ctl_watch_options *opt);

#endif
