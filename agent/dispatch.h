/*
 * dispatch.h — from a complete frame to a method handler, and back.
 *
 * A request owns a copy of its frame (params borrow from it) and its reply
 * buffer. Handlers may answer at once or later, from a database callback;
 * either way they end the request with exactly one req_done() or
 * req_fail(). A request whose connection closed meanwhile still runs to
 * its end (the database work must finish or fail) and its reply is dropped.
 */
#ifndef PGCOORD_AGENT_DISPATCH_H
#define PGCOORD_AGENT_DISPATCH_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "agent/db.h"
#include "proto/codec.h"

struct agent;
struct conn;

struct request {
	struct agent *ag;
	struct conn *conn;
	uint32_t msgid;
	const struct method *method;
	int method_index;	      /* in the method table, the metrics' label; -1: unknown */
	const msgpack_object *params; /* a map, or NULL for {} */
	char *frame;		      /* owns the bytes params point into */
	msgpack_unpacked unpacked;
	msgpack_sbuffer out;
	msgpack_packer pk;
	bool result_started;
	/* the handler's state for its callbacks (req_ctx_alloc), freed with
	 * the request */
	void *ctx;
	void (*ctx_free)(void *ctx);
	uint64_t started_ms;
	struct timespec started_ts; /* CLOCK_MONOTONIC arrival, for the latency metrics */
};

typedef void (*method_fn)(struct request *req);

enum method_flags {
	M_DB = 1 << 0,	    /* needs the database: `unavailable` while it is down */
	M_SESSION = 1 << 1, /* needs an open session on the connection */
	/* with M_DB: the handler also runs while the database is down, and
	 * answers that itself (record.recover) */
	M_DB_DOWN_OK = 1 << 3,
	/* The authorisation class; every method has exactly one. */
	M_READ = 1 << 4,  /* anyone: views; others' intents and data redacted */
	M_OWNER = 1 << 5, /* what the caller's uid owns, or an admin: handlers check */
	M_ADMIN = 1 << 2, /* only for admin peers (root, the agent's user, admin_uids) */
};
#define M_CLASS_MASK (M_READ | M_OWNER | M_ADMIN)

struct method {
	const char *name;
	method_fn fn;
	unsigned flags;
	/* The parameter keys it accepts, ", "-separated ("" for none):
	 * dispatch answers `invalid_params` for any other key, except keys
	 * starting with "x-" (ignored, for forward compatibility). */
	const char *params;
	/* Its reply tables (reply.h), NULL-terminated; more than one when the
	 * result is "one of" several shapes. NULL: not declared as tables. */
	const struct reply_kind *const *results;
};

/* Handles one complete frame of `len` bytes read from c. */
void dispatch_frame(struct conn *c, const char *data, size_t len);

/* The method table, for the metrics' labels: its size and each name. */
size_t dispatch_method_count(void);
const char *dispatch_method_name(size_t i);
/* Its authorisation class: "read", "owner" or "admin". */
const char *dispatch_method_class(size_t i);
/* The parameter keys it accepts, ", "-separated ("" for none). */
const char *dispatch_method_params(size_t i);
/* Its reply tables, NULL-terminated, or NULL. */
const struct reply_kind *const *dispatch_method_results(size_t i);

/* True when key (of len bytes) is one of the ", "-separated names in list. */
bool dispatch_key_listed(const char *list, const char *key, size_t len);

/* Formats the ids a log line about req carries: "conn=3 msgid=17
 * method=lease.acquire session=42" (session only when the connection has
 * one). */
void req_log_kv(const struct request *req, char *buf, size_t len);

/*
 * The handler's state for its callbacks, the one way a handler carries
 * anything to them: size bytes, zeroed, owned by the request and freed
 * when it ends (req_done/req_fail), after free_fn (may be NULL) has freed
 * what the state points to. Read it back as req->ctx; do not use it after
 * answering. NULL after answering `internal` when out of memory.
 */
void *req_ctx_alloc(struct request *req, size_t size, void (*free_fn)(void *ctx));

/* Starts the success reply and returns the packer for the result object. */
msgpack_packer *req_result(struct request *req);
/* Sends the reply started by req_result() and frees the request. */
void req_done(struct request *req);
/* Sends an error reply and frees the request. */
__attribute__((format(printf, 3, 4))) void req_fail(struct request *req, enum pgc_error_code code,
						    const char *fmt, ...);
/* Answers a failed database result with the matching retryable error. */
void req_fail_db(struct request *req, const struct db_result *res);

/*
 * Parameter readers. Each returns false after answering `invalid_params`
 * (naming the key and the expected type), so a handler just returns.
 * *present (may be NULL) says whether an optional key was given.
 */
bool req_param_str(struct request *req, const char *key, bool required, size_t max_len, char **out);
/* A string that names something: as req_param_str, and when present it
 * must not be empty. */
bool req_param_name(struct request *req, const char *key, bool required, size_t max_len,
		    char **out);
bool req_param_int(struct request *req, const char *key, bool required, int64_t min, int64_t max,
		   int64_t *out, bool *present);
bool req_param_bool(struct request *req, const char *key, bool required, bool *out, bool *present);
/* One of the NULL-terminated allowed names; *out is its index. The error
 * lists the allowed names. */
bool req_param_enum(struct request *req, const char *key, bool required, const char *const *allowed,
		    int *out, bool *present);
/* bin or str, at most max_len bytes (`too_large` beyond); *data borrows
 * from the request. */
bool req_param_bytes(struct request *req, const char *key, bool required, size_t max_len,
		     const char **data, size_t *len, bool *present);
/* An array of min_items..max_items elements (*out NULL when absent), which
 * the handler then checks element by element. */
bool req_param_array(struct request *req, const char *key, bool required, size_t min_items,
		     size_t max_items, const msgpack_object **out);

/*
 * The reply budget: the most bytes one reply may take, so that none is
 * dropped by max_output_bytes (it leaves room for notifications queued
 * beside it). List-type calls check it before building a reply.
 */
size_t req_reply_budget(const struct request *req);

/*
 * True when the rows of res (as MessagePack: their text plus a per-field
 * allowance for keys and framing) fit the reply budget. Otherwise answers
 * `too_large` with "<method> would answer about N bytes, over the reply
 * budget of M; <how_to_page>" and returns false.
 */
bool req_rows_fit(struct request *req, const PGresult *res, const char *how_to_page);

/* True when res has the columns of its row kind (after offset leading
 * ones); otherwise answers `internal` and returns false. Checked before
 * any packing, so a reply is never built from a misread statement. */
struct reply_kind;
bool req_rows_are(struct request *req, const struct reply_kind *kind, const PGresult *res,
		  int offset);

/* True when the connection has a session, else answers `no_session` or
 * `session_expired`: the one session check, for M_SESSION methods (by
 * dispatch) and for calls that need a session only sometimes. */
bool req_need_session(struct request *req);

/* True when s[0..len) is well-formed UTF-8 (what Postgres accepts as text). */
bool utf8_valid(const char *s, size_t len);

/*
 * Runs one statement for req on the REQUESTS lane. When the database is
 * down, answers `unavailable` and returns false (done is not called).
 */
bool req_query(struct request *req, const char *sql, int nparams, const char *const *params,
	       db_done_fn done);

/* True when the peer may make admin calls: root, the agent's own user, a uid
 * in admin_uids, or a member of admin_group (by gid or membership). */
bool req_is_admin(const struct request *req);

/* True when the peer may open sessions: client_uids and client_group are
 * both empty, or it is in one of them, or it is an admin. */
bool req_may_open_sessions(const struct request *req);

#endif
