/*
 * libpgcoord — the C client of pgcoord-agent.
 *
 * One `pgcoord` handle is one connection to the agent's Unix socket and at
 * most one session. Calls are synchronous and take a timeout; a handle is not
 * thread-safe (use one per thread). Notifications the agent pushes
 * (lease.changed, session.suspended, session.lost, …) are queued while a call
 * waits and handed to the notification callback by pgcoord_poll().
 *
 * ABI rules: the handle is opaque, only pgcoord_* symbols are exported, the
 * error enum is append-only, and no struct crosses the boundary by value.
 */
#ifndef PGCOORD_PGCOORD_H
#define PGCOORD_PGCOORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PGCOORD_DEFAULT_SOCKET "/run/pgcoord/agent.sock"

typedef struct pgcoord pgcoord;

/*
 * Errors. Values 1..99 are the agent's wire error codes (see PROTOCOL.md);
 * values from 100 are raised by the library itself. Append only.
 */
typedef enum pgcoord_err {
	PGCOORD_OK = 0,
	PGCOORD_E_INVALID_REQUEST = 1,
	PGCOORD_E_METHOD_NOT_FOUND = 2,
	PGCOORD_E_INVALID_PARAMS = 3,
	PGCOORD_E_UNAVAILABLE = 4,
	PGCOORD_E_TIMEOUT = 5,
	PGCOORD_E_BUSY = 6,
	PGCOORD_E_NOT_FOUND = 7,
	PGCOORD_E_FORBIDDEN = 8,
	PGCOORD_E_NO_SESSION = 9,
	PGCOORD_E_SESSION_EXPIRED = 10,
	PGCOORD_E_CONFLICT = 11,
	PGCOORD_E_FENCED = 12,
	PGCOORD_E_SUPERSEDED = 13,
	PGCOORD_E_SHUTTING_DOWN = 14,
	PGCOORD_E_INTERNAL = 15,
	PGCOORD_E_TOO_LARGE = 16,

	PGCOORD_E_CONNECT = 100,  /* could not connect to the agent's socket */
	PGCOORD_E_IO = 101,       /* the connection failed or was closed mid-call */
	PGCOORD_E_CALL_TIMEOUT = 102, /* no reply within the call's timeout; outcome unknown */
	PGCOORD_E_PROTOCOL = 103, /* the agent sent something that is not MessagePack-RPC */
	PGCOORD_E_NOMEM = 104,
	PGCOORD_E_ARG = 105,      /* a bad argument to a library function */
	PGCOORD_E_CLOSED = 106,   /* the handle's connection is already closed */
} pgcoord_err;

/* A static, human-readable description of err. Never NULL. */
const char *pgcoord_strerror(pgcoord_err err);

/* True for errors where retrying the same call (same ids) is the right move. */
bool pgcoord_err_retryable(pgcoord_err err);

/*
 * Connects to the agent at socket_path (NULL = PGCOORD_DEFAULT_SOCKET, or
 * $PGCOORD_SOCKET_PATH when set) within timeout_ms. On success *out owns a
 * new handle; release it with pgcoord_close().
 */
pgcoord_err pgcoord_connect(const char *socket_path, int timeout_ms, pgcoord **out);

/* Closes the connection and frees the handle. Accepts NULL. The session, if
 * any, stays resumable on the agent for its grace period. */
void pgcoord_close(pgcoord *c);

/* The agent's (or library's) message for the last failed call on c; "" if none. */
const char *pgcoord_last_message(const pgcoord *c);

/* The socket's file descriptor, to wait for readability in an event loop. */
int pgcoord_fd(const pgcoord *c);

/*
 * The generic call. params is a MessagePack-encoded map (or NULL/0 for no
 * parameters). On PGCOORD_OK, *result (when result is non-NULL) receives a
 * malloc'd MessagePack encoding of the result, to be freed with
 * pgcoord_free(). On an agent error the return is its code and
 * pgcoord_last_message() has its text.
 */
pgcoord_err pgcoord_call(pgcoord *c, const char *method, const void *params, size_t params_len,
			 int timeout_ms, void **result, size_t *result_len);

void pgcoord_free(void *p);

/* --- notifications ---------------------------------------------------- */

/*
 * Called once per pushed notification, from pgcoord_poll() only. params is
 * the MessagePack-encoded params map, valid during the call.
 */
typedef void (*pgcoord_notify_fn)(void *user, const char *method, const void *params,
				  size_t params_len);

void pgcoord_set_notify(pgcoord *c, pgcoord_notify_fn fn, void *user);

/*
 * Delivers queued notifications, then waits up to timeout_ms (0 = do not
 * wait, -1 = forever) for more and delivers those. Returns the number
 * delivered in *delivered (may be NULL). PGCOORD_E_IO when the agent closed
 * the connection.
 */
pgcoord_err pgcoord_poll(pgcoord *c, int timeout_ms, int *delivered);

/* --- agent and session ------------------------------------------------ */

pgcoord_err pgcoord_ping(pgcoord *c, int timeout_ms);

/* Opens a session named name (free text, for operators). *session_id may be NULL. */
pgcoord_err pgcoord_session_open(pgcoord *c, const char *name, int timeout_ms,
				 int64_t *session_id);

/* Re-attaches a session this agent still holds in its grace period. */
pgcoord_err pgcoord_session_resume(pgcoord *c, int64_t session_id, int timeout_ms);

pgcoord_err pgcoord_session_close(pgcoord *c, int timeout_ms);

/* The session this handle has open, or 0. */
int64_t pgcoord_session_id(const pgcoord *c);

#ifdef __cplusplus
}
#endif

#endif
