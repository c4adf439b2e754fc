/*
 * test_ctl.c — pgcoordctl against a real agent: ping, status, agents and
 * sessions succeed with --json output that is valid JSON holding what the
 * agent and the database say; no agent is exit 3, a bad command exit 2.
 *
 * JSON is checked by Python's json module (Python runs meson, so it is
 * there wherever these tests run): strictly valid, then each expression the
 * test asks about, evaluated over the parsed document `d`.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(ctl, .timeout = 60);

static const char json_script[] = "import json, sys\n"
				  "d = json.load(open(sys.argv[1]))\n"
				  "for e in sys.argv[2:]:\n"
				  "    print(json.dumps(eval(e), sort_keys=True))\n";

/*
 * Parses json and evaluates each expression over it; returns their values
 * as JSON, one a line (caller frees). Fails the test when json is not valid
 * JSON or an expression fails (a key that is missing).
 */
static char *json_eval(const char *json, const char *const *exprs)
{
	char *path = htmp_path("ctl.json");
	const char *argv[16] = {"python3", "-c", json_script, path};
	size_t n = 4;
	char *out = NULL;
	FILE *f = fopen(path, "we");

	cr_assert_not_null(f);
	fputs(json, f);
	fclose(f);
	for (size_t i = 0; exprs[i]; i++) {
		cr_assert_lt(n, sizeof(argv) / sizeof(argv[0]) - 1);
		argv[n++] = exprs[i];
	}
	argv[n] = NULL;
	int rc = hrun(argv, &out);
	cr_assert_eq(rc, 0, "not valid JSON, or a missing field:\n%s\n--- the output was:\n%s", out,
		     json);
	unlink(path);
	free(path);
	return out;
}

/* Runs pgcoordctl with args (socket first); returns the exit code. */
static int ctl(const char *socket, const char *const *args, char **out)
{
	const char *argv[16] = {ictl_bin(), "--socket", socket};
	size_t n = 3;

	for (size_t i = 0; args[i]; i++) {
		cr_assert_lt(n, sizeof(argv) / sizeof(argv[0]) - 1);
		argv[n++] = args[i];
	}
	argv[n] = NULL;
	return hrun(argv, out);
}

/* Runs `pgcoordctl --json COMMAND` and checks exit 0 and the expressions'
 * values against want (one per line). */
static void ctl_json(const char *socket, const char *command, const char *const *exprs,
		     const char *want)
{
	const char *args[] = {"--json", command, NULL};
	char *out = NULL;

	int rc = ctl(socket, args, &out);
	cr_assert_eq(rc, 0, "pgcoordctl --json %s exited %d:\n%s", command, rc, out);
	char *got = json_eval(out, exprs);
	cr_assert_str_eq(got, want, "pgcoordctl --json %s:\n%s", command, out);
	free(got);
	free(out);
}

Test(ctl, ping_status_agents_and_sessions_print_valid_json_with_their_fields)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ctl-json", NULL);
	iwait_janitor(a);
	const char *sock = hagent_socket(a);
	int fd = iconnect(sock);
	int64_t sid = isession_open(fd, "ctl-client");
	long inc = hdb_query_long(db, "SELECT incarnation FROM pgcoord.agents");
	char want[1024], expr[256];

	ctl_json(sock, "ping", (const char *const[]){"d['pong']", NULL}, "true\n");

	snprintf(want, sizeof(want),
		 "\"ctl-json\"\n%ld\n%d\n\"%s\"\n\"serving\"\n\"up\"\ntrue\n2\n", inc,
		 (int)hagent_pid(a), ihostname());
	ctl_json(sock, "status",
		 (const char *const[]){"d['replica_id']", "d['incarnation']", "d['pid']",
				       "d['host']", "d['state']", "d['db']", "d['registered']",
				       "d['sessions']", NULL},
		 want);

	snprintf(want, sizeof(want), "1\n\"ctl-json\"\n%ld\n%d\ntrue\nnull\ntrue\n", inc,
		 (int)hagent_pid(a));
	ctl_json(sock, "agents",
		 (const char *const[]){"len(d['agents'])", "d['agents'][0]['replica_id']",
				       "d['agents'][0]['incarnation']", "d['agents'][0]['pid']",
				       "d['agents'][0]['live']", "d['agents'][0]['stopped_at']",
				       "d['now_at'] > 0", NULL},
		 want);

	/* the client's session and the agent's own janitor session, as in SQL */
	char *ids = hdb_query_value(db, "SELECT '[' || string_agg(id::text, ', ' ORDER BY id) || "
					"']' FROM pgcoord.live_sessions");
	snprintf(expr, sizeof(expr), "[s['name'] for s in d['sessions'] if s['session'] == %lld]",
		 (long long)sid);
	snprintf(want, sizeof(want), "%s\n[\"ctl-client\"]\n[\"ctl-json\", \"ctl-json\"]\n", ids);
	ctl_json(sock, "sessions",
		 (const char *const[]){"[s['session'] for s in d['sessions']]", expr,
				       "[s['replica_id'] for s in d['sessions']]", NULL},
		 want);
	free(ids);

	/* the same commands for a human: exit 0 and the facts in the text */
	const char *const status_args[] = {"status", NULL};
	const char *const agents_args[] = {"agents", NULL};
	const char *const sessions_args[] = {"sessions", NULL};
	const char *const ping_args[] = {"ping", NULL};
	char *out = NULL;
	cr_assert_eq(ctl(sock, ping_args, &out), 0, "%s", out);
	cr_assert(strstr(out, "pong"), "%s", out);
	free(out);
	cr_assert_eq(ctl(sock, status_args, &out), 0, "%s", out);
	cr_assert(strstr(out, "ctl-json") && strstr(out, "serving"), "%s", out);
	free(out);
	cr_assert_eq(ctl(sock, agents_args, &out), 0, "%s", out);
	cr_assert(strstr(out, "ctl-json"), "%s", out);
	free(out);
	cr_assert_eq(ctl(sock, sessions_args, &out), 0, "%s", out);
	cr_assert(strstr(out, "ctl-client"), "%s", out);
	free(out);

	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(ctl, socket_from_the_environment_is_used_without_socket_flag)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ctl-env", NULL);
	const char *argv[] = {ictl_bin(), "--json", "status", NULL};
	char *out = NULL;

	setenv("PGCOORD_SOCKET_PATH", hagent_socket(a), 1);
	int rc = hrun(argv, &out);
	unsetenv("PGCOORD_SOCKET_PATH");
	cr_assert_eq(rc, 0, "%s", out);
	char *got = json_eval(out, (const char *const[]){"d['replica_id']", NULL});
	cr_assert_str_eq(got, "\"ctl-env\"\n");
	free(got);
	free(out);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(ctl, commands_exit_3_when_the_socket_does_not_exist)
{
	char *missing = htmp_path("no-agent.sock");
	const char *const commands[] = {"ping", "status", "agents", "sessions", NULL};

	for (size_t i = 0; commands[i]; i++) {
		const char *const args[] = {commands[i], NULL};
		const char *const json_args[] = {"--json", commands[i], NULL};
		char *out = NULL;

		int rc = ctl(missing, args, &out);
		cr_assert_eq(rc, 3, "%s exited %d:\n%s", commands[i], rc, out);
		cr_assert(strstr(out, "cannot connect") && strstr(out, missing), "%s", out);
		free(out);
		rc = ctl(missing, json_args, &out);
		cr_assert_eq(rc, 3, "--json %s exited %d:\n%s", commands[i], rc, out);
		free(out);
	}
	free(missing);
}

Test(ctl, unknown_command_or_option_exits_2)
{
	const char *const args[] = {"frobnicate", NULL};
	const char *const bad_flag[] = {"--no-such-flag", "status", NULL};
	const char *const none[] = {NULL};
	char *out = NULL;

	int rc = ctl("/nonexistent/agent.sock", args, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "unknown command") && strstr(out, "frobnicate"), "%s", out);
	free(out);
	rc = ctl("/nonexistent/agent.sock", bad_flag, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	free(out);
	rc = ctl("/nonexistent/agent.sock", none, &out);
	cr_assert_eq(rc, 2, "no command: exit %d:\n%s", rc, out);
	free(out);
}

/* Counts the lines of s. */
static int lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

Test(ctl, a_usage_error_names_the_problem_and_the_commands_usage_not_the_whole_help)
{
	const char *const negative[] = {"quota", "set", "demo", "-1", NULL};
	const char *const bad_flag[] = {"quota", "--no-such-flag", NULL};
	const char *const none[] = {NULL};
	char *out = NULL;

	/* a negative number is an operand, refused for its range */
	int rc = ctl("/nonexistent/agent.sock", negative, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "LIMIT must be a whole number from 0 to 2147483647, not \"-1\""),
		  "%s", out);
	cr_assert(strstr(out, "usage: pgcoordctl [OPTIONS] quota KEY | set KEY LIMIT"), "%s", out);
	cr_assert_not(strstr(out, "invalid option"), "%s", out);
	cr_assert_eq(lines(out), 3, "%s", out);
	free(out);

	rc = ctl("/nonexistent/agent.sock", bad_flag, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "--no-such-flag") && strstr(out, "see pgcoordctl help quota"), "%s",
		  out);
	cr_assert_eq(lines(out), 3, "%s", out);
	free(out);

	rc = ctl("/nonexistent/agent.sock", none, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "no command given") && strstr(out, "see pgcoordctl --help"), "%s",
		  out);
	cr_assert_eq(lines(out), 2, "%s", out);
	free(out);
}

Test(ctl, help_for_one_command_shows_its_usage_text_and_own_flags)
{
	const char *const flag[] = {"quota", "--help", NULL};
	const char *const word[] = {"help", "quota", NULL};
	const char *const unknown[] = {"help", "frobnicate", NULL};
	char *by_flag = NULL, *by_word = NULL, *out = NULL;

	cr_assert_eq(ctl("/nonexistent/agent.sock", flag, &by_flag), 0, "%s", by_flag);
	cr_assert_eq(ctl("/nonexistent/agent.sock", word, &by_word), 0, "%s", by_word);
	cr_assert_str_eq(by_flag, by_word);
	cr_assert(strstr(by_flag, "usage: pgcoordctl [OPTIONS] quota KEY | set KEY LIMIT") &&
		      strstr(by_flag, "set its limit") && strstr(by_flag, "--lapse-after S"),
		  "%s", by_flag);
	/* only quota's own flags, not another command's */
	cr_assert_not(strstr(by_flag, "--kill-grace"), "%s", by_flag);
	cr_assert_lt(lines(by_flag), 15, "%s", by_flag);
	free(by_flag);
	free(by_word);

	int rc = ctl("/nonexistent/agent.sock", unknown, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "unknown command \"frobnicate\""), "%s", out);
	free(out);
}

/* The value on text output's line for label ("label   value"); "" if none. */
static const char *field(const char *out, const char *label, char *buf, size_t len)
{
	size_t n = strlen(label);
	buf[0] = '\0';
	for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		if (strncmp(l, label, n) != 0 || l[n] != ' ')
			continue;
		const char *v = l + n + strspn(l + n, " ");
		snprintf(buf, len, "%.*s", (int)strcspn(v, "\n"), v);
		break;
	}
	return buf;
}

/* Text output: field names say what is shown, nested values read as fields. */
Test(ctl, status_and_lease_status_print_readable_fields)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ctl-text", NULL);
	iwait_janitor(a);
	const char *sock = hagent_socket(a);
	const char *const status_args[] = {"status", NULL};
	const char *const lease_args[] = {"lease", "status", "pgcoord.janitor", NULL};
	char *out = NULL, want[32], got[128];

	cr_assert_eq(ctl(sock, status_args, &out), 0, "%s", out);
	cr_assert_not(strstr(out, "uptime_ms"), "%s", out);
	cr_assert_neq(field(out, "uptime", got, sizeof(got))[0], '\0', "%s", out);
	cr_assert_neq(field(out, "replication.failover", got, sizeof(got))[0], '\0',
		      "no replication.failover field:\n%s", out);
	free(out);

	/* the agent's own janitor lease, asked by a caller without a session:
	 * this agent leads it, and the holder is the session the database names */
	long holder = hdb_query_long(db, "SELECT holder_session FROM pgcoord.leases "
					 "WHERE name = 'pgcoord.janitor'");
	cr_assert_eq(ctl(sock, lease_args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "%ld", holder);
	cr_assert_str_eq(field(out, "holder.session", got, sizeof(got)), want, "%s", out);
	cr_assert_str_eq(field(out, "holder.replica_id", got, sizeof(got)), "ctl-text", "%s", out);
	cr_assert_str_eq(field(out, "leader", got, sizeof(got)), "true", "%s", out);
	cr_assert_not(strstr(out, "{"), "holder printed as JSON:\n%s", out);
	free(out);

	hagent_destroy(a);
	hdb_drop(db);
}
