/*
 * ctl_leases.c — the lease commands: leases, lease status, and run's
 * flags checked into the options ctl_run.c leads and supervises with.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"
#include "ctl_run.h"

/* Packs an epoch-ms instant, or nil for the -1 of "none". */
static void pack_instant(msgpack_packer *pk, const char *key, int64_t at)
{
	ctl_pack_cstr(pk, key);
	if (at >= 0)
		msgpack_pack_int64(pk, at);
	else
		msgpack_pack_nil(pk);
}

/* lease.list as a table: the holder as "session@replica" ("-" when free). */
static void print_leases(const struct pgcoord_lease_list *l)
{
	static const struct ctl_column cols[] = {
	    {"NAME", "name", CTL_FMT_AUTO},
	    {"HOLDER", "holder", CTL_FMT_AUTO},
	    {"EPOCH", "epoch", CTL_FMT_AUTO},
	    {"EXPIRES_IN", "expires_in_ms", CTL_FMT_DURATION},
	    {"TTL", "ttl_ms", CTL_FMT_DURATION},
	    {"ACQUIRED", "acquired_at", CTL_FMT_AGE},
	    {"RENEWED", "renewed_at", CTL_FMT_AGE},
	};
	struct ctl_params p;
	msgpack_unpacked u;
	size_t off = 0;

	ctl_params_init(&p);
	msgpack_pack_array(&p.pk, l->count);
	for (size_t i = 0; i < l->count; i++) {
		const struct pgcoord_lease_info *row = &l->leases[i];
		char who[300];

		msgpack_pack_map(&p.pk, 7);
		ctl_pack_kv_str(&p.pk, "name", row->name);
		ctl_pack_cstr(&p.pk, "holder");
		if (row->holder_session > 0) {
			snprintf(who, sizeof(who), "%lld@%s", (long long)row->holder_session,
				 row->holder_replica ? row->holder_replica : "?");
			ctl_pack_cstr(&p.pk, who);
		} else {
			msgpack_pack_nil(&p.pk);
		}
		ctl_pack_cstr(&p.pk, "epoch");
		msgpack_pack_int64(&p.pk, row->epoch);
		ctl_pack_cstr(&p.pk, "expires_in_ms");
		msgpack_pack_int64(&p.pk, row->expires_in_ms);
		ctl_pack_cstr(&p.pk, "ttl_ms");
		msgpack_pack_int64(&p.pk, row->ttl_ms);
		pack_instant(&p.pk, "acquired_at", row->acquired_at);
		pack_instant(&p.pk, "renewed_at", row->renewed_at);
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, p.sb.data, p.sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_table(stdout, &u.data, cols, sizeof(cols) / sizeof(cols[0]),
				ctl_now_ms(NULL));
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&p.sb);
}

/* --json prints the agent's own result; the table reads the typed list. */
int ctl_cmd_leases(struct ctl *ctx, int argc, char **argv)
{
	struct pgcoord_lease_list *l = NULL;

	if (ctx->json) {
		struct ctl_result r;
		int rc = ctl_list(ctx, "lease.list", NULL, 0, &r);
		if (rc != CTL_EXIT_OK)
			return rc;
		ctl_print_json(stdout, r.obj);
		ctl_result_free(&r);
		return CTL_EXIT_OK;
	}
	if (!ctx->conn) {
		int rc = ctl_connect(ctx);
		if (rc != CTL_EXIT_OK)
			return rc;
	}
	pgcoord_err err = pgcoord_lease_list_get(ctx->conn, ctx->timeout_ms, &l);
	if (err != PGCOORD_OK)
		return ctl_call_failed(ctx, "lease.list", err);
	print_leases(l);
	pgcoord_lease_list_free(l);
	return CTL_EXIT_OK;
}

int ctl_cmd_lease(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	int rc;

	if (argc != 2 || strcmp(argv[0], "status") != 0)
		return ctl_usage_error("lease: expected `lease status NAME`");
	ctl_params_init(&p);
	msgpack_pack_map(&p.pk, 1);
	ctl_pack_kv_str(&p.pk, "name", argv[1]);
	rc = ctl_call_with(ctx, "lease.status", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	ctl_print_map(ctx, &r, NULL);
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

int ctl_cmd_run(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_run_opts o = {.socket_path = ctx->socket_path,
				 .timeout_ms = ctx->timeout_ms,
				 .lease = ctx->lease,
				 .kill_grace_ms = -1};
	long v;

	if (!ctx->lease || !*ctx->lease)
		return ctl_usage_error("run: --lease NAME is required");
	if (argc == 0)
		return ctl_usage_error("run: no command given (run --lease NAME -- CMD [ARGS...])");
	if (ctx->json)
		return ctl_usage_error("run: --json does not apply");
	if (ctx->ttl) {
		if (!ctl_parse_nonneg(ctx->ttl, 600000, &v) || v < 1000)
			return ctl_usage_error(
			    "--ttl needs milliseconds between 1000 and 600000, not "
			    "\"%s\"",
			    ctx->ttl);
		o.ttl_ms = (int)v;
	}
	if (ctx->kill_grace) {
		if (!ctl_parse_nonneg(ctx->kill_grace, INT_MAX, &v))
			return ctl_usage_error("--kill-grace needs milliseconds >= 0, not \"%s\"",
					       ctx->kill_grace);
		/* the margin is known here only with --ttl; else after acquire */
		if (o.ttl_ms && v >= o.ttl_ms / 3)
			return ctl_usage_error(
			    "--kill-grace %ld ms does not fit the safety margin: with --ttl %d, "
			    "leadership ends %d ms before another host can take over and CMD "
			    "must be dead by then",
			    v, o.ttl_ms, o.ttl_ms / 3);
		o.kill_grace_ms = (int)v;
	}
	if (ctx->keepalive) {
		if (!ctl_parse_nonneg(ctx->keepalive, 600000, &v) || v < 100)
			return ctl_usage_error(
			    "--keepalive needs milliseconds between 100 and 600000, "
			    "not \"%s\"",
			    ctx->keepalive);
		o.keepalive_ms = (int)v;
	}
	return ctl_run(&o, argv);
}
