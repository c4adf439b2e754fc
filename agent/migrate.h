/*
 * migrate.h — applies the schema migrations embedded from migrations/.
 *
 * Used by `pgcoord-agent migrate` and `pgcoordctl migrate`, never from the
 * event loop: it uses blocking libpq.
 */
#ifndef PGCOORD_AGENT_MIGRATE_H
#define PGCOORD_AGENT_MIGRATE_H

#include <stdbool.h>
#include <stddef.h>

struct pg_result; /* libpq's PGresult */

/* The schema version this binary needs: the highest embedded migration. */
int migrate_latest_version(void);

/*
 * Refuses, applying nothing, a database whose recorded migrations differ
 * from the embedded ones (migrate_check_applied) or that the old series
 * made. Otherwise applies every pending migration in order, each in its own transaction
 * under a transaction-scoped advisory lock, and records it in
 * pgcoord.schema_migrations. Safe to run concurrently from several hosts;
 * a run with nothing pending changes nothing. conninfo may be a libpq
 * conninfo string or URI ("" = libpq's environment defaults).
 * Afterwards, every run makes each pgcoord function SECURITY DEFINER with a
 * pinned search_path and not executable by PUBLIC (a later migration's
 * CREATE OR REPLACE resets that), and, with runtime_role non-NULL, grants
 * that role what the agent needs (pgcoord.grant_runtime).
 * On success *applied counts the migrations this call applied and
 * *version the schema version afterwards. On failure err explains.
 */
__attribute__((warn_unused_result)) bool migrate_apply(const char *conninfo,
						       const char *runtime_role, int *applied,
						       int *version, char *err, size_t errlen);

/*
 * The SQL that reads the applied migrations (version, name, checksum), in
 * version order. Each row's checksum is the sha256 of the migration's text
 * as embedded when it was applied.
 */
extern const char migrate_version_sql[];

/* True when a failed version query means "no schema yet" (version 0). */
bool migrate_error_means_empty(const char *sqlstate);

/* True when a failed version query means a schema of the old series
 * (no checksum column); migrate_old_series_message says what to do. */
bool migrate_error_means_old_series(const char *sqlstate);
extern const char migrate_old_series_message[];

/*
 * Checks the rows of migrate_version_sql against the embedded migrations:
 * each applied version must be one of ours, by name and checksum. On
 * success *version is the highest applied (0: none); on failure err names
 * the version and both checksums (or the foreign version).
 */
bool migrate_check_applied(const struct pg_result *res, int *version, char *err, size_t errlen);

#endif
