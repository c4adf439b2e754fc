/*
 * pgcoordctl — the operator's command line for pgcoord-agent.
 *
 *   pgcoordctl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]
 *
 * Every command but `migrate` is one or more calls to the local agent
 * through libpgcoord; `migrate` applies the schema with libpq directly.
 * Global flags may come before or after the command.
 *
 * Exit status (also in --help; scripts depend on it, so append only):
 *   0  success
 *   1  the agent (or, for migrate, the database) answered an error, or a
 *      check found a problem
 *   2  usage error
 *   3  cannot connect to the agent
 *   4  timeout or I/O error talking to the agent
 *
 * Adding a command: write `static int cmd_x(struct ctl *ctx, int argc,
 * char **argv)`, add a row to `commands`, and any flags of its own to
 * `options` with `.command = "x"`.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "proto/codec.h"
#include "agent/migrate.h"
#include "ctl_print.h"

#ifndef PGCOORD_VERSION
#define PGCOORD_VERSION "unknown"
#endif

enum ctl_exit {
	CTL_EXIT_OK = 0,
	CTL_EXIT_FAILED = 1,
	CTL_EXIT_USAGE = 2,
	CTL_EXIT_NOCONNECT = 3,
	CTL_EXIT_IO = 4,
};

#define CTL_DEFAULT_TIMEOUT_MS 5000

struct ctl {
	const char *cmd;
	const char *socket_path; /* resolved: flag, environment or default */
	int timeout_ms;
	bool json;
	const char *database_url; /* migrate */
	pgcoord *conn;
};

/* A decoded result; obj borrows from buf. */
struct ctl_result {
	void *buf;
	size_t len;
	msgpack_unpacked u;
	const msgpack_object *obj;
};

/* --- the command and option tables ---------------------------------------- */

struct ctl_command {
	const char *name;
	int (*run)(struct ctl *ctx, int argc, char **argv); /* argc/argv: the operands */
	int max_args;
	const char *synopsis; /* operands and own flags, for usage */
	const char *help;
};

enum ctl_opt_id {
	OPT_HELP = 'h',
	OPT_SOCKET = 256,
	OPT_JSON,
	OPT_TIMEOUT,
	OPT_VERSION,
	OPT_DATABASE_URL,
};

struct ctl_option {
	const char *name;
	int has_arg;
	enum ctl_opt_id id;
	const char *command; /* the only command that takes it; NULL = global */
	const char *arg;     /* argument name, for usage */
	const char *help;
};

static int cmd_ping(struct ctl *ctx, int argc, char **argv);
static int cmd_status(struct ctl *ctx, int argc, char **argv);
static int cmd_agents(struct ctl *ctx, int argc, char **argv);
static int cmd_sessions(struct ctl *ctx, int argc, char **argv);
static int cmd_migrate(struct ctl *ctx, int argc, char **argv);

static const struct ctl_command commands[] = {
    {"ping", cmd_ping, 0, "", "check that the agent answers, and how fast"},
    {"status", cmd_status, 0, "", "the agent's own state (does not touch the database)"},
    {"agents", cmd_agents, 0, "", "every registered agent of the fleet"},
    {"sessions", cmd_sessions, 0, "", "the live sessions of the whole fleet"},
    {"migrate", cmd_migrate, 0, "[--database-url URL]",
     "apply pending schema migrations with libpq (no agent needed)"},
};

static const struct ctl_option options[] = {
    {"socket", required_argument, OPT_SOCKET, NULL, "PATH",
     "the agent's socket (default: $PGCOORD_SOCKET_PATH, else " PGCOORD_DEFAULT_SOCKET ")"},
    {"json", no_argument, OPT_JSON, NULL, NULL, "print results as JSON"},
    {"timeout", required_argument, OPT_TIMEOUT, NULL, "MS",
     "connect and per-call timeout in milliseconds (default 5000)"},
    {"help", no_argument, OPT_HELP, NULL, NULL, "show this help"},
    {"version", no_argument, OPT_VERSION, NULL, NULL, "show the version"},
    {"database-url", required_argument, OPT_DATABASE_URL, "migrate", "URL",
     "libpq URL or conninfo (default: $PGCOORD_DATABASE_URL, else libpq's defaults)"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *out)
{
	fprintf(out, "usage: pgcoordctl [OPTIONS] COMMAND [ARGS]\n\n"
		     "Talks to this host's pgcoord-agent over its Unix socket.\n\n"
		     "Options:\n");
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct ctl_option *o = &options[i];
		char left[64];
		if (o->command)
			continue;
		snprintf(left, sizeof(left), "%s--%s%s%s", o->id == OPT_HELP ? "-h, " : "", o->name,
			 o->arg ? " " : "", o->arg ? o->arg : "");
		fprintf(out, "  %-22s %s\n", left, o->help);
	}
	fprintf(out, "\nCommands:\n");
	for (size_t i = 0; i < N_COMMANDS; i++) {
		const struct ctl_command *c = &commands[i];
		char left[64];
		snprintf(left, sizeof(left), "%s%s%s", c->name, *c->synopsis ? " " : "",
			 c->synopsis);
		if (strlen(left) > 22)
			fprintf(out, "  %s\n  %-22s %s\n", left, "", c->help);
		else
			fprintf(out, "  %-22s %s\n", left, c->help);
		for (size_t j = 0; j < N_OPTIONS; j++) {
			const struct ctl_option *o = &options[j];
			if (!o->command || strcmp(o->command, c->name) != 0)
				continue;
			snprintf(left, sizeof(left), "--%s%s%s", o->name, o->arg ? " " : "",
				 o->arg ? o->arg : "");
			fprintf(out, "    %-20s %s\n", left, o->help);
		}
	}
	fprintf(out, "\nTimes in tables are ages relative to this host's clock.\n\n"
		     "Exit status:\n"
		     "  0  success\n"
		     "  1  the agent (or, for migrate, the database) answered an error,\n"
		     "     or a check found a problem\n"
		     "  2  usage error\n"
		     "  3  cannot connect to the agent\n"
		     "  4  timeout or I/O error talking to the agent\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints the problem, then the usage, on stderr; returns CTL_EXIT_USAGE. */
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("pgcoordctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n\n", stderr);
	usage(stderr);
	return CTL_EXIT_USAGE;
}

/* --- talking to the agent ------------------------------------------------- */

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

static int ctl_connect(struct ctl *ctx)
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

static void result_free(struct ctl_result *r)
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
static int ctl_call(struct ctl *ctx, const char *method, const void *params, size_t params_len,
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
	if (err != PGCOORD_OK) {
		/* Agent errors by their wire name (what scripts and docs use). */
		const char *msg = pgcoord_last_message(ctx->conn);
		const char *retry = pgcoord_err_retryable(err) ? " (retryable)" : "";
		if ((int)err < 100)
			fprintf(stderr, "pgcoordctl: %s: %s%s%s%s\n", method,
				pgc_error_name((enum pgc_error_code)err), *msg ? ": " : "", msg,
				retry);
		else
			fprintf(stderr, "pgcoordctl: %s: %s%s\n", method,
				*msg ? msg : pgcoord_strerror(err), retry);
		return exit_for(err);
	}

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

/* --- commands ------------------------------------------------------------- */

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmd_ping(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_result r;
	int rc = ctl_connect(ctx);
	if (rc != CTL_EXIT_OK)
		return rc;

	double t0 = mono_ms();
	rc = ctl_call(ctx, "agent.ping", NULL, 0, &r);
	double rtt = mono_ms() - t0;
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		printf("pong from %s in %.2f ms\n", ctx->socket_path, rtt);
	result_free(&r);
	return CTL_EXIT_OK;
}

static int cmd_status(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_result r;
	int rc = ctl_call(ctx, "agent.status", NULL, 0, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		ctl_print_fields(stdout, r.obj, ctl_now_ms(r.obj));
	result_free(&r);
	return CTL_EXIT_OK;
}

/* Prints result[list_key] as a table, or the whole result as JSON. */
static int list_command(struct ctl *ctx, const char *method, const char *list_key,
			const struct ctl_column *cols, size_t ncols)
{
	struct ctl_result r;
	int rc = ctl_call(ctx, method, NULL, 0, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	const msgpack_object *rows = pgc_map_get(r.obj, list_key);
	if (ctx->json) {
		ctl_print_json(stdout, r.obj);
	} else if (!rows || rows->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: %s: the result has no \"%s\" list\n", method,
			list_key);
		rc = CTL_EXIT_IO;
	} else {
		ctl_print_table(stdout, rows, cols, ncols, ctl_now_ms(r.obj));
	}
	result_free(&r);
	return rc;
}

static int cmd_agents(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"REPLICA", "replica_id", CTL_FMT_AUTO},
	    {"INCARNATION", "incarnation", CTL_FMT_AUTO},
	    {"HOST", "host", CTL_FMT_AUTO},
	    {"PID", "pid", CTL_FMT_AUTO},
	    {"LIVE", "live", CTL_FMT_YESNO},
	    {"STARTED", "started_at", CTL_FMT_AGE},
	    {"HEARTBEAT", "heartbeat_at", CTL_FMT_AGE},
	    {"EXPIRES", "expires_at", CTL_FMT_AGE},
	};
	return list_command(ctx, "fleet.agents", "agents", cols, sizeof(cols) / sizeof(cols[0]));
}

static int cmd_sessions(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"SESSION", "session", CTL_FMT_AUTO},    {"NAME", "name", CTL_FMT_AUTO},
	    {"REPLICA", "replica_id", CTL_FMT_AUTO}, {"INCARNATION", "incarnation", CTL_FMT_AUTO},
	    {"OPENED", "opened_at", CTL_FMT_AGE},    {"EXPIRES", "expires_at", CTL_FMT_AGE},
	};
	return list_command(ctx, "fleet.sessions", "sessions", cols,
			    sizeof(cols) / sizeof(cols[0]));
}

static int cmd_migrate(struct ctl *ctx, int argc, char **argv)
{
	const char *url = ctx->database_url;
	int applied = 0, version = 0;
	char err[512] = "";

	if (!url)
		url = getenv("PGCOORD_DATABASE_URL");
	if (!url)
		url = ""; /* libpq's PG* environment and defaults */
	if (!migrate_apply(url, &applied, &version, err, sizeof(err))) {
		/* err comes from migrate/libpq and never repeats the password. */
		fprintf(stderr, "pgcoordctl: migrate: %s\n", err);
		return CTL_EXIT_FAILED;
	}
	if (ctx->json)
		printf("{\n  \"applied\": %d,\n  \"version\": %d\n}\n", applied, version);
	else if (applied == 0)
		printf("schema is up to date (version %d)\n", version);
	else
		printf("applied %d migration%s; schema version %d\n", applied,
		       applied == 1 ? "" : "s", version);
	return CTL_EXIT_OK;
}

/* --- main ----------------------------------------------------------------- */

static const struct ctl_command *find_command(const char *name)
{
	for (size_t i = 0; i < N_COMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static bool parse_timeout(const char *s, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v <= 0 || v > INT_MAX)
		return false;
	*out = (int)v;
	return true;
}

int main(int argc, char **argv)
{
	struct ctl ctx = {.timeout_ms = CTL_DEFAULT_TIMEOUT_MS};
	struct option longopts[N_OPTIONS + 1];
	bool seen[N_OPTIONS] = {false};
	char **operands = calloc((size_t)argc + 1, sizeof(char *));
	int noperands = 0;
	bool help = false, version = false;
	int rc;

	if (!operands) {
		fprintf(stderr, "pgcoordctl: out of memory\n");
		return CTL_EXIT_FAILED;
	}
	for (size_t i = 0; i < N_OPTIONS; i++)
		longopts[i] =
		    (struct option){options[i].name, options[i].has_arg, NULL, (int)options[i].id};
	longopts[N_OPTIONS] = (struct option){0};

	/*
	 * "-" hands operands back in order (as 1), so flags may follow the
	 * command whatever POSIXLY_CORRECT says; "--" ends the flags.
	 */
	int opt;
	while ((opt = getopt_long(argc, argv, "-h", longopts, NULL)) != -1) {
		if (opt == 1) {
			operands[noperands++] = optarg;
			continue;
		}
		if (opt == '?') {
			fputc('\n', stderr);
			usage(stderr);
			rc = CTL_EXIT_USAGE;
			goto out;
		}
		for (size_t i = 0; i < N_OPTIONS; i++)
			if ((int)options[i].id == opt)
				seen[i] = true;
		switch (opt) {
		case OPT_HELP:
			help = true;
			break;
		case OPT_VERSION:
			version = true;
			break;
		case OPT_SOCKET:
			ctx.socket_path = optarg;
			break;
		case OPT_JSON:
			ctx.json = true;
			break;
		case OPT_TIMEOUT:
			if (!parse_timeout(optarg, &ctx.timeout_ms)) {
				rc = usage_error("--timeout needs a positive number of "
						 "milliseconds, not \"%s\"",
						 optarg);
				goto out;
			}
			break;
		case OPT_DATABASE_URL:
			ctx.database_url = optarg;
			break;
		}
	}
	while (optind < argc)
		operands[noperands++] = argv[optind++];

	if (help) {
		usage(stdout);
		rc = CTL_EXIT_OK;
		goto out;
	}
	if (version) {
		printf("pgcoordctl %s\n", PGCOORD_VERSION);
		rc = CTL_EXIT_OK;
		goto out;
	}
	if (noperands == 0) {
		rc = usage_error("no command given");
		goto out;
	}
	const struct ctl_command *cmd = find_command(operands[0]);
	if (!cmd) {
		rc = usage_error("unknown command \"%s\"", operands[0]);
		goto out;
	}
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (seen[i] && options[i].command && strcmp(options[i].command, cmd->name) != 0) {
			rc = usage_error("--%s only goes with \"%s\"", options[i].name,
					 options[i].command);
			goto out;
		}
	}
	if (noperands - 1 > cmd->max_args) {
		rc = usage_error("%s: unexpected argument \"%s\"", cmd->name,
				 operands[1 + cmd->max_args]);
		goto out;
	}

	ctx.cmd = cmd->name;
	if (!ctx.socket_path) {
		const char *env = getenv("PGCOORD_SOCKET_PATH");
		ctx.socket_path = env && *env ? env : PGCOORD_DEFAULT_SOCKET;
	}
	rc = cmd->run(&ctx, noperands - 1, operands + 1);
	pgcoord_close(ctx.conn);
out:
	free(operands);
	return rc;
}
