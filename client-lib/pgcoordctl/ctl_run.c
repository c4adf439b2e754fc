/*
 * ctl_run.c — see ctl_run.h. One loop on ppoll with a short tick: it asks
 * pgcoord_lease_is_leader() on every turn, so a deadline that passes while
 * the agent says nothing (frozen, its database gone) stops CMD on time
 * without any message. Signals are blocked except inside ppoll, where their
 * handlers only raise flags.
 */
#include "ctl_run.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl_msgpack.h"

/* After SIGKILL, how long to wait for the group to vanish before exiting
 * anyway (a process stuck in the kernel cannot be helped by waiting). */
#define RUN_REAP_MAX_MS 2000
/* Farewell calls (release, session close) to an agent that may be frozen. */
#define RUN_FAREWELL_MAX_MS 1000

/* Set by the handlers, which run only inside ppoll. */
static volatile sig_atomic_t signal_seen;

static void on_signal(int sig)
{
	signal_seen = sig;
}

static void on_child(int sig)
{
	(void)sig; /* only wakes ppoll: the loop reaps every turn */
}

enum run_state {
	RUN_CAMPAIGNING, /* CMD not started */
	RUN_LEADING,	 /* CMD running, belief holds */
	RUN_STOPPING,	 /* SIGTERM sent to the group; SIGKILL at kill_at */
};

enum stop_cause {
	STOP_LOST,	 /* belief ended: exit 5 */
	STOP_SIGNAL,	 /* pgcoordctl was told to stop: CMD's status */
	STOP_CMD_EXITED, /* CMD ended by itself: its status */
};

struct run {
	const struct ctl_run_opts *o;
	pgcoord *c;
	int grace_ms;
	sigset_t orig_mask; /* restored in CMD */
	enum run_state state;
	enum stop_cause cause;
	pid_t pid; /* CMD, also its process group */
	bool cmd_ended;
	int cmd_status; /* wait status */
	int64_t kill_at;
	bool killed;
	bool session_lost;
	int64_t keepalive_at; /* CLOCK_MONOTONIC ms of the next session.keepalive; 0: none */
	char why[300];	      /* why belief ended, as the agent put it */
};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
	va_list ap;
	fputs("pgcoordctl: run: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Keeps the agent's own words for why leadership or the session ended. */
static void on_notify(void *user, const char *method, const void *params, size_t len)
{
	struct run *r = user;
	msgpack_unpacked u;
	size_t off = 0;
	const char *reason = "", *name = "";
	size_t rlen = 0, nlen = 0;
	bool leader = true;
	int64_t safe_ms = 0;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		msgpack_unpacked_destroy(&u);
		return;
	}
	ctl_obj_str(ctl_map_get(&u.data, "reason"), &reason, &rlen);
	if (strcmp(method, "lease.changed") == 0 &&
	    ctl_obj_str(ctl_map_get(&u.data, "name"), &name, &nlen) &&
	    strlen(r->o->lease) == nlen && memcmp(name, r->o->lease, nlen) == 0 &&
	    ctl_obj_bool(ctl_map_get(&u.data, "leader"), &leader) && !leader)
		snprintf(r->why, sizeof(r->why), "the agent ended leadership: %.*s", (int)rlen,
			 reason);
	else if (strcmp(method, "session.lost") == 0) {
		r->session_lost = true;
		snprintf(r->why, sizeof(r->why), "the session was lost: %.*s", (int)rlen, reason);
	} else if (strcmp(method, "session.suspended") == 0) {
		ctl_obj_int64(ctl_map_get(&u.data, "safe_ms"), &safe_ms);
		say("the agent cannot heartbeat; the session is lost in %" PRId64
		    " ms unless it recovers",
		    safe_ms);
	} else if (strcmp(method, "session.restored") == 0)
		say("the agent heartbeats again");
	msgpack_unpacked_destroy(&u);
}

static const char *signal_name(int sig)
{
	switch (sig) {
	case SIGTERM:
		return "SIGTERM";
	case SIGINT:
		return "SIGINT";
	case SIGHUP:
		return "SIGHUP";
	default:
		return "a signal";
	}
}

/* --- CMD and its process group ------------------------------------------ */

static bool group_alive(const struct run *r)
{
	return r->pid > 0 && (kill(-r->pid, 0) == 0 || errno == EPERM);
}

/* Reaps every child (CMD's orphans come to us: we are their subreaper). */
static void reap(struct run *r)
{
	int st;
	pid_t p;
	while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
		if (p == r->pid) {
			r->cmd_ended = true;
			r->cmd_status = st;
		}
	}
}

static int status_code(int st)
{
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return CTL_RUN_EXIT_REFUSED;
}

static bool start_cmd(struct run *r, char **argv)
{
	char epoch[24];
	pid_t parent = getpid();

	snprintf(epoch, sizeof(epoch), "%" PRId64, pgcoord_lease_epoch(r->c, r->o->lease));
	if (setenv("PGCOORD_LEASE", r->o->lease, 1) != 0 ||
	    setenv("PGCOORD_LEASE_EPOCH", epoch, 1) != 0) {
		say("cannot set CMD's environment: %s", strerror(errno));
		return false;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		say("cannot fork CMD: %s", strerror(errno));
		return false;
	}
	if (pid == 0) {
		struct sigaction dfl = {.sa_handler = SIG_DFL};
		setpgid(0, 0);
		/* Best effort if pgcoordctl itself is SIGKILLed: CMD goes too
		 * (its own children are then beyond reach). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(CTL_RUN_EXIT_LOST);
		sigaction(SIGCHLD, &dfl, NULL);
		sigaction(SIGTERM, &dfl, NULL);
		sigaction(SIGINT, &dfl, NULL);
		sigaction(SIGHUP, &dfl, NULL);
		sigprocmask(SIG_SETMASK, &r->orig_mask, NULL);
		execvp(argv[0], argv);
		int e = errno;
		fprintf(stderr, "pgcoordctl: run: cannot execute %s: %s\n", argv[0], strerror(e));
		_exit(e == ENOENT ? 127 : 126);
	}
	/* Both sides set the group, so signals to it work whoever runs first. */
	setpgid(pid, pid);
	r->pid = pid;
	r->state = RUN_LEADING;
	say("leading lease \"%s\" (epoch %s): started %s as pid %d", r->o->lease, epoch, argv[0],
	    (int)pid);
	return true;
}

/* SIGTERM to what is left of CMD's group; SIGKILL follows at kill_at. */
static void stop_group(struct run *r, enum stop_cause cause, const char *why)
{
	r->cause = cause;
	r->state = RUN_STOPPING;
	r->kill_at = now_ms() + r->grace_ms;
	if (group_alive(r)) {
		say("%s: stopping CMD (SIGTERM to process group %d, SIGKILL in %d ms)", why,
		    (int)r->pid, r->grace_ms);
		kill(-r->pid, SIGTERM);
	} else {
		say("%s; CMD has already ended", why);
	}
}

/* --- the agent ------------------------------------------------------------ */

/* Hands the lease back and closes the session, briefly: the agent may be
 * the reason we stop (frozen, shutting down). */
static void farewell(struct run *r)
{
	int t = r->o->timeout_ms < RUN_FAREWELL_MAX_MS ? r->o->timeout_ms : RUN_FAREWELL_MAX_MS;
	if (!r->c || pgcoord_fd(r->c) < 0 || r->session_lost || pgcoord_session_id(r->c) == 0)
		return;
	if (pgcoord_lease_release(r->c, r->o->lease, t, NULL) == PGCOORD_OK)
		(void)pgcoord_session_close(r->c, t);
}

static int call_failed(struct run *r, const char *what, pgcoord_err err)
{
	const char *msg = r->c ? pgcoord_last_message(r->c) : "";
	say("%s: %s%s%s", what, pgcoord_strerror(err), *msg ? ": " : "", msg);
	switch (err) {
	case PGCOORD_E_CONNECT:
		return CTL_RUN_EXIT_NOAGENT;
	case PGCOORD_E_IO:
	case PGCOORD_E_CLOSED:
	case PGCOORD_E_CALL_TIMEOUT:
	case PGCOORD_E_PROTOCOL:
		return CTL_RUN_EXIT_IO;
	default:
		return CTL_RUN_EXIT_REFUSED;
	}
}

/*
 * Connects, opens the session and starts the campaign; then checks the
 * kill grace against the margin of the ttl the agent applies.
 */
static int campaign(struct run *r)
{
	char name[300];
	pgcoord_err err = pgcoord_connect(r->o->socket_path, r->o->timeout_ms, &r->c);
	if (err != PGCOORD_OK) {
		int e = errno;
		say("cannot connect to the agent at %s: %s",
		    r->o->socket_path ? r->o->socket_path : "(default)",
		    err == PGCOORD_E_CONNECT ? strerror(e) : pgcoord_strerror(err));
		return err == PGCOORD_E_CONNECT ? CTL_RUN_EXIT_NOAGENT : CTL_RUN_EXIT_USAGE;
	}
	pgcoord_set_notify(r->c, on_notify, r);
	snprintf(name, sizeof(name), "pgcoordctl run --lease %s", r->o->lease);
	err = pgcoord_set_session_keepalive(r->c, r->o->keepalive_ms);
	if (err != PGCOORD_OK) {
		say("--keepalive: %s", pgcoord_last_message(r->c));
		return CTL_RUN_EXIT_USAGE;
	}
	err = pgcoord_session_open(r->c, name, r->o->timeout_ms, NULL);
	if (err != PGCOORD_OK)
		return call_failed(r, "session.open", err);
	if (r->o->keepalive_ms)
		r->keepalive_at = now_ms() + r->o->keepalive_ms / 3;
	struct pgcoord_lease_opts lo = PGCOORD_LEASE_OPTS_INIT;
	lo.ttl_ms = r->o->ttl_ms;
	lo.wait = true;
	err = pgcoord_lease_acquire_with(r->c, r->o->lease, &lo, r->o->timeout_ms, NULL, NULL);
	if (err != PGCOORD_OK)
		return call_failed(r, "lease.acquire", err);

	int64_t ttl = pgcoord_lease_ttl_ms(r->c, r->o->lease);
	int64_t margin = ttl / 3;
	if (ttl <= 0) {
		say("the agent did not say which ttl it applies to lease \"%s\"; give --ttl",
		    r->o->lease);
		farewell(r);
		return CTL_RUN_EXIT_USAGE;
	}
	if (r->o->kill_grace_ms < 0) {
		r->grace_ms = (int)(margin / 2);
	} else if (r->o->kill_grace_ms >= margin) {
		say("--kill-grace %d ms does not fit the safety margin of lease \"%s\": with ttl "
		    "%" PRId64 " ms, leadership ends %" PRId64
		    " ms before another host can take over, and CMD must be dead by then; give "
		    "less, or a longer --ttl",
		    r->o->kill_grace_ms, r->o->lease, ttl, margin);
		farewell(r);
		return CTL_RUN_EXIT_USAGE;
	} else {
		r->grace_ms = r->o->kill_grace_ms;
	}
	if (!pgcoord_lease_is_leader(r->c, r->o->lease))
		say("campaigning for lease \"%s\" (ttl %" PRId64 " ms)", r->o->lease, ttl);
	return -1;
}

/* --- the loop ------------------------------------------------------------- */

static int finish(struct run *r, int code)
{
	farewell(r);
	pgcoord_close(r->c);
	r->c = NULL;
	return code;
}

/*
 * session.keepalive from this loop, so the session lives only while the
 * loop turns. The call is bounded so it cannot hold the loop past the
 * local deadline: a late answer closes the handle, which ends belief.
 */
static void keep_alive(struct run *r)
{
	int64_t now = now_ms();
	if (!r->keepalive_at || now < r->keepalive_at || r->session_lost || pgcoord_fd(r->c) < 0)
		return;
	int64_t t = r->o->keepalive_ms / 3;
	if (t > r->o->timeout_ms)
		t = r->o->timeout_ms;
	if (r->state == RUN_LEADING) {
		int64_t left = pgcoord_lease_valid_ms(r->c, r->o->lease);
		if (left < t)
			t = left;
	}
	pgcoord_err err = pgcoord_session_keepalive(r->c, t > 0 ? (int)t : 1, NULL);
	if (err == PGCOORD_E_SESSION_EXPIRED || err == PGCOORD_E_NO_SESSION) {
		r->session_lost = true;
		if (!r->why[0])
			snprintf(r->why, sizeof(r->why), "the session was lost: %s",
				 pgcoord_last_message(r->c));
	} else if (err != PGCOORD_OK) {
		say("session.keepalive: %s", pgcoord_last_message(r->c));
	}
	r->keepalive_at = now_ms() + r->o->keepalive_ms / 3;
}

/* One turn of the state machine; returns an exit status when done, else -1. */
static int step(struct run *r, char **argv)
{
	int sig = signal_seen;

	signal_seen = 0;
	reap(r);
	if (pgcoord_fd(r->c) >= 0)
		(void)pgcoord_poll(r->c, 0, NULL); /* a failure closes the handle */
	keep_alive(r);
	bool leader = !r->session_lost && pgcoord_lease_is_leader(r->c, r->o->lease);
	bool connected = pgcoord_fd(r->c) >= 0;
	if (!connected && !r->why[0])
		snprintf(r->why, sizeof(r->why), "the connection to the agent failed: %s",
			 pgcoord_last_message(r->c));

	switch (r->state) {
	case RUN_CAMPAIGNING:
		if (sig)
			return finish(r, 128 + sig);
		if (!connected) {
			say("%s", r->why);
			return finish(r, CTL_RUN_EXIT_NOAGENT);
		}
		if (r->session_lost) {
			say("%s", r->why);
			return finish(r, CTL_RUN_EXIT_LOST);
		}
		if (leader && !start_cmd(r, argv))
			return finish(r, CTL_RUN_EXIT_REFUSED);
		return -1;
	case RUN_LEADING:
		if (!leader) {
			if (!r->why[0])
				snprintf(
				    r->why, sizeof(r->why),
				    "the local deadline passed with no renewal from the agent");
			stop_group(r, STOP_LOST, r->why);
		} else if (r->cmd_ended) {
			say("CMD exited with status %d", status_code(r->cmd_status));
			stop_group(r, STOP_CMD_EXITED, "CMD's process group outlived it");
		} else if (sig) {
			char why[64];
			snprintf(why, sizeof(why), "got %s", signal_name(sig));
			stop_group(r, STOP_SIGNAL, why);
		}
		return -1;
	case RUN_STOPPING:
		break;
	}

	/* Stopping: leadership may end meanwhile; the SIGKILL time stands. */
	int64_t now = now_ms();
	if (!r->killed && (now >= r->kill_at || sig) && group_alive(r)) {
		say("SIGKILL to process group %d", (int)r->pid);
		kill(-r->pid, SIGKILL);
		r->killed = true;
		r->kill_at = now;
	}
	bool settled = r->cmd_ended && !group_alive(r);
	if (!settled && !(r->killed && now >= r->kill_at + RUN_REAP_MAX_MS))
		return -1;
	if (!r->cmd_ended) {
		say("CMD (pid %d) did not die within %d ms of SIGKILL; giving up on it",
		    (int)r->pid, RUN_REAP_MAX_MS);
		r->cmd_status = SIGKILL; /* a wait status: killed by SIGKILL */
	}
	if (r->cause == STOP_LOST) {
		say("leadership of \"%s\" lost; CMD stopped (its status: %d)", r->o->lease,
		    status_code(r->cmd_status));
		return finish(r, CTL_RUN_EXIT_LOST);
	}
	return finish(r, status_code(r->cmd_status));
}

static int wait_ms(struct run *r)
{
	int64_t t = CTL_RUN_TICK_MS;
	if (r->state == RUN_LEADING && r->c) {
		/* wake right at the deadline, not up to a tick after it */
		int64_t left = pgcoord_lease_valid_ms(r->c, r->o->lease);
		if (left < t)
			t = left;
	} else if (r->state == RUN_STOPPING && !r->killed) {
		int64_t left = r->kill_at - now_ms();
		if (left < t)
			t = left;
	}
	if (r->keepalive_at && r->keepalive_at - now_ms() < t)
		t = r->keepalive_at - now_ms();
	return t < 0 ? 0 : (int)t;
}

int ctl_run(const struct ctl_run_opts *o, char **argv)
{
	struct run r = {.o = o, .state = RUN_CAMPAIGNING, .grace_ms = 0};
	struct sigaction sa = {.sa_handler = on_signal}, sc = {.sa_handler = on_child};
	sigset_t block, waitmask;
	int rc;

	/* Signals arrive only inside ppoll, so no check-then-wait race. */
	sigemptyset(&block);
	sigaddset(&block, SIGCHLD);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	sigprocmask(SIG_BLOCK, &block, &r.orig_mask);
	waitmask = r.orig_mask;
	sigdelset(&waitmask, SIGCHLD);
	sigdelset(&waitmask, SIGTERM);
	sigdelset(&waitmask, SIGINT);
	sigdelset(&waitmask, SIGHUP);
	sigemptyset(&sa.sa_mask);
	sigemptyset(&sc.sa_mask);
	sc.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGCHLD, &sc, NULL);
	/* CMD's orphans are reparented to us, so its whole group can be
	 * reaped and waited for. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);

	rc = campaign(&r);
	if (rc >= 0) {
		pgcoord_close(r.c);
		return rc;
	}
	for (;;) {
		rc = step(&r, argv);
		if (rc >= 0)
			return rc;
		struct pollfd pfd = {.fd = pgcoord_fd(r.c), .events = POLLIN};
		int ms = wait_ms(&r);
		struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
		if (ppoll(&pfd, pfd.fd >= 0 ? 1 : 0, &ts, &waitmask) < 0 && errno != EINTR) {
			say("ppoll: %s", strerror(errno));
			nanosleep(&ts, NULL);
		}
	}
}
