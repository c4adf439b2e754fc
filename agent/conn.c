/*
 * conn.c — see conn.h.
 */
#include "agent/conn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/dispatch.h"
#include "agent/sessions.h"
#include "proto/codec.h"

static void conn_free(struct conn *c)
{
	free(c);
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
	sessions_detach(ag, c);
	bufferevent_free(c->bev);
	c->bev = NULL;
	if (c->prev)
		c->prev->next = c->next;
	else
		ag->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	ag->nconns--;
	conn_unref(c);
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
	bufferevent_disable(c->bev, EV_READ);
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
	evbuffer_add(out, data, len);
}

void conn_notify(struct conn *c, const char *method,
		 void (*fill)(struct msgpack_packer *pk, void *arg), void *arg)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	if (c->closed)
		return;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_notify_begin(&pk, method);
	if (fill)
		fill(&pk, arg);
	else
		msgpack_pack_map(&pk, 0);
	conn_send(c, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
}

/* Answers a framing failure and closes: after a bad frame the stream
 * position is unknowable, so nothing later on it can be trusted. */
static void framing_error(struct conn *c, enum pgc_scan_result r)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char msg[160];
	enum pgc_error_code code =
	    r == PGC_SCAN_MALFORMED ? PGC_E_INVALID_REQUEST : PGC_E_TOO_LARGE;

	if (r == PGC_SCAN_TOO_BIG)
		snprintf(msg, sizeof(msg), "message larger than max_message_bytes (%d)",
			 c->ag->cfg.max_message_bytes);
	else if (r == PGC_SCAN_TOO_DEEP)
		snprintf(msg, sizeof(msg), "message nested deeper than max_depth (%d)",
			 c->ag->cfg.max_depth);
	else
		snprintf(msg, sizeof(msg), "bytes that are not MessagePack");
	log_write(&c->ag->log, LOG_LEVEL_WARN, "conn", NULL, "closing conn %llu: %s",
		  (unsigned long long)c->id, msg);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_response_error(&pk, 0, pgc_error_name(code), msg, false);
	conn_send(c, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	conn_close_after_flush(c);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	conn_ref(c); /* dispatching may close c */
	while (!c->closed && !c->closing) {
		size_t len = evbuffer_get_length(in);
		size_t frame_len = 0;
		unsigned char *data;
		enum pgc_scan_result r;

		if (len == 0)
			break;
		data = evbuffer_pullup(in, (ev_ssize_t)len);
		r = pgc_frame_scan(data, len, (size_t)c->ag->cfg.max_message_bytes,
				   (unsigned)c->ag->cfg.max_depth, &frame_len);
		if (r == PGC_SCAN_NEED_MORE)
			break;
		if (r != PGC_SCAN_COMPLETE) {
			framing_error(c, r);
			break;
		}
		dispatch_frame(c, (const char *)data, frame_len);
		if (!c->closed)
			evbuffer_drain(in, frame_len);
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
	bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	c->next = ag->conns;
	if (ag->conns)
		ag->conns->prev = c;
	ag->conns = c;
	ag->nconns++;
	return c;
}
