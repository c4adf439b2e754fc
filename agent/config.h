/*
 * config.h — the agent's options: defaults, /etc/pgcoord/agent.conf
 * (`key = value`), PGCOORD_* environment variables and --flags, applied in
 * that order so the later source wins. Every option lives in one table
 * (config.c) with its type, default, bounds and meaning.
 */
#ifndef PGCOORD_AGENT_CONFIG_H
#define PGCOORD_AGENT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "agent/log.h"
#include "agent/statement_mode.h"

#define CONFIG_DEFAULT_FILE "/etc/pgcoord/agent.conf"

struct config {
	char *database_url;
	char *replica_id;
	char *socket_path;
	int socket_mode;
	int listen_backlog; /* listen(2); the kernel caps it at net.core.somaxconn */
	int pool_size;
	int group_statements_max;      /* of one kind in flight; 0 = the pool's bound */
	int group_kind_statements_max; /* the same on any key; 0 = the pool's bound */
	int group_kind_hold_members;   /* calls per statement that tighten it to 1 */
	int heartbeat_interval_ms;
	int session_ttl_ms;
	int session_grace_ms;
	int query_timeout_ms;
	int connect_timeout_ms;
	int reconnect_max_ms;
	/* named prepared statements and session-level timeouts per database
	 * connection: auto decides from what the connections see */
	enum stmt_setting prepared_statements;
	int shutdown_timeout_ms;
	int lease_ttl_ms;
	int lease_retry_ms;
	int janitor_interval_ms;
	int retention_s;
	int max_message_bytes;
	int max_depth;
	int max_connections;
	int max_inflight_per_conn;
	int max_lease_watches_per_session;
	int max_lease_campaigns_per_session;
	/* quota, permit and record watches (issue 13) */
	int watch_poll_ms;
	/* waiting claims (issue 13) */
	int wait_poll_ms;
	int max_watches_per_session;
	int max_output_bytes;
	/* input path limits (issue 11) */
	int max_message_objects;
	int partial_frame_timeout_ms;
	int idle_timeout_ms;
	int max_connections_per_uid;
	int admin_connection_reserve;
	enum log_level log_level;
	char *admin_uids;     /* option text; resolved into admins below */
	char *admin_group;    /* option text; resolved into admins below */
	char *client_uids;    /* option text; resolved into clients below */
	char *client_group;   /* option text; resolved into clients below */
	char *metrics_listen; /* "" = no HTTP listener */
	/* Resolved by config_load from admin_uids and admin_group, so the
	 * per-request admin check never asks NSS (which may block). */
	struct admin_set {
		uid_t *uids; /* admin_uids plus the listed members of admin_group */
		size_t nuids;
		bool has_group;
		gid_t gid; /* a peer whose gid is this one is an admin */
	} admins;
	/* The same from client_uids and client_group: who may open sessions.
	 * Empty (no uids, no group) means every peer that reaches the socket. */
	struct admin_set clients;
};

/* True when the peer (uid, primary gid) is in the set: a listed uid, or the
 * set's group as its gid (members of the group are listed as uids). */
bool uid_set_has(const struct admin_set *set, uid_t uid, gid_t gid);

enum option_type { OPT_STRING, OPT_INT, OPT_MODE, OPT_LEVEL, OPT_STATEMENTS };

struct option_def {
	const char *name;
	enum option_type type;
	size_t offset;
	const char *default_value; /* as text, parsed like any other source */
	long min, max;		   /* OPT_INT only */
	bool secret;		   /* redacted when printed */
	bool reloadable;	   /* takes effect on SIGHUP */
	const char *doc;
};

extern const struct option_def config_options[];
extern const size_t config_options_count;

/* Sets every option to its default. */
void config_defaults(struct config *cfg);
void config_free(struct config *cfg);

/*
 * Loads options from the file (path NULL = CONFIG_DEFAULT_FILE if it
 * exists), then the environment, then argv flags (--name value or
 * --name=value, dashes or underscores alike). Stops at the first bad value
 * with "file:line: …" or "--flag: …" and a hint in err. Non-option argv
 * entries are rejected too. *config_path receives the file that was read
 * (NULL when none).
 */
__attribute__((warn_unused_result)) bool config_load(struct config *cfg, const char *path,
						     bool path_required, int argc, char **argv,
						     char *err, size_t errlen);

/* Cross-option checks (e.g. the heartbeat must fit inside the ttl). */
__attribute__((warn_unused_result)) bool config_validate(const struct config *cfg, char *err,
							 size_t errlen);

/* Prints the effective configuration as `key = value`, secrets redacted. */
void config_print(const struct config *cfg, FILE *out);

/* One option's value as config_print shows it (strings quoted, secrets
 * redacted). */
void config_format(const struct config *cfg, const struct option_def *def, char *buf, size_t len);

/* True when the option has the same value in a and b. */
bool config_equal(const struct config *a, const struct config *b, const struct option_def *def);

/* Gives dst the option's value from src (strings are swapped, so both
 * configs still own what config_free frees). */
void config_take(struct config *dst, struct config *src, const struct option_def *def);

/*
 * Parses a metrics_listen value ("127.0.0.1:9187", "[::1]:9187",
 * "localhost:9187") into a socket address. Refuses anything that is not a
 * loopback address: the HTTP pages have no authentication. Numeric only,
 * so it never waits on DNS. On failure why says what is wrong.
 */
__attribute__((warn_unused_result)) bool config_parse_listen(const char *text,
							     struct sockaddr_storage *out,
							     socklen_t *outlen, char *why,
							     size_t whylen);

/* A copy of a libpq conninfo/URI with any password replaced by "****". */
char *config_redact_conninfo(const char *conninfo);

#endif
