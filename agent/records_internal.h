/*
 * records_internal.h — what the record.* files share: the columns of
 * pgcoord.record_status, a call's context, the kind/key parameters, the
 * audit actor and the one-record reply (records.c). Private to records.c
 * and the record_*.c files.
 */
#ifndef PGCOORD_AGENT_RECORDS_INTERNAL_H
#define PGCOORD_AGENT_RECORDS_INTERNAL_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/cursor.h"
#include "agent/reply.h"

struct request;

#define RECORD_KIND_MAX 200
#define RECORD_KEY_MAX 200

/* Columns of pgcoord.record_status, in order, from wherever a query puts
 * the first one. */
enum {
	RS_KIND,
	RS_KEY,
	RS_STATE,
	RS_TERMINAL,
	RS_DATA,
	RS_PERMIT,
	RS_OWNER,
	RS_REPLICA,
	RS_LIVE,
	RS_TOKEN,
	RS_CREATED,
	RS_UPDATED,
	RS_SETTLED,
	RS_ADOPTED_FROM,
	RS_ADOPTED_AT,
	RS__COUNT
};

/* What a handler keeps for its database callback (req_ctx_alloc). */
struct record_call {
	char *kind;
	char *key;
	int64_t session;
	bool dry_run;
	struct page page; /* record.list */
};

/* A record_status row as the wire sends it (record_row), and as reads
 * send it, with `redacted` after it (record_read_row). */
extern const struct reply_kind record_row, record_read_row;

/* Frees what a call points to; the request frees the call. */
void record_call_free(void *ctx);
struct record_call *record_call_new(struct request *req);
/* The audit trail's actor for a call made through a session. */
void record_session_actor(struct request *req, int64_t session, char *buf, size_t len);
/* kind and key, which name every record. */
bool record_param_kind_key(struct request *req, struct record_call *call);
/* Replies {[created,] record, now_at} from a one-row result: now_at in
 * column 0, then `created` when has_created, then the record. */
void record_reply(struct request *req, const PGresult *res, bool has_created, bool with_redacted);

#endif
