/*
 * ctl_run.h — `pgcoordctl run --lease NAME -- CMD [ARGS…]`: run a command
 * only while this host's session leads a lease, and stop it before any
 * other host can lead.
 */
#ifndef PGCOORD_CTL_RUN_H
#define PGCOORD_CTL_RUN_H

/* Exit status of run besides CMD's own (see ctl_run). */
enum ctl_run_exit {
	CTL_RUN_EXIT_REFUSED = 1, /* the agent refused the lease, or CMD could not be forked */
	CTL_RUN_EXIT_USAGE = 2,	  /* also: --kill-grace does not fit the safety margin */
	CTL_RUN_EXIT_NOAGENT = 3, /* cannot reach the agent, or lost it before leading */
	CTL_RUN_EXIT_IO = 4,	  /* a call timed out or failed before leadership was won */
	CTL_RUN_EXIT_LOST = 5,	  /* leadership (or the campaigning session) was lost */
};

/* The loop's tick: how late, at most, a deadline that passes in silence is
 * noticed (the wait is also cut at the deadline itself). */
#define CTL_RUN_TICK_MS 50

struct ctl_run_opts {
	const char *socket_path;
	int timeout_ms;	   /* connect and per-call */
	const char *lease; /* name */
	int ttl_ms;	   /* 0: the agent's lease_ttl_ms */
	int kill_grace_ms; /* SIGTERM → SIGKILL; -1: half the safety margin */
	int keepalive_ms;  /* session keepalive_ms, sent from the loop; 0: none */
};

/*
 * Opens a session, campaigns for o->lease (lease.acquire wait=true), and
 * once it leads, runs argv (execvp, in a process group of its own, with
 * PGCOORD_LEASE and PGCOORD_LEASE_EPOCH in its environment) for as long as
 * pgcoord_lease_is_leader() holds. When belief ends — lease.changed
 * leader=false, the local deadline passing in silence, session.lost, the
 * connection failing — CMD's process group gets SIGTERM, then SIGKILL
 * kill_grace_ms later; the grace must be smaller than the safety margin
 * (ttl/3: the agent's belief ends that long before the row can expire for
 * another host), so the group is dead before anyone else can lead.
 * When CMD exits by itself, or pgcoordctl gets SIGTERM/SIGINT/SIGHUP, the
 * rest of its group is stopped the same way, the lease handed back and the
 * session closed.
 *
 * With o->keepalive_ms the session is opened with that keepalive_ms and
 * the loop itself calls session.keepalive every third of it: when
 * pgcoordctl hangs, the agent lets the lease lapse and another host can
 * lead. (A frozen pgcoordctl cannot stop CMD: CMD should fence its writes
 * with PGCOORD_LEASE_EPOCH.)
 *
 * Returns the exit status: CMD's own when it ended by itself or after
 * pgcoordctl passed on a signal (128+n when signal n killed it), otherwise
 * a ctl_run_exit, or 128+n when signal n stopped pgcoordctl before CMD ran.
 */
int ctl_run(const struct ctl_run_opts *o, char **argv);

#endif
