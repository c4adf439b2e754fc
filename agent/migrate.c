/*
 * migrate.c — forward-only schema migrations, applied once each.
 */
#include "agent/migrate.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/migrations.h"

/* Serializes concurrent `migrate` runs fleet-wide. Transaction-scoped, so it
 * works through a transaction-mode pooler and cannot leak. */
#define MIGRATE_LOCK_KEY "7305451342917510243"

const char migrate_version_sql[] =
    "SELECT coalesce(max(version), 0) FROM pgcoord.schema_migrations";

int migrate_latest_version(void)
{
	return migrations_count > 0 ? migrations[migrations_count - 1].version : 0;
}

bool migrate_error_means_empty(const char *sqlstate)
{
	/* undefined_table, invalid_schema_name: nothing was ever migrated */
	return sqlstate && (strcmp(sqlstate, "42P01") == 0 || strcmp(sqlstate, "3F000") == 0);
}

static bool exec_ok(PGconn *conn, const char *sql, const char *what, char *err, size_t errlen)
{
	PGresult *res = PQexec(conn, sql);
	ExecStatusType st = PQresultStatus(res);
	bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
	if (!ok)
		snprintf(err, errlen, "%s: %s", what, PQerrorMessage(conn));
	PQclear(res);
	return ok;
}

/* Applies one migration unless a concurrent run already did. */
static bool apply_one(PGconn *conn, const struct migration *m, bool *applied, char *err,
		      size_t errlen)
{
	char what[128];
	char version[16];
	const char *params[2] = {version, m->name};
	PGresult *res;

	*applied = false;
	snprintf(version, sizeof(version), "%d", m->version);
	snprintf(what, sizeof(what), "migration %04d_%s", m->version, m->name);

	if (!exec_ok(conn, "BEGIN", what, err, errlen))
		return false;
	if (!exec_ok(conn, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK_KEY ")", what, err,
		     errlen) ||
	    !exec_ok(conn,
		     "CREATE SCHEMA IF NOT EXISTS pgcoord;"
		     "CREATE TABLE IF NOT EXISTS pgcoord.schema_migrations ("
		     " version integer PRIMARY KEY, name text NOT NULL,"
		     " applied_at timestamptz NOT NULL DEFAULT now())",
		     what, err, errlen))
		goto rollback;

	res = PQexecParams(conn, "SELECT 1 FROM pgcoord.schema_migrations WHERE version = $1", 1,
			   NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		snprintf(err, errlen, "%s: %s", what, PQerrorMessage(conn));
		PQclear(res);
		goto rollback;
	}
	bool done_before = PQntuples(res) > 0;
	PQclear(res);

	if (!done_before) {
		if (!exec_ok(conn, m->sql, what, err, errlen))
			goto rollback;
		res = PQexecParams(conn,
				   "INSERT INTO pgcoord.schema_migrations (version, name) "
				   "VALUES ($1, $2)",
				   2, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			snprintf(err, errlen, "%s: %s", what, PQerrorMessage(conn));
			PQclear(res);
			goto rollback;
		}
		PQclear(res);
	}
	if (!exec_ok(conn, "COMMIT", what, err, errlen))
		return false;
	*applied = !done_before;
	return true;

rollback:
	PQclear(PQexec(conn, "ROLLBACK"));
	return false;
}

/*
 * After the migrations: every function SECURITY DEFINER with a pinned
 * search_path and not PUBLIC's (pgcoord.secure_functions), again
 * on every run, since a later CREATE OR REPLACE FUNCTION resets that; then,
 * when asked, the runtime role's grants, which must cover functions added
 * since it was last granted.
 */
static bool secure_and_grant(PGconn *conn, const char *runtime_role, char *err, size_t errlen)
{
	const char *what = "securing the pgcoord functions";
	PGresult *res =
	    PQexec(conn, "SELECT to_regprocedure('pgcoord.secure_functions()') IS NOT NULL");
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		snprintf(err, errlen, "%s: %s", what, PQerrorMessage(conn));
		PQclear(res);
		return false;
	}
	bool present = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (!present) {
		if (runtime_role) {
			snprintf(err, errlen,
				 "--runtime-role: this schema has no runtime role "
				 "support (pgcoord.grant_runtime)");
			return false;
		}
		return true;
	}
	if (!exec_ok(conn, "BEGIN", what, err, errlen))
		return false;
	if (!exec_ok(conn, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK_KEY ")", what, err,
		     errlen) ||
	    !exec_ok(conn, "SELECT pgcoord.secure_functions()", what, err, errlen))
		goto rollback;
	if (runtime_role) {
		const char *params[1] = {runtime_role};
		res = PQexecParams(conn, "SELECT pgcoord.grant_runtime($1)", 1, NULL, params, NULL,
				   NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK) {
			snprintf(err, errlen, "granting the runtime role %s: %s", runtime_role,
				 PQerrorMessage(conn));
			PQclear(res);
			goto rollback;
		}
		PQclear(res);
	}
	return exec_ok(conn, "COMMIT", what, err, errlen);
rollback:
	PQclear(PQexec(conn, "ROLLBACK"));
	return false;
}

/* CREATE … IF NOT EXISTS notices are expected on every run after the first */
static void ignore_notice(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

bool migrate_apply(const char *conninfo, const char *runtime_role, int *applied, int *version,
		   char *err, size_t errlen)
{
	PGconn *conn = PQconnectdb(conninfo ? conninfo : "");
	bool ok = true;

	*applied = 0;
	*version = 0;
	if (PQstatus(conn) != CONNECTION_OK) {
		snprintf(err, errlen, "cannot connect to the database: %s", PQerrorMessage(conn));
		/* libpq's messages end in a newline; keep ours one line */
		err[strcspn(err, "\n")] = '\0';
		PQfinish(conn);
		return false;
	}
	PQsetNoticeProcessor(conn, ignore_notice, NULL);
	for (int i = 0; i < migrations_count && ok; i++) {
		bool did = false;
		ok = apply_one(conn, &migrations[i], &did, err, errlen);
		if (ok) {
			*applied += did;
			*version = migrations[i].version;
		}
	}
	if (ok)
		ok = secure_and_grant(conn, runtime_role, err, errlen);
	if (!ok)
		err[strcspn(err, "\n")] = '\0';
	PQfinish(conn);
	return ok;
}
