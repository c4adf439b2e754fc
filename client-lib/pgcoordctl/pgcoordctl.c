/*
 * pgcoordctl — the operator's command line for pgcoord-agent.
 *
 *   pgcoordctl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]
 *
 * Every command but `migrate` is one or more calls to the local agent
 * through libpgcoord; `migrate` runs `pgcoord-agent migrate` (ctl_migrate.h).
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
 * `run --lease NAME -- CMD [ARGS…]` has its own (ctl_run.h):
 *   CMD's exit status   CMD ended by itself while leading, or after
 *                       pgcoordctl passed SIGTERM/SIGINT/SIGHUP on to it;
 *                       128+n when signal n ended CMD
 *   1  the agent refused the lease (a reserved name, say) or CMD could not
 *      be forked (a CMD that cannot be executed exits 127, or 126)
 *   2  usage error, also a --kill-grace that does not fit the margin
 *   3  cannot reach the agent, or the connection failed before leading
 *   4  a call timed out or failed before leadership was won
 *   5  leadership was lost (CMD was stopped), or the campaigning session
 *   128+n  pgcoordctl got signal n before CMD was started
 *
 * `wait quota KEY --room N` adds:
 *   5  --timeout passed before the quota had that much room
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
#include "ctl_msgpack.h"
#include "ctl_print.h"
#include "ctl_claim.h"
#include "ctl_migrate.h"
#include "ctl_top.h"
#include "ctl_run.h"
#include "ctl_watch.h"

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
	bool timeout_given; /* wait: --timeout bounds the whole wait */
	bool json;
	const char *database_url; /* migrate */
	const char *runtime_role; /* migrate */
	/* quota and permits */
	const char *lapse_after;
	const char *state;
	const char *quota;   /* the last --quota */
	const char **quotas; /* claim: every --quota, in order */
	int nquotas;
	const char *wait;
	const char *intent;
	const char *evidence;
	const char *reason;
	bool gone, running, override;
	/* records and recover */
	const char *kind;
	const char *owner;
	bool dead;
	const char *kinds;
	const char *limit;
	bool dry_run;
	/* leases and run */
	const char *lease;
	const char *ttl;
	const char *kill_grace;
	/* wait */
	const char *room;
	const char *keepalive;
	/* top */
	const char *interval;
	const char *count;
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
	OPT_RUNTIME_ROLE,
	OPT_LAPSE_AFTER,
	OPT_STATE,
	OPT_QUOTA,
	OPT_GONE,
	OPT_RUNNING,
	OPT_EVIDENCE,
	OPT_OVERRIDE,
	OPT_REASON,
	OPT_INTERVAL,
	OPT_COUNT,
	OPT_KIND,
	OPT_OWNER,
	OPT_DEAD,
	OPT_KINDS,
	OPT_LIMIT,
	OPT_DRY_RUN,
	OPT_LEASE,
	OPT_TTL,
	OPT_KILL_GRACE,
	OPT_ROOM,
	OPT_KEEPALIVE,
	OPT_WAIT,
	OPT_INTENT,
};

struct ctl_option {
	const char *name;
	int has_arg;
	enum ctl_opt_id id;
	const char *command; /* the commands that take it, space-separated; NULL = global */
	const char *arg;     /* argument name, for usage */
	const char *help;
};

static int cmd_ping(struct ctl *ctx, int argc, char **argv);
static int cmd_status(struct ctl *ctx, int argc, char **argv);
static int cmd_agents(struct ctl *ctx, int argc, char **argv);
static int cmd_sessions(struct ctl *ctx, int argc, char **argv);
static int cmd_migrate(struct ctl *ctx, int argc, char **argv);
static int cmd_quotas(struct ctl *ctx, int argc, char **argv);
static int cmd_quota(struct ctl *ctx, int argc, char **argv);
static int cmd_permits(struct ctl *ctx, int argc, char **argv);
static int cmd_check(struct ctl *ctx, int argc, char **argv);
static int cmd_top(struct ctl *ctx, int argc, char **argv);
static int cmd_records(struct ctl *ctx, int argc, char **argv);
static int cmd_recover(struct ctl *ctx, int argc, char **argv);
static int cmd_leases(struct ctl *ctx, int argc, char **argv);
static int cmd_lease(struct ctl *ctx, int argc, char **argv);
static int cmd_run(struct ctl *ctx, int argc, char **argv);
static int cmd_watch(struct ctl *ctx, int argc, char **argv);
static int cmd_wait(struct ctl *ctx, int argc, char **argv);
static int cmd_claim(struct ctl *ctx, int argc, char **argv);
static int cmd_cancel(struct ctl *ctx, int argc, char **argv);

static const struct ctl_command commands[] = {
    {"ping", cmd_ping, 0, "", "check that the agent answers, and how fast"},
    {"status", cmd_status, 0, "",
     "the agent's own state (does not touch the database); exit 1 unless it is serving, "
     "registered and its database is up"},
    {"agents", cmd_agents, 0, "", "every registered agent of the fleet"},
    {"sessions", cmd_sessions, 0, "", "the live sessions of the whole fleet"},
    {"migrate", cmd_migrate, 0, "[--database-url URL] [--runtime-role ROLE]",
     "apply pending schema migrations by running pgcoord-agent migrate"},
    {"quotas", cmd_quotas, 0, "", "every quota: limit, in flight (held, uncertain), room left"},
    {"quota", cmd_quota, 3, "KEY | set KEY LIMIT [--lapse-after S]",
     "show one quota, or set its limit (admin; creates it)"},
    {"permits", cmd_permits, 2, "[show|history|resolve|release ID]",
     "list permits, uncertain first, with reason and age (--state, --quota); show one or "
     "its audit trail; as an audited admin override: resolve ID --gone|--running --evidence "
     "TEXT, release ID --override [--reason TEXT]"},
    {"check", cmd_check, 0, "",
     "verify the permit ledger in one snapshot: every in_flight equals its permits' "
     "weights and audit trail, none over its limit (exit 1 and the rows if not)"},
    {"top", cmd_top, 0, "[--interval MS] [--count N]",
     "a compact live view: this agent, the fleet, leases, the quotas nearest their limit and "
     "uncertain permits, redrawn every second until Ctrl-C (--json: one object per frame)"},
    {"records", cmd_records, 3, "[show KIND KEY]",
     "list records with owner, liveness, token and permit (--kind, --owner, --dead); or "
     "show one"},
    {"recover", cmd_recover, 0, "--dry-run [--kinds K1,K2] [--limit N]",
     "what a recovery would adopt right now: the open records of dead owners (exit 1 if "
     "liveness cannot be read); recovering itself is for a replica's own session"},
    {"leases", cmd_leases, 0, "", "every lease: holder, epoch, when it expires"},
    {"lease", cmd_lease, 2, "status NAME", "one lease as the database and this agent see it"},
    {"run", cmd_run, INT_MAX,
     "--lease NAME [--ttl MS] [--kill-grace MS] [--keepalive MS] -- CMD [ARGS...]",
     "run CMD only while this host leads lease NAME (it waits to lead); when leadership "
     "ends CMD's process group gets SIGTERM, then SIGKILL after the grace, before any other "
     "host can lead. CMD gets PGCOORD_LEASE and PGCOORD_LEASE_EPOCH (the fencing token). "
     "Its own exit statuses are under \"Exit status of run\" in --help"},
    {"watch", cmd_watch, 2, "quota KEY | permit ID | records KIND",
     "print one line per change the agent pushes (quota.changed, permit.changed, "
     "record.orphaned for records whose owner died; the first line is the current state) "
     "until interrupted"},
    {"wait", cmd_wait, 2, "quota KEY --room N [--timeout MS]",
     "return once quota KEY has at least N of room (exit 0), or exit 5 when --timeout "
     "(here: the whole wait; default forever) passes first"},
    {"claim", cmd_claim, 1, "ID --quota KEY[:WEIGHT]... [--wait MS] [--intent TEXT]",
     "claim permit ID on the quotas (weight 1 unless given) and print the admission; exit 1 "
     "when denied or, with --wait, when it left the queue unadmitted. The permit belongs to "
     "this command's session: after it exits the permit stays counted as uncertain until "
     "released (permits release ID --override) or resolved"},
    {"cancel", cmd_cancel, 1, "ID",
     "take waiting claim ID out of the queue (an admin may cancel any session's; its owner "
     "is told); exit 1 when it is not waiting"},
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
     "libpq URL or conninfo (default: the agent's database_url setting)"},
    {"runtime-role", required_argument, OPT_RUNTIME_ROLE, "migrate", "ROLE",
     "grant ROLE what the agent needs to run as it (EXECUTE on the functions, SELECT on "
     "what it reads); connect as the schema's owner"},
    {"lapse-after", required_argument, OPT_LAPSE_AFTER, "quota", "S",
     "quota set: release permits uncertain for longer than S seconds (0: never)"},
    {"state", required_argument, OPT_STATE, "permits", "S",
     "only permits in state S (held, uncertain, released)"},
    {"quota", required_argument, OPT_QUOTA, "permits claim", "KEY",
     "permits: only permits holding quota KEY; claim: a quota to claim (KEY:WEIGHT for a "
     "weight other than 1), repeated for several, all or nothing"},
    {"wait", required_argument, OPT_WAIT, "claim", "MS",
     "without room, wait in the fleet-wide queue up to MS (1..3600000) for admission"},
    {"intent", required_argument, OPT_INTENT, "claim", "TEXT",
     "stored with the permit (what the slot is for)"},
    {"gone", no_argument, OPT_GONE, "permits", NULL,
     "resolve: the work was observed gone (releases it)"},
    {"running", no_argument, OPT_RUNNING, "permits", NULL,
     "resolve: the work was observed running (held again)"},
    {"evidence", required_argument, OPT_EVIDENCE, "permits", "TEXT",
     "resolve: what was observed (required, audited)"},
    {"override", no_argument, OPT_OVERRIDE, "permits", NULL,
     "release: operator override, audited with your uid"},
    {"reason", required_argument, OPT_REASON, "permits", "TEXT", "release: why (audited)"},
    {"interval", required_argument, OPT_INTERVAL, "top", "MS",
     "time between frames (default 1000)"},
    {"count", required_argument, OPT_COUNT, "top", "N",
     "stop after N frames (default: run until Ctrl-C)"},
    {"kind", required_argument, OPT_KIND, "records", "K", "only records of kind K"},
    {"owner", required_argument, OPT_OWNER, "records", "S", "only records owned by session S"},
    {"dead", no_argument, OPT_DEAD, "records", NULL,
     "only open records whose owner session is not live (what recovery adopts)"},
    {"kinds", required_argument, OPT_KINDS, "recover", "K1,K2", "only records of these kinds"},
    {"limit", required_argument, OPT_LIMIT, "recover agents sessions quotas permits records", "N",
     "recover: at most N records (default: the agent's, 1000); a list: only its first N "
     "rows, one page (default: every page)"},
    {"dry-run", no_argument, OPT_DRY_RUN, "recover", NULL, "change nothing (required)"},
    {"lease", required_argument, OPT_LEASE, "run", "NAME", "the lease to lead (required)"},
    {"ttl", required_argument, OPT_TTL, "run", "MS",
     "lease ttl, 1000..600000 (default: the agent's lease_ttl_ms); leadership ends ttl/3 "
     "before the lease can expire for another host: that is the safety margin"},
    {"kill-grace", required_argument, OPT_KILL_GRACE, "run", "MS",
     "SIGTERM to SIGKILL; must be below the margin (default: half of it)"},
    {"room", required_argument, OPT_ROOM, "wait", "N", "the room to wait for (required)"},
    {"keepalive", required_argument, OPT_KEEPALIVE, "run", "MS",
     "open the session with keepalive_ms MS (100..600000) and keep it alive from run's own "
     "loop: if run hangs, the lease lapses and another host can lead"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

/* Whether command `name` takes option o (a word of o->command). */
static bool option_of(const struct ctl_option *o, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = o->command; p && *p; p += strcspn(p, " "), p += *p == ' ') {
		if (strncmp(p, name, n) == 0 && (p[n] == ' ' || p[n] == '\0'))
			return true;
	}
	return false;
}
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *out)
{
	fprintf(out, "usage: pgcoordctl [OPTIONS] COMMAND [ARGS]\n"
		     "       pgcoordctl help [COMMAND]\n\n"
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
			if (!option_of(o, c->name))
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
		     "  4  timeout or I/O error talking to the agent\n"
		     "\n"
		     "Exit status of run:\n"
		     "  CMD's status  CMD ended by itself while leading, or after a SIGTERM,\n"
		     "                SIGINT or SIGHUP to pgcoordctl was passed on to it;\n"
		     "                128+n when signal n ended CMD\n"
		     "  1  the agent refused the lease, or CMD could not be forked\n"
		     "     (a CMD that cannot be executed exits 127, or 126)\n"
		     "  2  usage error, also a --kill-grace not below the safety margin\n"
		     "  3  cannot reach the agent, or the connection failed before leading\n"
		     "  4  a call timed out or failed before leadership was won\n"
		     "  5  leadership was lost and CMD stopped, or the campaigning session\n"
		     "     was lost\n"
		     "  128+n  pgcoordctl got signal n before CMD started\n"
		     "\n"
		     "Exit status of wait: as above, and\n"
		     "  5  --timeout passed before the quota had the room\n");
}

/*
 * Prints lead padded to indent columns, then text broken at spaces so that
 * lines end before column 79; later lines start at indent.
 */
static void print_wrapped(FILE *out, const char *lead, int indent, const char *text)
{
	const size_t width = 78 - (size_t)indent;
	const char *p = text;

	fprintf(out, "%-*s", indent, lead);
	while (*p) {
		size_t n = strlen(p);
		if (n > width) {
			n = width;
			while (n > 0 && p[n] != ' ')
				n--;
			if (n == 0)
				n = strcspn(p, " ");
		}
		fprintf(out, "%.*s\n", (int)n, p);
		p += n;
		while (*p == ' ')
			p++;
		if (*p)
			fprintf(out, "%*s", indent, "");
	}
}

static void command_usage_line(FILE *out, const struct ctl_command *c)
{
	fprintf(out, "usage: pgcoordctl [OPTIONS] %s%s%s\n", c->name, *c->synopsis ? " " : "",
		c->synopsis);
}

/* `pgcoordctl help CMD`, `pgcoordctl CMD --help`: one command's page. */
static void command_help(FILE *out, const struct ctl_command *c)
{
	bool any = false;

	command_usage_line(out, c);
	fputc('\n', out);
	print_wrapped(out, "  ", 2, c->help);
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct ctl_option *o = &options[i];
		char left[64];
		if (!option_of(o, c->name))
			continue;
		if (!any)
			fprintf(out, "\nOptions of %s:\n", c->name);
		any = true;
		snprintf(left, sizeof(left), "  --%s%s%s", o->name, o->arg ? " " : "",
			 o->arg ? o->arg : "");
		print_wrapped(out, left, 23, o->help);
	}
	fprintf(out, "\nGlobal options, every command and the exit statuses: pgcoordctl --help\n");
}

/* The command a usage error names the usage of; NULL until one is known. */
static const struct ctl_command *usage_command;

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool parse_nonneg(const char *s, long max, long *out);

/*
 * Prints the problem on one line, then where to read more (the command's
 * usage line once the command is known), on stderr; returns
 * CTL_EXIT_USAGE. The whole help would bury the one line that matters.
 */
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("pgcoordctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (usage_command) {
		command_usage_line(stderr, usage_command);
		fprintf(stderr, "see pgcoordctl help %s\n", usage_command->name);
	} else {
		fputs("see pgcoordctl --help\n", stderr);
	}
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
/* Says why method failed, and returns the exit status for it. */
static int call_failed(struct ctl *ctx, const char *method, pgcoord_err err)
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
	if (err != PGCOORD_OK)
		return call_failed(ctx, method, err);
	return ctl_decode(method, r);
}

/* A paged list: every page as one result, or with --limit N only the
 * first N rows (one page; its next_cursor says whether more follow). */
static int ctl_list(struct ctl *ctx, const char *method, const void *params, size_t params_len,
		    struct ctl_result *r)
{
	long limit = 0;
	pgcoord_err err;

	memset(r, 0, sizeof(*r));
	if (ctx->limit && (!parse_nonneg(ctx->limit, 10000, &limit) || limit == 0))
		return usage_error("--limit needs a whole number 1..10000, not \"%s\"", ctx->limit);
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
		return call_failed(ctx, method, err);
	return ctl_decode(method, r);
}

/* Copies the listed keys of a result row into a table row being packed
 * (nil where the row lacks one). */
static void pack_kept(msgpack_packer *pk, const msgpack_object *row, const char *const *keep,
		      size_t n)
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

/* Healthy means what a replica needs from its agent: serving, registered,
 * and its database reachable. Scripts (and scripts/dev) wait on this. */
static bool status_healthy(const struct pgcoord_agent_status *st, char *why, size_t whylen)
{
	if (strcmp(st->state, "serving") != 0 || !st->db_up || !st->registered) {
		snprintf(why, whylen, "state=%s db=%s registered=%s", st->state,
			 st->db_up ? "up" : "down", st->registered ? "true" : "false");
		return false;
	}
	return true;
}

static int cmd_status(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_result r;
	struct pgcoord_agent_status *st = NULL;
	char why[160];
	int rc = ctl_call(ctx, "agent.status", NULL, 0, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		ctl_print_fields(stdout, r.obj, ctl_now_ms(r.obj));
	result_free(&r);
	/* every field is printed as the agent sent it; the verdict is read
	 * from the typed status (agent.status never touches the database) */
	pgcoord_err err = pgcoord_agent_status_get(ctx->conn, ctx->timeout_ms, &st);
	if (err != PGCOORD_OK)
		return call_failed(ctx, "agent.status", err);
	rc = CTL_EXIT_OK;
	if (!status_healthy(st, why, sizeof(why))) {
		fprintf(stderr, "pgcoordctl: the agent is not healthy: %s\n", why);
		rc = CTL_EXIT_FAILED;
	}
	pgcoord_agent_status_free(st);
	return rc;
}

/* Prints result[list_key] as a table, or the whole result as JSON. */
static int list_command(struct ctl *ctx, const char *method, const char *list_key,
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
	    {"SESSION", "session", CTL_FMT_AUTO},	  {"NAME", "name", CTL_FMT_AUTO},
	    {"UID", "owner_uid", CTL_FMT_AUTO},		  {"REPLICA", "replica_id", CTL_FMT_AUTO},
	    {"INCARNATION", "incarnation", CTL_FMT_AUTO}, {"OPENED", "opened_at", CTL_FMT_AGE},
	    {"EXPIRES", "expires_at", CTL_FMT_AGE},
	};
	return list_command(ctx, "fleet.sessions", "sessions", cols,
			    sizeof(cols) / sizeof(cols[0]));
}

static int cmd_migrate(struct ctl *ctx, int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return ctl_migrate(ctx->database_url, ctx->runtime_role, ctx->json) == 0 ? CTL_EXIT_OK
										 : CTL_EXIT_FAILED;
}

/* --- quotas and permits --------------------------------------------------- */

/* Request params, packed as the commands go. */
struct ctl_params {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void params_init(struct ctl_params *p)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

/* Calls method with the params, then frees them. */
static int call_with(struct ctl *ctx, const char *method, struct ctl_params *p,
		     struct ctl_result *r)
{
	int rc = ctl_call(ctx, method, p->sb.data, p->sb.size, r);
	msgpack_sbuffer_destroy(&p->sb);
	return rc;
}

/* Prints the whole result as JSON, or result[key] (a map) as fields. */
static void print_map(struct ctl *ctx, const struct ctl_result *r, const char *key)
{
	const msgpack_object *m = key ? ctl_map_get(r->obj, key) : r->obj;
	if (ctx->json)
		ctl_print_json(stdout, r->obj);
	else
		ctl_print_fields(stdout, m ? m : r->obj, ctl_now_ms(r->obj));
}

static bool parse_nonneg(const char *s, long max, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > max)
		return false;
	*out = v;
	return true;
}

static int cmd_quotas(struct ctl *ctx, int argc, char **argv)
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
	return list_command(ctx, "quota.list", "quotas", cols, sizeof(cols) / sizeof(cols[0]));
}

static int cmd_quota(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	long limit, lapse = -1;
	int rc;

	if (argc == 1 && strcmp(argv[0], "set") != 0) {
		if (ctx->lapse_after)
			return usage_error("--lapse-after goes with `quota set`");
		params_init(&p);
		msgpack_pack_map(&p.pk, 1);
		ctl_pack_kv_str(&p.pk, "key", argv[0]);
		rc = call_with(ctx, "quota.get", &p, &r);
		if (rc != CTL_EXIT_OK)
			return rc;
		print_map(ctx, &r, "quota");
		result_free(&r);
		return CTL_EXIT_OK;
	}
	if (argc != 3 || strcmp(argv[0], "set") != 0)
		return usage_error("quota: expected `quota KEY` or `quota set KEY LIMIT`");
	if (!parse_nonneg(argv[2], INT32_MAX, &limit))
		return usage_error(
		    "quota set: LIMIT must be a whole number from 0 to %d, not \"%s\"", INT32_MAX,
		    argv[2]);
	if (ctx->lapse_after && !parse_nonneg(ctx->lapse_after, INT32_MAX, &lapse))
		return usage_error("--lapse-after needs whole seconds from 0 (never) to %d, not "
				   "\"%s\"",
				   INT32_MAX, ctx->lapse_after);
	params_init(&p);
	msgpack_pack_map(&p.pk, 2 + (lapse >= 0));
	ctl_pack_kv_str(&p.pk, "key", argv[1]);
	ctl_pack_kv_int(&p.pk, "limit", limit);
	if (lapse >= 0)
		ctl_pack_kv_int(&p.pk, "lapse_after_s", lapse);
	rc = call_with(ctx, "quota.set", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	print_map(ctx, &r, NULL);
	result_free(&r);
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
	params_init(&p);
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
		pack_kept(&p.pk, row, keep, sizeof(keep) / sizeof(keep[0]));
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

	params_init(&p);
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
	result_free(&r);
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

	params_init(&p);
	msgpack_pack_map(&p.pk, 1);
	ctl_pack_kv_str(&p.pk, "id", id);
	rc = call_with(ctx, method, &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else if (history)
		ctl_print_table(stdout, ctl_map_get(r.obj, "events"), cols,
				sizeof(cols) / sizeof(cols[0]), ctl_now_ms(r.obj));
	else
		print_map(ctx, &r, "permit");
	result_free(&r);
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
		return usage_error("permits resolve: say what was observed with exactly one of "
				   "--gone or --running");
	if (!ctx->evidence || strspn(ctx->evidence, " \t\r\n") == strlen(ctx->evidence))
		return usage_error("permits resolve: --evidence TEXT is required: what you "
				   "observed that shows the work is %s (it is audited)",
				   ctx->gone ? "gone" : "running");
	params_init(&p);
	msgpack_pack_map(&p.pk, 4);
	ctl_pack_kv_str(&p.pk, "id", id);
	ctl_pack_kv_str(&p.pk, "outcome", ctx->gone ? "gone" : "running");
	ctl_pack_kv_str(&p.pk, "evidence", ctx->evidence);
	ctl_pack_kv_bool(&p.pk, "override", true);
	rc = call_with(ctx, "permit.resolve", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	print_map(ctx, &r, NULL);
	result_free(&r);
	return CTL_EXIT_OK;
}

static int permits_release(struct ctl *ctx, const char *id)
{
	struct ctl_params p;
	struct ctl_result r;
	int rc;

	if (!ctx->override)
		return usage_error("permits release: pgcoordctl holds no session, so this is an "
				   "operator override: add --override (audited with your uid)");
	params_init(&p);
	msgpack_pack_map(&p.pk, 2 + (ctx->reason != NULL));
	ctl_pack_kv_str(&p.pk, "id", id);
	ctl_pack_kv_bool(&p.pk, "override", true);
	if (ctx->reason)
		ctl_pack_kv_str(&p.pk, "reason", ctx->reason);
	rc = call_with(ctx, "permit.release", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	print_map(ctx, &r, NULL);
	result_free(&r);
	return CTL_EXIT_OK;
}

static int cmd_permits(struct ctl *ctx, int argc, char **argv)
{
	const char *sub = argc ? argv[0] : "";
	bool resolve = strcmp(sub, "resolve") == 0, release = strcmp(sub, "release") == 0;

	if ((ctx->gone || ctx->running || ctx->evidence) && !resolve)
		return usage_error("--gone, --running and --evidence go with `permits resolve`");
	if ((ctx->override || ctx->reason) && !release)
		return usage_error("--override and --reason go with `permits release`");
	if ((ctx->state || ctx->quota) && argc)
		return usage_error("--state and --quota go with the `permits` list");
	if (argc == 0)
		return permits_list(ctx);
	if (argc != 2)
		return usage_error("permits %s: expected a permit ID", sub);
	if (strcmp(sub, "show") == 0)
		return permits_by_id(ctx, "permit.get", argv[1]);
	if (strcmp(sub, "history") == 0)
		return permits_by_id(ctx, "permit.history", argv[1]);
	if (resolve)
		return permits_resolve(ctx, argv[1]);
	if (release)
		return permits_release(ctx, argv[1]);
	return usage_error("permits: unknown subcommand \"%s\" (show, history, resolve, release)",
			   sub);
}

/* permit.check's violations as table rows. */
static void pack_violations(msgpack_packer *pk, const struct pgcoord_check_report *r)
{
	msgpack_pack_array(pk, r->nviolations);
	for (size_t i = 0; i < r->nviolations; i++) {
		const struct pgcoord_check_violation *v = &r->violations[i];
		msgpack_pack_map(pk, 6);
		ctl_pack_kv_str(pk, "key", v->key);
		ctl_pack_kv_int(pk, "limit", v->limit);
		ctl_pack_kv_int(pk, "in_flight", v->in_flight);
		ctl_pack_kv_int(pk, "permit_weights", v->permit_weights);
		ctl_pack_kv_int(pk, "audit_sum", v->audit_sum);
		ctl_pack_kv_str(pk, "problem", v->problem ? v->problem : "");
	}
}

static int cmd_check(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"KEY", "key", CTL_FMT_AUTO},
	    {"LIMIT", "limit", CTL_FMT_AUTO},
	    {"IN_FLIGHT", "in_flight", CTL_FMT_AUTO},
	    {"PERMIT_WEIGHTS", "permit_weights", CTL_FMT_AUTO},
	    {"AUDIT_SUM", "audit_sum", CTL_FMT_AUTO},
	    {"PROBLEM", "problem", CTL_FMT_AUTO},
	};
	struct pgcoord_check_report *r = NULL;
	struct ctl_result raw;
	bool ok = false;

	if (ctx->json) { /* the agent's result as it came */
		int rc = ctl_call(ctx, "permit.check", NULL, 0, &raw);
		if (rc != CTL_EXIT_OK)
			return rc;
		bool has_ok = ctl_obj_bool(ctl_map_get(raw.obj, "ok"), &ok);
		if (has_ok)
			ctl_print_json(stdout, raw.obj);
		else
			fprintf(stderr, "pgcoordctl: permit.check: the result has no \"ok\"\n");
		result_free(&raw);
		return !has_ok ? CTL_EXIT_IO : ok ? CTL_EXIT_OK : CTL_EXIT_FAILED;
	}
	if (!ctx->conn) {
		int rc = ctl_connect(ctx);
		if (rc != CTL_EXIT_OK)
			return rc;
	}
	pgcoord_err err = pgcoord_permit_check_get(ctx->conn, ctx->timeout_ms, &r);
	if (err != PGCOORD_OK)
		return call_failed(ctx, "permit.check", err);
	ok = r->ok;
	if (ok) {
		printf("ok: %lld quota%s conserved (in_flight = permit weights = audit sum, none "
		       "over its limit)\n",
		       (long long)r->quotas, r->quotas == 1 ? "" : "s");
	} else {
		msgpack_sbuffer sb;
		msgpack_packer pk;
		msgpack_unpacked u;
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		pack_violations(&pk, r);
		msgpack_unpacked_init(&u);
		printf("FAILED: the permit ledger breaks conservation:\n");
		if (msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
			ctl_print_table(stdout, &u.data, cols, sizeof(cols) / sizeof(cols[0]),
					r->now_at);
		msgpack_unpacked_destroy(&u);
		msgpack_sbuffer_destroy(&sb);
	}
	pgcoord_check_report_free(r);
	return ok ? CTL_EXIT_OK : CTL_EXIT_FAILED;
}

/* --- leases ---------------------------------------------------------------- */

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

	params_init(&p);
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
static int cmd_leases(struct ctl *ctx, int argc, char **argv)
{
	struct pgcoord_lease_list *l = NULL;

	if (ctx->json) {
		struct ctl_result r;
		int rc = ctl_list(ctx, "lease.list", NULL, 0, &r);
		if (rc != CTL_EXIT_OK)
			return rc;
		ctl_print_json(stdout, r.obj);
		result_free(&r);
		return CTL_EXIT_OK;
	}
	if (!ctx->conn) {
		int rc = ctl_connect(ctx);
		if (rc != CTL_EXIT_OK)
			return rc;
	}
	pgcoord_err err = pgcoord_lease_list_get(ctx->conn, ctx->timeout_ms, &l);
	if (err != PGCOORD_OK)
		return call_failed(ctx, "lease.list", err);
	print_leases(l);
	pgcoord_lease_list_free(l);
	return CTL_EXIT_OK;
}

static int cmd_lease(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	int rc;

	if (argc != 2 || strcmp(argv[0], "status") != 0)
		return usage_error("lease: expected `lease status NAME`");
	params_init(&p);
	msgpack_pack_map(&p.pk, 1);
	ctl_pack_kv_str(&p.pk, "name", argv[1]);
	rc = call_with(ctx, "lease.status", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	print_map(ctx, &r, NULL);
	result_free(&r);
	return CTL_EXIT_OK;
}

static int cmd_run(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_run_opts o = {.socket_path = ctx->socket_path,
				 .timeout_ms = ctx->timeout_ms,
				 .lease = ctx->lease,
				 .kill_grace_ms = -1};
	long v;

	if (!ctx->lease || !*ctx->lease)
		return usage_error("run: --lease NAME is required");
	if (argc == 0)
		return usage_error("run: no command given (run --lease NAME -- CMD [ARGS...])");
	if (ctx->json)
		return usage_error("run: --json does not apply");
	if (ctx->ttl) {
		if (!parse_nonneg(ctx->ttl, 600000, &v) || v < 1000)
			return usage_error("--ttl needs milliseconds between 1000 and 600000, not "
					   "\"%s\"",
					   ctx->ttl);
		o.ttl_ms = (int)v;
	}
	if (ctx->kill_grace) {
		if (!parse_nonneg(ctx->kill_grace, INT_MAX, &v))
			return usage_error("--kill-grace needs milliseconds >= 0, not \"%s\"",
					   ctx->kill_grace);
		/* the margin is known here only with --ttl; else after acquire */
		if (o.ttl_ms && v >= o.ttl_ms / 3)
			return usage_error(
			    "--kill-grace %ld ms does not fit the safety margin: with --ttl %d, "
			    "leadership ends %d ms before another host can take over and CMD "
			    "must be dead by then",
			    v, o.ttl_ms, o.ttl_ms / 3);
		o.kill_grace_ms = (int)v;
	}
	if (ctx->keepalive) {
		if (!parse_nonneg(ctx->keepalive, 600000, &v) || v < 100)
			return usage_error("--keepalive needs milliseconds between 100 and 600000, "
					   "not \"%s\"",
					   ctx->keepalive);
		o.keepalive_ms = (int)v;
	}
	return ctl_run(&o, argv);
}

/* --- records and recovery ------------------------------------------------- */

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

	params_init(&p);
	msgpack_pack_array(&p.pk, rows->via.array.size);
	for (uint32_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		const char *rep = "?";
		size_t replen = 1;
		int64_t sid = 0;
		char who[300];

		msgpack_pack_map(&p.pk, sizeof(keep) / sizeof(keep[0]) + 1);
		pack_kept(&p.pk, row, keep, sizeof(keep) / sizeof(keep[0]));
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

static int cmd_records(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	long owner = 0;
	bool truncated = false;
	int rc;

	if (argc) {
		if (argc != 3 || strcmp(argv[0], "show") != 0)
			return usage_error(
			    "records: expected `records` or `records show KIND KEY`");
		if (ctx->kind || ctx->owner || ctx->dead)
			return usage_error("--kind, --owner and --dead go with the `records` list");
		params_init(&p);
		msgpack_pack_map(&p.pk, 2);
		ctl_pack_kv_str(&p.pk, "kind", argv[1]);
		ctl_pack_kv_str(&p.pk, "key", argv[2]);
		rc = call_with(ctx, "record.get", &p, &r);
		if (rc != CTL_EXIT_OK)
			return rc;
		print_map(ctx, &r, "record");
		result_free(&r);
		return CTL_EXIT_OK;
	}
	if (ctx->owner && (!parse_nonneg(ctx->owner, LONG_MAX, &owner) || owner == 0))
		return usage_error("--owner needs a session id (a whole number >= 1), not \"%s\"",
				   ctx->owner);
	params_init(&p);
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
	result_free(&r);
	return rc;
}

static int cmd_recover(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_params p;
	struct ctl_result r;
	long limit = 0;
	bool read = false;
	int64_t left = 0, remaining = 0;
	int rc;

	if (!ctx->dry_run)
		return usage_error("recover: a recovery adopts records for the session that runs "
				   "it, and pgcoordctl holds none; add --dry-run to see what a "
				   "recovery would adopt now");
	if (ctx->limit && (!parse_nonneg(ctx->limit, 10000, &limit) || limit == 0))
		return usage_error("--limit needs a whole number 1..10000, not \"%s\"", ctx->limit);
	params_init(&p);
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
	rc = call_with(ctx, "record.recover", &p, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	const msgpack_object *rows = ctl_map_get(r.obj, "adopted");
	if (!ctl_obj_bool(ctl_map_get(r.obj, "liveness_read"), &read) || !rows ||
	    rows->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr, "pgcoordctl: record.recover: the result is not well-formed\n");
		result_free(&r);
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
	result_free(&r);
	return read ? CTL_EXIT_OK : CTL_EXIT_FAILED;
}

/* --- top ------------------------------------------------------------------ */

static int cmd_top(struct ctl *ctx, int argc, char **argv)
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
			return usage_error("--interval needs 100..3600000 ms, not \"%s\"",
					   ctx->interval);
		opt.interval_ms = (int)v;
	}
	if (ctx->count) {
		errno = 0;
		long v = strtol(ctx->count, &end, 10);
		if (errno || end == ctx->count || *end || v < 1 || v > INT_MAX)
			return usage_error("--count needs a number of frames >= 1, not \"%s\"",
					   ctx->count);
		opt.count = (int)v;
	}
	return ctl_top(&opt);
}

/* --- main ----------------------------------------------------------------- */

/* --- watch and wait ------------------------------------------------------- */

static int watch_target(struct ctl *ctx, int argc, char **argv, struct ctl_watch_options *opt)
{
	static const char *const whats[] = {"quota", "permit", "records"};
	bool known = false;

	if (argc != 2)
		return usage_error("%s needs quota KEY, permit ID or records KIND", ctx->cmd);
	for (size_t i = 0; i < sizeof(whats) / sizeof(whats[0]); i++)
		known |= strcmp(argv[0], whats[i]) == 0;
	if (!known)
		return usage_error("%s: \"%s\" is not quota, permit or records", ctx->cmd, argv[0]);
	if (!*argv[1])
		return usage_error("%s %s: the %s is empty", ctx->cmd, argv[0],
				   strcmp(argv[0], "quota") == 0    ? "key"
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

static int cmd_watch(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_watch_options opt;
	int rc = watch_target(ctx, argc, argv, &opt);
	return rc != CTL_EXIT_OK ? rc : ctl_watch(&opt);
}

/* KEY or KEY:WEIGHT; a key may hold ':' itself when no weight follows. */
static bool parse_quota_arg(const char *arg, char **key, int32_t *weight)
{
	const char *colon = strrchr(arg, ':');
	long w = 1;
	size_t n = strlen(arg);

	if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
		if (!parse_nonneg(colon + 1, INT32_MAX, &w) || w < 1)
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

static int cmd_claim(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_claim_options opt;
	long wait_ms = 0;
	int rc = CTL_EXIT_OK;
	char **keys = NULL;
	int32_t *weights = NULL;

	if (argc != 1 || !*argv[0])
		return usage_error("claim: expected a permit ID");
	if (ctx->nquotas == 0)
		return usage_error("claim needs at least one --quota KEY[:WEIGHT]");
	if (ctx->wait && (!parse_nonneg(ctx->wait, 3600000, &wait_ms) || wait_ms < 1))
		return usage_error("--wait takes milliseconds from 1 to 3600000, not \"%s\"",
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
			rc = usage_error("--quota takes KEY or KEY:WEIGHT (WEIGHT from 1 to %d), "
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

static int cmd_cancel(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_claim_options opt;

	if (argc != 1 || !*argv[0])
		return usage_error("cancel: expected the ID of a waiting claim");
	claim_options(ctx, argv[0], &opt);
	return ctl_cancel(&opt);
}

static int cmd_wait(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_watch_options opt;
	long room;
	int rc = watch_target(ctx, argc, argv, &opt);

	if (rc != CTL_EXIT_OK)
		return rc;
	if (strcmp(opt.what, "quota") != 0)
		return usage_error(
		    "wait: only a quota can be waited for (wait quota KEY --room N)");
	if (!ctx->room || !parse_nonneg(ctx->room, INT32_MAX, &room) || room < 1)
		return usage_error("wait needs --room N, N from 1 to %d", INT32_MAX);
	opt.room = room;
	if (ctx->timeout_given) {
		/* the whole wait; the calls within it get at most the default */
		opt.wait_ms = ctx->timeout_ms;
		if (opt.call_timeout_ms > CTL_DEFAULT_TIMEOUT_MS)
			opt.call_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
	}
	return ctl_wait(&opt);
}

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

/* "-5", "-0": a number, never a flag. */
static bool is_negative_number(const char *s)
{
	if (s[0] != '-' || !s[1])
		return false;
	for (s++; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

/* `pgcoordctl help [COMMAND]` */
static int help_command(int argc, char **argv)
{
	if (argc == 0) {
		usage(stdout);
		return CTL_EXIT_OK;
	}
	if (argc > 1)
		return usage_error("help: expected at most one command, not \"%s\"", argv[1]);
	const struct ctl_command *c = find_command(argv[0]);
	if (!c)
		return usage_error("help: unknown command \"%s\"", argv[0]);
	command_help(stdout, c);
	return CTL_EXIT_OK;
}

int main(int argc, char **argv)
{
	struct ctl ctx = {.timeout_ms = CTL_DEFAULT_TIMEOUT_MS};
	struct option longopts[N_OPTIONS + 1];
	bool seen[N_OPTIONS] = {false};
	char **operands = calloc((size_t)argc + 1, sizeof(char *));
	const char **quotas = calloc((size_t)argc + 1, sizeof(char *));
	int noperands = 0;
	bool help = false, version = false;
	int rc;

	if (!operands || !quotas) {
		fprintf(stderr, "pgcoordctl: out of memory\n");
		free(operands);
		free(quotas);
		return CTL_EXIT_FAILED;
	}
	ctx.quotas = quotas;
	for (size_t i = 0; i < N_OPTIONS; i++)
		longopts[i] =
		    (struct option){options[i].name, options[i].has_arg, NULL, (int)options[i].id};
	longopts[N_OPTIONS] = (struct option){0};

	/*
	 * "-" hands operands back in order (as 1), so flags may follow the
	 * command whatever POSIXLY_CORRECT says; "--" ends the flags. A
	 * negative number is an operand (`quota set KEY -1` is a range error,
	 * not an unknown flag -1): no flag is spelt with a digit.
	 */
	int opt;
	for (;;) {
		if (optind < argc && is_negative_number(argv[optind])) {
			operands[noperands++] = argv[optind++];
			continue;
		}
		opt = getopt_long(argc, argv, "-h", longopts, NULL);
		if (opt == -1)
			break;
		if (opt == 1) {
			operands[noperands++] = optarg;
			continue;
		}
		if (opt == '?') {
			/* getopt has named the flag; say where to read more */
			usage_command = noperands ? find_command(operands[0]) : NULL;
			if (usage_command)
				command_usage_line(stderr, usage_command);
			fprintf(stderr, "see pgcoordctl %s%s\n", usage_command ? "help " : "--help",
				usage_command ? usage_command->name : "");
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
			ctx.timeout_given = true;
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
		case OPT_RUNTIME_ROLE:
			if (!optarg[0]) {
				rc = usage_error("--runtime-role needs a role name");
				goto out;
			}
			ctx.runtime_role = optarg;
			break;
		case OPT_LAPSE_AFTER:
			ctx.lapse_after = optarg;
			break;
		case OPT_STATE:
			ctx.state = optarg;
			break;
		case OPT_QUOTA:
			ctx.quota = optarg;
			ctx.quotas[ctx.nquotas++] = optarg;
			break;
		case OPT_WAIT:
			ctx.wait = optarg;
			break;
		case OPT_INTENT:
			ctx.intent = optarg;
			break;
		case OPT_GONE:
			ctx.gone = true;
			break;
		case OPT_RUNNING:
			ctx.running = true;
			break;
		case OPT_EVIDENCE:
			ctx.evidence = optarg;
			break;
		case OPT_OVERRIDE:
			ctx.override = true;
			break;
		case OPT_REASON:
			ctx.reason = optarg;
			break;
		case OPT_INTERVAL:
			ctx.interval = optarg;
			break;
		case OPT_COUNT:
			ctx.count = optarg;
			break;
		case OPT_KIND:
			ctx.kind = optarg;
			break;
		case OPT_OWNER:
			ctx.owner = optarg;
			break;
		case OPT_DEAD:
			ctx.dead = true;
			break;
		case OPT_KINDS:
			ctx.kinds = optarg;
			break;
		case OPT_LIMIT:
			ctx.limit = optarg;
			break;
		case OPT_DRY_RUN:
			ctx.dry_run = true;
			break;
		case OPT_LEASE:
			ctx.lease = optarg;
			break;
		case OPT_TTL:
			ctx.ttl = optarg;
			break;
		case OPT_KILL_GRACE:
			ctx.kill_grace = optarg;
			break;
		case OPT_ROOM:
			ctx.room = optarg;
			break;
		case OPT_KEEPALIVE:
			ctx.keepalive = optarg;
			break;
		}
	}
	while (optind < argc)
		operands[noperands++] = argv[optind++];

	if (noperands > 0 && strcmp(operands[0], "help") == 0) {
		rc = help_command(noperands - 1, operands + 1);
		goto out;
	}
	if (help) {
		const struct ctl_command *c = noperands ? find_command(operands[0]) : NULL;
		if (c)
			command_help(stdout, c);
		else
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
	usage_command = cmd;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (seen[i] && options[i].command && !option_of(&options[i], cmd->name)) {
			rc = usage_error("--%s only goes with the command(s): %s", options[i].name,
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
	free(quotas);
	return rc;
}
