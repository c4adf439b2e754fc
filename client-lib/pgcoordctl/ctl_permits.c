/*
 * ctl_permits.c — the quota and permit commands: quotas, quota (show, set),
 * permits (list, show, history, and the audited overrides resolve and
 * release), and claim and cancel (ctl_claim.c holds their session).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl.h"
#include "ctl_claim.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"

int ctl_cmd_quotas(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"KEY", "key", CTL_FMT_AUTO},
	    {"LIMIT", "limit", CTL_FMT_AUTO},
	    {"IN_FLIGHT", "in_flight", CTL_FMT_AUTO},
	    {"HELD", "held", CTL_FMT_AUTO},
	    {"UNCERTAIN", "uncertain", CTL_FMT_AUTO},
	    {"AVAILABLE", "available", CTL_FMT_AUTO},
	    {"PERMITS", "permits", CTL_FMT_AUTO},
	    {"LAPSE_AFTER_S", "lapse_after_s", CTL_FMT_AUTO},
	};
	return ctl_list_command(ctx, "quota.list", "quotas", cols, sizeof(cols) / sizeof(cols[0]));
}

int ctl_cmd_quota(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	long limit, lapse = -1;
	int rc;

	if (argc == 1 && strcmp(argv[0], "set") != 0) {
		if (ctx->lapse_after)
			return ctl_usage_error("--lapse-after goes with `quota set`");
		ctl_params_init(&p);
		msgpack_pack_map(&p.pk, 1);
		ctl_pack_kv_str(&p.pk, "key", argv[0]);
		rc = ctl_call_with(ctx, "quota.get", &p, &r);
		if (rc != CTL_EXIT_OK)
			return rc;
		ctl_print_map(ctx, &r, "quota");
		ctl_result_free(&r);
		return CTL_EXIT_OK;
	}
	if (argc != 3 || strcmp(argv[0], "set") != 0)
		return ctl_usage_error("quota: expected `quota KEY` or `quota set KEY LIMIT`");
	if (!ctl_parse_nonneg(argv[2], INT32_MAX, &limit))
		return ctl_usage_error(
		    "quota set: LIMIT must be a whole number from 0 to %d, not \"%s\"", INT32_MAX,
		    argv[2]);
	if (ctx->lapse_after && !ctl_parse_nonneg(ctx->lapse_after, INT32_MAX, &lapse))
		return ctl_usage_error(
		    "--lapse-after needs whole seconds from 0 (never) to %d, not "
		    "\"%s\"",
		    INT32_MAX, ctx->lapse_after);
	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 2 + (lapse >= 0));
	ctl_pack_kv_str(&p.pk, "key", argv[1]);
	ctl_pack_kv_int(&p.pk, "limit", limit);
	if (lapse >= 0)
		ctl_pack_kv_int(&p.pk, "lapse_after_s", lapse);
	rc = ctl_call_with(ctx, "quota.set", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	ctl_print_map(ctx, &r, NULL);
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

/* Appends "key:weight,…" of a permit's quotas to a string packed into pk. */
static void pack_quotas_text(msgpack_packer *pk, const msgpack_object *quotas)
{
	char buf[512];
	size_t n = 0;
	buf[0] = '\0';
	for (uint32_t i = 0; quotas && quotas->type == MSGPACK_OBJECT_ARRAY &&
			     i < quotas->via.array.size && n < sizeof(buf);
	     i++) {
		const msgpack_object *q = &quotas->via.array.ptr[i];
		const char *k = "";
		size_t klen = 0;
		int64_t w = 0;
		ctl_obj_str(ctl_map_get(q, "key"), &k, &klen);
		ctl_obj_int64(ctl_map_get(q, "weight"), &w);
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%.*s:%lld", i ? "," : "",
				      (int)klen, k, (long long)w);
	}
	ctl_pack_cstr(pk, buf);
}

/*
 * permit.list rows, reshaped for a table: quotas as "key:weight,…" and the
 * owner as "session@replica", the other fields as the agent sent them.
 */
static int print_permits(const msgpack_object *result)
{
	static const char *const keep[] = {"id",	 "state",    "phase",
					   "created_at", "state_at", "uncertain_reason"};
	static const struct ctl_column cols[] = {
	    {"ID", "id", CTL_FMT_AUTO},
	    {"STATE", "state", CTL_FMT_AUTO},
	    {"PHASE", "phase", CTL_FMT_AUTO},
	    {"QUOTAS", "quotas", CTL_FMT_AUTO},
	    {"OWNER", "owner", CTL_FMT_AUTO},
	    {"AGE", "created_at", CTL_FMT_AGE},
	    {"STATE_SINCE", "state_at", CTL_FMT_AGE},
	    {"REASON", "uncertain_reason", CTL_FMT_AUTO},
	};
	const msgpack_object *rows = ctl_map_get(result, "permits");
	struct ctl_params p;
	msgpack_unpacked u;
	size_t off = 0;
	bool truncated = false;

	if (!rows || rows->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: permit.list: the result has no \"permits\" list\n");
		return CTL_EXIT_IO;
	}
	ctl_params_init(&p);
	msgpack_pack_array(&p.pk, rows->via.array.size);
	for (uint32_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		const msgpack_object *owner = ctl_map_get(row, "owner_session");
		const msgpack_object *replica = ctl_map_get(row, "owner_replica");
		int64_t sid;
		const char *rep = "?";
		size_t replen = 1;
		char who[300];

		msgpack_pack_map(&p.pk, 8);
		ctl_pack_kept(&p.pk, row, keep, sizeof(keep) / sizeof(keep[0]));
		ctl_pack_cstr(&p.pk, "quotas");
		pack_quotas_text(&p.pk, ctl_map_get(row, "quotas"));
		ctl_pack_cstr(&p.pk, "owner");
		if (ctl_obj_int64(owner, &sid)) {
			ctl_obj_str(replica, &rep, &replen);
			snprintf(who, sizeof(who), "%lld@%.*s", (long long)sid, (int)replen, rep);
			ctl_pack_cstr(&p.pk, who);
		} else {
			msgpack_pack_nil(&p.pk);
		}
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, p.sb.data, p.sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_table(stdout, &u.data, cols, sizeof(cols) / sizeof(cols[0]),
				ctl_now_ms(result));
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&p.sb);
	ctl_obj_bool(ctl_map_get(result, "truncated"), &truncated);
	if (truncated)
		printf("(more permits than shown; narrow with --state or --quota)\n");
	return CTL_EXIT_OK;
}

/* Uncertain first (what needs an operator), then oldest first: the agent
 * pages by id, so the order is made here, over every page. */
static int permit_order(const void *a, const void *b)
{
	const msgpack_object *x = a, *y = b;
	const char *sx = "", *sy = "";
	size_t lx = 0, ly = 0;
	int64_t cx = 0, cy = 0;

	ctl_obj_str(ctl_map_get(x, "state"), &sx, &lx);
	ctl_obj_str(ctl_map_get(y, "state"), &sy, &ly);
	bool ux = lx == 9 && memcmp(sx, "uncertain", 9) == 0;
	bool uy = ly == 9 && memcmp(sy, "uncertain", 9) == 0;
	if (ux != uy)
		return ux ? -1 : 1;
	ctl_obj_int64(ctl_map_get(x, "created_at"), &cx);
	ctl_obj_int64(ctl_map_get(y, "created_at"), &cy);
	if (cx != cy)
		return cx < cy ? -1 : 1;
	ctl_obj_str(ctl_map_get(x, "id"), &sx, &lx);
	ctl_obj_str(ctl_map_get(y, "id"), &sy, &ly);
	int c = memcmp(sx, sy, lx < ly ? lx : ly);
	return c ? c : (lx > ly) - (lx < ly);
}

static int permits_list(struct ctl *ctx)
{
	struct ctl_params p;
	struct ctl_result r;
	int rc;

	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, (ctx->state != NULL) + (ctx->quota != NULL));
	if (ctx->state)
		ctl_pack_kv_str(&p.pk, "state", ctx->state);
	if (ctx->quota)
		ctl_pack_kv_str(&p.pk, "quota", ctx->quota);
	rc = ctl_list(ctx, "permit.list", p.sb.data, p.sb.size, &r);
	msgpack_sbuffer_destroy(&p.sb);
	if (rc != CTL_EXIT_OK)
		return rc;
	const msgpack_object *rows = ctl_map_get(r.obj, "permits");
	if (rows && rows->type == MSGPACK_OBJECT_ARRAY && rows->via.array.size > 1)
		qsort(rows->via.array.ptr, rows->via.array.size, sizeof(msgpack_object),
		      permit_order);
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		rc = print_permits(r.obj);
	ctl_result_free(&r);
	return rc;
}

static int permits_by_id(struct ctl *ctx, const char *method, const char *id)
{
	static const struct ctl_column cols[] = {
	    {"SEQ", "seq", CTL_FMT_AUTO},	{"AT", "at", CTL_FMT_AGE},
	    {"EVENT", "event", CTL_FMT_AUTO},	{"QUOTA", "quota", CTL_FMT_AUTO},
	    {"DELTA", "delta", CTL_FMT_AUTO},	{"ACTOR", "actor", CTL_FMT_AUTO},
	    {"STATE", "state", CTL_FMT_AUTO},	{"PHASE", "phase", CTL_FMT_AUTO},
	    {"REASON", "reason", CTL_FMT_AUTO},
	};
	struct ctl_params p;
	struct ctl_result r;
	bool history = strcmp(method, "permit.history") == 0;
	int rc;

	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 1);
	ctl_pack_kv_str(&p.pk, "id", id);
	rc = ctl_call_with(ctx, method, &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else if (history)
		ctl_print_table(stdout, ctl_map_get(r.obj, "events"), cols,
				sizeof(cols) / sizeof(cols[0]), ctl_now_ms(r.obj));
	else
		ctl_print_map(ctx, &r, "permit");
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

/* Operator overrides: pgcoordctl has no session, so both go as admin
 * overrides, audited by the agent with this process's uid. */
static int permits_resolve(struct ctl *ctx, const char *id)
{
	struct ctl_params p;
	struct ctl_result r;
	int rc;

	if (ctx->gone == ctx->running)
		return ctl_usage_error("permits resolve: say what was observed with exactly one of "
				       "--gone or --running");
	if (!ctx->evidence || strspn(ctx->evidence, " \t\r\n") == strlen(ctx->evidence))
		return ctl_usage_error("permits resolve: --evidence TEXT is required: what you "
				       "observed that shows the work is %s (it is audited)",
				       ctx->gone ? "gone" : "running");
	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 4);
	ctl_pack_kv_str(&p.pk, "id", id);
	ctl_pack_kv_str(&p.pk, "outcome", ctx->gone ? "gone" : "running");
	ctl_pack_kv_str(&p.pk, "evidence", ctx->evidence);
	ctl_pack_kv_bool(&p.pk, "override", true);
	rc = ctl_call_with(ctx, "permit.resolve", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	ctl_print_map(ctx, &r, NULL);
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

static int permits_release(struct ctl *ctx, const char *id)
{
	struct ctl_params p;
	struct ctl_result r;
	int rc;

	if (!ctx->override)
		return ctl_usage_error(
		    "permits release: pgcoordctl holds no session, so this is an "
		    "operator override: add --override (audited with your uid)");
	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 2 + (ctx->reason != NULL));
	ctl_pack_kv_str(&p.pk, "id", id);
	ctl_pack_kv_bool(&p.pk, "override", true);
	if (ctx->reason)
		ctl_pack_kv_str(&p.pk, "reason", ctx->reason);
	rc = ctl_call_with(ctx, "permit.release", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	ctl_print_map(ctx, &r, NULL);
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

int ctl_cmd_permits(struct ctl *ctx, int argc, char **argv)
{
	const char *sub = argc ? argv[0] : "";
	bool resolve = strcmp(sub, "resolve") == 0, release = strcmp(sub, "release") == 0;

	if ((ctx->gone || ctx->running || ctx->evidence) && !resolve)
		return ctl_usage_error(
		    "--gone, --running and --evidence go with `permits resolve`");
	if ((ctx->override || ctx->reason) && !release)
		return ctl_usage_error("--override and --reason go with `permits release`");
	if ((ctx->state || ctx->quota) && argc)
		return ctl_usage_error("--state and --quota go with the `permits` list");
	if (argc == 0)
		return permits_list(ctx);
	if (argc != 2)
		return ctl_usage_error("permits %s: expected a permit ID", sub);
	if (strcmp(sub, "show") == 0)
		return permits_by_id(ctx, "permit.get", argv[1]);
	if (strcmp(sub, "history") == 0)
		return permits_by_id(ctx, "permit.history", argv[1]);
	if (resolve)
		return permits_resolve(ctx, argv[1]);
	if (release)
		return permits_release(ctx, argv[1]);
	return ctl_usage_error(
	    "permits: unknown subcommand \"%s\" (show, history, resolve, release)", sub);
}

/* KEY or KEY:WEIGHT; a key may hold ':' itself when no weight follows. */
static bool parse_quota_arg(const char *arg, char **key, int32_t *weight)
{
	const char *colon = strrchr(arg, ':');
	long w = 1;
	size_t n = strlen(arg);

	if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
		if (!ctl_parse_nonneg(colon + 1, INT32_MAX, &w) || w < 1)
			return false;
		n = (size_t)(colon - arg);
	}
	if (n == 0)
		return false;
	*key = strndup(arg, n);
	*weight = (int32_t)w;
	return *key != NULL;
}

static void claim_options(const struct ctl *ctx, const char *id, struct ctl_claim_options *opt)
{
	*opt = (struct ctl_claim_options){.socket_path = ctx->socket_path,
					  .call_timeout_ms = ctx->timeout_ms,
					  .json = ctx->json,
					  .id = id};
}

int ctl_cmd_claim(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_claim_options opt;
	long wait_ms = 0;
	int rc = CTL_EXIT_OK;
	char **keys = NULL;
	int32_t *weights = NULL;

	if (argc != 1 || !*argv[0])
		return ctl_usage_error("claim: expected a permit ID");
	if (ctx->nquotas == 0)
		return ctl_usage_error("claim needs at least one --quota KEY[:WEIGHT]");
	if (ctx->wait && (!ctl_parse_nonneg(ctx->wait, 3600000, &wait_ms) || wait_ms < 1))
		return ctl_usage_error("--wait takes milliseconds from 1 to 3600000, not \"%s\"",
				       ctx->wait);
	keys = calloc((size_t)ctx->nquotas, sizeof(char *));
	weights = calloc((size_t)ctx->nquotas, sizeof(int32_t));
	if (!keys || !weights) {
		fprintf(stderr, "pgcoordctl: out of memory\n");
		rc = CTL_EXIT_FAILED;
		goto out;
	}
	for (int i = 0; i < ctx->nquotas; i++) {
		if (!parse_quota_arg(ctx->quotas[i], &keys[i], &weights[i])) {
			rc = ctl_usage_error(
			    "--quota takes KEY or KEY:WEIGHT (WEIGHT from 1 to %d), "
			    "not \"%s\"",
			    INT32_MAX, ctx->quotas[i]);
			goto out;
		}
	}
	claim_options(ctx, argv[0], &opt);
	opt.keys = (const char *const *)keys;
	opt.weights = weights;
	opt.nquotas = (size_t)ctx->nquotas;
	opt.wait_ms = wait_ms;
	opt.intent = ctx->intent;
	rc = ctl_claim(&opt);
out:
	for (int i = 0; keys && i < ctx->nquotas; i++)
		free(keys[i]);
	free(keys);
	free(weights);
	return rc;
}

int ctl_cmd_cancel(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_claim_options opt;

	if (argc != 1 || !*argv[0])
		return ctl_usage_error("cancel: expected the ID of a waiting claim");
	claim_options(ctx, argv[0], &opt);
	return ctl_cancel(&opt);
}
