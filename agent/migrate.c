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
    "SELECT version, name, checksum FROM pgcoord.schema_migrations ORDER BY version";

const char migrate_old_series_message[] =
    "this database's pgcoord schema was made by the earlier, unreleased migration series "
    "(pgcoord.schema_migrations has no checksums) and cannot be upgraded: re-create the "
    "database (or DROP SCHEMA pgcoord CASCADE as its owner) and run `pgcoord-agent migrate` "
    "(or `pgcoordctl migrate`) again";

int migrate_latest_version(void)
{
	return migrations_count > 0 ? migrations[migrations_count - 1].version : 0;
}

bool migrate_error_means_empty(const char *sqlstate)
{
	/* undefined_table, invalid_schema_name: nothing was ever migrated */
	return sqlstate && (strcmp(sqlstate, "42P01") == 0 || strcmp(sqlstate, "3F000") == 0);
}

bool migrate_error_means_old_series(const char *sqlstate)
{
	/* undefined_column: a schema_migrations without the checksum column */
	return sqlstate && strcmp(sqlstate, "42703") == 0;
}

/* The binary's migration of that version, or NULL: versions rise but may
 * skip a number, so they are not the array's subscripts. */
static const struct migration *migration_of(int version)
{
	for (int i = 0; i < migrations_count; i++)
		if (migrations[i].version == version)
			return &migrations[i];
	return NULL;
}

static bool recorded_in(const PGresult *res, int version)
{
	for (int row = 0; row < PQntuples(res); row++)
		if (atoi(PQgetvalue(res, row, 0)) == version)
			return true;
	return false;
}

bool migrate_check_applied(const PGresult *res, int *version, char *err, size_t errlen)
{
	*version = 0;
	for (int row = 0; row < PQntuples(res); row++) {
		int v = atoi(PQgetvalue(res, row, 0));
		const char *name = PQgetvalue(res, row, 1);
		const char *sum = PQgetisnull(res, row, 2) ? "(none)" : PQgetvalue(res, row, 2);
		const struct migration *m = migration_of(v);

		if (!m || strcmp(m->name, name) != 0) {
			snprintf(err, errlen,
				 "the database records migration %04d_%s, which this binary does "
				 "not have (its latest is %04d_%s): it was made by another "
				 "migration series or a newer binary; nothing was applied",
				 v, name, migrations[migrations_count - 1].version,
				 migrations[migrations_count - 1].name);
			return false;
		}
		if (strcmp(m->checksum, sum) != 0) {
			snprintf(err, errlen,
				 "migration %04d_%s was applied with checksum %s but this binary's "
				 "text of it has checksum %s: the schema is not what this binary "
				 "knows; nothing was applied",
				 v, name, sum, m->checksum);
			return false;
		}
	}
	/* the schema's version is the last of the binary's migrations applied
	 * with every one before it: a database that recorded a later version
	 * but not an earlier one (added to the series after it was applied)
	 * is behind, and migrate applies the one it lacks */
	for (int i = 0; i < migrations_count && recorded_in(res, migrations[i].version); i++)
		*version = migrations[i].version;
	return true;
}

/* Refuses, before anything is applied, a schema made by other migration
 * texts: an old series, a changed migration, a newer binary's. */
static bool check_applied(PGconn *conn, char *err, size_t errlen)
{
	PGresult *res = PQexec(conn, migrate_version_sql);
	const char *sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	int version;
	bool ok;

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		ok = migrate_check_applied(res, &version, err, errlen);
	else if (migrate_error_means_empty(sqlstate))
		ok = true;
	else if (migrate_error_means_old_series(sqlstate)) {
		snprintf(err, errlen, "%s", migrate_old_series_message);
		ok = false;
	} else {
		snprintf(err, errlen, "reading pgcoord.schema_migrations: %s",
			 PQerrorMessage(conn));
		ok = false;
	}
	PQclear(res);
	return ok;
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
	const char *params[3] = {version, m->name, m->checksum};
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
		     " checksum text NOT NULL,"
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
		res =
		    PQexecParams(conn,
				 "INSERT INTO pgcoord.schema_migrations (version, name, checksum) "
				 "VALUES ($1, $2, $3)",
				 3, NULL, params, NULL, NULL, 0);
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
	ok = check_applied(conn, err, errlen);
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
