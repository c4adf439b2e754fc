/*
 * client.c — one scenario client: a libpgcoord handle plus what an
 * application must do around it by PROTOCOL.md's rules, which libpgcoord
 * leaves to its caller: reconnect and resume the session after a broken
 * connection, retry claims and releases with the same id while the answer
 * is retryable, and release an id given up after an unknown outcome.
 */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETRY_PAUSE_MS 100

static const char *const wire_codes[] = {
    NULL,
    "invalid_request",
    "method_not_found",
    "invalid_params",
    "unavailable",
    "timeout",
    "busy",
    "not_found",
    "forbidden",
    "no_session",
    "session_expired",
    "conflict",
    "fenced",
    "superseded",
    "shutting_down",
    "internal",
    "too_large",
};

const char *conf_err_code(pgcoord_err err)
{
	if (err > 0 && (size_t)err < sizeof(wire_codes) / sizeof(wire_codes[0]))
		return wire_codes[err];
	switch (err) {
	case PGCOORD_OK:
		return "ok";
	case PGCOORD_E_CONNECT:
		return "connect";
	case PGCOORD_E_IO:
		return "io";
	case PGCOORD_E_CALL_TIMEOUT:
		return "call_timeout";
	case PGCOORD_E_PROTOCOL:
		return "protocol";
	case PGCOORD_E_NOMEM:
		return "nomem";
	case PGCOORD_E_ARG:
		return "arg";
	case PGCOORD_E_CLOSED:
		return "closed";
	default:
		return "unknown";
	}
}

/* The call may have taken effect: the agent could not say, or its answer
 * was never read. */
static bool outcome_unknown(pgcoord_err err)
{
	return err == PGCOORD_E_TIMEOUT || err == PGCOORD_E_UNAVAILABLE ||
	       err == PGCOORD_E_CALL_TIMEOUT || err == PGCOORD_E_IO;
}

void conf_client_init(struct conf_client *cl, const char *path)
{
	memset(cl, 0, sizeof(*cl));
	snprintf(cl->path, sizeof(cl->path), "%s", path);
}

void conf_client_close(struct conf_client *cl)
{
	pgcoord_close(cl->h);
	cl->h = NULL;
}

/* A live handle: a connection found broken (pgcoord_poll says so without
 * waiting) is replaced, and the session resumed on the new one. A resume
 * answered conflict (the agent still sees the old connection) or a
 * retryable error is asked again, within the call timeout. */
pgcoord_err conf_client_ensure(struct conf_client *cl)
{
	pgcoord_err err;
	int64_t end;

	if (cl->h != NULL && pgcoord_fd(cl->h) >= 0) {
		err = pgcoord_poll(cl->h, 0, NULL);
		if (err == PGCOORD_OK)
			return PGCOORD_OK;
	}
	pgcoord_close(cl->h);
	cl->h = NULL;
	err = pgcoord_connect(cl->path, CONF_CALL_TIMEOUT_MS, &cl->h);
	if (err != PGCOORD_OK) {
		snprintf(cl->message, sizeof(cl->message), "connect %s: %s", cl->path,
			 pgcoord_strerror(err));
		return err;
	}
	if (cl->session == 0)
		return PGCOORD_OK;
	end = conf_now_ms() + CONF_CALL_TIMEOUT_MS;
	for (;;) {
		err = pgcoord_session_resume(cl->h, cl->session, CONF_CALL_TIMEOUT_MS);
		if (err == PGCOORD_OK) {
			cl->resumed = true;
			return PGCOORD_OK;
		}
		snprintf(cl->message, sizeof(cl->message), "resuming session %lld: %s",
			 (long long)cl->session, pgcoord_last_message(cl->h));
		if (err == PGCOORD_E_IO || err == PGCOORD_E_CLOSED) {
			pgcoord_close(cl->h);
			cl->h = NULL;
			return err;
		}
		if ((!pgcoord_err_retryable(err) && err != PGCOORD_E_CONFLICT) ||
		    conf_now_ms() + RETRY_PAUSE_MS >= end) {
			if (!pgcoord_err_retryable(err) && err != PGCOORD_E_CONFLICT)
				cl->session = 0; /* the agent will not give it back */
			return err;
		}
		conf_sleep_ms(RETRY_PAUSE_MS);
	}
}

/* result as an object in zone (nil when the call answered none). */
static bool unpack_into(msgpack_zone *z, const void *res, size_t len, msgpack_object *out)
{
	size_t off = 0;
	char *copy;

	out->type = MSGPACK_OBJECT_NIL;
	if (res == NULL || len == 0)
		return true;
	/* Strings of the object point into the bytes unpacked: keep them in zone. */
	copy = msgpack_zone_malloc(z, len);
	if (copy == NULL)
		return false;
	memcpy(copy, res, len);
	return msgpack_unpack(copy, len, &off, z, out) == MSGPACK_UNPACK_SUCCESS;
}

pgcoord_err conf_client_call(struct conf_client *cl, msgpack_zone *z, const char *method,
			     const msgpack_object *params, int timeout_ms, msgpack_object *result)
{
	pgcoord_err err = conf_client_ensure(cl);
	char *bytes = NULL;
	size_t len = 0;
	void *res = NULL;
	size_t res_len = 0;

	if (err != PGCOORD_OK)
		return err;
	if (params != NULL && params->type != MSGPACK_OBJECT_NIL)
		bytes = conf_pack(params, &len);
	err = pgcoord_call(cl->h, method, bytes, len, timeout_ms, &res, &res_len);
	free(bytes);
	if (err != PGCOORD_OK) {
		snprintf(cl->message, sizeof(cl->message), "%s: %s: %s", method, conf_err_code(err),
			 pgcoord_last_message(cl->h));
	} else if (result != NULL && !unpack_into(z, res, res_len, result)) {
		snprintf(cl->message, sizeof(cl->message), "%s: a result that does not decode",
			 method);
		err = PGCOORD_E_PROTOCOL;
	}
	pgcoord_free(res);
	return err;
}

pgcoord_err conf_client_retry(struct conf_client *cl, msgpack_zone *z, const char *method,
			      const msgpack_object *params, int timeout_ms, int64_t budget_ms,
			      msgpack_object *result, int *attempts, bool *unseen)
{
	int64_t end = conf_now_ms() + budget_ms;
	pgcoord_err err;

	*attempts = 0;
	*unseen = false;
	for (;;) {
		err = conf_client_ensure(cl);
		if (err == PGCOORD_OK) {
			++*attempts;
			err = conf_client_call(cl, z, method, params, timeout_ms, result);
			if (err == PGCOORD_OK)
				return err;
			if (outcome_unknown(err))
				*unseen = true;
		} else if (err == PGCOORD_E_CONNECT) {
			err = PGCOORD_E_IO; /* no agent yet: try again within the budget */
		}
		if (!pgcoord_err_retryable(err) || conf_now_ms() + RETRY_PAUSE_MS >= end)
			return err;
		conf_sleep_ms(RETRY_PAUSE_MS);
	}
}

bool conf_client_give_up(struct conf_client *cl, msgpack_zone *z, const char *id)
{
	const char *keys[] = {"id", "reason"};
	msgpack_object vals[] = {conf_make_str(z, id),
				 conf_make_str(z, "claim given up after an unknown outcome")};
	msgpack_object params = conf_make_map(z, 2, keys, vals);
	int attempts;
	bool unseen;
	pgcoord_err err = conf_client_retry(cl, z, "permit.release", &params, CONF_CALL_TIMEOUT_MS,
					    CONF_RETRY_BUDGET_MS, NULL, &attempts, &unseen);

	/* not_found: no permit, the id is now retired */
	return err == PGCOORD_OK || err == PGCOORD_E_NOT_FOUND;
}

pgcoord_err conf_client_claim(struct conf_client *cl, msgpack_zone *z, const msgpack_object *params,
			      int timeout_ms, int64_t budget_ms, struct conf_claim *out)
{
	char *id = conf_get_str(z, params, "id");
	bool unseen;
	pgcoord_err err;

	memset(out, 0, sizeof(*out));
	err = conf_client_retry(cl, z, "permit.claim", params, timeout_ms, budget_ms, &out->result,
				&out->attempts, &unseen);
	if (err == PGCOORD_OK) {
		/* A denial speaks only for the last attempt: an unseen earlier one
		 * may still commit, so the id is released as after a give-up. */
		if (unseen && conf_is_str(conf_get(&out->result, "status"), "denied"))
			out->retired = conf_client_give_up(cl, z, id);
		return err;
	}
	if (unseen) {
		out->gave_up = true;
		out->released = conf_client_give_up(cl, z, id);
	}
	return err;
}
