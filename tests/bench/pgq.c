/*
 * pgq.c — libpq helpers shared by pgcoord-bench and pgcoord-capacity
 * (pgq.h). The build defines _GNU_SOURCE, which gives
 * program_invocation_short_name for the messages' prefix.
 */
#include "pgq.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void pgq_die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", program_invocation_short_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(2);
}

static void ignore_notice(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

PGconn *pgq_connect(const char *conninfo, const char *appname)
{
	const char *keys[] = {"dbname", "application_name", NULL};
	const char *values[] = {conninfo, appname, NULL};
	PGconn *c = PQconnectdbParams(keys, values, 1);

	if (PQstatus(c) != CONNECTION_OK)
		pgq_die("cannot connect to %s: %s", conninfo, PQerrorMessage(c));
	PQsetNoticeProcessor(c, ignore_notice, NULL);
	return c;
}

/* Formats the statement into sql (kept for the caller's error message)
 * and runs it. */
static PGresult *exec_formatted(PGconn *c, char *sql, size_t size, const char *fmt, va_list ap)
{
	vsnprintf(sql, size, fmt, ap);
	return PQexec(c, sql);
}

void pgq_exec_or_die(PGconn *c, const char *fmt, ...)
{
	char sql[4096];
	va_list ap;
	PGresult *r;

	va_start(ap, fmt);
	r = exec_formatted(c, sql, sizeof(sql), fmt, ap);
	va_end(ap);
	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		pgq_die("setting up the database: %s  statement: %.300s", PQresultErrorMessage(r),
			sql);
	PQclear(r);
}

long long pgq_query_ll(PGconn *c, const char *fmt, ...)
{
	char sql[4096];
	long long v = -1;
	va_list ap;
	PGresult *r;

	va_start(ap, fmt);
	r = exec_formatted(c, sql, sizeof(sql), fmt, ap);
	va_end(ap);
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
		v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	else
		fprintf(stderr, "%s: %s  query: %.300s\n", program_invocation_short_name,
			PQresultErrorMessage(r), sql);
	PQclear(r);
	return v;
}
