/*
 * ctl_call.c — how pgcoordctl's commands talk to the agent: connecting (and
 * saying why not), one call or a whole paged list decoded into a
 * ctl_result, the exit status of a failure, and the few ways a result is
 * shown (fields, a table, JSON) that most commands end with.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"

static int exit_for(pgcoord_err err)
{
	switch (err) {
	case PGCOORD_OK:
		return CTL_EXIT_OK;
	case PGCOORD_E_CONNECT:
		return CTL_EXIT_NOCONNECT;
	case PGCOORD_E_IO:
	case PGCOORD_E_CALL_TIMEOUT:
	case PGCOORD_E_CLOSED:
	case PGCOORD_E_PROTOCOL:
		return CTL_EXIT_IO;
	default:
		return CTL_EXIT_FAILED;
	}
}

int ctl_connect(struct ctl *ctx)
{
	pgcoord_err err = pgcoord_connect(ctx->socket_path, ctx->timeout_ms, &ctx->conn);
	if (err == PGCOORD_OK)
		return CTL_EXIT_OK;

	int e = errno;
	if (err == PGCOORD_E_ARG) {
		fprintf(stderr, "pgcoordctl: unusable socket path %s: %s\n", ctx->socket_path,
			strerror(e));
		return CTL_EXIT_USAGE;
	}
	const char *why = pgcoord_strerror(err);
	if (err == PGCOORD_E_CONNECT)
		why = e == ETIMEDOUT ? "timed out" : strerror(e);
	fprintf(stderr, "pgcoordctl: cannot connect to the agent at %s: %s\n", ctx->socket_path,
		why);
	if (e == ENOENT || e == ECONNREFUSED)
		fprintf(stderr, "pgcoordctl: is pgcoord-agent running? (choose the socket with "
				"--socket or PGCOORD_SOCKET_PATH)\n");
	else if (e == EACCES)
		fprintf(stderr, "pgcoordctl: this user may not open the socket; it is mode 0660, "
				"owned by the agent's group\n");
	return exit_for(err);
}

void ctl_result_free(struct ctl_result *r)
{
	if (r->obj)
		msgpack_unpacked_destroy(&r->u);
	pgcoord_free(r->buf);
	memset(r, 0, sizeof(*r));
}

/*
 * Makes one call and decodes its result. On failure prints what went wrong
 * (the wire code name and the agent's message) and returns the exit code.
 */
/* Says why method failed, and returns the exit status for it. */
int ctl_call_failed(struct ctl *ctx, const char *method, pgcoord_err err)
{
	/* Agent errors by their wire name (what scripts and docs use). */
	const char *msg = pgcoord_last_message(ctx->conn);
	const char *retry = pgcoord_err_retryable(err) ? " (retryable)" : "";
	if ((int)err < 100)
		fprintf(stderr, "pgcoordctl: %s: %s%s%s%s\n", method, pgcoord_err_name(err),
			*msg ? ": " : "", msg, retry);
	else
		fprintf(stderr, "pgcoordctl: %s: %s%s\n", method,
			*msg ? msg : pgcoord_strerror(err), retry);
	return exit_for(err);
}

/* Decodes the result r->buf holds; CTL_EXIT_OK or CTL_EXIT_IO. */
static int ctl_decode(const char *method, struct ctl_result *r)
{
	size_t off = 0;
	msgpack_unpacked_init(&r->u);
	if (msgpack_unpack_next(&r->u, r->buf, r->len, &off) != MSGPACK_UNPACK_SUCCESS) {
		msgpack_unpacked_destroy(&r->u);
		fprintf(stderr, "pgcoordctl: %s: the result does not decode\n", method);
		return CTL_EXIT_IO;
	}
	r->obj = &r->u.data;
	return CTL_EXIT_OK;
}

int ctl_call(struct ctl *ctx, const char *method, const void *params, size_t params_len,
	     struct ctl_result *r)
{
	memset(r, 0, sizeof(*r));
	if (!ctx->conn) {
		int rc = ctl_connect(ctx);
		if (rc != CTL_EXIT_OK)
			return rc;
	}
	pgcoord_err err =
	    pgcoord_call(ctx->conn, method, params, params_len, ctx->timeout_ms, &r->buf, &r->len);
	if (err != PGCOORD_OK)
		return ctl_call_failed(ctx, method, err);
	return ctl_decode(method, r);
}

/* A paged list: every page as one result, or with --limit N only the
 * first N rows (one page; its next_cursor says whether more follow). */
int ctl_list(struct ctl *ctx, const char *method, const void *params, size_t params_len,
	     struct ctl_result *r)
{
	long limit = 0;
	pgcoord_err err;

	memset(r, 0, sizeof(*r));
	if (ctx->limit && (!ctl_parse_nonneg(ctx->limit, 10000, &limit) || limit == 0))
		return ctl_usage_error("--limit needs a whole number 1..10000, not \"%s\"",
				       ctx->limit);
	if (!ctx->conn) {
		int rc = ctl_connect(ctx);
		if (rc != CTL_EXIT_OK)
			return rc;
	}
	if (limit > 0)
		err = pgcoord_list_page(ctx->conn, method, params, params_len, limit, NULL,
					ctx->timeout_ms, &r->buf, &r->len, NULL);
	else
		err = pgcoord_list_all(ctx->conn, method, params, params_len, ctx->timeout_ms,
				       &r->buf, &r->len);
	if (err != PGCOORD_OK)
		return ctl_call_failed(ctx, method, err);
	return ctl_decode(method, r);
}

/* Copies the listed keys of a result row into a table row being packed
 * (nil where the row lacks one). */
void ctl_pack_kept(msgpack_packer *pk, const msgpack_object *row, const char *const *keep, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		const msgpack_object *v = ctl_map_get(row, keep[k]);
		ctl_pack_cstr(pk, keep[k]);
		if (v)
			msgpack_pack_object(pk, *v);
		else
			msgpack_pack_nil(pk);
	}
}

/* Prints result[list_key] as a table, or the whole result as JSON. */
int ctl_list_command(struct ctl *ctx, const char *method, const char *list_key,
		     const struct ctl_column *cols, size_t ncols)
{
	struct ctl_result r;
	int rc = ctl_list(ctx, method, NULL, 0, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	const msgpack_object *rows = ctl_map_get(r.obj, list_key);
	if (ctx->json) {
		ctl_print_json(stdout, r.obj);
	} else if (!rows || rows->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: %s: the result has no \"%s\" list\n", method,
			list_key);
		rc = CTL_EXIT_IO;
	} else {
		ctl_print_table(stdout, rows, cols, ncols, ctl_now_ms(r.obj));
	}
	ctl_result_free(&r);
	return rc;
}

void ctl_params_init(struct ctl_params *p)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

/* Calls method with the params, then frees them. */
int ctl_call_with(struct ctl *ctx, const char *method, struct ctl_params *p, struct ctl_result *r)
{
	int rc = ctl_call(ctx, method, p->sb.data, p->sb.size, r);
	msgpack_sbuffer_destroy(&p->sb);
	return rc;
}

/* Prints the whole result as JSON, or result[key] (a map) as fields. */
void ctl_print_map(struct ctl *ctx, const struct ctl_result *r, const char *key)
{
	const msgpack_object *m = key ? ctl_map_get(r->obj, key) : r->obj;
	if (ctx->json)
		ctl_print_json(stdout, r->obj);
	else
		ctl_print_fields(stdout, m ? m : r->obj, ctl_now_ms(r->obj));
}
