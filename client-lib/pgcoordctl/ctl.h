/*
 * ctl.h — what pgcoordctl's files share: the parsed command line (struct
 * ctl), the exit statuses, calls to the agent and their results
 * (ctl_call.c), usage errors (ctl_usage.c) and every command's entry point
 * (ctl_fleet.c, ctl_permits.c, ctl_leases.c, ctl_records.c, ctl_live.c).
 * Internal to pgcoordctl; nothing here is libpgcoord API.
 */
#ifndef PGCOORD_CTL_H
#define PGCOORD_CTL_H

#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"

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
	const char *permit; /* why --permit */
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

/* Request params, packed as the commands go. */
struct ctl_params {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

struct ctl_column;

/* --- calls to the agent (ctl_call.c) ------------------------------------- */

/* Connects to ctx->socket_path; prints why not and returns the exit status. */
int ctl_connect(struct ctl *ctx);
/* Says why method failed, and returns the exit status for it. */
int ctl_call_failed(struct ctl *ctx, const char *method, pgcoord_err err);
/* One call, its result decoded into r (connecting first if need be). */
int ctl_call(struct ctl *ctx, const char *method, const void *params, size_t params_len,
	     struct ctl_result *r);
/* A paged list: every page, or the first --limit rows. */
int ctl_list(struct ctl *ctx, const char *method, const void *params, size_t params_len,
	     struct ctl_result *r);
void ctl_result_free(struct ctl_result *r);
void ctl_params_init(struct ctl_params *p);
/* Calls method with the params, then frees them. */
int ctl_call_with(struct ctl *ctx, const char *method, struct ctl_params *p, struct ctl_result *r);
/* Copies the listed keys of a result row into a table row being packed. */
void ctl_pack_kept(msgpack_packer *pk, const msgpack_object *row, const char *const *keep,
		   size_t n);
/* Prints the whole result as JSON, or result[key] (a map) as fields. */
void ctl_print_map(struct ctl *ctx, const struct ctl_result *r, const char *key);
/* Prints result[list_key] as a table, or the whole result as JSON. */
int ctl_list_command(struct ctl *ctx, const char *method, const char *list_key,
		     const struct ctl_column *cols, size_t ncols);

/* --- usage errors (ctl_usage.c) ------------------------------------------ */

/* Prints the problem and where to read more; returns CTL_EXIT_USAGE. */
int ctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A whole number 0..max. */
bool ctl_parse_nonneg(const char *s, long max, long *out);

/* --- the commands: operands in argc/argv, exit status returned ----------- */

/* ctl_fleet.c */
int ctl_cmd_ping(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_status(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_agents(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_sessions(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_check(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_migrate(struct ctl *ctx, int argc, char **argv);

/* ctl_permits.c */
int ctl_cmd_quotas(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_quota(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_permits(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_claim(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_cancel(struct ctl *ctx, int argc, char **argv);
/* ctl_why.c */
int ctl_cmd_why(struct ctl *ctx, int argc, char **argv);

/* ctl_leases.c */
int ctl_cmd_leases(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_lease(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_run(struct ctl *ctx, int argc, char **argv);

/* ctl_records.c */
int ctl_cmd_records(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_recover(struct ctl *ctx, int argc, char **argv);

/* ctl_live.c */
int ctl_cmd_top(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_watch(struct ctl *ctx, int argc, char **argv);
int ctl_cmd_wait(struct ctl *ctx, int argc, char **argv);

#endif
