/*
 * test_sqlstate.c — which wire error a failed statement becomes. The
 * mapping decides whether a client retries with the same id (unavailable,
 * timeout: nothing happened or it rolled back) or gives up (a refusal the
 * schema raised on purpose, or a bug), so each class is pinned here.
 */
#include <criterion/criterion.h>

#include "agent/db.h"
#include "proto/codec.h"

Test(sqlstate, schema_refusals_keep_their_meaning)
{
	cr_assert_eq(db_error_for_sqlstate("PCNFD"), PGC_E_NOT_FOUND);
	cr_assert_eq(db_error_for_sqlstate("PCFEN"), PGC_E_FENCED);
	cr_assert_eq(db_error_for_sqlstate("PCCFL"), PGC_E_CONFLICT);
	cr_assert_eq(db_error_for_sqlstate("PCFBD"), PGC_E_FORBIDDEN);
	cr_assert_eq(db_error_for_sqlstate("PCSEX"), PGC_E_SESSION_EXPIRED);
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
}

Test(sqlstate, server_side_bounds_are_timeouts)
{
	/* statement_timeout and lock_timeout, set from the request's deadline */
	cr_assert_eq(db_error_for_sqlstate("57014"), PGC_E_TIMEOUT);
	cr_assert_eq(db_error_for_sqlstate("55P03"), PGC_E_TIMEOUT);
}

Test(sqlstate, anything_else_is_internal)
{
	/* a unique violation or a syntax error is a bug, not a reason to retry */
	cr_assert_eq(db_error_for_sqlstate("23505"), PGC_E_INTERNAL);
	cr_assert_eq(db_error_for_sqlstate("42601"), PGC_E_INTERNAL);
	cr_assert_eq(db_error_for_sqlstate("P0001"), PGC_E_INTERNAL);
	cr_assert_eq(db_error_for_sqlstate(""), PGC_E_INTERNAL);
}
