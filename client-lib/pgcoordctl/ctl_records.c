/*
 * ctl_records.c — the record commands: records (list, show) and recover
 * --dry-run, what a recovery would adopt from dead owners right now.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "ctl.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"

/*
 * Record rows, reshaped for a table: the owner as "session@replica", the
 * other fields as the agent sent them.
 */
static void print_records(const msgpack_object *rows, int64_t now_ms)
{
	static const char *const keep[] = {"kind",	 "key",	       "state",
					   "owner_live", "token",      "permit",
					   "updated_at", "settled_at", "adopted_from"};
	static const struct ctl_column cols[] = {
	    {"KIND", "kind", CTL_FMT_AUTO},	    {"KEY", "key", CTL_FMT_AUTO},
	    {"STATE", "state", CTL_FMT_AUTO},	    {"OWNER", "owner", CTL_FMT_AUTO},
	    {"LIVE", "owner_live", CTL_FMT_YESNO},  {"TOKEN", "token", CTL_FMT_AUTO},
	    {"PERMIT", "permit", CTL_FMT_AUTO},	    {"UPDATED", "updated_at", CTL_FMT_AGE},
	    {"SETTLED", "settled_at", CTL_FMT_AGE}, {"ADOPTED_FROM", "adopted_from", CTL_FMT_AUTO},
	};
	struct ctl_params p;
	msgpack_unpacked u;
	size_t off = 0;

	ctl_params_init(&p);
	msgpack_pack_array(&p.pk, rows->via.array.size);
	for (uint32_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		const char *rep = "?";
		size_t replen = 1;
		int64_t sid = 0;
		char who[300];

		msgpack_pack_map(&p.pk, sizeof(keep) / sizeof(keep[0]) + 1);
		ctl_pack_kept(&p.pk, row, keep, sizeof(keep) / sizeof(keep[0]));
		ctl_obj_int64(ctl_map_get(row, "owner_session"), &sid);
		ctl_obj_str(ctl_map_get(row, "owner_replica"), &rep, &replen);
		snprintf(who, sizeof(who), "%lld@%.*s", (long long)sid, (int)replen, rep);
		ctl_pack_kv_str(&p.pk, "owner", who);
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, p.sb.data, p.sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_table(stdout, &u.data, cols, sizeof(cols) / sizeof(cols[0]), now_ms);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&p.sb);
}

int ctl_cmd_records(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	long owner = 0;
	bool truncated = false;
	int rc;

	if (argc) {
		if (argc != 3 || strcmp(argv[0], "show") != 0)
			return ctl_usage_error(
			    "records: expected `records` or `records show KIND KEY`");
		if (ctx->kind || ctx->owner || ctx->dead)
			return ctl_usage_error(
			    "--kind, --owner and --dead go with the `records` list");
		ctl_params_init(&p);
		msgpack_pack_map(&p.pk, 2);
		ctl_pack_kv_str(&p.pk, "kind", argv[1]);
		ctl_pack_kv_str(&p.pk, "key", argv[2]);
		rc = ctl_call_with(ctx, "record.get", &p, &r);
		if (rc != CTL_EXIT_OK)
			return rc;
		ctl_print_map(ctx, &r, "record");
		ctl_result_free(&r);
		return CTL_EXIT_OK;
	}
	if (ctx->owner && (!ctl_parse_nonneg(ctx->owner, LONG_MAX, &owner) || owner == 0))
		return ctl_usage_error(
		    "--owner needs a session id (a whole number >= 1), not \"%s\"", ctx->owner);
	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, (ctx->kind != NULL) + (owner > 0) + 2 * ctx->dead);
	if (ctx->kind)
		ctl_pack_kv_str(&p.pk, "kind", ctx->kind);
	if (owner > 0)
		ctl_pack_kv_int(&p.pk, "owner", owner);
	if (ctx->dead) {
		/* what a recovery would take: open records of owners not live */
		ctl_pack_kv_bool(&p.pk, "live_owner", false);
		ctl_pack_kv_bool(&p.pk, "terminal", false);
	}
	rc = ctl_list(ctx, "record.list", p.sb.data, p.sb.size, &r);
	msgpack_sbuffer_destroy(&p.sb);
	if (rc != CTL_EXIT_OK)
		return rc;
	const msgpack_object *rows = ctl_map_get(r.obj, "records");
	if (ctx->json) {
		ctl_print_json(stdout, r.obj);
	} else if (!rows || rows->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: record.list: the result has no \"records\" list\n");
		rc = CTL_EXIT_IO;
	} else {
		print_records(rows, ctl_now_ms(r.obj));
		ctl_obj_bool(ctl_map_get(r.obj, "truncated"), &truncated);
		if (truncated)
			printf(
			    "(more records than shown; narrow with --kind, --owner or --dead)\n");
	}
	ctl_result_free(&r);
	return rc;
}

int ctl_cmd_recover(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	long limit = 0;
	bool read = false;
	int64_t left = 0, remaining = 0;
	int rc;

	if (!ctx->dry_run)
		return ctl_usage_error(
		    "recover: a recovery adopts records for the session that runs "
		    "it, and pgcoordctl holds none; add --dry-run to see what a "
		    "recovery would adopt now");
	if (ctx->limit && (!ctl_parse_nonneg(ctx->limit, 10000, &limit) || limit == 0))
		return ctl_usage_error("--limit needs a whole number 1..10000, not \"%s\"",
				       ctx->limit);
	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 1 + (ctx->kinds != NULL) + (limit > 0));
	ctl_pack_kv_bool(&p.pk, "dry_run", true);
	if (ctx->kinds) {
		size_t n = 1;
		for (const char *s = ctx->kinds; *s; s++)
			n += *s == ',';
		ctl_pack_cstr(&p.pk, "kinds");
		msgpack_pack_array(&p.pk, n);
		for (const char *s = ctx->kinds;; s++) {
			const char *end = strchr(s, ',');
			size_t len = end ? (size_t)(end - s) : strlen(s);
			ctl_pack_strn(&p.pk, s, len);
			if (!end)
				break;
			s = end;
		}
	}
	if (limit > 0)
		ctl_pack_kv_int(&p.pk, "limit", limit);
	rc = ctl_call_with(ctx, "record.recover", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	const msgpack_object *rows = ctl_map_get(r.obj, "adopted");
	if (!ctl_obj_bool(ctl_map_get(r.obj, "liveness_read"), &read) || !rows ||
	    rows->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: record.recover: the result is not well-formed\n");
		ctl_result_free(&r);
		return CTL_EXIT_IO;
	}
	if (ctx->json) {
		ctl_print_json(stdout, r.obj);
	} else if (!read) {
		const char *why = "";
		size_t len = 0;
		ctl_obj_str(ctl_map_get(r.obj, "reason"), &why, &len);
		printf("liveness could not be read (%.*s): a recovery would adopt nothing now\n",
		       (int)len, why);
	} else {
		ctl_obj_int64(ctl_map_get(r.obj, "left_alone"), &left);
		ctl_obj_int64(ctl_map_get(r.obj, "remaining"), &remaining);
		print_records(rows, ctl_now_ms(r.obj));
		printf("a recovery would adopt %u record%s of dead owners; %lld left alone (live "
		       "owners)",
		       (unsigned)rows->via.array.size, rows->via.array.size == 1 ? "" : "s",
		       (long long)left);
		if (remaining > 0)
			printf("; %lld more past the limit", (long long)remaining);
		printf("\n");
	}
	ctl_result_free(&r);
	return read ? CTL_EXIT_OK : CTL_EXIT_FAILED;
}
