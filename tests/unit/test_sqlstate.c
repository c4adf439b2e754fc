/*
 * test_sqlstate.c — which wire error a failed statement becomes. The
 * mapping decides whether a client retries with the same id (unavailable,
 * timeout: nothing happened or it rolled back) or gives up (a refusal the
 * schema raised on purpose, or a bug), so each class is pinned here.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/sqlstate.h"
#include "proto/codec.h"

/* Every migration's text, one after the other; caller frees. */
static char *migrations_text(void)
{
	const char *root = getenv("PGCOORD_SOURCE_ROOT");
	char dir[4096], path[4600];
	char *all = calloc(1, 1);
	size_t len = 0;
	struct dirent *e;
	DIR *d;

	cr_assert_not_null(root, "PGCOORD_SOURCE_ROOT is not set");
	snprintf(dir, sizeof(dir), "%s/migrations", root);
	d = opendir(dir);
	cr_assert_not_null(d, "cannot open %s", dir);
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		if (n < 5 || strcmp(e->d_name + n - 4, ".sql") != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "re");
		cr_assert_not_null(f, "cannot open %s", path);
		fseek(f, 0, SEEK_END);
		long size = ftell(f);
		rewind(f);
		all = realloc(all, len + (size_t)size + 1);
		cr_assert_eq(fread(all + len, 1, (size_t)size, f), (size_t)size);
		len += (size_t)size;
		all[len] = '\0';
		fclose(f);
	}
	closedir(d);
	return all;
}

/* Every SQLSTATE the migrations raise on purpose is one of the refusals the
 * agent answers as such, and every refusal in the table is raised. */
Test(sqlstate, every_code_the_migrations_raise_is_in_the_table)
{
	static const char *const table[] = {"PCNFD", "PCFEN", "PCCFL", "PCFBD",
					    "PCSEX", "PCINV", "PCSUP"};
	char *sql = migrations_text();
	int raised = 0;

	for (const char *p = sql; (p = strstr(p, "ERRCODE = '")); p++) {
		char code[6] = {0};
		memcpy(code, p + strlen("ERRCODE = '"), 5);
		cr_assert(strncmp(code, "PC", 2) == 0,
			  "the migrations raise %s: a deliberate refusal is of class PC", code);
		cr_assert(db_sqlstate_is_refusal(code),
			  "the migrations raise %s, which agent/sqlstate.c does not know", code);
		cr_assert_neq(db_error_for_sqlstate(code), PGC_E_INTERNAL);
		raised++;
	}
	cr_assert_gt(raised, 0, "no ERRCODE found in the migrations");
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		char needle[32];
		snprintf(needle, sizeof(needle), "ERRCODE = '%s'", table[i]);
		cr_assert_not_null(strstr(sql, needle), "%s is in the table but never raised",
				   table[i]);
		cr_assert(db_sqlstate_is_refusal(table[i]));
	}
	free(sql);
}

Test(sqlstate, schema_refusals_keep_their_meaning)
{
	cr_assert_eq(db_error_for_sqlstate("PCNFD"), PGC_E_NOT_FOUND);
	cr_assert_eq(db_error_for_sqlstate("PCFEN"), PGC_E_FENCED);
	cr_assert_eq(db_error_for_sqlstate("PCCFL"), PGC_E_CONFLICT);
	cr_assert_eq(db_error_for_sqlstate("PCFBD"), PGC_E_FORBIDDEN);
	cr_assert_eq(db_error_for_sqlstate("PCSEX"), PGC_E_SESSION_EXPIRED);
	cr_assert_eq(db_error_for_sqlstate("PCINV"), PGC_E_INVALID_PARAMS);
	cr_assert_eq(db_error_for_sqlstate("PCSUP"), PGC_E_SUPERSEDED);
	cr_assert(db_sqlstate_is_refusal("PCFEN"));
	cr_assert(db_sqlstate_is_refusal("PCSEX"));
}

Test(sqlstate, other_states_are_not_refusals)
{
	cr_assert_not(db_sqlstate_is_refusal(NULL));
	cr_assert_not(db_sqlstate_is_refusal("PC000"));
	cr_assert_not(db_sqlstate_is_refusal("23505"));
	cr_assert_not(db_sqlstate_is_refusal("57014"));
	/* a prefix of a refusal is not one */
	cr_assert_not(db_sqlstate_is_refusal("PCNF"));
}

Test(sqlstate, lost_connections_and_contention_are_retryable)
{
	/* no answer from the server at all */
	cr_assert_eq(db_error_for_sqlstate(NULL), PGC_E_UNAVAILABLE);
	/* class 08: connection exceptions */
	cr_assert_eq(db_error_for_sqlstate("08006"), PGC_E_UNAVAILABLE);
	cr_assert_eq(db_error_for_sqlstate("08001"), PGC_E_UNAVAILABLE);
	/* class 53: out of connections, memory, disk */
	cr_assert_eq(db_error_for_sqlstate("53300"), PGC_E_UNAVAILABLE);
	/* 57P01 admin_shutdown: the backend was terminated */
	cr_assert_eq(db_error_for_sqlstate("57P01"), PGC_E_UNAVAILABLE);
	/* serialization failure, deadlock: the transaction rolled back */
	cr_assert_eq(db_error_for_sqlstate("40001"), PGC_E_UNAVAILABLE);
	cr_assert_eq(db_error_for_sqlstate("40P01"), PGC_E_UNAVAILABLE);
	/* read_only_sql_transaction: a standby answered; the primary may not */
	cr_assert_eq(db_error_for_sqlstate("25006"), PGC_E_UNAVAILABLE);
	/* unique_violation: a write of the same id committed meanwhile; the
	 * retry reads it */
	cr_assert_eq(db_error_for_sqlstate("23505"), PGC_E_UNAVAILABLE);
}

Test(sqlstate, server_side_bounds_are_timeouts)
{
	/* statement_timeout and lock_timeout, set from the request's deadline */
	cr_assert_eq(db_error_for_sqlstate("57014"), PGC_E_TIMEOUT);
	cr_assert_eq(db_error_for_sqlstate("55P03"), PGC_E_TIMEOUT);
}

Test(sqlstate, anything_else_is_internal)
{
	/* a syntax error or a check violation is a bug, not a reason to retry */
	cr_assert_eq(db_error_for_sqlstate("23514"), PGC_E_INTERNAL);
	cr_assert_eq(db_error_for_sqlstate("42601"), PGC_E_INTERNAL);
	cr_assert_eq(db_error_for_sqlstate("P0001"), PGC_E_INTERNAL);
	cr_assert_eq(db_error_for_sqlstate(""), PGC_E_INTERNAL);
}
