/*
 * ctl_migrate.h — `pgcoordctl migrate`: applies the schema by running
 * `pgcoord-agent migrate`, so the CLI needs no part of the agent's code.
 */
#ifndef PGCOORD_CTL_MIGRATE_H
#define PGCOORD_CTL_MIGRATE_H

#include <stdbool.h>

/* The agent binary when $PGCOORD_AGENT_BIN is not set (set by the build). */
#ifndef PGCOORD_AGENT_PATH
#define PGCOORD_AGENT_PATH "pgcoord-agent"
#endif

/*
 * Runs `pgcoord-agent migrate [--runtime-role ROLE]` with database_url (NULL:
 * the agent's own configuration, $PGCOORD_DATABASE_URL included) passed in
 * its environment, never on its command line where `ps` shows it. Prints
 * the outcome as text or, with json, as {applied, version}; the agent's
 * errors reach stderr as it wrote them. Returns 0 on success, 1 when the
 * agent could not be run or failed.
 */
int ctl_migrate(const char *database_url, const char *runtime_role, bool json);

#endif
