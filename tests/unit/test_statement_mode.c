/*
 * test_statement_mode.c — the prepared_statements words and the modes they
 * lead to: auto only ever moves down (named, named-pooled, unnamed); on and
 * off stay where they start.
 */
#include <criterion/criterion.h>

#include "agent/statement_mode.h"

Test(statement_mode, words)
{
	enum stmt_setting s = STMT_SETTING_OFF;
	cr_assert(stmt_setting_parse("auto", &s));
	cr_assert_eq(s, STMT_SETTING_AUTO);
	cr_assert(stmt_setting_parse("on", &s));
	cr_assert_eq(s, STMT_SETTING_ON);
	cr_assert(stmt_setting_parse("off", &s));
	cr_assert_eq(s, STMT_SETTING_OFF);
	cr_assert_not(stmt_setting_parse("yes", &s));
	cr_assert_not(stmt_setting_parse("Auto", &s));
	cr_assert_not(stmt_setting_parse("", &s));
	cr_assert_eq(s, STMT_SETTING_OFF, "a refused word leaves the value");
	cr_assert_str_eq(stmt_setting_name(STMT_SETTING_AUTO), "auto");
	cr_assert_str_eq(stmt_mode_name(STMT_MODE_NAMED), "named");
	cr_assert_str_eq(stmt_mode_name(STMT_MODE_NAMED_POOLED), "named-pooled");
	cr_assert_str_eq(stmt_mode_name(STMT_MODE_UNNAMED), "unnamed");
}

Test(statement_mode, auto_moves_down_and_never_back)
{
	enum stmt_mode m = stmt_mode_initial(STMT_SETTING_AUTO);
	cr_assert_eq(m, STMT_MODE_NAMED);
	m = stmt_mode_after_pooler(STMT_SETTING_AUTO, m);
	cr_assert_eq(m, STMT_MODE_NAMED_POOLED);
	m = stmt_mode_after_lost(STMT_SETTING_AUTO, m);
	cr_assert_eq(m, STMT_MODE_UNNAMED);
	/* a later connection that sees the pooler does not bring names back */
	cr_assert_eq(stmt_mode_after_pooler(STMT_SETTING_AUTO, m), STMT_MODE_UNNAMED);
	/* directly, a lost statement goes unnamed too */
	cr_assert_eq(stmt_mode_after_lost(STMT_SETTING_AUTO, STMT_MODE_NAMED), STMT_MODE_UNNAMED);
}

Test(statement_mode, on_and_off_are_forced)
{
	cr_assert_eq(stmt_mode_initial(STMT_SETTING_ON), STMT_MODE_NAMED);
	cr_assert_eq(stmt_mode_after_pooler(STMT_SETTING_ON, STMT_MODE_NAMED), STMT_MODE_NAMED);
	cr_assert_eq(stmt_mode_after_lost(STMT_SETTING_ON, STMT_MODE_NAMED), STMT_MODE_NAMED);
	cr_assert_eq(stmt_mode_initial(STMT_SETTING_OFF), STMT_MODE_UNNAMED);
	cr_assert_eq(stmt_mode_after_pooler(STMT_SETTING_OFF, STMT_MODE_UNNAMED),
		     STMT_MODE_UNNAMED);
}

Test(statement_mode, lost_statement_sqlstates)
{
	cr_assert(stmt_sqlstate_lost_statement("26000"));
	cr_assert(stmt_sqlstate_lost_statement("42P05"));
	cr_assert_not(stmt_sqlstate_lost_statement("57014"));
	cr_assert_not(stmt_sqlstate_lost_statement(NULL));
}
