/*
 * ctl_live.c — the commands that keep running as things change: top, watch
 * and wait. Here their flags and operands are checked; ctl_top.c and
 * ctl_watch.c do the work.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "ctl_top.h"
#include "ctl_watch.h"

/* --- top ------------------------------------------------------------------ */

int ctl_cmd_top(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_top_options opt = {
	    .socket_path = ctx->socket_path,
	    .timeout_ms = ctx->timeout_ms,
	    .interval_ms = 1000,
	    .json = ctx->json,
	};
	char *end;

	if (ctx->interval) {
		errno = 0;
		long v = strtol(ctx->interval, &end, 10);
		if (errno || end == ctx->interval || *end || v < 100 || v > 3600000)
			return ctl_usage_error("--interval needs 100..3600000 ms, not \"%s\"",
					       ctx->interval);
		opt.interval_ms = (int)v;
	}
	if (ctx->count) {
		errno = 0;
		long v = strtol(ctx->count, &end, 10);
		if (errno || end == ctx->count || *end || v < 1 || v > INT_MAX)
			return ctl_usage_error("--count needs a number of frames >= 1, not \"%s\"",
					       ctx->count);
		opt.count = (int)v;
	}
	return ctl_top(&opt);
}

/* --- watch and wait ------------------------------------------------------- */

static int watch_target(struct ctl *ctx, int argc, char **argv, struct ctl_watch_options *opt)
{
	static const char *const whats[] = {"quota", "permit", "records"};
	bool known = false;

	if (argc != 2)
		return ctl_usage_error("%s needs quota KEY, permit ID or records KIND", ctx->cmd);
	for (size_t i = 0; i < sizeof(whats) / sizeof(whats[0]); i++)
		known |= strcmp(argv[0], whats[i]) == 0;
	if (!known)
		return ctl_usage_error("%s: \"%s\" is not quota, permit or records", ctx->cmd,
				       argv[0]);
	if (!*argv[1])
		return ctl_usage_error("%s %s: the %s is empty", ctx->cmd, argv[0],
				       strcmp(argv[0], "quota") == 0	? "key"
				       : strcmp(argv[0], "permit") == 0 ? "id"
									: "kind");
	*opt = (struct ctl_watch_options){
	    .socket_path = ctx->socket_path,
	    .call_timeout_ms = ctx->timeout_ms,
	    .json = ctx->json,
	    .what = argv[0],
	    .target = argv[1],
	    .wait_ms = -1,
	};
	return CTL_EXIT_OK;
}

int ctl_cmd_watch(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_watch_options opt;
	int rc = watch_target(ctx, argc, argv, &opt);
	return rc != CTL_EXIT_OK ? rc : ctl_watch(&opt);
}

int ctl_cmd_wait(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_watch_options opt;
	long room;
	int rc = watch_target(ctx, argc, argv, &opt);

	if (rc != CTL_EXIT_OK)
		return rc;
	if (strcmp(opt.what, "quota") != 0)
		return ctl_usage_error(
		    "wait: only a quota can be waited for (wait quota KEY --room N)");
	if (!ctx->room || !ctl_parse_nonneg(ctx->room, INT32_MAX, &room) || room < 1)
		return ctl_usage_error("wait needs --room N, N from 1 to %d", INT32_MAX);
	opt.room = room;
	if (ctx->timeout_given) {
		/* the whole wait; the calls within it get at most the default */
		opt.wait_ms = ctx->timeout_ms;
		if (opt.call_timeout_ms > CTL_DEFAULT_TIMEOUT_MS)
			opt.call_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
	}
	return ctl_wait(&opt);
}
