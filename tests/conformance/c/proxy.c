/*
 * proxy.c — a Unix-socket relay between a client and its agent, on a
 * thread of its own, that can lose a reply on the way back (the request
 * reached the agent, the answer never reached the client) or cut every
 * connection it carries.
 */
#include "conformance.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_PAIRS 16
#define MAX_DOOMED 8

struct pair {
	int c, a; /* client side, agent side; -1 when free */
	msgpack_unpacker up, down;
	uint64_t doomed[MAX_DOOMED];
	int ndoomed;
};

struct conf_proxy {
	char agent_path[256], path[256];
	int lfd;
	int wake[2];
	pthread_t thread;
	pthread_mutex_t mu;
	char drop_method[128]; /* guarded by mu */
	bool stop;	       /* guarded by mu */
	struct pair pairs[MAX_PAIRS];
};

static int unix_socket(const char *path, bool listening)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (listening ? bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 16) != 0
		      : connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static bool write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

static void pair_close(struct conf_proxy *p, struct pair *pr)
{
	pthread_mutex_lock(&p->mu);
	close(pr->c);
	close(pr->a);
	pr->c = pr->a = -1;
	pthread_mutex_unlock(&p->mu);
	msgpack_unpacker_destroy(&pr->up);
	msgpack_unpacker_destroy(&pr->down);
}

static void accept_one(struct conf_proxy *p)
{
	int c = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC), a;

	if (c < 0)
		return;
	a = unix_socket(p->agent_path, false);
	for (int i = 0; a >= 0 && i < MAX_PAIRS; i++) {
		struct pair *pr = &p->pairs[i];

		if (pr->c >= 0)
			continue;
		msgpack_unpacker_init(&pr->up, 4096);
		msgpack_unpacker_init(&pr->down, 4096);
		pr->ndoomed = 0;
		pthread_mutex_lock(&p->mu);
		pr->c = c;
		pr->a = a;
		pthread_mutex_unlock(&p->mu);
		return;
	}
	close(c);
	if (a >= 0)
		close(a);
}

/* Client → agent: bytes pass unchanged; requests of the method whose reply
 * is to be lost are noted. */
static bool relay_up(struct conf_proxy *p, struct pair *pr)
{
	msgpack_unpacked m;
	ssize_t n;

	if (!msgpack_unpacker_reserve_buffer(&pr->up, 65536))
		return false;
	n = read(pr->c, msgpack_unpacker_buffer(&pr->up), 65536);
	if (n <= 0)
		return false;
	if (!write_all(pr->a, msgpack_unpacker_buffer(&pr->up), (size_t)n))
		return false;
	msgpack_unpacker_buffer_consumed(&pr->up, (size_t)n);
	msgpack_unpacked_init(&m);
	while (msgpack_unpacker_next(&pr->up, &m) == MSGPACK_UNPACK_SUCCESS) {
		const msgpack_object *o = &m.data;

		if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4 ||
		    o->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    o->via.array.ptr[2].type != MSGPACK_OBJECT_STR)
			continue;
		pthread_mutex_lock(&p->mu);
		if (p->drop_method[0] != '\0' &&
		    conf_is_str(&o->via.array.ptr[2], p->drop_method) && pr->ndoomed < MAX_DOOMED) {
			pr->doomed[pr->ndoomed++] = o->via.array.ptr[1].via.u64;
			p->drop_method[0] = '\0';
		}
		pthread_mutex_unlock(&p->mu);
	}
	msgpack_unpacked_destroy(&m);
	return true;
}

/* Agent → client, message by message; a doomed reply ends the pair. */
static bool relay_down(struct pair *pr)
{
	msgpack_unpacked m;
	ssize_t n;
	bool ok = true;

	if (!msgpack_unpacker_reserve_buffer(&pr->down, 65536))
		return false;
	n = read(pr->a, msgpack_unpacker_buffer(&pr->down), 65536);
	if (n <= 0)
		return false;
	msgpack_unpacker_buffer_consumed(&pr->down, (size_t)n);
	msgpack_unpacked_init(&m);
	while (ok && msgpack_unpacker_next(&pr->down, &m) == MSGPACK_UNPACK_SUCCESS) {
		const msgpack_object *o = &m.data;
		size_t len;
		char *bytes;

		if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4 &&
		    conf_is_int(&o->via.array.ptr[0]) && conf_int(&o->via.array.ptr[0]) == 1 &&
		    o->via.array.ptr[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			for (int i = 0; i < pr->ndoomed; i++)
				if (pr->doomed[i] == o->via.array.ptr[1].via.u64)
					ok = false; /* lost on the way back */
		if (!ok)
			break;
		bytes = conf_pack(o, &len);
		ok = write_all(pr->c, bytes, len);
		free(bytes);
	}
	msgpack_unpacked_destroy(&m);
	return ok;
}

static void *proxy_main(void *arg)
{
	struct conf_proxy *p = arg;

	for (;;) {
		struct pollfd fds[2 + 2 * MAX_PAIRS];
		int idx[2 + 2 * MAX_PAIRS];
		nfds_t n = 0;

		pthread_mutex_lock(&p->mu);
		bool stop = p->stop;
		pthread_mutex_unlock(&p->mu);
		if (stop)
			break;
		fds[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
		fds[n++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
		for (int i = 0; i < MAX_PAIRS; i++) {
			if (p->pairs[i].c < 0)
				continue;
			idx[n] = i;
			fds[n++] = (struct pollfd){.fd = p->pairs[i].c, .events = POLLIN};
			idx[n] = i;
			fds[n++] = (struct pollfd){.fd = p->pairs[i].a, .events = POLLIN};
		}
		if (poll(fds, n, -1) < 0)
			continue;
		if (fds[0].revents) {
			char b[16];

			if (read(p->wake[0], b, sizeof(b)) < 0)
				continue;
		}
		if (fds[1].revents & POLLIN)
			accept_one(p);
		for (nfds_t k = 2; k < n; k++) {
			struct pair *pr = &p->pairs[idx[k]];
			bool ok;

			if (fds[k].revents == 0 || pr->c < 0)
				continue;
			ok = fds[k].fd == pr->c ? relay_up(p, pr) : relay_down(pr);
			if (!ok)
				pair_close(p, pr);
		}
	}
	for (int i = 0; i < MAX_PAIRS; i++)
		if (p->pairs[i].c >= 0)
			pair_close(p, &p->pairs[i]);
	return NULL;
}

struct conf_proxy *conf_proxy_start(const char *agent_path, const char *path)
{
	struct conf_proxy *p = calloc(1, sizeof(*p));

	if (p == NULL)
		abort();
	snprintf(p->agent_path, sizeof(p->agent_path), "%s", agent_path);
	snprintf(p->path, sizeof(p->path), "%s", path);
	for (int i = 0; i < MAX_PAIRS; i++)
		p->pairs[i].c = p->pairs[i].a = -1;
	pthread_mutex_init(&p->mu, NULL);
	p->lfd = unix_socket(path, true);
	if (p->lfd < 0 || pipe2(p->wake, O_CLOEXEC) != 0) {
		conf_fail("proxy on %s: %s", path, strerror(errno));
		if (p->lfd >= 0)
			close(p->lfd);
		free(p);
		return NULL;
	}
	if (pthread_create(&p->thread, NULL, proxy_main, p) != 0)
		abort();
	return p;
}

const char *conf_proxy_path(const struct conf_proxy *p)
{
	return p->path;
}

void conf_proxy_drop_reply(struct conf_proxy *p, const char *method)
{
	pthread_mutex_lock(&p->mu);
	snprintf(p->drop_method, sizeof(p->drop_method), "%s", method);
	pthread_mutex_unlock(&p->mu);
}

void conf_proxy_cut(struct conf_proxy *p)
{
	/* shutdown, not close: the relay thread sees the end and closes. */
	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < MAX_PAIRS; i++)
		if (p->pairs[i].c >= 0) {
			shutdown(p->pairs[i].c, SHUT_RDWR);
			shutdown(p->pairs[i].a, SHUT_RDWR);
		}
	pthread_mutex_unlock(&p->mu);
}

void conf_proxy_stop(struct conf_proxy *p)
{
	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_mutex_unlock(&p->mu);
	if (write(p->wake[1], "x", 1) < 0)
		perror("proxy wake");
	pthread_join(p->thread, NULL);
	close(p->lfd);
	close(p->wake[0]);
	close(p->wake[1]);
	unlink(p->path);
	pthread_mutex_destroy(&p->mu);
	free(p);
}
