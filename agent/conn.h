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

struct agent;
struct session;
struct bufferevent;

struct conn {
	struct agent *ag;
	struct conn *next, *prev;
	struct bufferevent *bev;
	uint64_t id; /* for logs */
	uid_t uid;   /* SO_PEERCRED of the client */
	gid_t gid;
	pid_t pid;
	int inflight; /* requests dispatched and not yet answered */
	int refs;     /* the socket itself holds one; each request one */
	bool closed;  /* the socket is gone; replies are dropped */
	bool closing; /* close once pending output is written */
	struct session *session;
	int64_t lost_session; /* a session that died under this connection */
};

/* Takes ownership of fd. NULL (fd not closed) on failure. */
struct conn *conn_create(struct agent *ag, int fd);

/* Closes the socket now; the struct lives until the last request ends. */
void conn_close(struct conn *c, const char *why);

/* Closes after the queued output (an error reply) is written. */
void conn_close_after_flush(struct conn *c);

void conn_ref(struct conn *c);
void conn_unref(struct conn *c);

/* Queues bytes for the client. Drops a client whose unread output passes
 * max_output_bytes. No-op on a closed connection. */
void conn_send(struct conn *c, const void *data, size_t len);

/* Pushes a notification: `fill` packs the params map (NULL = {}). */
struct msgpack_packer;
void conn_notify(struct conn *c, const char *method,
		 void (*fill)(struct msgpack_packer *pk, void *arg), void *arg);

#endif
