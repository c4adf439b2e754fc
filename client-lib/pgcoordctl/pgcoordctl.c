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
 * Adding a command: write `int ctl_cmd_x(struct ctl *ctx, int argc, char
 * **argv)` in the file of its family (ctl.h lists them), add a row to
 * `ctl_commands`, and any flags of its own to `ctl_options` with
 * `.command = "x"`.
 *
 * This file holds the command and option tables and main, which parses the
 * command line into a struct ctl; help and usage errors are ctl_usage.c's,
 * calls to the agent ctl_call.c's, the commands in ctl_fleet.c,
 * ctl_permits.c, ctl_leases.c, ctl_records.c and ctl_live.c.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgcoord/pgcoord.h"
#include "ctl.h"
#include "ctl_usage.h"

#ifndef PGCOORD_VERSION
#define PGCOORD_VERSION "unknown"
#endif

const struct ctl_command ctl_commands[] = {
    {"ping", ctl_cmd_ping, 0, "", "check that the agent answers, and how fast"},
    {"status", ctl_cmd_status, 0, "",
     "the agent's own state (does not touch the database); exit 1 unless it is serving, "
     "registered and its database is up"},
    {"agents", ctl_cmd_agents, 0, "", "every registered agent of the fleet"},
    {"sessions", ctl_cmd_sessions, 0, "", "the live sessions of the whole fleet"},
    {"migrate", ctl_cmd_migrate, 0, "[--database-url URL] [--runtime-role ROLE]",
     "apply pending schema migrations by running pgcoord-agent migrate"},
    {"quotas", ctl_cmd_quotas, 0, "", "every quota: limit, in flight (held, uncertain), room left"},
    {"quota", ctl_cmd_quota, 3, "KEY | set KEY LIMIT [--lapse-after S]",
     "show one quota, or set its limit (admin; creates it)"},
    {"why", ctl_cmd_why, 1, "KEY | --permit ID [--limit N]",
     "who holds quota KEY's room (or the room of permit ID's quotas): limit, in flight, "
     "waiting, the queue's head, the uncertain permits with reasons and ages, the largest "
     "and the longest-held permits (another uid's details need admin)"},
    {"permits", ctl_cmd_permits, 2, "[show|history|resolve|release ID]",
     "list permits, uncertain first, with reason and age (--state, --quota); show one or "
     "its audit trail; as an audited admin override: resolve ID --gone|--running --evidence "
     "TEXT, release ID --override [--reason TEXT]"},
    {"check", ctl_cmd_check, 0, "",
     "verify the permit ledger in one snapshot: every in_flight equals its permits' "
     "weights and audit trail, none over its limit (exit 1 and the rows if not)"},
    {"top", ctl_cmd_top, 0, "[--interval MS] [--count N]",
     "a compact live view: this agent, the fleet, leases, the quotas nearest their limit and "
     "uncertain permits, redrawn every second until Ctrl-C (--json: one object per frame)"},
    {"records", ctl_cmd_records, 3, "[show KIND KEY]",
     "list records with owner, liveness, token and permit (--kind, --owner, --dead); or "
     "show one"},
    {"recover", ctl_cmd_recover, 0, "--dry-run [--kinds K1,K2] [--limit N]",
     "what a recovery would adopt right now: the open records of dead owners (exit 1 if "
     "liveness cannot be read); recovering itself is for a replica's own session"},
    {"leases", ctl_cmd_leases, 0, "", "every lease: holder, epoch, when it expires"},
    {"lease", ctl_cmd_lease, 2, "status NAME", "one lease as the database and this agent see it"},
    {"run", ctl_cmd_run, INT_MAX,
     "--lease NAME [--ttl MS] [--kill-grace MS] [--keepalive MS] -- CMD [ARGS...]",
     "run CMD only while this host leads lease NAME (it waits to lead); when leadership "
     "ends CMD's process group gets SIGTERM, then SIGKILL after the grace, before any other "
     "host can lead. CMD gets PGCOORD_LEASE and PGCOORD_LEASE_EPOCH (the fencing token). "
     "Its own exit statuses are under \"Exit status of run\" in --help"},
    {"watch", ctl_cmd_watch, 2, "quota KEY | permit ID | records KIND",
     "print one line per change the agent pushes (quota.changed, permit.changed, "
     "record.orphaned for records whose owner died; the first line is the current state) "
     "until interrupted"},
    {"wait", ctl_cmd_wait, 2, "quota KEY --room N [--timeout MS]",
     "return once quota KEY has at least N of room (exit 0), or exit 5 when --timeout "
     "(here: the whole wait; default forever) passes first"},
    {"claim", ctl_cmd_claim, 1, "ID --quota KEY[:WEIGHT]... [--wait MS] [--intent TEXT]",
     "claim permit ID on the quotas (weight 1 unless given) and print the admission; exit 1 "
     "when denied or, with --wait, when it left the queue unadmitted. The permit belongs to "
     "this command's session: after it exits the permit stays counted as uncertain until "
     "released (permits release ID --override) or resolved"},
    {"cancel", ctl_cmd_cancel, 1, "ID",
     "take waiting claim ID out of the queue (an admin may cancel any session's; its owner "
     "is told); exit 1 when it is not waiting"},
};

const struct ctl_option ctl_options[] = {
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
    {"limit", required_argument, OPT_LIMIT, "recover agents sessions quotas permits records why",
     "N",
     "recover: at most N records (default: the agent's, 1000); a list: only its first N "
     "rows, one page (default: every page); why: at most N permits per list (1..50, "
     "default 5)"},
    {"permit", required_argument, OPT_PERMIT, "why", "ID",
     "why: the quotas of permit ID (a held or uncertain one)"},
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

#define N_COMMANDS (sizeof(ctl_commands) / sizeof(ctl_commands[0]))
#define N_OPTIONS (sizeof(ctl_options) / sizeof(ctl_options[0]))

const size_t ctl_ncommands = N_COMMANDS;
const size_t ctl_noptions = N_OPTIONS;

/* --- main ----------------------------------------------------------------- */

static const struct ctl_command *find_command(const char *name)
{
	for (size_t i = 0; i < N_COMMANDS; i++)
		if (strcmp(ctl_commands[i].name, name) == 0)
			return &ctl_commands[i];
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
		ctl_usage(stdout);
		return CTL_EXIT_OK;
	}
	if (argc > 1)
		return ctl_usage_error("help: expected at most one command, not \"%s\"", argv[1]);
	const struct ctl_command *c = find_command(argv[0]);
	if (!c)
		return ctl_usage_error("help: unknown command \"%s\"", argv[0]);
	ctl_command_help(stdout, c);
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
		longopts[i] = (struct option){ctl_options[i].name, ctl_options[i].has_arg, NULL,
					      (int)ctl_options[i].id};
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
			ctl_usage_command = noperands ? find_command(operands[0]) : NULL;
			if (ctl_usage_command)
				ctl_command_usage_line(stderr, ctl_usage_command);
			fprintf(stderr, "see pgcoordctl %s%s\n",
				ctl_usage_command ? "help " : "--help",
				ctl_usage_command ? ctl_usage_command->name : "");
			rc = CTL_EXIT_USAGE;
			goto out;
		}
		for (size_t i = 0; i < N_OPTIONS; i++)
			if ((int)ctl_options[i].id == opt)
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
				rc = ctl_usage_error("--timeout needs a positive number of "
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
				rc = ctl_usage_error("--runtime-role needs a role name");
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
		case OPT_PERMIT:
			ctx.permit = optarg;
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
			ctl_command_help(stdout, c);
		else
			ctl_usage(stdout);
		rc = CTL_EXIT_OK;
		goto out;
	}
	if (version) {
		printf("pgcoordctl %s\n", PGCOORD_VERSION);
		rc = CTL_EXIT_OK;
		goto out;
	}
	if (noperands == 0) {
		rc = ctl_usage_error("no command given");
		goto out;
	}
	const struct ctl_command *cmd = find_command(operands[0]);
	if (!cmd) {
		rc = ctl_usage_error("unknown command \"%s\"", operands[0]);
		goto out;
	}
	ctl_usage_command = cmd;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (seen[i] && ctl_options[i].command &&
		    !ctl_option_of(&ctl_options[i], cmd->name)) {
			rc = ctl_usage_error("--%s only goes with the command(s): %s",
					     ctl_options[i].name, ctl_options[i].command);
			goto out;
		}
	}
	if (noperands - 1 > cmd->max_args) {
		rc = ctl_usage_error("%s: unexpected argument \"%s\"", cmd->name,
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
