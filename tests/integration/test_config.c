/*
 * test_config.c — the agent's configuration: a bad file or value stops it
 * with exit 2 and a message that says where and what is allowed,
 * --check-config shows the effective options with passwords redacted, and
 * the sources stack file < PGCOORD_* environment < flags.
 *
 * Criterion runs each test in its own process, so setenv() here reaches
 * only that test's agents.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

TestSuite(config, .timeout = 60);

/* Writes text to a new file in the test's temp dir; caller frees the path. */
static char *write_config(const char *text)
{
	char *path = htmp_path("agent.conf");
	FILE *f = fopen(path, "we");

	cr_assert_not_null(f);
	cr_assert_eq(fputs(text, f) >= 0, true);
	cr_assert_eq(fclose(f), 0);
	return path;
}

/* `pgcoord-agent --check-config ARGS...`: exit code and output. */
static int check_config(const char *const *args, char **out)
{
	const char *argv[16] = {iagent_bin(), "--check-config"};
	size_t n = 2;

	for (size_t i = 0; args && args[i]; i++) {
		cr_assert_lt(n, sizeof(argv) / sizeof(argv[0]) - 1);
		argv[n++] = args[i];
	}
	argv[n] = NULL;
	return hrun(argv, out);
}

static void assert_line(const char *out, const char *line)
{
	char *want;

	cr_assert_geq(asprintf(&want, "\n%s\n", line), 0);
	/* the first line has no newline before it */
	cr_assert(strstr(out, want) || strncmp(out, line, strlen(line)) == 0,
		  "no line \"%s\" in:\n%s", line, out);
	free(want);
}

Test(config, unknown_option_in_a_config_file_exits_2_naming_file_and_line)
{
	char *path = write_config("# pgcoord\n"
				  "pool_size = 2\n"
				  "\n"
				  "hearbeat_interval_ms = 500\n");
	const char *const args[] = {"--config", path, NULL};
	char *log = NULL, where[512];

	int rc = hagent_start_expect_exit(NULL, "cfg-unknown", args, &log);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	snprintf(where, sizeof(where), "%s:4:", path);
	cr_assert(strstr(log, where), "the message does not name %s:\n%s", where, log);
	cr_assert(strstr(log, "hearbeat_interval_ms"), "%s", log);
	free(log);

	/* --check-config refuses the same file the same way */
	cr_assert_eq(check_config(args, &log), 2);
	cr_assert(strstr(log, where), "%s", log);
	free(log);
	free(path);
}

Test(config, bad_values_exit_2_with_the_allowed_range)
{
	char *path = write_config("session_ttl_ms = 100\n");
	const char *const file_args[] = {"--config", path, NULL};
	char *log = NULL, where[512];

	int rc = hagent_start_expect_exit(NULL, "cfg-range", file_args, &log);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	snprintf(where, sizeof(where), "%s:1:", path);
	cr_assert(strstr(log, where), "%s", log);
	cr_assert(strstr(log, "session_ttl_ms"), "%s", log);
	cr_assert(strstr(log, "200..600000"), "the range is not named:\n%s", log);
	free(log);
	free(path);

	const char *const flag_args[] = {"--max-connections", "0", NULL};
	rc = hagent_start_expect_exit(NULL, "cfg-range", flag_args, &log);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "max-connections") && strstr(log, "1..65536"), "%s", log);
	free(log);

	const char *const word_args[] = {"--pool-size", "four", NULL};
	rc = hagent_start_expect_exit(NULL, "cfg-range", word_args, &log);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "\"four\"") && strstr(log, "1..64"), "%s", log);
	free(log);

	setenv("PGCOORD_HEARTBEAT_INTERVAL_MS", "10", 1);
	rc = hagent_start_expect_exit(NULL, "cfg-range", NULL, &log);
	unsetenv("PGCOORD_HEARTBEAT_INTERVAL_MS");
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "PGCOORD_HEARTBEAT_INTERVAL_MS") && strstr(log, "50..60000"), "%s",
		  log);
	free(log);

	/* each value in range, but heartbeats that do not fit three times in a ttl */
	const char *const ratio_args[] = {"--session-ttl-ms", "300", "--heartbeat-interval-ms",
					  "200", NULL};
	rc = hagent_start_expect_exit(NULL, "cfg-range", ratio_args, &log);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "heartbeat_interval_ms") && strstr(log, "a third"), "%s", log);
	free(log);
}

Test(config, check_config_redacts_the_database_password_in_both_forms)
{
	const char *const uri[] = {
	    "--database-url",
	    "postgresql://alice:s3cr3t-uri@db.example:5432/pgcoord?sslmode=require", NULL};
	char *out = NULL;

	cr_assert_eq(check_config(uri, &out), 0, "%s", out);
	cr_assert_null(strstr(out, "s3cr3t"), "the password leaked:\n%s", out);
	assert_line(out, "database_url = \"postgresql://alice:****@db.example:5432/pgcoord"
			 "?sslmode=require\"");
	/* every option is shown */
	assert_line(out, "heartbeat_interval_ms = 1000");
	assert_line(out, "socket_mode = 0660");
	free(out);

	const char *const kv[] = {
	    "--database-url", "host=db.example user=alice password=s3cr3t-kv dbname=pgcoord", NULL};
	cr_assert_eq(check_config(kv, &out), 0, "%s", out);
	cr_assert_null(strstr(out, "s3cr3t"), "the password leaked:\n%s", out);
	assert_line(out, "database_url = \"host=db.example user=alice password=**** "
			 "dbname=pgcoord\"");
	free(out);

	/* a quoted value with spaces and an escaped quote, spaces around '=' */
	const char *const quoted[] = {"--database-url",
				      "host=db password = 'it\\'s s3cr3t too' dbname=x", NULL};
	cr_assert_eq(check_config(quoted, &out), 0, "%s", out);
	cr_assert_null(strstr(out, "s3cr3t"), "the password leaked:\n%s", out);
	assert_line(out, "database_url = \"host=db password=**** dbname=x\"");
	free(out);

	/* a URI password given as a query parameter */
	const char *const query[] = {
	    "--database-url", "postgresql://db.example/pgcoord?user=alice&password=s3cr3t-q", NULL};
	cr_assert_eq(check_config(query, &out), 0, "%s", out);
	cr_assert_null(strstr(out, "s3cr3t"), "the password leaked:\n%s", out);
	free(out);

	/* a config file's password is just as hidden */
	char *path = write_config("database_url = \"postgresql://bob:f1le-pw@db/x\"\n");
	const char *const file_args[] = {"--config", path, NULL};
	cr_assert_eq(check_config(file_args, &out), 0, "%s", out);
	cr_assert_null(strstr(out, "f1le-pw"), "the password leaked:\n%s", out);
	assert_line(out, "database_url = \"postgresql://bob:****@db/x\"");
	free(out);
	free(path);
}

Test(config, environment_overrides_the_file_and_flags_override_the_environment)
{
	char *path = write_config("pool_size = 3\n"
				  "max_connections = 33\n"
				  "log_level = warn\n");
	const char *const file_only[] = {"--config", path, NULL};
	const char *const with_flag[] = {"--config", path, "--max-connections", "55", NULL};
	char *out = NULL;

	cr_assert_eq(check_config(file_only, &out), 0, "%s", out);
	assert_line(out, "pool_size = 3");
	assert_line(out, "max_connections = 33");
	assert_line(out, "log_level = warn");
	free(out);

	setenv("PGCOORD_MAX_CONNECTIONS", "44", 1);
	setenv("PGCOORD_LOG_LEVEL", "debug", 1);
	cr_assert_eq(check_config(file_only, &out), 0, "%s", out);
	assert_line(out, "pool_size = 3"); /* not in the environment: the file's */
	assert_line(out, "max_connections = 44");
	assert_line(out, "log_level = debug");
	free(out);

	cr_assert_eq(check_config(with_flag, &out), 0, "%s", out);
	assert_line(out, "max_connections = 55");
	assert_line(out, "log_level = debug");
	free(out);
	unsetenv("PGCOORD_MAX_CONNECTIONS");
	unsetenv("PGCOORD_LOG_LEVEL");
	free(path);
}

/* The same order, seen in what a serving agent does: ttl from the flag over
 * the file, grace from the environment over the file. */
Test(config, serving_agent_applies_file_then_environment_then_flags)
{
	struct harness_db *db = idb_migrated();
	char *path = write_config("session_ttl_ms = 4000\n"
				  "session_grace_ms = 1000\n"
				  "heartbeat_interval_ms = 500\n");
	const char *const args[] = {"--config", path, "--session-ttl-ms", "6000", NULL};

	setenv("PGCOORD_SESSION_GRACE_MS", "2500", 1);
	setenv("PGCOORD_SESSION_TTL_MS", "5000", 1);
	struct hagent *a = hagent_start(db, "cfg-live", args);
	unsetenv("PGCOORD_SESSION_GRACE_MS");
	unsetenv("PGCOORD_SESSION_TTL_MS");

	int fd = iconnect(hagent_socket(a));
	struct ireply r;
	const msgpack_object *res = icall_ok(fd, "session.open", NULL, &r);
	cr_assert_eq(iint(res, "ttl_ms"), 6000);
	cr_assert_eq(iint(res, "grace_ms"), 2500);
	int64_t id = iint(res, "session");
	ireply_destroy(&r);
	/* and the database got the flag's ttl */
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.session_liveness WHERE id = %lld AND "
			   "expires_at - now() > interval '4500 ms'",
			   (long long)id),
	    1);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
	free(path);
}

Test(config, missing_config_file_given_with_config_exits_2)
{
	char *path = htmp_path("absent.conf");
	const char *const args[] = {"--config", path, NULL};
	char *log = NULL;

	int rc = hagent_start_expect_exit(NULL, "cfg-missing", args, &log);
	cr_assert_eq(rc, 2, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, path) && strstr(log, "cannot read"), "%s", log);
	free(log);
	free(path);
}

/* Every option --check-config prints is documented in --help, with its flag. */
Test(config, help_documents_every_option_with_its_flag)
{
	const char *help_argv[] = {iagent_bin(), "--help", NULL};
	char *help = NULL, *out = NULL;
	int count = 0;

	cr_assert_eq(hrun(help_argv, &help), 0, "%s", help);
	cr_assert_eq(check_config(NULL, &out), 0, "%s", out);
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		char flag[96] = "--";
		size_t n = 2;

		for (const char *p = line; *p && *p != ' ' && n < sizeof(flag) - 2; p++)
			flag[n++] = *p == '_' ? '-' : *p;
		flag[n++] = ' ';
		flag[n] = '\0';
		cr_assert(strstr(help, flag), "--help does not document %s", flag);
		count++;
	}
	cr_assert_gt(count, 15);
	free(help);
	free(out);
}

Test(config, flags_take_name_equals_value_too)
{
	const char *const args[] = {"--pool-size=9", "--socket-path=/tmp/x.sock", NULL};
	char *out = NULL;

	cr_assert_eq(check_config(args, &out), 0, "%s", out);
	assert_line(out, "pool_size = 9");
	assert_line(out, "socket_path = \"/tmp/x.sock\"");
	free(out);
}
