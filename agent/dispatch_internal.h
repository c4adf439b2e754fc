/*
 * dispatch_internal.h — what the dispatch files share beyond dispatch.h:
 * counting an answer, freeing a request, and answering one that never
 * became a request (request.c, called by dispatch.c; request.c calls
 * nothing of dispatch.c, so the two are layered, not a circle). Private
 * to dispatch.c and request.c.
 */
#ifndef PGCOORD_AGENT_DISPATCH_INTERNAL_H
#define PGCOORD_AGENT_DISPATCH_INTERNAL_H

#include <stdint.h>

#include "proto/codec.h"

struct conn;
struct request;

/* Counts the answer in the metrics (labels: the method's place in the
 * table, req->method_index, or "unknown"; and the outcome) and logs it at
 * debug level. */
void dispatch_req_count(struct request *req, int outcome);
/* Frees the request and its context, and lets go of its connection. */
void dispatch_req_free(struct request *req);
/* Sends an error reply for msgid on c, outside any request's buffer. */
void dispatch_send_error(struct conn *c, uint32_t msgid, enum pgc_error_code code, const char *msg);

#endif
