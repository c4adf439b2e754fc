/*
 * sqlstate.c — which wire error a failed statement's SQLSTATE becomes; see
 * sqlstate.h.
 */
#include "agent/sqlstate.h"

#include <stddef.h>
#include <string.h>

/* The refusals the pgcoord schema raises on purpose, one SQLSTATE of class
 * PC each (migrations/README.md): their message is written for the client.
 * unit-sqlstate checks that every code the migrations raise is here. */
static const struct {
	const char *sqlstate;
	enum pgc_error_code code;
} refusals[] = {
    {"PCNFD", PGC_E_NOT_FOUND},	 {"PCFEN", PGC_E_FENCED},	   {"PCCFL", PGC_E_CONFLICT},
    {"PCFBD", PGC_E_FORBIDDEN},	 {"PCSEX", PGC_E_SESSION_EXPIRED}, {"PCINV", PGC_E_INVALID_PARAMS},
    {"PCSUP", PGC_E_SUPERSEDED},
};

bool db_sqlstate_is_refusal(const char *sqlstate)
{
	for (size_t i = 0; sqlstate && i < sizeof(refusals) / sizeof(refusals[0]); i++)
		if (strcmp(sqlstate, refusals[i].sqlstate) == 0)
			return true;
	return false;
}

enum pgc_error_code db_error_for_sqlstate(const char *sqlstate)
{
	if (!sqlstate)
		return PGC_E_UNAVAILABLE;
	for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++)
		if (strcmp(sqlstate, refusals[i].sqlstate) == 0)
			return refusals[i].code;
	/* connection exceptions, shutdowns, resource limits, serialization
	 * conflicts and read-only standbys: a retry may well succeed. So does
	 * a unique violation: a claim inserts its permit row after its quota
	 * rows (0018), and one that meets a row of its id that another
	 * transaction wrote meanwhile (a release retiring the id, a claim of
	 * the id with other quotas) rolls back whole; its retry reads that row
	 * and answers from it. */
	if (strncmp(sqlstate, "08", 2) == 0 || strncmp(sqlstate, "53", 2) == 0 ||
	    strncmp(sqlstate, "57P", 3) == 0 || strcmp(sqlstate, "40001") == 0 ||
	    strcmp(sqlstate, "40P01") == 0 || strcmp(sqlstate, "25006") == 0 ||
	    strcmp(sqlstate, "23505") == 0)
		return PGC_E_UNAVAILABLE;
	/* the server-side bound (db_bound_ms) ran out: statement_timeout
	 * (query_canceled) or lock_timeout (lock_not_available); the statement
	 * rolled back, so a retry is safe */
	if (strcmp(sqlstate, "57014") == 0 || strcmp(sqlstate, "55P03") == 0)
		return PGC_E_TIMEOUT;
	return PGC_E_INTERNAL;
}
