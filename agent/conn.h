/*
 * conn.h — one client connection: framing with limits, peer credentials,
 * output back-pressure, and a lifetime that outlasts the socket while
 * requests it started are still running against the database.
 */
#ifndef PGCOORD_AGENT_CONN_H
#define PGCOORD_AGENT_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/notices.h"
#include "proto/codec.h"

struct agent;
struct session;
struct bufferevent;
struct event;

struct conn {
	struct agent *ag;
	struct conn *next, *prev;
	struct bufferevent *bev;  /* replies that could not be written at once */
	struct event *read_event; /* requests: read straight into rbuf */
	uint64_t id;		  /* for logs */
	uid_t uid;		  /* SO_PEERCRED of the client */
	gid_t gid;
	pid_t pid;
	int inflight; /* requests dispatched and not yet answered */
	int refs;     /* the socket itself holds one; each request one */
	bool closed;  /* the socket is gone; replies are dropped */
	bool closing; /* close once pending output is written */
	struct session *session;
	int64_t lost_session; /* a session that died under this connection */
	/* Input: the bytes from the start of the frame being received on, and
	 * the scanner's place in them, so each byte is examined once. */
	unsigned char *rbuf;
	size_t rpos; /* where the current frame starts */
	size_t rlen; /* bytes held */
	size_t rcap;
	struct pgc_scanner scan;
	/* Deadlines: a begun frame must complete; a connection with nothing to
	 * do (no session, nothing in flight) may not idle forever. */
	uint64_t frame_started_ms; /* 0 while no frame is partly received */
	uint64_t last_active_ms;   /* last byte read or reply queued */
	uint64_t deadline_at_ms;   /* when deadline_timer fires; 0 = not armed */
	struct event *deadline_timer;
};

/* True when the peer may make admin calls and use the admin connection
 * reserve: root, the agent's own user, a uid in admin_uids, or a member of
 * admin_group. */
bool conn_peer_is_admin(const struct agent *ag, uid_t uid, gid_t gid);

/*
 * What a connection hands upward, set by main.c in struct agent: each
 * complete frame to dispatch, and a closing connection to the session
 * registry (its session enters its grace period). conn.c includes
 * neither, so the request path's dependencies point one way.
 */
struct conn_hooks {
	void (*frame)(struct conn *c, const char *data, size_t len);
	void (*closing)(struct agent *ag, struct conn *c);
};

/* Takes ownership of fd. NULL (fd not closed) on failure. */
struct conn *conn_create(struct agent *ag, int fd);

/* Closes the socket now; the struct lives until the last request ends. */
void conn_close(struct conn *c, const char *why);

/* True when the client has hung up, though the loop may not have read the
 * hang-up yet (a reconnect can overtake it). Never blocks. */
bool conn_peer_gone(const struct conn *c);

/* Closes after the queued output (an error reply) is written. */
void conn_close_after_flush(struct conn *c);

void conn_ref(struct conn *c);
void conn_unref(struct conn *c);

/* Queues bytes for the client. Drops a client whose unread output passes
 * max_output_bytes. No-op on a closed connection. */
void conn_send(struct conn *c, const void *data, size_t len);

/* Pushes a notification, its params packed from src by its table
 * (notices.h); src NULL for a table that reads nothing ({}). */
struct reply_src;
void conn_notify(struct conn *c, enum notice_id id, const struct reply_src *src);
/* The same from a C struct alone. */
void conn_notify_struct(struct conn *c, enum notice_id id, const void *view);

#endif
