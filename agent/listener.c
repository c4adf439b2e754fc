/*
 * listener.c — see listener.h.
 */
#include "agent/listener.h"

#include <errno.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"

struct listener {
	struct agent *ag;
	struct evconnlistener *ev;
	struct event *resume_timer;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	dev_t dev;
	ino_t ino;
	bool activated; /* the fd came from systemd: the file is not ours */
};

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

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct listener *l = arg;
	(void)fd;
	(void)what;
	evconnlistener_enable(l->ev);
}

static void accept_cb(struct evconnlistener *ev, evutil_socket_t fd, struct sockaddr *sa,
		      int socklen, void *arg)
{
	struct listener *l = arg;
	(void)ev;
	(void)sa;
	(void)socklen;

	if (l->ag->state == AGENT_STOPPING || l->ag->state == AGENT_SUPERSEDED) {
		close(fd);
		return;
	}
	if (l->ag->nconns >= l->ag->cfg.max_connections) {
		log_warn(&l->ag->log, "listener",
			 "refusing a connection: max_connections (%d) reached",
			 l->ag->cfg.max_connections);
		close(fd);
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
	mode_t old_umask;
	int fd;

	l = calloc(1, sizeof(*l));
	if (!l) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->ag = ag;
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
	if (!clear_stale_socket(l->path, err, errlen))
		goto fail;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		goto fail;
	}
	/* no window in which the socket exists with looser permissions */
	old_umask = umask(0177);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		umask(old_umask);
		snprintf(err, errlen, "cannot bind %s: %s", l->path, strerror(errno));
		close(fd);
		goto fail;
	}
	umask(old_umask);
	if (chmod(l->path, (mode_t)ag->cfg.socket_mode) != 0 || lstat(l->path, &st) != 0) {
		snprintf(err, errlen, "cannot set mode of %s: %s", l->path, strerror(errno));
		close(fd);
		unlink(l->path);
		goto fail;
	}
	l->dev = st.st_dev;
	l->ino = st.st_ino;
have_fd:
	l->ev = evconnlistener_new(ag->base, accept_cb, l, LEV_OPT_CLOSE_ON_FREE, 128, fd);
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
	free(l);
}
