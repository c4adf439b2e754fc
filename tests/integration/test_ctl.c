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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"
#include "pgcoord/pgcoord.h"

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
	return ictl_run(socket, args, out);
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

/* --- claim and cancel ------------------------------------------------------ */

struct bg_ctl {
	const char *sock;
	const char *const *args;
	int rc;
	char *out;
};

static void *bg_ctl_run(void *arg)
{
	struct bg_ctl *b = arg;
	b->rc = ctl(b->sock, b->args, &b->out);
	return NULL;
}

Test(ctl, claim_prints_the_admission_exits_1_when_denied_or_expired_and_cancel_takes_a_waiter_out)
{
	static const char *const wait_args[] = {"--wait-poll-ms", "50", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ctl-claim", wait_args);
	const char *sock = hagent_socket(a);
	char *out = NULL;
	pgcoord *holder = NULL;
	pgcoord_claim *cl = NULL;

	const char *const set[] = {"quota", "set", "q", "2", NULL};
	cr_assert_eq(ctl(sock, set, &out), 0, "%s", out);
	free(out);

	/* admitted, weight 2, with an intent */
	const char *const first[] = {"claim",	 "first",   "--quota", "q:2",
				     "--intent", "nightly", NULL};
	cr_assert_eq(ctl(sock, first, &out), 0, "%s", out);
	cr_assert(strstr(out, "first admitted token="), "%s", out);
	free(out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'first' "
					"AND convert_from(intent, 'UTF8') = 'nightly'"),
		     1);
	cr_assert_eq(hdb_query_long(db, "SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'"), 2);

	/* denied: exit 1, the quota named, nothing counted */
	const char *const denied[] = {"claim", "second", "--quota", "q", NULL};
	cr_assert_eq(ctl(sock, denied, &out), 1, "%s", out);
	cr_assert(strstr(out, "denied: quota q has no room"), "%s", out);
	/* and who holds it: the one permit, under the table's headers */
	cr_assert(strstr(out, "0 claim(s) waiting; held by, largest first"), "%s", out);
	cr_assert(strstr(out, "OWNER_REPLICA"), "%s", out);
	cr_assert(strstr(out, "\nfirst "), "%s", out);
	free(out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'second'"),
		     0);
	/* the same for a machine: the denial and its holders as JSON */
	const char *const denied_json[] = {"--json", "claim", "second", "--quota", "q", NULL};
	cr_assert_eq(ctl(sock, denied_json, &out), 1, "%s", out);
	const char *const denied_exprs[] = {"d['status'], d['quota'], d['limit'], d['in_flight']",
					    "[(h['id'], h['weight']) for h in d['holders']]",
					    "d['waiting'], d['hidden']", NULL};
	cr_assert_not_null(strchr(out, '{'), "%s", out);
	char *denial = json_eval(strchr(out, '{'), denied_exprs);
	cr_assert_str_eq(denial, "[\"denied\", \"q\", 2, 2]\n[[\"first\", 2]]\n[0, 0]\n", "%s",
			 out);
	free(denial);
	free(out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'second'"),
		     0);

	/* a wait that ends unadmitted */
	const char *const expires[] = {"claim", "second", "--quota", "q", "--wait", "300", NULL};
	cr_assert_eq(ctl(sock, expires, &out), 1, "%s", out);
	cr_assert(strstr(out, "not admitted: wait_ms elapsed"), "%s", out);
	free(out);

	/* a wait that a release ends: the holder is a session of this test */
	cr_assert_eq(pgcoord_connect(sock, 5000, &holder), PGCOORD_OK);
	cr_assert_eq(pgcoord_session_open(holder, "holder", 5000, NULL), PGCOORD_OK);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'first'"),
		     1);
	const char *const raise_limit[] = {"quota", "set", "q", "3", NULL};
	cr_assert_eq(ctl(sock, raise_limit, &out), 0, "%s", out);
	free(out);
	cr_assert_eq(pgcoord_permit_claim(
			 holder, "third",
			 &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						      .keys = (const char *const[]){"q"},
						      .nquotas = 1,
						      .limit = PGCOORD_NO_LIMIT},
			 5000, &cl),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_ADMITTED);
	pgcoord_claim_free(cl);
	const char *const waits[] = {"--json", "claim",	 "fourth", "--quota",
				     "q",      "--wait", "20000",  NULL};
	struct bg_ctl bg = {.sock = sock, .args = waits};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, bg_ctl_run, &bg), 0);
	cr_assert(iwait_sql(db, 10000,
			    "SELECT count(*) FROM pgcoord.waiters WHERE id = 'fourth' AND "
			    "state = 'queued'"),
		  "the claim did not queue");
	cr_assert_eq(pgcoord_permit_release(holder, "third", 0, NULL, 5000, NULL), PGCOORD_OK);
	pthread_join(t, NULL);
	cr_assert_eq(bg.rc, 0, "%s", bg.out);
	/* it waited behind first (weight 2) and third, as the queued answer said */
	const char *const exprs[] = {"d['id']",
				     "d['status']",
				     "d['queued_ms'] >= 0",
				     "d['queued_for']['quota'], d['queued_for']['position']",
				     "[h['id'] for h in d['queued_for']['holders']]",
				     NULL};
	char *got = json_eval(strchr(bg.out, '{'), exprs);
	cr_assert_str_eq(got,
			 "\"fourth\"\n\"admitted\"\ntrue\n[\"q\", 1]\n[\"first\", \"third\"]\n",
			 "%s", bg.out);
	cr_assert(strstr(bg.out, "queued at position 1 for quota q"), "%s", bg.out);
	free(got);
	free(bg.out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permit_events WHERE "
					"permit_id = 'fourth' AND event = 'admitted'"),
		     1);

	/* cancel: an admin takes another session's waiter out; not waiting: exit 1 */
	cr_assert_eq(pgcoord_permit_claim(
			 holder, "fifth",
			 &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						      .keys = (const char *const[]){"q"},
						      .nquotas = 1,
						      .limit = PGCOORD_NO_LIMIT,
						      .wait_ms = 30000},
			 5000, &cl),
		     PGCOORD_OK);
	cr_assert_eq(pgcoord_claim_get_status(cl), PGCOORD_CLAIM_QUEUED);
	pgcoord_claim_free(cl);
	const char *const cancel[] = {"cancel", "fifth", NULL};
	cr_assert_eq(ctl(sock, cancel, &out), 0, "%s", out);
	cr_assert(strstr(out, "fifth cancelled"), "%s", out);
	free(out);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.waiters WHERE id = 'fifth' "
					"AND state = 'queued'"),
		     0);
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 'fifth'"),
		     0);
	const char *const cancel_held[] = {"cancel", "first", NULL};
	cr_assert_eq(ctl(sock, cancel_held, &out), 1, "%s", out);
	cr_assert(strstr(out, "not waiting"), "%s", out);
	free(out);

	pgcoord_close(holder);
	hagent_destroy(a);
	hdb_drop(db);
}

/* quota.list answers pages of at most 1000: pgcoordctl follows every page
 * (or, with --limit, prints one page of the first N). */
Test(ctl, listings_follow_every_page_or_print_the_first_limit_rows)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "ctl-pages", NULL);
	iwait_janitor(a);
	hdb_exec(db, "SELECT pgcoord.quota_set('q-' || lpad(i::text, 4, '0'), i, NULL, 'test') "
		     "FROM generate_series(1, 1205) i");
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.quotas"), 1205);

	ctl_json(hagent_socket(a), "quotas",
		 (const char *const[]){
		     "len(d['quotas'])", "d['quotas'][0]['key']", "d['quotas'][-1]['key']",
		     "len(set(q['key'] for q in d['quotas']))", "d['next_cursor']", NULL},
		 "1205\n\"q-0001\"\n\"q-1205\"\n1205\nnull\n");

	/* the table: a header and one line per quota */
	const char *const table[] = {"quotas", NULL};
	char *out = NULL;
	int rc = ctl(hagent_socket(a), table, &out);
	cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
	cr_assert_eq(lines(out), 1 + 1205, "%d lines", lines(out));
	cr_assert(strstr(out, "q-1205"));
	free(out);

	const char *const first[] = {"--json", "quotas", "--limit", "10", NULL};
	rc = ctl(hagent_socket(a), first, &out);
	cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
	char *got =
	    json_eval(out, (const char *const[]){"len(d['quotas'])", "d['quotas'][-1]['key']",
						 "d['next_cursor'] is not None", NULL});
	cr_assert_str_eq(got, "10\n\"q-0010\"\ntrue\n", "%s", out);
	free(got);
	free(out);

	/* over the agent's cap: its refusal, exit 1 */
	const char *const over[] = {"quotas", "--limit", "1001", NULL};
	rc = ctl(hagent_socket(a), over, &out);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
	cr_assert(strstr(out, "invalid_params") || strstr(out, "limit"), "%s", out);
	free(out);
	const char *const zero[] = {"quotas", "--limit", "0", NULL};
	rc = ctl(hagent_socket(a), zero, &out);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
	free(out);

	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	hagent_destroy(a);
	hdb_drop(db);
}
