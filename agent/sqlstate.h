/*
 * sqlstate.h — the one table from a failed statement's SQLSTATE to the
 * wire error a client sees: the schema's deliberate refusals (class PC),
 * what a retry may cure (unavailable, timeout), and bugs (internal).
 */
#ifndef PGCOORD_AGENT_SQLSTATE_H
#define PGCOORD_AGENT_SQLSTATE_H

#include <stdbool.h>

#include "proto/codec.h"

/* Maps a failed result's SQLSTATE to the wire error a client should see:
 * 57014 (statement_timeout) and 55P03 (lock_timeout) are TIMEOUT.
 * The schema's deliberate refusals (PCNFD not_found, PCFEN fenced, PCCFL
 * conflict, PCFBD forbidden, PCSEX session_expired, PCINV invalid_params)
 * map to their codes. */
enum pgc_error_code db_error_for_sqlstate(const char *sqlstate);
/* True for one of those refusals. */
bool db_sqlstate_is_refusal(const char *sqlstate);

#endif
