/*
 * listener.c — see listener.h.
 */
#include "agent/listener.h"

#include <errno.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "proto/codec.h"

struct listener {
	struct agent *ag;
	struct evconnlistener *ev;
	struct event *resume_timer;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	dev_t dev;
	ino_t ino;
	bool activated; /* the fd came from systemd: the file is not ours */
	int lock_fd;	/* flock on <socket_path>.lock, held for the process's life */
	int backlog;	/* what listen() was last given */
	/* refusals are logged at most once per REFUSAL_LOG_MS, with a count */
	uint64_t refusal_logged_ms;
	unsigned refusals_unlogged;
};

#define REFUSAL_LOG_MS 10000

/*
 * Decides what to do about an existing file at the socket path: a live
 * agent answering there means we must not steal its path; a socket nobody
 * answers on is a leftover of a crash and may be replaced.
 */
static bool clear_stale_socket(const char *path, char *err, size_t errlen)
{
	struct stat st;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	if (lstat(path, &st) != 0)
		return true;
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen,
			 "%s exists and is not a socket; remove it or choose another "
			 "socket_path",
			 path);
		return false;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return false;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(fd);
		snprintf(err, errlen,
			 "another agent is serving on %s; stop it first or choose another "
			 "socket_path",
			 path);
		return false;
	}
	close(fd);
	if (unlink(path) != 0 && errno != ENOENT) {
		snprintf(err, errlen, "cannot replace stale socket %s: %s", path, strerror(errno));
		return false;
	}
	return true;
}

/*
 * Two agents started at once on one path would both find no live socket and
 * the second would unlink the first's fresh one. An exclusive flock on
 * <socket_path>.lock, held until the process exits, serialises them: only
 * its holder may replace or remove the socket. The lock file is never
 * removed (a removed lock file lets two processes lock different files); it
 * holds the holder's pid for the error message.
 */
static bool take_path_lock(struct listener *l, char *err, size_t errlen)
{
	char lock_path[sizeof(l->path) + 8], pid[32];
	ssize_t n;

	snprintf(lock_path, sizeof(lock_path), "%s.lock", l->path);
	l->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (l->lock_fd < 0) {
		snprintf(err, errlen, "cannot open lock file %s: %s", lock_path, strerror(errno));
		return false;
	}
	if (flock(l->lock_fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		n = pread(l->lock_fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		if (e == EWOULDBLOCK)
			snprintf(
			    err, errlen,
			    "another agent is serving on %s (pid %s holds %s); stop it first or "
			    "choose another socket_path",
			    l->path, pid[0] ? pid : "unknown", lock_path);
		else
			snprintf(err, errlen, "cannot lock %s: %s", lock_path, strerror(e));
		return false;
	}
	n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (ftruncate(l->lock_fd, 0) != 0 || pwrite(l->lock_fd, pid, (size_t)n, 0) != n)
		log_warn(&l->ag->log, "listener", "cannot write the pid into %s: %s", lock_path,
			 strerror(errno));
	return true;
}

/*
 * Binds with a umask that leaves exactly socket_mode, so the socket never
 * exists with other permissions and no chmod by path (which would follow a
 * symlink put in its place) is needed. Should the file system not honour
 * the umask (a default ACL on the directory), the mode is set with
 * fchmodat(AT_SYMLINK_NOFOLLOW), which refuses a symlink.
 */
static bool bind_with_mode(struct listener *l, int fd, const struct sockaddr_un *sa,
			   struct stat *st, char *err, size_t errlen)
{
	mode_t mode = (mode_t)l->ag->cfg.socket_mode & 0777;
	mode_t old_umask = umask(~mode & 0777);
	int rc = bind(fd, (const struct sockaddr *)sa, sizeof(*sa));
	int e = errno;

	umask(old_umask);
	if (rc != 0) {
		snprintf(err, errlen, "cannot bind %s: %s", l->path, strerror(e));
		return false;
	}
	if (lstat(l->path, st) != 0 || !S_ISSOCK(st->st_mode)) {
		snprintf(err, errlen, "%s is not the socket just bound", l->path);
		return false;
	}
	if ((st->st_mode & 07777) != mode &&
	    (fchmodat(AT_FDCWD, l->path, mode, AT_SYMLINK_NOFOLLOW) != 0 ||
	     lstat(l->path, st) != 0)) {
		snprintf(err, errlen, "cannot set mode of %s: %s", l->path, strerror(errno));
		unlink(l->path); /* ours: bound a moment ago under our lock */
		return false;
	}
	return true;
}

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct listener *l = arg;
	(void)fd;
	(void)what;
	evconnlistener_enable(l->ev);
}

/* Logs a refused connection, at most once every REFUSAL_LOG_MS, so a client
 * reconnecting in a loop cannot flood the log. */
static void log_refusal(struct listener *l, const char *why)
{
	uint64_t now = mono_ms();

	if (l->refusal_logged_ms != 0 && now - l->refusal_logged_ms < REFUSAL_LOG_MS) {
		l->refusals_unlogged++;
		return;
	}
	if (l->refusals_unlogged > 0)
		log_warn(&l->ag->log, "listener",
			 "refusing a connection: %s (and %u other refusals in the last %d s)", why,
			 l->refusals_unlogged, REFUSAL_LOG_MS / 1000);
	else
		log_warn(&l->ag->log, "listener", "refusing a connection: %s", why);
	l->refusal_logged_ms = now;
	l->refusals_unlogged = 0;
}

/*
 * Tells a refused client why in one error frame (msgid 0) before closing. A
 * fresh socket's send buffer is empty, so the few bytes go out without
 * blocking; if they do not, the close alone still refuses.
 */
static void refuse(struct listener *l, int fd, const char *why)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	log_refusal(l, why);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_response_error(&pk, 0, pgc_error_name(PGC_E_BUSY), why,
				pgc_error_retryable(PGC_E_BUSY));
	(void)send(fd, sb.data, sb.size, MSG_DONTWAIT | MSG_NOSIGNAL);
	msgpack_sbuffer_destroy(&sb);
	close(fd);
}

/*
 * Whether this peer may have one more connection: admins may use every slot
 * of max_connections and are not counted per uid; others may use all but
 * the admin reserve, and at most max_connections_per_uid each. On refusal
 * why says which limit.
 */
static bool admit(struct agent *ag, int fd, char *why, size_t whylen)
{
	const struct config *cfg = &ag->cfg;
	struct ucred cred;
	socklen_t credlen = sizeof(cred);
	int same_uid = 0;

	if (ag->nconns >= cfg->max_connections) {
		snprintf(why, whylen, "max_connections (%d) reached", cfg->max_connections);
		return false;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
		snprintf(why, whylen, "cannot read the peer's credentials: %s", strerror(errno));
		return false;
	}
	if (conn_peer_is_admin(ag, cred.uid, cred.gid))
		return true;
	/* at least one slot stays open to everyone */
	int reserve = cfg->admin_connection_reserve < cfg->max_connections
			  ? cfg->admin_connection_reserve
			  : cfg->max_connections - 1;
	if (ag->nconns >= cfg->max_connections - reserve) {
		snprintf(why, whylen,
			 "uid %u: only the %d slots of admin_connection_reserve are left of "
			 "max_connections (%d)",
			 (unsigned)cred.uid, reserve, cfg->max_connections);
		return false;
	}
	for (const struct conn *c = ag->conns; c; c = c->next)
		if (c->uid == cred.uid)
			same_uid++;
	if (same_uid >= cfg->max_connections_per_uid) {
		snprintf(why, whylen, "uid %u already has %d connections (max_connections_per_uid)",
			 (unsigned)cred.uid, same_uid);
		return false;
	}
	return true;
}

static void accept_cb(struct evconnlistener *ev, evutil_socket_t fd, struct sockaddr *sa,
		      int socklen, void *arg)
{
	struct listener *l = arg;
	char why[200];
	(void)ev;
	(void)sa;
	(void)socklen;

	if (l->ag->state == AGENT_STOPPING || l->ag->state == AGENT_SUPERSEDED) {
		close(fd);
		return;
	}
	if (!admit(l->ag, fd, why, sizeof(why))) {
		refuse(l, fd, why);
		return;
	}
	if (!conn_create(l->ag, fd))
		close(fd);
}

/* Out of file descriptors (or another accept failure): pause accepting for a
 * moment instead of spinning on a listener that stays readable. */
static void accept_error_cb(struct evconnlistener *ev, void *arg)
{
	struct listener *l = arg;
	struct timeval tv = {1, 0};
	log_warn(&l->ag->log, "listener", "accept failed: %s; pausing for 1 s", strerror(errno));
	evconnlistener_disable(ev);
	evtimer_add(l->resume_timer, &tv);
}

static void make_parent_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		/* systemd's RuntimeDirectory normally made it; this is for
		 * hand-run agents. An error surfaces at bind. */
		(void)mkdir(dir, 0755);
	}
}

/* net.core.somaxconn, the kernel's cap on any listen backlog; 0 when unknown. */
static int somaxconn(void)
{
	FILE *f = fopen("/proc/sys/net/core/somaxconn", "re");
	int v = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%d", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

/* Says so when the kernel queues fewer connects than listen_backlog asks:
 * a burst beyond the cap gets EAGAIN, whatever the option says. */
static void warn_if_capped(struct listener *l, int backlog)
{
	int cap = somaxconn();

	if (cap > 0 && backlog > cap)
		log_warn(&l->ag->log, "listener",
			 "listen_backlog %d is capped at %d by net.core.somaxconn; raise that "
			 "(sysctl net.core.somaxconn=%d) to queue larger bursts of connections",
			 backlog, cap, backlog);
}

bool listener_set_backlog(struct listener *l, int backlog)
{
	if (backlog == l->backlog)
		return true;
	if (listen(evconnlistener_get_fd(l->ev), backlog) != 0) {
		log_warn(&l->ag->log, "listener", "cannot set listen_backlog to %d: %s", backlog,
			 strerror(errno));
		return false;
	}
	l->backlog = backlog;
	warn_if_capped(l, backlog);
	return true;
}

#define SD_LISTEN_FDS_START 3

/*
 * The socket systemd passed (sd_listen_fds(3)), checked to be what
 * socket_path names: returns its fd, -1 when the agent was not socket
 * activated, -2 (err set) when what was passed is unusable. The LISTEN_*
 * variables are removed so no child could mistake them for its own.
 */
static int activated_socket(struct agent *ag, char *err, size_t errlen)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	struct sockaddr_un sa;
	socklen_t salen = sizeof(sa);
	int fd = SD_LISTEN_FDS_START, type = 0, listening = 0;
	socklen_t optlen = sizeof(int);

	if (!pid || !fds || atol(pid) != (long)getpid())
		return -1;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (atoi(fds) < 1)
		return -1;
	if (atoi(fds) > 1)
		log_warn(&ag->log, "listener",
			 "systemd passed %s sockets; using the first, closing none", fds);
	memset(&sa, 0, sizeof(sa));
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &optlen) != 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
		snprintf(err, errlen, "socket activation: fd 3 is not a socket: %s",
			 strerror(errno));
		return -2;
	}
	if (sa.sun_family != AF_UNIX || type != SOCK_STREAM || !listening) {
		snprintf(err, errlen,
			 "socket activation: fd 3 is not a listening stream Unix socket; use "
			 "ListenStream=%s in the .socket unit",
			 ag->cfg.socket_path);
		return -2;
	}
	if (strncmp(sa.sun_path, ag->cfg.socket_path, sizeof(sa.sun_path)) != 0) {
		snprintf(err, errlen,
			 "socket activation: systemd passed a socket bound to %.108s but "
			 "socket_path is %s; make ListenStream= and socket_path agree",
			 sa.sun_path, ag->cfg.socket_path);
		return -2;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
		snprintf(err, errlen, "socket activation: fcntl: %s", strerror(errno));
		return -2;
	}
	return fd;
}

struct listener *listener_create(struct agent *ag, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct listener *l;
	struct stat st;
	int fd;

	l = calloc(1, sizeof(*l));
	if (!l) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->ag = ag;
	l->lock_fd = -1;
	snprintf(l->path, sizeof(l->path), "%s", ag->cfg.socket_path);
	memcpy(sa.sun_path, l->path, strlen(l->path) + 1); /* fits: validated */

	fd = activated_socket(ag, err, errlen);
	if (fd == -2)
		goto fail;
	if (fd >= 0) {
		/* mode and owner are the .socket unit's (SocketMode=, SocketGroup=) */
		l->activated = true;
		log_info(&ag->log, "listener", "using the socket systemd passed on %s", l->path);
		goto have_fd;
	}
	make_parent_dir(l->path);
	if (!take_path_lock(l, err, errlen) || !clear_stale_socket(l->path, err, errlen))
		goto fail;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		goto fail;
	}
	if (!bind_with_mode(l, fd, &sa, &st, err, errlen)) {
		close(fd);
		goto fail;
	}
	l->dev = st.st_dev;
	l->ino = st.st_ino;
have_fd:
	/* listen() again on systemd's socket only changes its backlog */
	l->ev = evconnlistener_new(ag->base, accept_cb, l, LEV_OPT_CLOSE_ON_FREE,
				   ag->cfg.listen_backlog, fd);
	l->resume_timer = evtimer_new(ag->base, resume_cb, l);
	if (!l->ev || !l->resume_timer) {
		snprintf(err, errlen, "cannot listen on %s", l->path);
		if (!l->ev)
			close(fd);
		if (!l->activated)
			unlink(l->path);
		goto fail;
	}
	evconnlistener_set_error_cb(l->ev, accept_error_cb);
	l->backlog = ag->cfg.listen_backlog;
	warn_if_capped(l, l->backlog);
	return l;
fail:
	listener_destroy(l);
	return NULL;
}

void listener_destroy(struct listener *l)
{
	struct stat st;
	if (!l)
		return;
	if (l->ev) {
		evconnlistener_free(l->ev);
		/* a successor may already have bound the path: leave its socket;
		 * an activated socket's file is systemd's */
		if (!l->activated && lstat(l->path, &st) == 0 && st.st_dev == l->dev &&
		    st.st_ino == l->ino)
			unlink(l->path);
	}
	if (l->resume_timer)
		event_free(l->resume_timer);
	/* after the unlink, so a successor waiting on the lock finds the path free */
	if (l->lock_fd >= 0)
		close(l->lock_fd);
	free(l);
}
