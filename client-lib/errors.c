/*
 * errors.c — descriptions and retry classes of pgcoord_err. The wire codes
 * (1..99) keep PROTOCOL.md's meanings; the library's own (100+) describe
 * what happened on this side of the socket.
 */
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

const char *pgcoord_strerror(pgcoord_err err)
{
	switch (err) {
	case PGCOORD_OK:
		return "success";
	case PGCOORD_E_INVALID_REQUEST:
		return "the agent could not read the request envelope";
	case PGCOORD_E_METHOD_NOT_FOUND:
		return "the agent has no such method";
	case PGCOORD_E_INVALID_PARAMS:
		return "a parameter is missing, of the wrong type or out of range";
	case PGCOORD_E_UNAVAILABLE:
		return "the database is unavailable; retry with the same ids";
	case PGCOORD_E_TIMEOUT:
		return "the database did not answer in time; outcome unknown, retry with the same "
		       "ids";
	case PGCOORD_E_BUSY:
		return "too many requests in flight on this connection; retry";
	case PGCOORD_E_NOT_FOUND:
		return "the named object does not exist";
	case PGCOORD_E_FORBIDDEN:
		return "this user may not make the call";
	case PGCOORD_E_NO_SESSION:
		return "the call needs a session; open one first";
	case PGCOORD_E_SESSION_EXPIRED:
		return "the session is closed or no longer live";
	case PGCOORD_E_CONFLICT:
		return "the request contradicts existing state";
	case PGCOORD_E_FENCED:
		return "ownership was taken over by another session";
	case PGCOORD_E_SUPERSEDED:
		return "the agent lost its identity to a newer incarnation";
	case PGCOORD_E_SHUTTING_DOWN:
		return "the agent is shutting down; retry against its successor";
	case PGCOORD_E_INTERNAL:
		return "internal error in the agent";
	case PGCOORD_E_TOO_LARGE:
		return "a message or field is over its size limit";
	case PGCOORD_E_CONNECT:
		return "could not connect to the agent's socket";
	case PGCOORD_E_IO:
		return "the connection to the agent failed or was closed";
	case PGCOORD_E_CALL_TIMEOUT:
		return "no reply from the agent in time; outcome unknown";
	case PGCOORD_E_PROTOCOL:
		return "the agent sent something that is not pgcoord MessagePack-RPC";
	case PGCOORD_E_NOMEM:
		return "out of memory";
	case PGCOORD_E_ARG:
		return "invalid argument";
	case PGCOORD_E_CLOSED:
		return "the connection is closed; reconnect";
	case PGCOORD_E_EXPIRED:
		return "the queued claim left the queue unadmitted; nothing is held";
	}
	return "unknown pgcoord error";
}

/*
 * Retrying with the same ids is safe for these because every mutating call
 * is idempotent by its ids (PROTOCOL.md): an unknown outcome (TIMEOUT,
 * CALL_TIMEOUT, IO after the request left) is resolved by the retry finding
 * the original. IO and CALL_TIMEOUT may need a new connection first (and
 * session.open {resume} within the grace period).
 */
bool pgcoord_err_retryable(pgcoord_err err)
{
	switch (err) {
	case PGCOORD_E_UNAVAILABLE:
	case PGCOORD_E_TIMEOUT:
	case PGCOORD_E_BUSY:
	case PGCOORD_E_SHUTTING_DOWN:
	case PGCOORD_E_CALL_TIMEOUT:
	case PGCOORD_E_IO:
		return true;
	default:
		return false;
	}
}

/* The agent's codes keep their wire names (what scripts and docs use). */
const char *pgcoord_err_name(pgcoord_err err)
{
	if ((int)err < 1 || (int)err > 99)
		return NULL;
	return pgc_error_name((enum pgc_error_code)err);
}
