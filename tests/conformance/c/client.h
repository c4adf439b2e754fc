/*
 * client.h — a scenario client of the C runner: libpgcoord plus the
 * reconnect, resume and retry rules PROTOCOL.md asks of its callers.
 */
#ifndef PGCOORD_CONFORMANCE_CLIENT_H
#define PGCOORD_CONFORMANCE_CLIENT_H

#include "conformance.h"

#include <pgcoord/pgcoord.h>

#define CONF_CALL_TIMEOUT_MS 5000  /* one call */
#define CONF_RETRY_BUDGET_MS 10000 /* a claim's or release's retries */

struct conf_client {
	char path[256];
	pgcoord *h;
	int64_t session; /* 0: none */
	bool resumed;	 /* the session was resumed after a broken connection */
	char message[512];
};

struct conf_claim {
	msgpack_object result;
	int attempts;
	bool gave_up;  /* the outcome stayed unknown and the id was given up */
	bool released; /* ...and its release succeeded */
	bool retired;  /* denied after an unseen attempt: the id was released */
};

/* PROTOCOL.md's name of err (wire codes), or the library's own. */
const char *conf_err_code(pgcoord_err err);

void conf_client_init(struct conf_client *cl, const char *path);
void conf_client_close(struct conf_client *cl);
pgcoord_err conf_client_ensure(struct conf_client *cl);

/* One call through pgcoord_call (params: a map or NULL); *result in zone. */
pgcoord_err conf_client_call(struct conf_client *cl, msgpack_zone *z, const char *method,
			     const msgpack_object *params, int timeout_ms, msgpack_object *result);

/* The call retried with the same params while retryable, for budget_ms;
 * *unseen: some attempt's outcome was never seen. */
pgcoord_err conf_client_retry(struct conf_client *cl, msgpack_zone *z, const char *method,
			      const msgpack_object *params, int timeout_ms, int64_t budget_ms,
			      msgpack_object *result, int *attempts, bool *unseen);

/* permit.claim with the retry rule; an id whose outcome stayed unknown is
 * released (out->gave_up, out->released) and the error returned. */
pgcoord_err conf_client_claim(struct conf_client *cl, msgpack_zone *z, const msgpack_object *params,
			      int timeout_ms, int64_t budget_ms, struct conf_claim *out);

/* Releases an id given up after an unknown outcome; not_found counts. */
bool conf_client_give_up(struct conf_client *cl, msgpack_zone *z, const char *id);

#endif
