/*
 * transport.c — the Unix socket under a handle: connect with a deadline,
 * write everything with a deadline, wait for input. Knows nothing about
 * MessagePack.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "handle.h"

int64_t pgcoord__now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t pgcoord__deadline(int timeout_ms)
{
	if (timeout_ms < 0)
		return -1;
	return pgcoord__now_ms() + timeout_ms;
}

int pgcoord__remaining(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t left = deadline - pgcoord__now_ms();
	if (left <= 0)
		return 0;
	return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

/* poll() one fd for events by deadline, restarting on EINTR with the time left. */
static pgcoord_err wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd pfd = {.fd = fd, .events = events};
		int n = poll(&pfd, 1, pgcoord__remaining(deadline));
		if (n > 0)
			return PGCOORD_OK; /* POLLERR/POLLHUP: the next syscall reports it */
		if (n == 0)
			return PGCOORD_E_CALL_TIMEOUT;
		if (errno != EINTR)
			return PGCOORD_E_IO;
	}
}

pgcoord_err pgcoord__sock_wait_readable(int fd, int64_t deadline)
{
	return wait_fd(fd, POLLIN, deadline);
}

/*
 * The next pause between connects refused with EAGAIN: 1 ms doubling to
 * CONNECT_BACKOFF_MAX_MS, each drawn at random from its upper half, so a
 * fleet restarting together does not retry in step.
 */
#define CONNECT_BACKOFF_MAX_MS 50

static int connect_backoff_ms(int *step, unsigned *seed)
{
	int ceiling = *step;

	if (*step < CONNECT_BACKOFF_MAX_MS)
		*step = *step * 2 > CONNECT_BACKOFF_MAX_MS ? CONNECT_BACKOFF_MAX_MS : *step * 2;
	*seed = *seed * 1103515245u + 12345u;
	return ceiling - (int)((*seed >> 16) % (unsigned)(ceiling / 2 + 1));
}

/* connect() until done or deadline; returns 0 or the errno that stopped it
 * (ETIMEDOUT when the deadline came first). */
static int connect_by(int fd, const struct sockaddr_un *sun, int64_t deadline)
{
	int step = 1;
	unsigned seed = (unsigned)getpid() ^ (unsigned)pgcoord__now_ms() ^ (unsigned)fd << 16;

	for (;;) {
		if (connect(fd, (const struct sockaddr *)sun, sizeof(*sun)) == 0)
			return 0;
		int e = errno;
		if (e == EINPROGRESS) {
			pgcoord_err w = wait_fd(fd, POLLOUT, deadline);
			if (w == PGCOORD_E_CALL_TIMEOUT)
				return ETIMEDOUT;
			if (w != PGCOORD_OK)
				return errno;
			socklen_t elen = sizeof(e);
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) < 0)
				return errno;
			return e;
		}
		if (e == EINTR)
			continue;
		if (e == EISCONN)
			return 0; /* the interrupted connect went through */
		if (e != EAGAIN)
			return e; /* ENOENT, ECONNREFUSED, EACCES: no agent to wait for */
		/*
		 * The agent's accept queue (listen_backlog) is full: a burst of
		 * connects it has not caught up with. A Unix socket cannot be
		 * polled for that to change, so retry until the deadline.
		 */
		int left = pgcoord__remaining(deadline);
		if (left == 0)
			return ETIMEDOUT;
		int ms = connect_backoff_ms(&step, &seed);
		if (left > 0 && left < ms)
			ms = left;
		struct timespec nap = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
		while (nanosleep(&nap, &nap) != 0 && errno == EINTR)
			;
	}
}

pgcoord_err pgcoord__sock_connect(const char *path, int64_t deadline, int *fd_out, char *msg,
				  size_t msglen)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	size_t plen = strlen(path);

	*fd_out = -1;
	if (plen == 0 || plen >= sizeof(sun.sun_path)) {
		snprintf(msg, msglen, "socket path %s (%zu bytes, at most %zu)",
			 plen ? "too long" : "empty", plen, sizeof(sun.sun_path) - 1);
		errno = plen ? ENAMETOOLONG : EINVAL;
		return PGCOORD_E_ARG;
	}
	memcpy(sun.sun_path, path, plen + 1);

	/* Non-blocking from the start: every later wait is a poll() with a deadline. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		int e = errno;
		snprintf(msg, msglen, "socket: %s", strerror(e));
		errno = e;
		return PGCOORD_E_CONNECT;
	}
	int e = connect_by(fd, &sun, deadline);
	if (e != 0) {
		snprintf(msg, msglen, "connect to %s: %s", path,
			 e == ETIMEDOUT ? "timed out" : strerror(e));
		close(fd);
		errno = e;
		return PGCOORD_E_CONNECT;
	}
	*fd_out = fd;
	return PGCOORD_OK;
}

pgcoord_err pgcoord__sock_send(int fd, const char *buf, size_t len, int64_t deadline, size_t *sent)
{
	*sent = 0;
	while (*sent < len) {
		/* MSG_NOSIGNAL: a dead agent must give EPIPE, not kill the caller. */
		ssize_t n = send(fd, buf + *sent, len - *sent, MSG_NOSIGNAL);
		if (n > 0) {
			*sent += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			pgcoord_err err = wait_fd(fd, POLLOUT, deadline);
			if (err != PGCOORD_OK)
				return err;
			continue;
		}
		return PGCOORD_E_IO;
	}
	return PGCOORD_OK;
}
