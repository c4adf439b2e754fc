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

/* The schema version this binary needs: the highest embedded migration. */
int migrate_latest_version(void);

/*
 * Applies every pending migration in order, each in its own transaction
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

/* The SQL that reads the schema version; see migrate_version_from_error(). */
extern const char migrate_version_sql[];

/* True when a failed version query means "no schema yet" (version 0). */
bool migrate_error_means_empty(const char *sqlstate);

#endif
