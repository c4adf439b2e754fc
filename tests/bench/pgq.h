/*
 * pgq.h — the few libpq helpers pgcoord-bench and pgcoord-capacity share
 * for setting up and reading their database: connect, run a statement or
 * die, read one number. Messages are prefixed with the program's name.
 */
#ifndef PGCOORD_TESTS_PGQ_H
#define PGCOORD_TESTS_PGQ_H

#include <libpq-fe.h>

/* Prints "<program>: <message>" and exits with status 2. */
__attribute__((noreturn, format(printf, 1, 2))) void pgq_die(const char *fmt, ...);

/* Connects to conninfo as appname, notices silenced; dies when it cannot. */
PGconn *pgq_connect(const char *conninfo, const char *appname);

/* Runs one statement; dies, naming it, unless it succeeds. */
__attribute__((format(printf, 2, 3))) void pgq_exec_or_die(PGconn *c, const char *fmt, ...);

/* The first column of the first row as a number; -1 (and the error on
 * stderr) on any failure. */
__attribute__((format(printf, 2, 3))) long long pgq_query_ll(PGconn *c, const char *fmt, ...);

#endif
