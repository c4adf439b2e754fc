/*
 * ctl_usage.h — pgcoordctl's command and option tables (defined with main
 * in pgcoordctl.c) and what reads them to explain itself: --help, `help
 * COMMAND` and the usage line of an error (ctl_usage.c).
 */
#ifndef PGCOORD_CTL_USAGE_H
#define PGCOORD_CTL_USAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "ctl.h"

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
	OPT_PERMIT,
};

struct ctl_option {
	const char *name;
	int has_arg;
	enum ctl_opt_id id;
	const char *command; /* the commands that take it, space-separated; NULL = global */
	const char *arg;     /* argument name, for usage */
	const char *help;
};

extern const struct ctl_command ctl_commands[];
extern const size_t ctl_ncommands;
extern const struct ctl_option ctl_options[];
extern const size_t ctl_noptions;

/* The command a usage error names the usage of; NULL until one is known. */
extern const struct ctl_command *ctl_usage_command;

/* Whether command `name` takes option o (a word of o->command). */
bool ctl_option_of(const struct ctl_option *o, const char *name);
/* --help: every global option, command and command option, and the exit statuses. */
void ctl_usage(FILE *out);
void ctl_command_usage_line(FILE *out, const struct ctl_command *c);
/* `pgcoordctl help CMD`, `pgcoordctl CMD --help`: one command's page. */
void ctl_command_help(FILE *out, const struct ctl_command *c);

#endif
