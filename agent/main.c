/*
 * main.c — pgcoord-agent: command line, the event loop, signals, and the
 * order of start-up and shutdown.
 *
 *   pgcoord-agent [--config FILE] [--OPTION VALUE ...]   serve
 *   pgcoord-agent migrate [--config FILE] [--database-url URL] [--runtime-role ROLE]
 *   pgcoord-agent --check-config [--config FILE] [...]
 *   pgcoord-agent --help-config-markdown                 docs/CONFIGURATION.md's table
 *
 * Exit status: 0 clean stop; 1 refused to start or lost its identity;
 * 2 bad configuration or usage.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/config_doc.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/dispatch.h"
#include "agent/groups.h"
#include "agent/http.h"
#include "agent/identity.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/listener.h"
#include "agent/methods.h"
#include "agent/metrics.h"
#include "agent/migrate.h"
#include "agent/notify.h"
#include "agent/reload.h"
#include "agent/sessions.h"
#include "agent/waiters.h"
#include "agent/watches.h"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: pgcoord-agent [--config FILE] [--OPTION VALUE ...]\n"
		"       pgcoord-agent migrate [--config FILE] [--database-url URL] [--runtime-role "
		"ROLE]\n"
		"       pgcoord-agent --check-config [--config FILE] [--OPTION VALUE ...]\n"
		"       pgcoord-agent --help | --version | --help-config-markdown\n\n"
		"Options come from the config file (default %s, `key = value`),\n"
		"then PGCOORD_<NAME> environment variables, then flags; later wins.\n\n",
		CONFIG_DEFAULT_FILE);
	for (size_t i = 0; i < config_options_count; i++) {
		const struct option_def *o = &config_options[i];
		char flag[64];
		snprintf(flag, sizeof(flag), "--%s", o->name);
		for (char *p = flag + 2; *p; p++)
			if (*p == '_')
				*p = '-';
		fprintf(out, "  %-26s %s (default: %s)\n", flag, o->doc,
			o->default_value[0] ? o->default_value : "\"\"");
	}
	fprintf(out, "\nExit status: 0 clean stop, 1 refused to start or lost its identity,\n"
		     "2 bad configuration or usage.\n");
}

static void db_state_changed(bool up, void *arg)
{
	struct agent *ag = arg;
	enum notice_id id = up ? NOTICE_AGENT_DB_UP : NOTICE_AGENT_DB_DOWN;
	/* the notice may push a client that does not read over
	 * max_output_bytes, and closing it frees it: step past it first */
	for (struct conn *c = ag->conns, *next; c; c = next) {
		next = c->next;
		conn_notify(c, id, NULL);
	}
	notify_status_update(ag);
}

static void stopped(struct agent *ag)
{
	agent_exit(ag, ag->exit_code);
}

static void stop_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	(void)fd;
	(void)what;
	log_warn(&ag->log, "main", "shutdown_timeout_ms passed; exiting without confirmation");
	agent_exit(ag, ag->exit_code);
}

static void begin_shutdown(struct agent *ag, const char *why)
{
	struct timeval tv = {ag->cfg.shutdown_timeout_ms / 1000,
			     (ag->cfg.shutdown_timeout_ms % 1000) * 1000};
	if (ag->state == AGENT_STOPPING)
		return;
	log_info(&ag->log, "main", "%s: shutting down", why);
	ag->state = AGENT_STOPPING;
	notify_stopping(ag);
	/* beliefs end before the database hand-back, so no client acts as
	 * leader after a successor could have been elected */
	leases_end_all(ag, "the agent is shutting down");
	/* no new clients; the socket file goes now so a successor can bind */
	listener_destroy(ag->listener);
	ag->listener = NULL;
	ag->stop_timer = evtimer_new(ag->base, stop_timeout_cb, ag);
	if (ag->stop_timer)
		evtimer_add(ag->stop_timer, &tv);
	identity_stop(ag, stopped);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	struct agent *ag = arg;
	(void)what;
	if (sig == SIGHUP) {
		(void)agent_reload(ag);
		return;
	}
	begin_shutdown(ag, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* Pulls --config FILE out of argv (it decides where the other options come
 * from, so it is read first). */
/* Removes "FLAG VALUE" / "FLAG=VALUE" from argv (the last one wins) and
 * points *value at it; false, having said why, when the value is missing. */
static bool take_flag(int *argc, char **argv, const char *flag, const char *what,
		      const char **value)
{
	size_t flen = strlen(flag);
	for (int i = 0; i < *argc; i++) {
		const char *a = argv[i];
		int drop = 0;
		if (strcmp(a, flag) == 0) {
			if (i + 1 >= *argc) {
				fprintf(stderr, "pgcoord-agent: %s needs %s\n", flag, what);
				return false;
			}
			*value = argv[i + 1];
			drop = 2;
		} else if (strncmp(a, flag, flen) == 0 && a[flen] == '=') {
			*value = a + flen + 1;
			drop = 1;
		}
		if (drop) {
			memmove(&argv[i], &argv[i + drop],
				(size_t)(*argc - i - drop) * sizeof(char *));
			*argc -= drop;
			i--;
		}
	}
	return true;
}

static int run_migrate(const struct config *cfg, const char *runtime_role)
{
	char err[1024];
	int applied = 0, version = 0;
	if (!migrate_apply(cfg->database_url, runtime_role, &applied, &version, err, sizeof(err))) {
		fprintf(stderr, "pgcoord-agent migrate: %s\n", err);
		return 1;
	}
	printf("applied %d migration(s); schema at version %d\n", applied, version);
	if (runtime_role)
		printf("granted the runtime role %s\n", runtime_role);
	return 0;
}

/* conn.c hands frames to dispatch and closes to the session registry
 * through these, so that it includes neither. */
static const struct conn_hooks conn_hooks = {
    .frame = dispatch_frame,
    .closing = sessions_detach,
};

static int serve(struct agent *ag)
{
	char err[512];
	struct db_settings dbs = {
	    .conninfo = ag->cfg.database_url,
	    .pool_size = ag->cfg.pool_size,
	    .query_timeout_ms = ag->cfg.query_timeout_ms,
	    .connect_timeout_ms = ag->cfg.connect_timeout_ms,
	    .reconnect_max_ms = ag->cfg.reconnect_max_ms,
	    .prepared_statements = ag->cfg.prepared_statements,
	};

	ag->base = event_base_new();
	if (!ag->base) {
		fprintf(stderr, "pgcoord-agent: cannot create the event loop\n");
		return 1;
	}
	ag->started_ms = mono_ms();
	ag->conn_hooks = &conn_hooks;
	ag->state = AGENT_STARTING;
	ag->listener = listener_create(ag, err, sizeof(err));
	if (!ag->listener) {
		log_error(&ag->log, "main", "%s", err);
		event_base_free(ag->base);
		return 1;
	}
	ag->db = db_create(ag->base, &dbs, &ag->log, db_state_changed, ag);
	ag->metrics = metrics_create(dispatch_method_count(), dispatch_method_name);
	/* the common calls go by the fast kinds, which hand the rest on */
	ag->claim_slow_group = group_create(ag, &permit_claim_group_kind, NULL);
	ag->release_slow_group = group_create(ag, &permit_release_group_kind, NULL);
	if (ag->claim_slow_group)
		ag->claim_group = group_create(ag, &permit_claim_fast_kind, ag->claim_slow_group);
	if (ag->release_slow_group)
		ag->release_group =
		    group_create(ag, &permit_release_fast_kind, ag->release_slow_group);
	ag->sig_term = evsignal_new(ag->base, SIGTERM, signal_cb, ag);
	ag->sig_int = evsignal_new(ag->base, SIGINT, signal_cb, ag);
	ag->sig_hup = evsignal_new(ag->base, SIGHUP, signal_cb, ag);
	if (!ag->db || !ag->metrics || !ag->claim_group || !ag->release_group || !ag->sig_term ||
	    !ag->sig_int || !ag->sig_hup || !leases_start(ag) || !watches_start(ag) ||
	    !waiters_start(ag) || !identity_start(ag)) {
		log_error(&ag->log, "main", "out of memory at start-up");
		ag->exit_code = 1;
		goto out;
	}
	evsignal_add(ag->sig_term, NULL);
	evsignal_add(ag->sig_int, NULL);
	evsignal_add(ag->sig_hup, NULL);
	char *shown = config_redact_conninfo(ag->cfg.database_url);
	char kv[2048] = "";
	log_kv_str(kv, sizeof(kv), "version", PGCOORD_VERSION_STRING);
	log_kv_str(kv, sizeof(kv), "socket_path", ag->cfg.socket_path);
	log_kv_str(kv, sizeof(kv), "replica_id", ag->cfg.replica_id);
	log_kv_str(kv, sizeof(kv), "database_url", shown ? shown : "");
	log_write(&ag->log, LOG_LEVEL_INFO, "main", kv, "listening");
	free(shown);
	if (ag->cfg.metrics_listen[0]) {
		ag->http = http_create(ag, err, sizeof(err));
		if (!ag->http) {
			log_error(&ag->log, "main", "%s", err);
			ag->exit_code = 1;
			goto out;
		}
	}
	notify_starting(ag);

	event_base_dispatch(ag->base);

out:
	while (ag->conns)
		conn_close(ag->conns, "agent exiting");
	/* after a clean stop the database has closed them already */
	sessions_lose_all(ag, "the agent exited",
			  ag->exit_code == 0 ? LOG_LEVEL_INFO : LOG_LEVEL_WARN);
	listener_destroy(ag->listener);
	ag->listener = NULL;
	db_destroy(ag->db);		/* fails what is still running: callbacks run now */
	group_destroy(ag->claim_group); /* after the database: it answered their members */
	group_destroy(ag->release_group);
	group_destroy(ag->claim_slow_group); /* after the fast ones, which hand to them */
	group_destroy(ag->release_slow_group);
	http_destroy(ag->http); /* after the database: its callbacks may answer pages */
	ag->http = NULL;
	leases_finish(ag);
	watches_finish(ag);
	waiters_finish(ag);
	janitor_finish(ag);
	identity_finish(ag);
	notify_finish(ag);
	metrics_destroy(ag->metrics);
	ag->metrics = NULL;
	if (ag->stop_timer)
		event_free(ag->stop_timer);
	if (ag->sig_term)
		event_free(ag->sig_term);
	if (ag->sig_int)
		event_free(ag->sig_int);
	if (ag->sig_hup)
		event_free(ag->sig_hup);
	event_base_free(ag->base);
	char status[32] = "";
	log_kv_int(status, sizeof(status), "status", ag->exit_code);
	log_write(&ag->log, LOG_LEVEL_INFO, "main", status, "exited");
	return ag->exit_code;
}

int main(int argc, char **argv)
{
	struct agent ag;
	const char *config_path = NULL, *runtime_role = NULL;
	bool migrate = false, check = false;
	char err[1024];
	int rc;

	memset(&ag, 0, sizeof(ag));
	argc--;
	argv++;
	if (argc > 0 && strcmp(argv[0], "migrate") == 0) {
		migrate = true;
		argc--;
		argv++;
	}
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		}
		if (strcmp(argv[i], "--help-config-markdown") == 0) {
			config_print_markdown(stdout);
			return 0;
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("pgcoord-agent %s (schema %d, protocol %d)\n",
			       PGCOORD_VERSION_STRING, migrate_latest_version(),
			       PGC_PROTOCOL_VERSION);
			return 0;
		}
		if (strcmp(argv[i], "--check-config") == 0) {
			check = true;
			memmove(&argv[i], &argv[i + 1], (size_t)(argc - i - 1) * sizeof(char *));
			argc--;
			i--;
		}
	}
	if (!take_flag(&argc, argv, "--config", "a file name", &config_path))
		return 2;
	if (migrate && !take_flag(&argc, argv, "--runtime-role", "a role name", &runtime_role))
		return 2;
	if (runtime_role && !runtime_role[0]) {
		fprintf(stderr, "pgcoord-agent: --runtime-role needs a role name\n");
		return 2;
	}
	config_defaults(&ag.cfg);
	if (!config_load(&ag.cfg, config_path, config_path != NULL, argc, argv, err, sizeof(err)) ||
	    !config_validate(&ag.cfg, err, sizeof(err))) {
		fprintf(stderr, "pgcoord-agent: %s\n", err);
		config_free(&ag.cfg);
		return 2;
	}
	ag.config_path = config_path;
	ag.argc = argc;
	ag.argv = argv;
	logger_init(&ag.log, ag.cfg.log_level);

	if (check) {
		config_print(&ag.cfg, stdout);
		rc = 0;
	} else if (migrate) {
		rc = run_migrate(&ag.cfg, runtime_role);
	} else {
		/* a client that vanished mid-write must not kill the agent */
		signal(SIGPIPE, SIG_IGN);
		rc = serve(&ag);
	}
	config_free(&ag.cfg);
	return rc;
}
