/*
 * conn.c — see conn.h.
 */
#include "agent/conn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <msgpack.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/reply.h"
#include "proto/codec.h"

/* Below this a drained read buffer is kept for the next frame. */
#define RBUF_KEEP 65536
#define RBUF_MIN 4096

static void conn_free(struct conn *c)
{
	free(c->rbuf);
	free(c);
}

bool conn_peer_is_admin(const struct agent *ag, uid_t uid, gid_t gid)
{
	if (uid == 0 || uid == geteuid())
		return true;
	return uid_set_has(&ag->cfg.admins, uid, gid);
}

void conn_ref(struct conn *c)
{
	c->refs++;
}

void conn_unref(struct conn *c)
{
	if (--c->refs == 0)
		conn_free(c);
}

void conn_close(struct conn *c, const char *why)
{
	struct agent *ag = c->ag;
	char kv[64];

	if (c->closed)
		return;
	c->closed = true;
	snprintf(kv, sizeof(kv), "conn=%llu", (unsigned long long)c->id);
	log_write(&ag->log, LOG_LEVEL_DEBUG, "conn", kv, "closed: %s", why);
	if (ag->conn_hooks)
		ag->conn_hooks->closing(ag, c);
	event_free(c->read_event);
	c->read_event = NULL;
	bufferevent_free(c->bev);
	c->bev = NULL;
	event_free(c->deadline_timer);
	c->deadline_timer = NULL;
	free(c->rbuf);
	c->rbuf = NULL;
	c->rpos = c->rlen = c->rcap = 0;
	if (c->prev)
		c->prev->next = c->next;
	else
		ag->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	ag->nconns--;
	conn_unref(c);
}

bool conn_peer_gone(const struct conn *c)
{
	struct pollfd p = {.events = POLLRDHUP};

	if (c->closed || !c->bev)
		return true;
	p.fd = bufferevent_getfd(c->bev);
	if (p.fd < 0)
		return true;
	/* POLLRDHUP: the peer closed or shut down its side; whatever it sent
	 * before that can no longer be answered to anyone who reads it. */
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	if (c->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		conn_close(c, "closed after an unrecoverable framing error");
}

void conn_close_after_flush(struct conn *c)
{
	if (c->closed)
		return;
	c->closing = true;
	event_del(c->read_event);
	write_cb(c->bev, c);
}

void conn_send(struct conn *c, const void *data, size_t len)
{
	struct evbuffer *out;
	char kv[64];

	if (c->closed)
		return;
	out = bufferevent_get_output(c->bev);
	if (evbuffer_get_length(out) + len > (size_t)c->ag->cfg.max_output_bytes) {
		snprintf(kv, sizeof(kv), "conn=%llu", (unsigned long long)c->id);
		log_write(&c->ag->log, LOG_LEVEL_WARN, "conn", kv,
			  "dropping a client that does not read its replies (over "
			  "max_output_bytes=%d)",
			  c->ag->cfg.max_output_bytes);
		conn_close(c, "output limit");
		return;
	}
	if (evbuffer_get_length(out) == 0) {
		/* Nothing queued before it: written now, which is almost always
		 * all of it, instead of arming a write event for the next turn of
		 * the loop (two epoll_ctl calls and an epoll_wait per reply).
		 * What does not fit, or fails, goes through the buffer, whose
		 * write reports the error. */
		ssize_t n = send(bufferevent_getfd(c->bev), data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			data = (const char *)data + n;
			len -= (size_t)n;
		}
	}
	if (len > 0)
		evbuffer_add(out, data, len);
	c->last_active_ms = mono_ms();
}

void conn_notify(struct conn *c, enum notice_id id, const struct reply_src *src)
{
	static const struct reply_src none = {0};
	msgpack_sbuffer sb;
	msgpack_packer pk;

	if (c->closed)
		return;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_notify_begin(&pk, notice_method(id));
	reply_pack(&pk, notice_params(id), src ? src : &none);
	conn_send(c, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
}

void conn_notify_struct(struct conn *c, enum notice_id id, const void *view)
{
	struct reply_src src = {.c = view};

	conn_notify(c, id, &src);
}

/* Sends one error with msgid 0 and closes once it is written; a client
 * that never reads it is dropped at the next partial-frame deadline. */
static void send_error_and_close(struct conn *c, enum pgc_error_code code, const char *msg)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_response_error(&pk, 0, pgc_error_name(code), msg, pgc_error_retryable(code));
	conn_ref(c); /* a reply written at once closes c here: keep it to look */
	conn_send(c, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	conn_close_after_flush(c);
	if (!c->closed) {
		int ms = c->ag->cfg.partial_frame_timeout_ms;
		struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
		c->deadline_at_ms = mono_ms() + (uint64_t)ms;
		evtimer_add(c->deadline_timer, &tv);
	}
	conn_unref(c);
}

/* Answers a framing failure and closes: after a bad frame the stream
 * position is unknowable, so nothing later on it can be trusted. */
static void framing_error(struct conn *c, enum pgc_scan_result r)
{
	char msg[160];
	enum pgc_error_code code =
	    r == PGC_SCAN_MALFORMED ? PGC_E_INVALID_REQUEST : PGC_E_TOO_LARGE;

	if (r == PGC_SCAN_TOO_MANY)
		snprintf(msg, sizeof(msg),
			 "message holds more than max_message_objects (%d) objects",
			 c->ag->cfg.max_message_objects);
	else if (r == PGC_SCAN_TOO_BIG)
		snprintf(msg, sizeof(msg), "message larger than max_message_bytes (%d)",
			 c->ag->cfg.max_message_bytes);
	else if (r == PGC_SCAN_TOO_DEEP)
		snprintf(msg, sizeof(msg), "message nested deeper than max_depth (%d)",
			 c->ag->cfg.max_depth);
	else
		snprintf(msg, sizeof(msg), "bytes that are not MessagePack");
	char kv[64] = "";
	log_kv_int(kv, sizeof(kv), "conn", (long long)c->id);
	log_kv_int(kv, sizeof(kv), "uid", c->uid);
	log_write(&c->ag->log, LOG_LEVEL_WARN, "conn", kv, "closing: %s", msg);
	send_error_and_close(c, code, msg);
}

static bool idle_expired(const struct conn *c, uint64_t now)
{
	int idle = c->ag->cfg.idle_timeout_ms;
	return idle > 0 && !c->session && c->inflight == 0 && c->frame_started_ms == 0 &&
	       now - c->last_active_ms >= (uint64_t)idle;
}

/*
 * Arms the one timer for whichever deadline comes first. The idle deadline
 * moves with every byte, so the timer is only moved earlier here; firing
 * early just re-arms it, which keeps a busy connection from touching the
 * timer heap on every read.
 */
static void arm_deadline(struct conn *c, uint64_t now)
{
	uint64_t due = 0;
	int idle = c->ag->cfg.idle_timeout_ms;

	if (c->closed || c->closing)
		return;
	if (c->frame_started_ms)
		due = c->frame_started_ms + (uint64_t)c->ag->cfg.partial_frame_timeout_ms;
	if (idle > 0) {
		/* a busy connection is looked at again one idle period from now */
		uint64_t at = c->last_active_ms + (uint64_t)idle;
		if (at <= now)
			at = now + (uint64_t)idle;
		if (due == 0 || at < due)
			due = at;
	}
	if (due == 0 || (c->deadline_at_ms != 0 && c->deadline_at_ms <= due))
		return;
	uint64_t wait = due > now ? due - now : 0;
	struct timeval tv = {(time_t)(wait / 1000), (suseconds_t)(wait % 1000) * 1000};
	c->deadline_at_ms = due;
	evtimer_add(c->deadline_timer, &tv);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	uint64_t now = mono_ms();
	char kv[96], msg[160];
	(void)fd;
	(void)what;

	c->deadline_at_ms = 0;
	if (c->closed)
		return;
	if (c->closing) {
		conn_close(c, "its last error reply was not read in time");
		return;
	}
	snprintf(kv, sizeof(kv), "conn=%llu uid=%u", (unsigned long long)c->id, (unsigned)c->uid);
	if (c->frame_started_ms &&
	    now - c->frame_started_ms >= (uint64_t)c->ag->cfg.partial_frame_timeout_ms) {
		snprintf(msg, sizeof(msg),
			 "request incomplete after %d ms (%zu bytes received; "
			 "partial_frame_timeout_ms)",
			 c->ag->cfg.partial_frame_timeout_ms, c->rlen - c->rpos);
		log_write(&c->ag->log, LOG_LEVEL_WARN, "conn", kv, "closing: %s", msg);
		send_error_and_close(c, PGC_E_INVALID_REQUEST, msg);
		return;
	}
	if (idle_expired(c, now)) {
		log_write(&c->ag->log, LOG_LEVEL_INFO, "conn", kv,
			  "closing: no session and no request for %d ms (idle_timeout_ms)",
			  c->ag->cfg.idle_timeout_ms);
		conn_close(c, "idle");
		return;
	}
	arm_deadline(c, now);
}

/*
 * Makes room for `more` bytes after the held ones, first moving the current
 * frame's bytes to the front. What is moved arrived in the same read as a
 * frame that just completed, so every byte is moved at most once.
 */
static bool rbuf_reserve(struct conn *c, size_t more)
{
	if (c->rpos > 0) {
		memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
		c->rlen -= c->rpos;
		c->rpos = 0;
	}
	if (c->rcap - c->rlen >= more)
		return true;
	size_t cap = c->rcap ? c->rcap : RBUF_MIN;
	while (cap - c->rlen < more)
		cap *= 2;
	unsigned char *p = realloc(c->rbuf, cap);
	if (!p)
		return false;
	c->rbuf = p;
	c->rcap = cap;
	return true;
}

/* After a frame: an empty buffer starts over, a large one is given back. */
static void rbuf_settle(struct conn *c)
{
	if (c->rpos < c->rlen)
		return;
	c->rpos = c->rlen = 0;
	if (c->rcap > RBUF_KEEP) {
		free(c->rbuf);
		c->rbuf = NULL;
		c->rcap = 0;
	}
}

/*
 * Reads what the socket holds into rbuf with one recv() when it fits (the
 * usual request), instead of the bufferevent's ioctl(FIONREAD) and readv()
 * and a copy out of its buffer. False when the connection was closed.
 */
static bool read_some(struct conn *c, int fd, size_t limit, bool *more)
{
	size_t held = c->rlen - c->rpos;
	/* room for one more small request: rbuf_reserve doubles the buffer
	 * when there is less, so a large frame still comes in a few reads.
	 * Not room for all that is held: a byte dribbled into a large partial
	 * frame would then be read with a recv() of half a megabyte, which
	 * costs in proportion under the sanitizers. */
	size_t want = RBUF_MIN;

	if (held >= limit) { /* the scanner has said TOO_BIG by now */
		*more = false;
		return true;
	}
	if (want > limit - held)
		want = limit - held;
	if (!rbuf_reserve(c, want)) {
		log_error(&c->ag->log, "conn", "conn %llu: out of memory for input",
			  (unsigned long long)c->id);
		conn_close(c, "out of memory");
		return false;
	}
	/* all the room there is, within the one-frame limit */
	size_t room = c->rcap - c->rlen;
	if (room > limit - held)
		room = limit - held;
	ssize_t n;
	do
		n = recv(fd, c->rbuf + c->rlen, room, 0);
	while (n < 0 && errno == EINTR);
	if (n == 0) {
		conn_close(c, "client closed the connection");
		return false;
	}
	if (n < 0) {
		*more = false;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return true;
		conn_close(c, strerror(errno));
		return false;
	}
	c->rlen += (size_t)n;
	/* a stream recv stops short of room only when it emptied the socket */
	*more = (size_t)n == room;
	return true;
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	/* one byte past the largest frame is the scanner's proof of TOO_BIG, so
	 * no more than that is ever held for one frame */
	size_t limit = (size_t)c->ag->cfg.max_message_bytes + 1;
	uint64_t now = mono_ms();
	bool more = true, unscanned = false;
	(void)what;

	conn_ref(c); /* dispatching may close c */
	c->last_active_ms = now;
	while (!c->closed && !c->closing) {
		size_t frame_len = 0;
		enum pgc_scan_result r = PGC_SCAN_NEED_MORE;

		if (unscanned)
			r = pgc_scanner_feed(&c->scan, c->rbuf + c->rpos, c->rlen - c->rpos,
					     &frame_len);
		if (r == PGC_SCAN_COMPLETE) {
			c->frame_started_ms = 0;
			c->ag->conn_hooks->frame(c, (const char *)c->rbuf + c->rpos, frame_len);
			if (c->closed)
				break;
			c->rpos += frame_len;
			rbuf_settle(c);
			unscanned = c->rpos < c->rlen;
			continue;
		}
		if (r != PGC_SCAN_NEED_MORE) {
			framing_error(c, r);
			break;
		}
		/* held bytes, not rlen: read_some may move them to the front */
		size_t held = c->rlen - c->rpos;
		if (!more || !read_some(c, fd, limit, &more))
			break;
		unscanned = c->rlen - c->rpos > held;
	}
	if (!c->closed && !c->closing) {
		if (c->rlen > c->rpos && c->frame_started_ms == 0)
			c->frame_started_ms = now;
		arm_deadline(c, now);
	}
	conn_unref(c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;
	(void)bev;
	if (what & BEV_EVENT_EOF)
		conn_close(c, "client closed the connection");
	else if (what & BEV_EVENT_ERROR)
		conn_close(c, strerror(EVUTIL_SOCKET_ERROR()));
}

struct conn *conn_create(struct agent *ag, int fd)
{
	struct conn *c = calloc(1, sizeof(*c));
	struct ucred cred;
	socklen_t credlen = sizeof(cred);

	if (!c)
		return NULL;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
		free(c);
		return NULL;
	}
	evutil_make_socket_nonblocking(fd);
	c->bev = bufferevent_socket_new(ag->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!c->bev) {
		free(c);
		return NULL;
	}
	c->ag = ag;
	c->id = ++ag->next_conn_id;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->pid = cred.pid;
	c->refs = 1;
	c->deadline_timer = evtimer_new(ag->base, deadline_cb, c);
	c->read_event = event_new(ag->base, fd, EV_READ | EV_PERSIST, read_cb, c);
	if (!c->deadline_timer || !c->read_event || event_add(c->read_event, NULL) != 0) {
		if (c->read_event)
			event_free(c->read_event);
		if (c->deadline_timer)
			event_free(c->deadline_timer);
		bufferevent_setfd(c->bev, -1); /* the caller still owns fd */
		bufferevent_free(c->bev);
		free(c);
		return NULL;
	}
	pgc_scanner_init(&c->scan, (size_t)ag->cfg.max_message_bytes, (unsigned)ag->cfg.max_depth,
			 (size_t)ag->cfg.max_message_objects);
	c->last_active_ms = mono_ms();
	/* the bufferevent only writes what a reply could not send at once
	 * (conn_send); requests are read by read_cb straight into rbuf */
	bufferevent_setcb(c->bev, NULL, write_cb, event_cb, c);
	bufferevent_disable(c->bev, EV_READ);
	bufferevent_enable(c->bev, EV_WRITE);
	c->next = ag->conns;
	if (ag->conns)
		ag->conns->prev = c;
	ag->conns = c;
	ag->nconns++;
	arm_deadline(c, c->last_active_ms);
	return c;
}
