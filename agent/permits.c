/*
 * permits.c — the permit.* methods: claims, their lifecycle (phase,
 * uncertainty, resolve, release), listings, history and the conservation
 * check.
 *
 * Every method is ONE statement calling one function of
 * migrations/0004_permits.sql, so it is its own transaction: nothing stays
 * open across a round trip to a client, and it works through a
 * transaction-mode pooler. All deciding happens there; this file validates
 * parameters, names the actor for the audit trail, and turns rows into
 * replies. A database failure is answered as a retryable error, never as
 * an admission (guarantee 4).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/dispatch.h"
#include "agent/groups.h"
#include "agent/methods.h"
#include "agent/metrics.h"
#include "agent/cursor.h"
#include "agent/pgrow.h"
#include "agent/reply.h"
#include "agent/sessions.h"
#include "agent/waiters.h"

#define PERMIT_ID_MAX 200
#define PERMIT_KEY_MAX 200
#define PERMIT_MAX_QUOTAS 32
#define PERMIT_INTENT_MAX 65536
#define PERMIT_TEXT_MAX 4000 /* reasons and evidence */
#define PERMIT_LIST_DEFAULT 1000
#define PERMIT_LIST_MAX 10000
#define PERMIT_WAIT_MS_MAX 3600000

static const char *const phase_names[] = {"reserved", "dispatched", "running", NULL};
static const char *const owner_loss_names[] = {"uncertain", "release", NULL};
static const char *const outcome_names[] = {"running", "gone", NULL};
static const char *const state_names[] = {"held", "uncertain", "released", NULL};

/* What a handler keeps for its database callback (req_ctx_alloc). */
struct permit_call {
	char *id;
	bool override;
	/* permit.claim: the requested quotas, sorted by key */
	struct claim_quota *quotas;
	size_t nquotas;
	struct page page; /* permit.list */
};

struct claim_quota {
	const char *key; /* borrows from the request frame */
	size_t len;
	int64_t weight;
};

/* Frees what a call points to; the request frees the call. */
static void permit_call_free(void *ctx)
{
	struct permit_call *call = ctx;

	free(call->id);
	free(call->quotas);
	page_free(&call->page);
}

/* The audit trail's actor for a call made through a session. */
static void session_actor(struct request *req, char *buf, size_t len)
{
	snprintf(buf, len, "session:%" PRId64 "@%s", req->conn->session->id,
		 req->ag->cfg.replica_id);
}

/* The actor of an admin override: the peer's uid from SO_PEERCRED. */
static void operator_actor(struct request *req, char *buf, size_t len)
{
	snprintf(buf, len, "operator:uid=%u", (unsigned)req->conn->uid);
}

/* Reads the required, non-empty permit id. */
static bool param_id(struct request *req, char **id)
{
	return req_param_name(req, "id", true, PERMIT_ID_MAX, id);
}

/* Reads a text parameter that must say something (reason, evidence). */
static bool param_text(struct request *req, const char *key, bool required, char **out)
{
	if (!req_param_str(req, key, required, PERMIT_TEXT_MAX, out))
		return false;
	if (*out && strspn(*out, " \t\r\n") == strlen(*out)) {
		free(*out);
		*out = NULL;
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "parameter '%s' must not be empty: say what was observed", key);
			return false;
		}
	}
	return true;
}

/* override: true is for admins only; the reply names why it was refused. */
static bool param_override(struct request *req, bool *override)
{
	*override = false;
	if (!req_param_bool(req, "override", false, override, NULL))
		return false;
	if (*override && !req_is_admin(req)) {
		req_fail(req, PGC_E_FORBIDDEN,
			 "override is an admin call; uid %u is not root, the agent's user, in "
			 "admin_uids or in admin_group",
			 (unsigned)req->conn->uid);
		return false;
	}
	return true;
}

/* An admin override, audited in the log too: who, which permit, what now. */
static void log_override(struct request *req, const char *id, const char *what, const char *state)
{
	char kv[4 * 200 + 128] = ""; /* room for a fully escaped id */
	log_kv_int(kv, sizeof(kv), "uid", req->conn->uid);
	log_kv_str(kv, sizeof(kv), "permit", id);
	if (state)
		log_kv_str(kv, sizeof(kv), "state", state);
	log_write(&req->ag->log, LOG_LEVEL_WARN, "permits", kv, "%s", what);
}

/* --- permit.claim ---------------------------------------------------- */

static int cmp_quota(const void *a, const void *b)
{
	const struct claim_quota *x = a, *y = b;
	size_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(x->key, y->key, n);
	if (c)
		return c;
	return x->len < y->len ? -1 : x->len > y->len;
}

/* A Postgres array literal {"k1","k2"} of the keys, quoted and escaped. */
static char *keys_literal(const struct claim_quota *q, size_t n)
{
	size_t cap = 3, len = 0;
	char *out;
	for (size_t i = 0; i < n; i++)
		cap += 2 * q[i].len + 3;
	out = malloc(cap);
	if (!out)
		return NULL;
	out[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		if (i)
			out[len++] = ',';
		out[len++] = '"';
		for (size_t j = 0; j < q[i].len; j++) {
			if (q[i].key[j] == '"' || q[i].key[j] == '\\')
				out[len++] = '\\';
			out[len++] = q[i].key[j];
		}
		out[len++] = '"';
	}
	out[len++] = '}';
	out[len] = '\0';
	return out;
}

static char *weights_literal(const struct claim_quota *q, size_t n)
{
	size_t cap = 3 + n * 12, len = 0;
	char *out = malloc(cap);
	if (!out)
		return NULL;
	out[len++] = '{';
	for (size_t i = 0; i < n; i++)
		len +=
		    (size_t)snprintf(out + len, cap - len, "%s%" PRId64, i ? "," : "", q[i].weight);
	snprintf(out + len, cap - len, "}");
	return out;
}

/* Reads quotas: [{key, weight?}] into call->quotas, sorted, no duplicates
 * (the sort is the lock order the SQL relies on; duplicates would make one
 * claim count twice against one quota). */
static bool parse_claim_quotas(struct request *req, struct permit_call *call)
{
	const msgpack_object *arr;
	if (!req_param_array(req, "quotas", true, 1, PERMIT_MAX_QUOTAS, &arr))
		return false;
	call->nquotas = arr->via.array.size;
	call->quotas = calloc(call->nquotas, sizeof(*call->quotas));
	if (!call->quotas) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return false;
	}
	for (size_t i = 0; i < call->nquotas; i++) {
		const msgpack_object *el = &arr->via.array.ptr[i], *k, *w;
		struct claim_quota *q = &call->quotas[i];
		if (el->type != MSGPACK_OBJECT_MAP) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "quotas[%zu] must be a map {key, weight}, not %s", i,
				 pgc_obj_type_name(el));
			return false;
		}
		k = pgc_map_get(el, "key");
		w = pgc_map_get(el, "weight");
		if (!k || !pgc_obj_str(k, &q->key, &q->len) || q->len == 0 ||
		    q->len > PERMIT_KEY_MAX || memchr(q->key, '\0', q->len) ||
		    !utf8_valid(q->key, q->len)) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "quotas[%zu].key must be a UTF-8 string of 1..%d bytes", i,
				 PERMIT_KEY_MAX);
			return false;
		}
		q->weight = 1;
		if (w && w->type != MSGPACK_OBJECT_NIL &&
		    (!pgc_obj_int64(w, &q->weight) || q->weight < 1 || q->weight > INT32_MAX)) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "quotas[%zu].weight must be an integer 1..%d (default 1)", i,
				 INT32_MAX);
			return false;
		}
	}
	qsort(call->quotas, call->nquotas, sizeof(*call->quotas), cmp_quota);
	for (size_t i = 1; i < call->nquotas; i++) {
		if (cmp_quota(&call->quotas[i - 1], &call->quotas[i]) == 0) {
			req_fail(req, PGC_E_INVALID_PARAMS,
				 "quota \"%.*s\" appears twice in quotas; give it once with the "
				 "total weight",
				 (int)call->quotas[i].len, call->quotas[i].key);
			return false;
		}
	}
	return true;
}

static int64_t claimed_weight(const struct permit_call *call, const char *key)
{
	for (size_t i = 0; i < call->nquotas; i++)
		if (call->quotas[i].len == strlen(key) &&
		    memcmp(call->quotas[i].key, key, call->quotas[i].len) == 0)
			return call->quotas[i].weight;
	return 0;
}

/* Columns of pgcoord.claim_decision (0004_permits.sql), in order. A
 * refusal arrives as the statement's (or the member's) SQLSTATE instead. */
enum {
	CL_STATUS,
	CL_TOKEN,
	CL_STATE,
	CL_PHASE,
	CL_OWNER,
	CL_REPLICA,
	CL_CREATED,
	CL_RELEASED,
	CL_DKEY,
	CL_DLIMIT,
	CL_DINFLIGHT,
	CL_NOW,
	CL_POSITION, /* queued only */
	CL_QUEUED_AT,
	CL_DEADLINE_AT
};

/* What each claim status sends of permit_claim's row (after `status`, `id`
 * and, where it says, `mine`). */
static const struct reply_col claim_granted_cols[] = {
    {"token", REPLY_INT, CL_TOKEN, 0},
    {"state", REPLY_STR, CL_STATE, 0},
    {"phase", REPLY_STR, CL_PHASE, 0},
    {"owner_session", REPLY_INT, CL_OWNER, 0},
    {"owner_replica", REPLY_STR, CL_REPLICA, 0},
    {"created_at", REPLY_INT, CL_CREATED, 0},
    {"now_at", REPLY_INT, CL_NOW, 0},
};
static const struct reply_kind claim_granted_row = REPLY_KIND(claim_granted_cols);

static const struct reply_col claim_queued_cols[] = {
    {"position", REPLY_INT, CL_POSITION, 0},
    {"queued_at", REPLY_INT, CL_QUEUED_AT, 0},
    {"deadline_at", REPLY_INT, CL_DEADLINE_AT, 0},
    {"now_at", REPLY_INT, CL_NOW, 0},
};
static const struct reply_kind claim_queued_row = REPLY_KIND(claim_queued_cols);

static const struct reply_col claim_denied_cols[] = {
    {"quota", REPLY_STR, CL_DKEY, 0},
    {"limit", REPLY_INT, CL_DLIMIT, 0},
    {"in_flight", REPLY_INT, CL_DINFLIGHT, 0},
    {"now_at", REPLY_INT, CL_NOW, 0},
};
static const struct reply_kind claim_denied_row = REPLY_KIND(claim_denied_cols);

/* admitted, held (a retry of a held id): the grant. */
static void claim_granted(struct request *req, struct permit_call *call, const PGresult *res,
			  int row, int col)
{
	struct reply_map m;
	struct group_keys keys = {0};
	for (size_t i = 0; i < call->nquotas; i++)
		group_keys_add(&keys, call->quotas[i].key, call->quotas[i].len);
	/* so that its release is held only behind statements on its keys */
	if (req->ag->release_group)
		group_remember_keys(req->ag->release_group, call->id, &keys);
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "status", PQgetvalue(res, row, col + CL_STATUS));
	reply_kv_str(&m, "id", call->id);
	reply_kv_row(&m, &claim_granted_row, res, row, col);
	/* a retry through another session (of the same uid: another uid's
	 * is refused) finds the grant owned by the first one; it says so
	 * rather than moving ownership silently */
	reply_kv_bool(&m, "mine",
		      !pgrow_null(res, row, col + CL_OWNER) && req->conn->session &&
			  pgrow_int(res, row, col + CL_OWNER) == req->conn->session->id);
	reply_map_end(&m);
	req_done(req);
}

/* A waiting claim: permit.admitted or permit.expired follows on the
 * connection of the session that queued it (waiters.c). */
static void claim_queued(struct request *req, struct permit_call *call, const PGresult *res,
			 int row, int col)
{
	int64_t owner = pgrow_int(res, row, col + CL_OWNER);
	bool mine = req->conn->session && owner == req->conn->session->id;
	if (mine)
		waiters_track(req->ag, call->id, owner);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "status", "queued");
	reply_kv_str(&m, "id", call->id);
	reply_kv_row(&m, &claim_queued_row, res, row, col);
	reply_kv_bool(&m, "mine", mine);
	reply_map_end(&m);
	req_done(req);
}

static void claim_denied(struct request *req, struct permit_call *call, const PGresult *res,
			 int row, int col)
{
	const char *key = PQgetvalue(res, row, col + CL_DKEY);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "status", "denied");
	reply_kv_str(&m, "id", call->id);
	reply_kv_row(&m, &claim_denied_row, res, row, col);
	reply_kv_int(&m, "weight", claimed_weight(call, key));
	reply_map_end(&m);
	req_done(req);
}

/* The claim drew its token before it found the key has no quota, so the
 * schema answers it in the row; on the wire it is not_found. */
static void claim_unknown_quota(struct request *req, struct permit_call *call, const PGresult *res,
				int row, int col)
{
	(void)call;
	req_fail(req, PGC_E_NOT_FOUND,
		 "quota \"%s\" does not exist: create it with quota.set, or pass `limit` with the "
		 "claim",
		 PQgetvalue(res, row, col + CL_DKEY));
}

/* pgcoord.claim_status, one handler each. */
static const struct {
	const char *status;
	void (*answer)(struct request *req, struct permit_call *call, const PGresult *res, int row,
		       int col);
} claim_statuses[] = {
    {"admitted", claim_granted},
    {"held", claim_granted},
    {"queued", claim_queued},
    {"denied", claim_denied},
    {"unknown_quota", claim_unknown_quota},
};

/* Answers a claim from its row of permit_claim_group (or permit_wait's
 * own): its columns from `col` on are claim_decision's. */
static void claim_answer(struct request *req, void *ctx, const PGresult *res, int row, int col)
{
	struct permit_call *call = ctx;
	const char *status = PQgetvalue(res, row, col + CL_STATUS);

	if (PQnfields(res) != col + CL_DEADLINE_AT + 1) {
		req_fail(req, PGC_E_INTERNAL, "permit_claim: %d columns where %d were expected",
			 PQnfields(res), col + CL_DEADLINE_AT + 1);
		return;
	}
	metrics_claim_result(req->ag, status);
	for (size_t i = 0; i < sizeof(claim_statuses) / sizeof(claim_statuses[0]); i++) {
		if (strcmp(status, claim_statuses[i].status) == 0) {
			claim_statuses[i].answer(req, call, res, row, col);
			return;
		}
	}
	req_fail(req, PGC_E_INTERNAL, "permit_claim: unexpected status \"%s\"", status);
}

/* A claim's part of its group, or the whole group, failed: fail closed, a
 * claim that could not be checked is never an admission; a retry with the
 * same id finds what committed. */
static void claim_failed(struct request *req, void *ctx, const struct db_result *r)
{
	req_fail_db(req, r);
}

/* A waiting claim's own statement (permit_wait, 0006_waiting_claims.sql). */
static void waited(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;

	if (!r->ok || PQntuples(r->res) != 1)
		claim_failed(req, call, r);
	else
		claim_answer(req, call, r->res, 0, 0);
}

/* Claims waiting at the same moment are judged in one statement, in
 * arrival order, each by permit_claim_as exactly as if alone (0004_permits.sql). */
const struct group_kind permit_claim_group_kind = {
    .name = "claim",
    .sql = "SELECT * FROM pgcoord.permit_claim_group($1::bigint[], $2::boolean[], $3::text[], "
	   "$4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bytea[], "
	   "$10::integer[], $11::text[])",
    /* the group function's v_n = 1 branch, without the group's frame: a
     * refusal raises as the statement's error, as it does there. Its
     * arguments are the member's own, so nothing builds or parses arrays
     * of one. */
    .lone_sql =
	"SELECT 1, NULL::text, NULL::text, c.* FROM pgcoord.permit_claim_as("
	"$1::bigint, $2::boolean, $3::text, $4::text[], $5::integer[], $6::bigint, $7::text, "
	"$8::text, $9::bytea, $10::integer, $11::text) c",
    .nargs = 11,
    .answer = claim_answer,
    .fail = claim_failed,
};

void rpc_permit_claim(struct request *req)
{
	struct agent *ag = req->ag;
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	const char *intent = NULL;
	size_t intent_len = 0;
	bool has_intent = false, has_limit = false;
	int on_loss = 0;
	int64_t limit = 0, wait_ms = 0;
	char *keys = NULL, *weights = NULL, *intent_hex = NULL;
	char session[24], limit_s[24], actor[256], uid[24], wait_s[24];

	if (!call)
		return;
	if (!param_id(req, &call->id) || !parse_claim_quotas(req, call) ||
	    !req_param_bytes(req, "intent", false, PERMIT_INTENT_MAX, &intent, &intent_len,
			     &has_intent) ||
	    !req_param_enum(req, "on_owner_loss", false, owner_loss_names, &on_loss, NULL) ||
	    !req_param_int(req, "limit", false, 0, INT32_MAX, &limit, &has_limit) ||
	    !req_param_int(req, "wait_ms", false, 0, PERMIT_WAIT_MS_MAX, &wait_ms, NULL))
		goto fail;
	if (has_limit && call->nquotas != 1) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter 'limit' sets one quota's limit: give it with exactly one quota "
			 "(this claim has %zu)",
			 call->nquotas);
		goto fail;
	}
	keys = keys_literal(call->quotas, call->nquotas);
	weights = weights_literal(call->quotas, call->nquotas);
	if (has_intent)
		intent_hex = pgrow_bytea_param(intent, intent_len);
	if (!keys || !weights || (has_intent && !intent_hex)) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		goto fail;
	}
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	snprintf(limit_s, sizeof(limit_s), "%" PRId64, limit);
	session_actor(req, actor, sizeof(actor));
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	/* the uid rules (a non-admin's limit only creates a missing quota;
	 * another uid's retirement does not block the id; any other id of
	 * another uid's is a conflict that tells nothing of it) are applied
	 * in the same statement: permit_claim_as (0010_claim_owner.sql) */
	const char *params[11] = {uid,
				  req_is_admin(req) ? "true" : "false",
				  call->id,
				  keys,
				  weights,
				  session,
				  ag->cfg.replica_id,
				  owner_loss_names[on_loss],
				  intent_hex,
				  has_limit ? limit_s : NULL,
				  actor};
	if (wait_ms > 0) {
		/* a claim that may queue goes alone: the queue is judged in the
		 * same transaction as the claim (permit_wait, 0006_waiting_claims.sql) */
		const char *wparams[12];
		memcpy(wparams, params, sizeof(params));
		snprintf(wait_s, sizeof(wait_s), "%" PRId64, wait_ms);
		wparams[11] = wait_s;
		req_query(req,
			  "SELECT * FROM pgcoord.permit_wait($1, $2, $3, $4::text[], "
			  "$5::integer[], $6, $7, $8, $9::bytea, $10::integer, $11, $12)",
			  12, wparams, waited);
		goto fail;
	}
	/* guarantees 1, 3, 4: the whole admission is one function call, in
	 * the one statement of its group */
	struct group_keys claim_keys = {0};
	for (size_t i = 0; i < call->nquotas; i++)
		group_keys_add(&claim_keys, call->quotas[i].key, call->quotas[i].len);
	group_add(ag->claim_group, req, call, params, &claim_keys);
fail:
	free(keys);
	free(weights);
	free(intent_hex);
}

/* --- permit.update ----------------------------------------------------- */

/* Answers {id, the row's cells} for a call on one permit. */
static void reply_permit_row(struct request *req, const struct permit_call *call,
			     const struct reply_kind *kind, const PGresult *res)
{
	struct reply_map m;

	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "id", call->id);
	reply_kv_row(&m, kind, res, 0, 0);
	reply_map_end(&m);
	req_done(req);
}

/* The columns of pgcoord.permit_change (0004_permits.sql), which the
 * lifecycle functions answer; each reply sends its own of them. A refusal
 * arrives as the statement's error (a class-PC SQLSTATE), never as a row. */
enum { CH_CHANGED, CH_STATE, CH_PHASE, CH_PHASE_AT, CH_STATE_AT, CH_OWNER, CH_DETAIL, CH_NOW };

/* A lifecycle function answers exactly one permit_change row. */
static bool one_change(struct request *req, const struct reply_kind *kind, const PGresult *res)
{
	if (PQntuples(res) != 1) {
		req_fail(req, PGC_E_INTERNAL, "%s returned %d rows", req->method->name,
			 PQntuples(res));
		return false;
	}
	return req_rows_are(req, kind, res, 0);
}

static const struct reply_col update_cols[] = {
    {"phase", REPLY_STR, CH_PHASE, 0},
    {"state", REPLY_STR, CH_STATE, 0},
    {"changed", REPLY_BOOL, CH_CHANGED, 0},
    {"phase_at", REPLY_INT, CH_PHASE_AT, 0},
    {"now_at", REPLY_INT, CH_NOW, 0},
    {"state_at", REPLY_HIDDEN, CH_STATE_AT, 0},
    {"owner_session", REPLY_HIDDEN, CH_OWNER, 0},
    {"detail", REPLY_HIDDEN, CH_DETAIL, 0},
};
static const struct reply_kind update_row = REPLY_KIND(update_cols);

static void updated(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok)
		req_fail_db(req, r);
	else if (one_change(req, &update_row, res))
		reply_permit_row(req, call, &update_row, res);
}

void rpc_permit_update(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	int phase = 0;
	char session[24], actor[256];

	if (!call)
		return;
	if (!param_id(req, &call->id) ||
	    !req_param_enum(req, "phase", true, phase_names, &phase, NULL))
		return;
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	session_actor(req, actor, sizeof(actor));
	const char *params[4] = {call->id, session, phase_names[phase], actor};
	/* guarantee 6: phase moves forward only, audited in the same transaction */
	req_query(req, "SELECT * FROM pgcoord.permit_update($1, $2, $3, $4)", 4, params, updated);
}

/* --- permit.mark_uncertain ----------------------------------------------- */

static const struct reply_col marked_cols[] = {
    {"state", REPLY_STR, CH_STATE, 0},
    {"changed", REPLY_BOOL, CH_CHANGED, 0},
    {"state_at", REPLY_INT, CH_STATE_AT, 0},
    {"now_at", REPLY_INT, CH_NOW, 0},
    {"phase", REPLY_HIDDEN, CH_PHASE, 0},
    {"phase_at", REPLY_HIDDEN, CH_PHASE_AT, 0},
    {"owner_session", REPLY_HIDDEN, CH_OWNER, 0},
    {"detail", REPLY_HIDDEN, CH_DETAIL, 0},
};
static const struct reply_kind marked_row = REPLY_KIND(marked_cols);

static void marked(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok)
		req_fail_db(req, r);
	else if (one_change(req, &marked_row, res))
		reply_permit_row(req, call, &marked_row, res);
}

void rpc_permit_mark_uncertain(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	char *reason = NULL;
	char session[24], actor[256];

	if (!call)
		return;
	if (!param_id(req, &call->id) || !param_text(req, "reason", true, &reason))
		return;
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	session_actor(req, actor, sizeof(actor));
	const char *params[4] = {call->id, session, reason, actor};
	/* guarantee 5: the permit keeps counting, now visibly uncertain */
	req_query(req, "SELECT * FROM pgcoord.permit_mark_uncertain($1, $2, $3, $4)", 4, params,
		  marked);
	free(reason);
}

/* --- permit.resolve ------------------------------------------------------ */

static const struct reply_col resolved_cols[] = {
    {"state", REPLY_STR, CH_STATE, 0},		{"owner_session", REPLY_INT, CH_OWNER, 0},
    {"changed", REPLY_BOOL, CH_CHANGED, 0},	{"detail", REPLY_STR, CH_DETAIL, 0},
    {"now_at", REPLY_INT, CH_NOW, 0},		{"phase", REPLY_HIDDEN, CH_PHASE, 0},
    {"phase_at", REPLY_HIDDEN, CH_PHASE_AT, 0}, {"state_at", REPLY_HIDDEN, CH_STATE_AT, 0},
};
static const struct reply_kind resolved_row = REPLY_KIND(resolved_cols);

static void resolved(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok) {
		req_fail_db(req, r);
	} else if (one_change(req, &resolved_row, res)) {
		if (call->override)
			log_override(req, call->id, "resolved by operator override",
				     PQgetvalue(res, 0, CH_STATE));
		reply_permit_row(req, call, &resolved_row, res);
	}
}

void rpc_permit_resolve(struct request *req)
{
	struct agent *ag = req->ag;
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	char *evidence = NULL;
	int outcome = 0;
	char session[24], actor[256], uid[24];
	bool has_session;

	if (!call)
		return;
	if (!param_id(req, &call->id) ||
	    !req_param_enum(req, "outcome", true, outcome_names, &outcome, NULL) ||
	    !param_override(req, &call->override) ||
	    /* guarantee 5: a slot is freed on observed evidence, never on silence */
	    !param_text(req, "evidence", true, &evidence))
		goto fail;
	if (!call->override && !req_need_session(req))
		goto fail;
	has_session = req->conn->session != NULL;
	if (has_session)
		snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	if (call->override)
		operator_actor(req, actor, sizeof(actor));
	else
		session_actor(req, actor, sizeof(actor));
	/* an operator without a session who says "running" holds it as nobody's:
	 * it counts until an operator releases it */
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	/* another uid's permit (uncertain or not) is admin work */
	const char *params[9] = {uid,
				 req_is_admin(req) ? "true" : "false",
				 call->id,
				 has_session ? session : NULL,
				 has_session ? ag->cfg.replica_id : NULL,
				 outcome_names[outcome],
				 evidence,
				 call->override ? "true" : "false",
				 actor};
	req_query(req,
		  "SELECT * FROM pgcoord.permit_resolve_as($1, $2, $3, $4, $5, $6, $7, $8, $9)", 9,
		  params, resolved);
fail:
	free(evidence);
}

/* --- permit.release ------------------------------------------------------ */

/* The columns of pgcoord.release_decision; a refusal is the statement's
 * (or, in a group, the member's) SQLSTATE instead. */
enum { RD_STATUS, RD_STATE, RD_RELEASED_AT, RD_NOW };

/* What a release sends of its row after `id` and `released`. */
static const struct reply_col released_cols[] = {
    {"status", REPLY_HIDDEN, RD_STATUS, 0},
    {"state", REPLY_STR, RD_STATE, 0},
    {"released_at", REPLY_INT, RD_RELEASED_AT, 0},
    {"now_at", REPLY_INT, RD_NOW, 0},
};
static const struct reply_kind released_row = REPLY_KIND(released_cols);

/* released: this call released it; already_released: release is
 * idempotent, `released` false says it was before. */
static void release_done(struct request *req, struct permit_call *call, const PGresult *res,
			 int row, int col, bool released)
{
	if (call->override && released)
		log_override(req, call->id, "released by operator override", NULL);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "id", call->id);
	reply_kv_bool(&m, "released", released);
	reply_kv_row(&m, &released_row, res, row, col);
	reply_map_end(&m);
	req_done(req);
}

static void release_released(struct request *req, struct permit_call *call, const PGresult *res,
			     int row, int col)
{
	release_done(req, call, res, row, col, true);
}

static void release_already(struct request *req, struct permit_call *call, const PGresult *res,
			    int row, int col)
{
	release_done(req, call, res, row, col, false);
}

/* There was no permit: the release retired the id (it wrote the tombstone,
 * so this is an answer of the function, not a raise). */
static void release_retired(struct request *req, struct permit_call *call, const PGresult *res,
			    int row, int col)
{
	(void)res, (void)row, (void)col;
	req_fail(req, PGC_E_NOT_FOUND,
		 "no permit \"%s\"; the id is now retired: a claim of it still on its way, or "
		 "made later, is refused as released",
		 call->id);
}

/* pgcoord.release_status, one handler each. */
static const struct {
	const char *status;
	void (*answer)(struct request *req, struct permit_call *call, const PGresult *res, int row,
		       int col);
} release_statuses[] = {
    {"released", release_released},
    {"already_released", release_already},
    {"retired", release_retired},
};

/* Answers a release from its row of permit_release_group: its columns from
 * `col` on are release_decision's. */
static void release_answer(struct request *req, void *ctx, const PGresult *res, int row, int col)
{
	struct permit_call *call = ctx;
	const char *status = PQgetvalue(res, row, col + RD_STATUS);

	if (!reply_kind_fits(&released_row, res, col)) {
		req_rows_are(req, &released_row, res, col);
		return;
	}
	for (size_t i = 0; i < sizeof(release_statuses) / sizeof(release_statuses[0]); i++) {
		if (strcmp(status, release_statuses[i].status) == 0) {
			release_statuses[i].answer(req, call, res, row, col);
			return;
		}
	}
	req_fail(req, PGC_E_INTERNAL, "permit_release: unexpected status \"%s\"", status);
}

static void release_failed(struct request *req, void *ctx, const struct db_result *r)
{
	req_fail_db(req, r);
}

/* Releases waiting at the same moment go as one statement, like claims. */
const struct group_kind permit_release_group_kind = {
    .name = "release",
    .sql = "SELECT * FROM pgcoord.permit_release_group($1::bigint[], $2::text[], $3::bigint[], "
	   "$4::boolean[], $5::text[], $6::text[])",
    /* one release, one frame: permit_release_one answers one value */
    .lone_sql = "SELECT 1, NULL::text, NULL::text, r.* FROM pgcoord.permit_release_one("
		"$1::bigint, $2::text, $3::bigint, $4::boolean, $5::text, $6::text) r",
    .nargs = 6,
    .answer = release_answer,
    .fail = release_failed,
};

void rpc_permit_release(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	char *reason = NULL;
	char session[24] = "", actor[256], uid[24];

	if (!call)
		return;
	if (!param_id(req, &call->id) || !param_override(req, &call->override) ||
	    !param_text(req, "reason", false, &reason))
		goto fail;
	if (!call->override && !req_need_session(req))
		goto fail;
	if (req->conn->session)
		snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	if (call->override)
		operator_actor(req, actor, sizeof(actor));
	else
		session_actor(req, actor, sizeof(actor));
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	const char *params[6] = {uid,
				 call->id,
				 session[0] ? session : NULL,
				 call->override ? "true" : "false",
				 actor,
				 reason ? reason : (call->override ? "operator override" : NULL)};
	/* guarantees 2 and 3: released exactly once, counters and audit rows in
	 * the same transaction (its group's) */
	struct group_keys keys;
	group_recall_keys(req->ag->release_group, call->id, &keys);
	group_add(req->ag->release_group, req, call, params, &keys);
fail:
	free(reason);
}

/* --- permit.get, permit.list ----------------------------------------------- */

/*
 * One row per (permit, quota), permits in the order wanted, with the
 * permit's columns repeated; the outer row carries now_at when nothing
 * matches. One statement, so a permit and its quotas agree.
 */
#define PERMIT_COLS                                                                                \
	"n.now_at, s.id, s.token, s.effective_state, s.phase, s.owner_session, s.owner_replica, "  \
	"s.on_owner_loss, s.effective_reason, pgcoord.ms(s.created_at), "                          \
	"pgcoord.ms(s.phase_at), pgcoord.ms(s.state_at), pgcoord.ms(s.released_at), "              \
	"octet_length(s.intent), pq.key, pq.weight, "                                              \
	"s.owner_session IS NOT NULL AND pgcoord.session_is_live(s.owner_session)"

enum {
	PC_NOW,
	PC_ID,
	PC_TOKEN,
	PC_STATE,
	PC_PHASE,
	PC_OWNER,
	PC_REPLICA,
	PC_ON_LOSS,
	PC_REASON,
	PC_CREATED,
	PC_PHASE_AT,
	PC_STATE_AT,
	PC_RELEASED,
	PC_INTENT_LEN,
	PC_KEY,
	PC_WEIGHT,
	PC_OWNER_LIVE,
	PC_INTENT,  /* permit.get only */
	PC_REDACTED /* permit.get only: the intent was withheld (another uid's) */
};

/* A permit as permit.get and permit.list send it, around its quotas
 * (one row each: PC_KEY, PC_WEIGHT); permit.get adds the intent. */
static const struct reply_col permit_cols[] = {
    {"now_at", REPLY_HIDDEN, PC_NOW, 0},
    {"id", REPLY_STR, PC_ID, 0},
    {"token", REPLY_INT, PC_TOKEN, 0},
    {"state", REPLY_STR, PC_STATE, 0},
    {"phase", REPLY_STR, PC_PHASE, 0},
    {"owner_session", REPLY_INT, PC_OWNER, 0},
    {"owner_replica", REPLY_STR, PC_REPLICA, 0},
    {"owner_live", REPLY_BOOL, PC_OWNER_LIVE, 0},
    {"on_owner_loss", REPLY_STR, PC_ON_LOSS, 0},
    {"uncertain_reason", REPLY_STR, PC_REASON, 0},
    {"intent_bytes", REPLY_INT, PC_INTENT_LEN, 0},
    {"created_at", REPLY_INT, PC_CREATED, 0},
    {"phase_at", REPLY_INT, PC_PHASE_AT, 0},
    {"state_at", REPLY_INT, PC_STATE_AT, 0},
    {"released_at", REPLY_INT, PC_RELEASED, 0},
    /* ages by the database clock, so they mean the same on every host */
    {"age_ms", REPLY_AGE, PC_CREATED, PC_NOW},
    {"phase_age_ms", REPLY_AGE, PC_PHASE_AT, PC_NOW},
    {"state_age_ms", REPLY_AGE, PC_STATE_AT, PC_NOW},
    {"key", REPLY_HIDDEN, PC_KEY, 0},
    {"weight", REPLY_HIDDEN, PC_WEIGHT, 0},
    /* permit.get only; the intent in whichever format bytea_output says */
    {"intent", REPLY_BYTEA, PC_INTENT, 0},
    {"redacted", REPLY_BOOL, PC_REDACTED, 0},
};
/* permit.list: the same without the last two */
static const struct reply_kind permit_row = {permit_cols,
					     sizeof(permit_cols) / sizeof(permit_cols[0]) - 2};
static const struct reply_kind permit_get_row = REPLY_KIND(permit_cols);

static const struct reply_col permit_quota_cols[] = {
    {"key", REPLY_STR, PC_KEY, 0},
    {"weight", REPLY_INT, PC_WEIGHT, 0},
};
static const struct reply_kind permit_quota_row = REPLY_KIND(permit_quota_cols);

/* Packs the permit whose rows start at `row`; returns the first row of the
 * next permit. */
static int pack_permit(msgpack_packer *pk, const PGresult *res, int row,
		       const struct reply_kind *kind)
{
	int n = PQntuples(res), end = row;
	const char *id = PQgetvalue(res, row, PC_ID);
	struct reply_map m;

	while (end < n && strcmp(PQgetvalue(res, end, PC_ID), id) == 0)
		end++;
	reply_map_begin(&m, pk);
	reply_kv_row(&m, kind, res, row, 0);
	msgpack_packer *quotas = reply_key(&m, "quotas");
	msgpack_pack_array(quotas, (size_t)(end - row));
	for (int i = row; i < end; i++)
		reply_pack_row(quotas, &permit_quota_row, res, i, 0);
	reply_map_end(&m);
	return end;
}

static void got(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;

	if (!r->ok) {
		req_fail_db(req, r);
	} else if (!req_rows_are(req, &permit_get_row, res, 0)) {
		/* answered */
	} else if (PQntuples(res) < 1 || pgrow_null(res, 0, PC_ID)) {
		req_fail(req, PGC_E_NOT_FOUND, "no permit \"%s\"", call->id);
	} else {
		struct reply_map m;
		reply_map_begin(&m, req_result(req));
		pack_permit(reply_key(&m, "permit"), res, 0, &permit_get_row);
		reply_kv_int(&m, "now_at", pgrow_int(res, 0, PC_NOW));
		reply_map_end(&m);
		req_done(req);
	}
}

void rpc_permit_get(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	if (!call)
		return;
	if (!param_id(req, &call->id))
		return;
	char uid[24];
	snprintf(uid, sizeof(uid), "%u", (unsigned)req->conn->uid);
	const char *params[3] = {call->id, uid, req_is_admin(req) ? "true" : "false"};
	/* another uid's intent never leaves the database for a non-admin */
	req_query(req,
		  "SELECT " PERMIT_COLS ", CASE WHEN NOT r.redacted THEN s.intent END, r.redacted "
		  "FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN (pgcoord.permit_status s "
		  "  JOIN pgcoord.permit_quotas pq ON pq.permit_id = s.id "
		  "  CROSS JOIN LATERAL (SELECT NOT $3::boolean AND "
		  "    pgcoord.session_owner_uid(s.owner_session) IS DISTINCT FROM $2::bigint "
		  "    AS redacted) r) ON s.id = $1 "
		  "ORDER BY pq.key",
		  3, params, got);
}

/* permit.list pages by id (the permits' primary key) */
static const struct cursor_kind permit_cursor = {'p', 1, PERMIT_ID_MAX, false};

static void listed(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const struct permit_call *call = req->ctx;
	int64_t limit = call->page.limit;
	const PGresult *res = r->res;
	int n, count = 0;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &permit_row, res, 0) ||
	    !req_rows_fit(req, res, "page with a smaller limit or narrower filters"))
		return;
	n = PQntuples(res);
	for (int i = 0; i < n; i++)
		if (!pgrow_null(res, i, PC_ID) &&
		    (i == 0 || strcmp(PQgetvalue(res, i, PC_ID), PQgetvalue(res, i - 1, PC_ID))))
			count++;
	/* the query asked for one permit more than limit, to say "truncated" */
	bool truncated = count > limit;
	if (truncated)
		count = (int)limit;
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	msgpack_packer *pk = reply_key(&m, "permits");
	msgpack_pack_array(pk, (size_t)count);
	int last = -1;
	for (int i = 0, done = 0; i < n && done < count; done++) {
		last = i;
		i = pack_permit(pk, res, i, &permit_row);
	}
	reply_kv_bool(&m, "truncated", truncated);
	reply_kv_int(&m, "now_at", n ? pgrow_int(res, 0, PC_NOW) : 0);
	reply_kv_next_cursor(&m, &permit_cursor, res, truncated ? last : -1, (const int[]){PC_ID});
	reply_map_end(&m);
	req_done(req);
}

void rpc_permit_list(struct request *req)
{
	char *quota = NULL;
	int state = 0, phase = 0;
	bool has_state, has_phase, has_owner;
	int64_t owner = 0;
	char owner_s[24];

	if (!req_param_str(req, "quota", false, PERMIT_KEY_MAX, &quota))
		return;
	if (!req_param_enum(req, "state", false, state_names, &state, &has_state) ||
	    !req_param_enum(req, "phase", false, phase_names, &phase, &has_phase) ||
	    !req_param_int(req, "owner", false, 1, INT64_MAX, &owner, &has_owner)) {
		free(quota);
		return;
	}
	snprintf(owner_s, sizeof(owner_s), "%" PRId64, owner);
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	if (!call || !req_param_page(req, &permit_cursor, PERMIT_LIST_DEFAULT, PERMIT_LIST_MAX,
				     &call->page)) {
		free(quota);
		return;
	}
	const char *params[6] = {quota,
				 has_state ? state_names[state] : NULL,
				 has_phase ? phase_names[phase] : NULL,
				 has_owner ? owner_s : NULL,
				 call->page.fetch,
				 page_after(&call->page, 0)};
	/* by id, a range scan of permits_pkey from the cursor on (the statement
	 * asks for one permit more than a page, to say "another follows");
	 * released tombstones only when asked for by state. The page's ids go
	 * to permit_quotas as an array, so its shares are read by permits_pkey
	 * too (joined on id alone, the planner hashes every permit) */
	req_query(req,
		  "WITH sel AS ("
		  " SELECT s.* FROM pgcoord.permit_status s"
		  " WHERE s.id > $6::text"
		  "  AND ($1::text IS NULL OR EXISTS (SELECT 1 FROM pgcoord.permit_quotas f"
		  "   WHERE f.permit_id = s.id AND f.key = $1))"
		  "  AND ($2::text IS NULL OR s.effective_state = $2)"
		  "  AND ($3::text IS NULL OR s.phase = $3)"
		  "  AND ($4::bigint IS NULL OR s.owner_session = $4)"
		  "  AND (s.state <> 'released' OR $2::text = 'released')"
		  " ORDER BY s.id"
		  " LIMIT $5::integer) "
		  "SELECT " PERMIT_COLS " FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN (sel s JOIN pgcoord.permit_quotas pq ON pq.permit_id = s.id"
		  "  AND pq.permit_id = ANY (ARRAY(SELECT id::text FROM sel))) ON true "
		  "ORDER BY s.id, pq.key",
		  6, params, listed);
	free(quota);
}

/* --- permit.history -------------------------------------------------------- */

enum { PE_NOW, PE_FOUND, PE_SEQ };

static const struct reply_col permit_event_cols[] = {
    {"now_at", REPLY_HIDDEN, PE_NOW, 0},
    {"found", REPLY_HIDDEN, PE_FOUND, 0},
    {"seq", REPLY_INT, PE_SEQ, 0},
    {"event", REPLY_STR, 3, 0},
    {"quota", REPLY_STR, 4, 0},
    {"delta", REPLY_INT, 5, 0},
    {"actor", REPLY_STR, 6, 0},
    {"reason", REPLY_STR, 7, 0},
    {"state", REPLY_STR, 8, 0},
    {"phase", REPLY_STR, 9, 0},
    {"at", REPLY_INT, 10, 0},
};
static const struct reply_kind permit_event_row = REPLY_KIND(permit_event_cols);

static void history_done(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	struct permit_call *call = req->ctx;
	const PGresult *res = r->res;
	int n;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &permit_event_row, res, 0))
		return;
	n = PQntuples(res);
	if (n < 1 || !pgrow_bool(res, 0, PE_FOUND)) {
		req_fail(req, PGC_E_NOT_FOUND, "no permit \"%s\"", call->id);
		return;
	}
	if (!req_rows_fit(req, res, "read the permit's audit rows in the database"))
		return;
	int count = pgrow_null(res, 0, PE_SEQ) ? 0 : n;
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_str(&m, "id", call->id);
	msgpack_packer *pk = reply_key(&m, "events");
	msgpack_pack_array(pk, (size_t)count);
	for (int i = 0; i < count; i++)
		reply_pack_row(pk, &permit_event_row, res, i, 0);
	reply_kv_int(&m, "now_at", pgrow_int(res, 0, PE_NOW));
	reply_map_end(&m);
	req_done(req);
}

void rpc_permit_history(struct request *req)
{
	struct permit_call *call = req_ctx_alloc(req, sizeof(*call), permit_call_free);
	if (!call)
		return;
	if (!param_id(req, &call->id))
		return;
	const char *params[1] = {call->id};
	req_query(req,
		  "SELECT n.now_at, n.found, e.id, e.event, e.key, e.delta, e.actor, e.reason, "
		  "e.state, e.phase, pgcoord.ms(e.at) "
		  "FROM (SELECT pgcoord.ms(now()) AS now_at, "
		  "  EXISTS (SELECT 1 FROM pgcoord.permits WHERE id = $1) AS found) n "
		  "LEFT JOIN pgcoord.permit_events e ON e.permit_id = $1 "
		  "ORDER BY e.id",
		  1, params, history_done);
}

/* --- permit.check ------------------------------------------------------------ */

/* permit.check's rows: a quota's conservation, or a stalled queue. */
enum { CK_NOW, CK_KEY, CK_PROBLEM = 6, CK_HEAD_ID, CK_HEAD_AGE };

static const struct reply_col violation_cols[] = {
    {"now_at", REPLY_HIDDEN, CK_NOW, 0},
    {"key", REPLY_STR, CK_KEY, 0},
    {"limit", REPLY_INT, 2, 0},
    {"in_flight", REPLY_INT, 3, 0},
    {"permit_weights", REPLY_INT, 4, 0},
    {"audit_sum", REPLY_INT, 5, 0},
    {"problem", REPLY_STR, CK_PROBLEM, 0},
    {"head_id", REPLY_HIDDEN, CK_HEAD_ID, 0},
    {"head_age_ms", REPLY_HIDDEN, CK_HEAD_AGE, 0},
};
static const struct reply_kind violation_row = REPLY_KIND(violation_cols);

static const struct reply_col stalled_cols[] = {
    {"key", REPLY_STR, CK_KEY, 0},
    {"head_id", REPLY_STR, CK_HEAD_ID, 0},
    {"head_age_ms", REPLY_INT, CK_HEAD_AGE, 0},
};
static const struct reply_kind stalled_row = REPLY_KIND(stalled_cols);

static void checked(const struct db_result *r, void *arg)
{
	struct request *req = arg;
	const PGresult *res = r->res;
	int n, quotas = 0, bad = 0, stalled = 0;

	if (!r->ok) {
		req_fail_db(req, r);
		return;
	}
	if (!req_rows_are(req, &violation_row, res, 0))
		return;
	n = PQntuples(res);
	for (int i = 0; i < n; i++) {
		if (pgrow_null(res, i, CK_KEY))
			continue;
		if (!pgrow_null(res, i, CK_HEAD_ID)) {
			stalled++;
			continue;
		}
		quotas++;
		bad += PQgetlength(res, i, CK_PROBLEM) > 0;
	}
	if (bad)
		log_error(&req->ag->log, "permits",
			  "conservation check failed for %d quota(s); see permit.check", bad);
	if (stalled)
		log_error(&req->ag->log, "permits",
			  "%d waiting queue(s) have a head that fits but was not admitted; see "
			  "permit.check",
			  stalled);
	struct reply_map m;
	reply_map_begin(&m, req_result(req));
	reply_kv_bool(&m, "ok", bad == 0);
	reply_kv_int(&m, "quotas", quotas);
	msgpack_packer *pk = reply_key(&m, "violations");
	msgpack_pack_array(pk, (size_t)bad);
	for (int i = 0; i < n; i++) {
		if (pgrow_null(res, i, CK_KEY) || !pgrow_null(res, i, CK_HEAD_ID) ||
		    PQgetlength(res, i, CK_PROBLEM) == 0)
			continue;
		reply_pack_row(pk, &violation_row, res, i, 0);
	}
	/* a queue whose head fits was not handed its room (0006_waiting_claims.sql) */
	pk = reply_key(&m, "stalled_queues");
	msgpack_pack_array(pk, (size_t)stalled);
	for (int i = 0; i < n; i++) {
		if (pgrow_null(res, i, CK_KEY) || pgrow_null(res, i, CK_HEAD_ID))
			continue;
		reply_pack_row(pk, &stalled_row, res, i, 0);
	}
	reply_kv_int(&m, "now_at", n ? pgrow_int(res, 0, CK_NOW) : 0);
	reply_map_end(&m);
	req_done(req);
}

void rpc_permit_check(struct request *req)
{
	/* guarantee 2, checked in one statement: one consistent snapshot */
	req_query(req,
		  "SELECT n.now_at, c.key, c.\"limit\", c.in_flight, c.permit_weights, "
		  "c.audit_sum, c.problem, NULL::text, NULL::bigint "
		  "FROM (SELECT pgcoord.ms(now()) AS now_at) n "
		  "LEFT JOIN pgcoord.permits_check() c ON true "
		  "UNION ALL SELECT pgcoord.ms(now()), s.key, NULL, NULL, NULL, NULL, NULL, "
		  "s.head_id, s.head_age_ms FROM pgcoord.stalled_queues() s",
		  0, NULL, checked);
}
