/*
 * ctl_why.c — `pgcoordctl why KEY` and `why --permit ID`: who holds a
 * quota's room (quota.why), for the operator whose claim was denied or
 * queued. A permit names its quotas, so `--permit` asks permit.get for them
 * and then shows each; a denied claim leaves no row, so for one the quota
 * is the question to ask.
 */
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"

static const struct ctl_column holder_cols[] = {
    {"ID", "id", CTL_FMT_AUTO},
    {"WEIGHT", "weight", CTL_FMT_AUTO},
    {"STATE", "state", CTL_FMT_AUTO},
    {"PHASE", "phase", CTL_FMT_AUTO},
    {"OWNER_REPLICA", "owner_replica", CTL_FMT_AUTO},
    {"SESSION", "owner_session", CTL_FMT_AUTO},
    {"HELD", "held_ms", CTL_FMT_DURATION},
    {"IN_STATE", "state_ms", CTL_FMT_DURATION},
    {"REASON", "reason", CTL_FMT_AUTO},
};
#define N_HOLDER_COLS (sizeof(holder_cols) / sizeof(holder_cols[0]))

/* The lists of quota.why, with what each heading says. */
static const struct {
	const char *key, *title;
} why_lists[] = {
    {"uncertain", "uncertain, longest first (counted until resolved or released)"},
    {"largest", "largest holders"},
    {"oldest", "held longest"},
};

static void print_why(const msgpack_object *res)
{
	int64_t now = ctl_now_ms(res);
	const msgpack_object *quota = ctl_map_get(res, "quota");
	const msgpack_object *head = ctl_map_get(res, "queue_head");

	if (quota && quota->type == MSGPACK_OBJECT_MAP)
		ctl_print_fields(stdout, quota, now);
	if (head && head->type == MSGPACK_OBJECT_MAP) {
		printf("\nqueue head (the next claim admitted when room frees):\n");
		ctl_print_fields(stdout, head, now);
	} else {
		printf("\nqueue: empty\n");
	}
	const msgpack_object *hidden = quota ? ctl_map_get(quota, "hidden") : NULL;
	for (size_t i = 0; i < sizeof(why_lists) / sizeof(why_lists[0]); i++) {
		const msgpack_object *rows = ctl_map_get(res, why_lists[i].key);
		if (!rows || rows->type != MSGPACK_OBJECT_ARRAY)
			continue;
		printf("\n%s:\n", why_lists[i].title);
		ctl_print_table(stdout, rows, holder_cols, N_HOLDER_COLS, now);
	}
	if (hidden && hidden->type == MSGPACK_OBJECT_POSITIVE_INTEGER && hidden->via.u64 > 0)
		printf("\n%llu holder(s) of other uids are counted above but not shown (their "
		       "details need admin)\n",
		       (unsigned long long)hidden->via.u64);
}

/* quota.why of one key, printed (or as JSON). */
static int why_key(struct ctl *ctx, const char *key, long holders)
{
	struct ctl_params p;
	struct ctl_result r;

	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, holders ? 2 : 1);
	ctl_pack_kv_str(&p.pk, "key", key);
	if (holders)
		ctl_pack_kv_int(&p.pk, "holders", holders);
	int rc = ctl_call_with(ctx, "quota.why", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		print_why(r.obj);
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

/* The quotas of permit id, each shown as `why KEY` shows it. */
static int why_permit(struct ctl *ctx, const char *id, long holders)
{
	struct ctl_params p;
	struct ctl_result r;

	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 1);
	ctl_pack_kv_str(&p.pk, "id", id);
	int rc = ctl_call_with(ctx, "permit.get", &p, &r);
	if (rc != CTL_EXIT_OK) {
		fprintf(stderr,
			"pgcoordctl: a denied claim leaves no permit behind, and a waiting one is "
			"not a permit yet: ask about its quota (pgcoordctl why KEY)\n");
		return rc;
	}
	const msgpack_object *permit = ctl_map_get(r.obj, "permit");
	const msgpack_object *quotas = permit ? ctl_map_get(permit, "quotas") : NULL;
	if (!quotas || quotas->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: permit.get answered no quotas for \"%s\"\n", id);
		ctl_result_free(&r);
		return CTL_EXIT_FAILED;
	}
	if (!ctx->json) {
		char state[64] = "?";
		ctl_format_value(state, sizeof(state), "state", ctl_map_get(permit, "state"),
				 CTL_FMT_AUTO, 0);
		printf("permit %s is %s, on %u quota(s)\n", id, state, quotas->via.array.size);
	}
	for (uint32_t i = 0; i < quotas->via.array.size && rc == CTL_EXIT_OK; i++) {
		const msgpack_object *key = ctl_map_get(&quotas->via.array.ptr[i], "key");
		char name[256];
		if (!key || key->type != MSGPACK_OBJECT_STR || key->via.str.size >= sizeof(name))
			continue;
		memcpy(name, key->via.str.ptr, key->via.str.size);
		name[key->via.str.size] = '\0';
		if (!ctx->json)
			printf("\n== quota %s\n", name);
		rc = why_key(ctx, name, holders);
	}
	ctl_result_free(&r);
	return rc;
}

int ctl_cmd_why(struct ctl *ctx, int argc, char **argv)
{
	long holders = 0;

	if (ctx->limit && (!ctl_parse_nonneg(ctx->limit, 50, &holders) || holders == 0))
		return ctl_usage_error(
		    "why: --limit must be a whole number from 1 to 50, not \"%s\"", ctx->limit);
	if (ctx->permit && argc == 0)
		return why_permit(ctx, ctx->permit, holders);
	if (!ctx->permit && argc == 1)
		return why_key(ctx, argv[0], holders);
	return ctl_usage_error("why: expected `why KEY` or `why --permit ID`");
}
