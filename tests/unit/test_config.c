/*
 * test_config.c — the agent's configuration: sources and their precedence,
 * errors that name file, line and a fix, redaction, metrics_listen, and the
 * SIGHUP reload (agent_reload) on a hand-built agent.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/config.h"
#include "agent/reload.h"

static char *write_conf(const char *text)
{
	char *path = strdup("/tmp/pgcoord-test-conf.XXXXXX");
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	cr_assert(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	return path;
}

static void rewrite(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert(f);
	fputs(text, f);
	fclose(f);
}

/* Loads file + env + argv into cfg; returns false with err filled. */
static bool load(struct config *cfg, const char *path, int argc, char **argv, char *err,
		 size_t errlen)
{
	config_defaults(cfg);
	return config_load(cfg, path, path != NULL, argc, argv, err, errlen) &&
	       config_validate(cfg, err, errlen);
}

static void clear_env(void)
{
	for (size_t i = 0; i < config_options_count; i++) {
		char var[96] = "PGCOORD_";
		size_t n = strlen(var);
		for (const char *p = config_options[i].name; *p; p++)
			var[n++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
		var[n] = '\0';
		unsetenv(var);
	}
	unsetenv("NOTIFY_SOCKET");
}

TestSuite(config, .init = clear_env);

Test(config, every_default_parses_and_validates)
{
	struct config cfg;
	char err[512] = "";
	cr_assert(load(&cfg, "/nonexistent/agent.conf", 0, NULL, err, sizeof(err)) == false);
	cr_assert(strstr(err, "/nonexistent/agent.conf: cannot read"), "%s", err);
	config_free(&cfg);
	/* no file given and none at the default path: defaults only */
	config_defaults(&cfg);
	cr_assert(config_load(&cfg, "/nonexistent/agent.conf", false, 0, NULL, err, sizeof(err)),
		  "%s", err);
	cr_assert(config_validate(&cfg, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.pool_size, 8);
	cr_assert_str_eq(cfg.metrics_listen, "");
	config_free(&cfg);
}

Test(config, flags_beat_environment_beat_file)
{
	struct config cfg;
	char err[512] = "";
	char *path = write_conf("# comment\n\npool_size = 2\nlease_ttl_ms = 20000\n"
				"session_grace_ms = 500\n");
	char *argv[] = {"--pool-size", "6", "--session_grace_ms=700"};
	setenv("PGCOORD_POOL_SIZE", "5", 1);
	setenv("PGCOORD_LEASE_TTL_MS", "30000", 1);
	cr_assert(load(&cfg, path, 3, argv, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.pool_size, 6);		       /* flag over env over file */
	cr_assert_eq(cfg.lease_ttl_ms, 30000);	       /* env over file */
	cr_assert_eq(cfg.session_grace_ms, 700);       /* --name=value form */
	cr_assert_eq(cfg.heartbeat_interval_ms, 1000); /* default */
	config_free(&cfg);
	unlink(path);
	free(path);
}

Test(config, bad_values_name_file_line_and_a_hint)
{
	struct config cfg;
	char err[512] = "";
	char *path = write_conf("pool_size = 2\n\nheartbeat_interval_ms = often\n");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, ":3: heartbeat_interval_ms: \"often\" is not a whole number"), "%s",
		  err);
	cr_assert(strstr(err, path), "%s", err);
	config_free(&cfg);

	rewrite(path, "pool_size = 1000\n");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, ":1: pool_size: 1000 is out of range (expected 1..64)"), "%s", err);
	config_free(&cfg);

	rewrite(path, "pool-size = 3\n");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, ":1: unknown option \"pool-size\""), "%s", err);
	config_free(&cfg);

	rewrite(path, "log_level = loud\n");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, "expected error, warn, info or debug"), "%s", err);
	config_free(&cfg);

	rewrite(path, "prepared_statements = yes\n");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, ":1: prepared_statements: \"yes\" is not auto, on or off"), "%s",
		  err);
	config_free(&cfg);

	rewrite(path, "prepared_statements = off\n");
	cr_assert(load(&cfg, path, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.prepared_statements, STMT_SETTING_OFF);
	config_free(&cfg);

	rewrite(path, "prepared_statements = on\n");
	cr_assert(load(&cfg, path, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.prepared_statements, STMT_SETTING_ON);
	config_free(&cfg);

	/* the default, and the environment and the flag over the file */
	rewrite(path, "pool_size = 3\n");
	cr_assert(load(&cfg, path, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.prepared_statements, STMT_SETTING_AUTO);
	config_free(&cfg);
	rewrite(path, "prepared_statements = on\n");
	setenv("PGCOORD_PREPARED_STATEMENTS", "off", 1);
	cr_assert(load(&cfg, path, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.prepared_statements, STMT_SETTING_OFF);
	config_free(&cfg);
	char *flags[] = {"--prepared-statements", "auto"};
	cr_assert(load(&cfg, path, 2, flags, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.prepared_statements, STMT_SETTING_AUTO);
	config_free(&cfg);
	setenv("PGCOORD_PREPARED_STATEMENTS", "sometimes", 1);
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, "\"sometimes\" is not auto, on or off"), "%s", err);
	config_free(&cfg);
	unsetenv("PGCOORD_PREPARED_STATEMENTS");

	rewrite(path, "just words\n");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, ":1: expected `key = value`"), "%s", err);
	config_free(&cfg);

	setenv("PGCOORD_MAX_DEPTH", "99", 1);
	rewrite(path, "");
	cr_assert(!load(&cfg, path, 0, NULL, err, sizeof(err)));
	cr_assert(strstr(err, "environment PGCOORD_MAX_DEPTH: 99 is out of range"), "%s", err);
	config_free(&cfg);
	unlink(path);
	free(path);
}

Test(config, cross_checks_say_what_to_change)
{
	struct config cfg;
	char err[512] = "";
	char *argv[] = {"--heartbeat-interval-ms", "5000"};
	cr_assert(!load(&cfg, NULL, 2, argv, err, sizeof(err)));
	cr_assert(strstr(err, "raise session_ttl_ms or lower heartbeat_interval_ms"), "%s", err);
	config_free(&cfg);
}

/* Who may open sessions: a typo must stop the agent, naming the value, not
 * lock every client out (or let everyone in) silently. */
Test(config, client_uids_and_client_group_are_resolved_or_refused_by_name)
{
	struct config cfg;
	char err[512] = "";
	char *uids[] = {"--client-uids", "1001, 1002,1003"};
	cr_assert(load(&cfg, NULL, 2, uids, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.clients.nuids, 3);
	cr_assert_eq(cfg.clients.uids[1], 1002);
	cr_assert_not(cfg.clients.has_group);
	cr_assert_eq(cfg.admins.nuids, 0, "client_uids leaked into the admins");
	config_free(&cfg);

	char *bad[] = {"--client-uids", "1001,alice"};
	cr_assert(!load(&cfg, NULL, 2, bad, err, sizeof(err)));
	cr_assert(strstr(err, "client_uids: \"1001,alice\" is not a comma-separated list of "
			      "numeric uids"),
		  "%s", err);
	config_free(&cfg);

	char *group[] = {"--client-group", "root"};
	cr_assert(load(&cfg, NULL, 2, group, err, sizeof(err)), "%s", err);
	cr_assert(cfg.clients.has_group);
	cr_assert_eq(cfg.clients.gid, 0);
	config_free(&cfg);

	char *nogroup[] = {"--client-group", "no-such-group-pgcoord"};
	cr_assert(!load(&cfg, NULL, 2, nogroup, err, sizeof(err)));
	cr_assert(strstr(err, "client_group: no group named \"no-such-group-pgcoord\" on this "
			      "host"),
		  "%s", err);
	config_free(&cfg);
}

/* A retention horizon a retry could outlive is refused; 0 and an hour pass. */
Test(config, retention_is_off_or_at_least_an_hour)
{
	struct config cfg;
	char err[512] = "";
	char *short_window[] = {"--retention-s", "600"};
	char *hour[] = {"--retention-s", "3600"};
	char *off[] = {"--retention-s", "0"};

	cr_assert(!load(&cfg, NULL, 2, short_window, err, sizeof(err)));
	cr_assert(strstr(err, "retention_s (600) must be 0 (keep everything) or at least 3600"),
		  "%s", err);
	config_free(&cfg);
	cr_assert(load(&cfg, NULL, 2, hour, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.retention_s, 3600);
	config_free(&cfg);
	cr_assert(load(&cfg, NULL, 2, off, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.retention_s, 0);
	config_free(&cfg);
}

Test(config, a_malformed_database_url_is_refused_without_quoting_its_password)
{
	struct config cfg;
	char err[512];
	char *leaky[] = {"--database-url", "host=db password=s3cret tail user=u"};
	cr_assert(!load(&cfg, NULL, 2, leaky, err, sizeof(err)));
	cr_assert(strstr(err, "database_url: libpq cannot parse it"), "%s", err);
	cr_assert(!strstr(err, "tail") && !strstr(err, "s3cret"), "%s", err);
	cr_assert(strstr(err, "single quotes"), "%s", err);
	config_free(&cfg);

	char *plain[] = {"--database-url", "postgresql://db/pgcoord?sslmode=require&bogus=1"};
	cr_assert(!load(&cfg, NULL, 2, plain, err, sizeof(err)));
	cr_assert(strstr(err, "invalid URI query parameter: \"bogus\""), "%s", err);
	config_free(&cfg);

	char *good[] = {"--database-url", "postgresql://u:p%20w@db1,db2/pgcoord"
					  "?target_session_attrs=read-write"};
	cr_assert(load(&cfg, NULL, 2, good, err, sizeof(err)), "%s", err);
	config_free(&cfg);
}

Test(config, metrics_listen_is_loopback_only)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char why[256];
	cr_assert(config_parse_listen("127.0.0.1:9187", &ss, &len, why, sizeof(why)));
	cr_assert(config_parse_listen("127.1.2.3:0", &ss, &len, why, sizeof(why)));
	cr_assert(config_parse_listen("[::1]:9187", &ss, &len, why, sizeof(why)));
	cr_assert(config_parse_listen("localhost:80", &ss, &len, why, sizeof(why)));
	cr_assert(!config_parse_listen("0.0.0.0:9187", &ss, &len, why, sizeof(why)));
	cr_assert(strstr(why, "not a loopback address"), "%s", why);
	cr_assert(!config_parse_listen("[::]:9187", &ss, &len, why, sizeof(why)));
	cr_assert(!config_parse_listen("10.1.2.3:9187", &ss, &len, why, sizeof(why)));
	cr_assert(!config_parse_listen("127.0.0.1", &ss, &len, why, sizeof(why)));
	cr_assert(strstr(why, "has no port"), "%s", why);
	cr_assert(!config_parse_listen("127.0.0.1:99999", &ss, &len, why, sizeof(why)));
	cr_assert(!config_parse_listen("db.example:9187", &ss, &len, why, sizeof(why)));
	cr_assert(strstr(why, "not a numeric IP address"), "%s", why);

	struct config cfg;
	char err[512];
	char *argv[] = {"--metrics-listen", "192.168.1.1:9187"};
	cr_assert(!load(&cfg, NULL, 2, argv, err, sizeof(err)));
	cr_assert(strstr(err, "metrics_listen: 192.168.1.1 is not a loopback address"), "%s", err);
	config_free(&cfg);
}

Test(config, check_config_output_redacts_passwords)
{
	struct config cfg;
	char err[512], *buf = NULL;
	size_t len = 0;
	char *argv[] = {"--database-url",
			"postgresql://app:s3cret-pw@db:5432/pgcoord?password=other-pw"};
	cr_assert(load(&cfg, NULL, 2, argv, err, sizeof(err)), "%s", err);
	FILE *out = open_memstream(&buf, &len);
	config_print(&cfg, out);
	fclose(out);
	cr_assert(!strstr(buf, "s3cret-pw"), "%s", buf);
	cr_assert(!strstr(buf, "other-pw"), "%s", buf);
	cr_assert(strstr(buf, "database_url = \"postgresql://app:****@db:5432/pgcoord"), "%s", buf);
	/* every option is printed */
	for (size_t i = 0; i < config_options_count; i++) {
		char line[128];
		snprintf(line, sizeof(line), "%s = ", config_options[i].name);
		cr_assert(strstr(buf, line), "%s missing from:\n%s", line, buf);
	}
	free(buf);
	config_free(&cfg);

	char *r = config_redact_conninfo("host=db password='it\\'s a secret' user=u");
	cr_assert_str_eq(r, "host=db password=**** user=u");
	free(r);
	r = config_redact_conninfo("host=db password = plain user=u");
	cr_assert_str_eq(r, "host=db password=**** user=u");
	free(r);
}

/* --- SIGHUP --------------------------------------------------------------- */

struct hand_agent {
	struct agent ag;
	char *logbuf;
	size_t loglen;
	char *path;
};

static void hand_agent_init(struct hand_agent *h, const char *conf)
{
	char err[512];
	memset(h, 0, sizeof(*h));
	h->path = write_conf(conf);
	cr_assert(load(&h->ag.cfg, h->path, 0, NULL, err, sizeof(err)), "%s", err);
	h->ag.config_path = h->path;
	logger_init(&h->ag.log, h->ag.cfg.log_level);
	h->ag.log.journald = false;
	h->ag.log.out = open_memstream(&h->logbuf, &h->loglen);
}

static const char *hand_agent_log(struct hand_agent *h)
{
	fflush(h->ag.log.out);
	return h->logbuf;
}

static void hand_agent_finish(struct hand_agent *h)
{
	fclose(h->ag.log.out);
	free(h->logbuf);
	config_free(&h->ag.cfg);
	unlink(h->path);
	free(h->path);
}

Test(config, sighup_applies_reloadable_options_and_names_the_others)
{
	struct hand_agent h;
	hand_agent_init(&h, "log_level = info\nsession_grace_ms = 1000\npool_size = 2\n"
			    "database_url = host=a password=old-secret\n");
	rewrite(h.path, "log_level = debug\nsession_grace_ms = 2500\nlease_ttl_ms = 9000\n"
			"query_timeout_ms = 700\npool_size = 3\n"
			"database_url = host=b password=new-secret\n");
	cr_assert_eq(agent_reload(&h.ag), 4);
	cr_assert_eq(h.ag.cfg.log_level, LOG_LEVEL_DEBUG);
	cr_assert_eq(h.ag.log.level, LOG_LEVEL_DEBUG);
	cr_assert_eq(h.ag.cfg.session_grace_ms, 2500);
	cr_assert_eq(h.ag.cfg.lease_ttl_ms, 9000);
	cr_assert_eq(h.ag.cfg.query_timeout_ms, 700);
	/* not reloadable: the running values stay */
	cr_assert_eq(h.ag.cfg.pool_size, 2);
	cr_assert(strstr(h.ag.cfg.database_url, "host=a"));
	const char *log = hand_agent_log(&h);
	cr_assert(strstr(log, "pool_size changed to 3 but needs a restart"), "%s", log);
	cr_assert(strstr(log, "database_url changed but needs a restart"), "%s", log);
	cr_assert(strstr(log, "session_grace_ms = 2500 (was 1000)"), "%s", log);
	cr_assert(strstr(log, "option=lease_ttl_ms"), "%s", log);
	cr_assert(strstr(log, "4 option(s) applied, 2 need a restart"), "%s", log);
	cr_assert(!strstr(log, "secret"), "a password reached the log:\n%s", log);
	hand_agent_finish(&h);
}

Test(config, sighup_with_a_bad_file_keeps_the_running_configuration)
{
	struct hand_agent h;
	hand_agent_init(&h, "session_grace_ms = 1000\n");
	rewrite(h.path, "session_grace_ms = 2000\nlog_level = chatty\n");
	cr_assert_eq(agent_reload(&h.ag), -1);
	cr_assert_eq(h.ag.cfg.session_grace_ms, 1000);
	const char *log = hand_agent_log(&h);
	cr_assert(strstr(log, "the running one stays"), "%s", log);
	cr_assert(strstr(log, ":2: log_level: \\\"chatty\\\" is not a log level"), "%s", log);
	rewrite(h.path, "session_grace_ms = 2000\nprepared_statements = maybe\n");
	cr_assert_eq(agent_reload(&h.ag), -1);
	cr_assert_eq(h.ag.cfg.session_grace_ms, 1000);
	cr_assert_eq(h.ag.cfg.prepared_statements, STMT_SETTING_AUTO);
	log = hand_agent_log(&h);
	cr_assert(strstr(log, ":2: prepared_statements: \\\"maybe\\\" is not auto, on or off"),
		  "%s", log);
	/* a valid change needs a restart: the connections keep what they prepared */
	rewrite(h.path, "session_grace_ms = 1000\nprepared_statements = off\n");
	cr_assert_eq(agent_reload(&h.ag), 0);
	cr_assert_eq(h.ag.cfg.prepared_statements, STMT_SETTING_AUTO);
	log = hand_agent_log(&h);
	cr_assert(strstr(log, "prepared_statements changed to off but needs a restart"), "%s", log);

	/* nothing changed: nothing applied, nothing to restart */
	rewrite(h.path, "session_grace_ms = 1000\n");
	cr_assert_eq(agent_reload(&h.ag), 0);
	hand_agent_finish(&h);
}

/* The input path's limits (issue 11): defaults, and the edges of their
 * ranges; idle_timeout_ms may be 0 (off), the partial-frame deadline not. */
Test(config, input_path_limits_have_sane_defaults_and_ranges)
{
	struct config cfg;
	char err[512] = "";
	char *off[] = {"--idle-timeout-ms", "0", "--max-message-objects", "16"};
	char *no_deadline[] = {"--partial-frame-timeout-ms", "0"};
	char *few_objects[] = {"--max-message-objects", "15"};
	char *no_uid_slot[] = {"--max-connections-per-uid", "0"};

	cr_assert(load(&cfg, NULL, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.max_message_objects, 65536);
	cr_assert_eq(cfg.partial_frame_timeout_ms, 10000);
	cr_assert_eq(cfg.idle_timeout_ms, 600000);
	cr_assert_eq(cfg.max_connections_per_uid, 64);
	cr_assert_eq(cfg.admin_connection_reserve, 16);
	config_free(&cfg);

	cr_assert(load(&cfg, NULL, 4, off, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.idle_timeout_ms, 0);
	cr_assert_eq(cfg.max_message_objects, 16);
	config_free(&cfg);
	cr_assert(!load(&cfg, NULL, 2, no_deadline, err, sizeof(err)));
	cr_assert(
	    strstr(err, "--partial-frame-timeout-ms: 0 is out of range (expected 100..3600000)"),
	    "%s", err);
	config_free(&cfg);
	cr_assert(!load(&cfg, NULL, 2, few_objects, err, sizeof(err)));
	cr_assert(strstr(err, "--max-message-objects: 15 is out of range"), "%s", err);
	config_free(&cfg);
	cr_assert(!load(&cfg, NULL, 2, no_uid_slot, err, sizeof(err)));
	cr_assert(strstr(err, "--max-connections-per-uid: 0 is out of range"), "%s", err);
	config_free(&cfg);
}

Test(config, the_adaptive_bound_per_kind_is_off_by_default_and_parses)
{
	struct config cfg;
	char err[512] = "";
	char *on[] = {"--group-kind-hold-members", "4"};
	char *too_many[] = {"--group-kind-hold-members", "257"};
	char *negative[] = {"--group-kind-hold-members", "-1"};

	cr_assert(load(&cfg, NULL, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.group_kind_statements_max, 2);
	cr_assert_eq(cfg.group_kind_hold_members, 0);
	config_free(&cfg);

	cr_assert(load(&cfg, NULL, 2, on, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.group_kind_hold_members, 4);
	config_free(&cfg);
	setenv("PGCOORD_GROUP_KIND_HOLD_MEMBERS", "16", 1);
	cr_assert(load(&cfg, NULL, 0, NULL, err, sizeof(err)), "%s", err);
	cr_assert_eq(cfg.group_kind_hold_members, 16);
	config_free(&cfg);
	unsetenv("PGCOORD_GROUP_KIND_HOLD_MEMBERS");

	cr_assert(!load(&cfg, NULL, 2, too_many, err, sizeof(err)));
	cr_assert(strstr(err, "--group-kind-hold-members: 257 is out of range (expected 0..256)"),
		  "%s", err);
	config_free(&cfg);
	cr_assert(!load(&cfg, NULL, 2, negative, err, sizeof(err)));
	cr_assert(strstr(err, "--group-kind-hold-members: -1 is out of range"), "%s", err);
	config_free(&cfg);
}
