/*
 * ctl_usage.c — pgcoordctl explaining itself: --help and `help COMMAND`
 * from the tables in pgcoordctl.c, and the one-line usage errors every
 * command reports bad operands with. Separate from main so that the
 * commands can say "usage" without knowing how the line was parsed.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "ctl_usage.h"

/* Whether command `name` takes option o (a word of o->command). */
bool ctl_option_of(const struct ctl_option *o, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = o->command; p && *p; p += strcspn(p, " "), p += *p == ' ') {
		if (strncmp(p, name, n) == 0 && (p[n] == ' ' || p[n] == '\0'))
			return true;
	}
	return false;
}

void ctl_usage(FILE *out)
{
	fprintf(out, "usage: pgcoordctl [OPTIONS] COMMAND [ARGS]\n"
		     "       pgcoordctl help [COMMAND]\n\n"
		     "Talks to this host's pgcoord-agent over its Unix socket.\n\n"
		     "Options:\n");
	for (size_t i = 0; i < ctl_noptions; i++) {
		const struct ctl_option *o = &ctl_options[i];
		char left[64];
		if (o->command)
			continue;
		snprintf(left, sizeof(left), "%s--%s%s%s", o->id == OPT_HELP ? "-h, " : "", o->name,
			 o->arg ? " " : "", o->arg ? o->arg : "");
		fprintf(out, "  %-22s %s\n", left, o->help);
	}
	fprintf(out, "\nCommands:\n");
	for (size_t i = 0; i < ctl_ncommands; i++) {
		const struct ctl_command *c = &ctl_commands[i];
		char left[64];
		snprintf(left, sizeof(left), "%s%s%s", c->name, *c->synopsis ? " " : "",
			 c->synopsis);
		if (strlen(left) > 22)
			fprintf(out, "  %s\n  %-22s %s\n", left, "", c->help);
		else
			fprintf(out, "  %-22s %s\n", left, c->help);
		for (size_t j = 0; j < ctl_noptions; j++) {
			const struct ctl_option *o = &ctl_options[j];
			if (!ctl_option_of(o, c->name))
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

void ctl_command_usage_line(FILE *out, const struct ctl_command *c)
{
	fprintf(out, "usage: pgcoordctl [OPTIONS] %s%s%s\n", c->name, *c->synopsis ? " " : "",
		c->synopsis);
}

/* `pgcoordctl help CMD`, `pgcoordctl CMD --help`: one command's page. */
void ctl_command_help(FILE *out, const struct ctl_command *c)
{
	bool any = false;

	ctl_command_usage_line(out, c);
	fputc('\n', out);
	print_wrapped(out, "  ", 2, c->help);
	for (size_t i = 0; i < ctl_noptions; i++) {
		const struct ctl_option *o = &ctl_options[i];
		char left[64];
		if (!ctl_option_of(o, c->name))
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
const struct ctl_command *ctl_usage_command;

/*
 * Prints the problem on one line, then where to read more (the command's
 * usage line once the command is known), on stderr; returns
 * CTL_EXIT_USAGE. The whole help would bury the one line that matters.
 */
int ctl_usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("pgcoordctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (ctl_usage_command) {
		ctl_command_usage_line(stderr, ctl_usage_command);
		fprintf(stderr, "see pgcoordctl help %s\n", ctl_usage_command->name);
	} else {
		fputs("see pgcoordctl --help\n", stderr);
	}
	return CTL_EXIT_USAGE;
}

bool ctl_parse_nonneg(const char *s, long max, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > max)
		return false;
	*out = v;
	return true;
}
