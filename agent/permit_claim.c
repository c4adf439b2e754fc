/*
 * permit_claim.c — permit.claim: its quotas read and sorted, the claim
 * grouped with others waiting at the same moment (groups.c: one of one
 * quota without a limit in the fast group, any other in the slow one) or,
 * when it may queue, sent alone (permit_wait), and each claim_decision row
 * answered.
 * The path a grant takes is the one that must never admit twice, so it is
 * kept apart from the calls on permits that already exist.
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
#include "agent/permits_internal.h"
#include "agent/pgrow.h"
#include "agent/reply.h"
#include "agent/sessions.h"
#include "agent/waiters.h"

#define PERMIT_MAX_QUOTAS 32
#define PERMIT_INTENT_MAX 65536
#define PERMIT_WAIT_MS_MAX 3600000

static const char *const owner_loss_names[] = {"uncertain", "release", NULL};

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

/* A grant (admitted, or held: a retry of a held id) is answered from its
 * row, with the call's id and whether the caller's session owns it. */
struct granted_view {
	const char *id;
	bool mine;
};

static const struct reply_col granted_cols[] = {
    {"status", REPLY_STR, CL_STATUS, 0},
    REPLY_FIELD("id", REPLY_FIELD_STR, struct granted_view, id),
    {"token", REPLY_INT, CL_TOKEN, 0},
    {"state", REPLY_STR, CL_STATE, 0},
    {"phase", REPLY_STR, CL_PHASE, 0},
    {"owner_session", REPLY_INT, CL_OWNER, 0},
    {"owner_replica", REPLY_STR, CL_REPLICA, 0},
    {"created_at", REPLY_INT, CL_CREATED, 0},
    {"now_at", REPLY_INT, CL_NOW, 0},
    REPLY_FIELD("mine", REPLY_FIELD_BOOL, struct granted_view, mine),
};
const struct reply_kind permit_granted_reply = REPLY_KIND(granted_cols);

static void claim_granted(struct request *req, struct permit_call *call, const PGresult *res,
			  int row, int col)
{
	struct group_keys keys = {0};
	for (size_t i = 0; i < call->nquotas; i++)
		group_keys_add(&keys, call->quotas[i].key, call->quotas[i].len);
	/* so that its release is held only behind statements on its keys */
	if (req->ag->release_group)
		group_remember_keys(req->ag->release_group, call->id, &keys);
	/* a retry through another session (of the same uid: another uid's
	 * is refused) finds the grant owned by the first one; it says so
	 * rather than moving ownership silently */
	struct granted_view v = {
	    .id = call->id,
	    .mine = !pgrow_null(res, row, col + CL_OWNER) && req->conn->session &&
		    pgrow_int(res, row, col + CL_OWNER) == req->conn->session->id,
	};
	struct reply_src src = {.res = res, .row = row, .nrows = 1, .offset = col, .c = &v};
	reply_pack(req_result(req), &permit_granted_reply, &src);
	req_done(req);
}

/* A waiting claim: permit.admitted or permit.expired follows on the
 * connection of the session that queued it (waiters.c). */
static void claim_queued(struct request *req, struct permit_call *call, const PGresult *res,
			 int row, int col)
{
	int64_t owner = pgrow_int(res, row, col + CL_OWNER);
	bool mine = req->conn->session && owner == req->conn->session->id;
	struct claim_pending *p = calloc(1, sizeof(*p));
	if (!p) {
		req_fail(req, PGC_E_INTERNAL, "out of memory (the claim is queued: retry it)");
		return;
	}
	p->queued = true;
	p->track = mine;
	p->owner = owner;
	p->status = "queued";
	p->id = call->id;
	p->position = pgrow_int(res, row, col + CL_POSITION);
	p->queued_at = pgrow_int(res, row, col + CL_QUEUED_AT);
	p->deadline_at = pgrow_int(res, row, col + CL_DEADLINE_AT);
	p->now_at = pgrow_int(res, row, col + CL_NOW);
	p->mine = mine;
	claim_holders_send(req, call, p);
}

static void claim_denied(struct request *req, struct permit_call *call, const PGresult *res,
			 int row, int col)
{
	struct claim_pending *p = calloc(1, sizeof(*p));
	if (!p) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return;
	}
	snprintf(p->key, sizeof(p->key), "%s", PQgetvalue(res, row, col + CL_DKEY));
	p->status = "denied";
	p->id = call->id;
	p->quota = p->key;
	p->limit = pgrow_int(res, row, col + CL_DLIMIT);
	p->in_flight = pgrow_int(res, row, col + CL_DINFLIGHT);
	p->now_at = pgrow_int(res, row, col + CL_NOW);
	p->weight = claimed_weight(call, p->key);
	claim_holders_send(req, call, p);
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

/*
 * Claims waiting at the same moment go as one statement of a group
 * function, element i of each array for member i. A group of one, of
 * either kind, is permit_claim_as alone: the group function's v_n = 1
 * branch without the group's frame (a refusal raises as the statement's
 * error, as it does there), with the member's own arguments, so nothing
 * builds or parses arrays of one; for one call it also costs the database
 * less than the one statement's pipeline (0.23 against 0.31 ms,
 * docs/PERFORMANCE.md).
 */
#define CLAIM_KIND(kind_name, function)                                                            \
	{                                                                                          \
		.name = kind_name,                                                                 \
		.sql =                                                                             \
		    "SELECT * FROM pgcoord." function "($1::bigint[], $2::boolean[], "             \
		    "$3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], "   \
		    "$9::bytea[], $10::integer[], $11::text[])",                                   \
		.lone_sql =                                                                        \
		    "SELECT 1, NULL::text, NULL::text, c.* FROM pgcoord.permit_claim_as("          \
		    "$1::bigint, $2::boolean, $3::text, $4::text[], $5::integer[], "               \
		    "$6::bigint, $7::text, $8::text, $9::bytea, $10::integer, $11::text) c",       \
		.nargs = 11, .answer = claim_answer, .fail = claim_failed,                         \
	}

/* The common claims (one quota, no limit) are judged by one SQL statement
 * (0022_claim_release_fast.sql); what it leaves (a retry, a session not
 * live, a quota without room for all of them, ...) goes on to
 * permit_claim_group_kind, with the same arguments. */
const struct group_kind permit_claim_fast_kind = CLAIM_KIND("claim", "permit_claim_fast");

/* The other claims: each judged in arrival order by permit_claim_as
 * exactly as if alone (0004_permits.sql), in one statement. */
const struct group_kind permit_claim_group_kind = CLAIM_KIND("claim_slow", "permit_claim_group");

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
	if (!permit_param_id(req, &call->id) || !parse_claim_quotas(req, call) ||
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
	keys = call->keys_lit = keys_literal(call->quotas, call->nquotas);
	weights = call->weights_lit = weights_literal(call->quotas, call->nquotas);
	if (has_intent)
		intent_hex = pgrow_bytea_param(intent, intent_len);
	if (!keys || !weights || (has_intent && !intent_hex)) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		goto fail;
	}
	snprintf(session, sizeof(session), "%" PRId64, req->conn->session->id);
	snprintf(limit_s, sizeof(limit_s), "%" PRId64, limit);
	permit_session_actor(req, actor, sizeof(actor));
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
	group_add(call->nquotas == 1 && !has_limit ? ag->claim_group : ag->claim_slow_group, req,
		  call, params, &claim_keys);
fail:
	/* keys and weights stay with the call: a denied or queued answer
	 * reads its holders with them */
	free(intent_hex);
}
