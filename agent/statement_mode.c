/*
 * statement_mode.c — the prepared_statements setting and its effective
 * mode; see statement_mode.h.
 */
#include "agent/statement_mode.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const char *const setting_names[] = {"auto", "on", "off"};
static const char *const mode_names[] = {"named", "named-pooled", "unnamed"};

bool stmt_setting_parse(const char *text, enum stmt_setting *out)
{
	for (size_t i = 0; i < sizeof(setting_names) / sizeof(setting_names[0]); i++) {
		if (strcmp(text, setting_names[i]) == 0) {
			*out = (enum stmt_setting)i;
			return true;
		}
	}
	return false;
}

const char *stmt_setting_name(enum stmt_setting s)
{
	return (unsigned)s < sizeof(setting_names) / sizeof(setting_names[0]) ? setting_names[s]
									      : "?";
}

const char *stmt_mode_name(enum stmt_mode m)
{
	return (unsigned)m < STMT_MODE__COUNT ? mode_names[m] : "?";
}

enum stmt_mode stmt_mode_initial(enum stmt_setting s)
{
	return s == STMT_SETTING_OFF ? STMT_MODE_UNNAMED : STMT_MODE_NAMED;
}

enum stmt_mode stmt_mode_after_pooler(enum stmt_setting s, enum stmt_mode m)
{
	return s == STMT_SETTING_AUTO && m == STMT_MODE_NAMED ? STMT_MODE_NAMED_POOLED : m;
}

bool stmt_sqlstate_lost_statement(const char *sqlstate)
{
	return sqlstate && (strcmp(sqlstate, "26000") == 0 || strcmp(sqlstate, "42P05") == 0);
}

enum stmt_mode stmt_mode_after_lost(enum stmt_setting s, enum stmt_mode m)
{
	return s == STMT_SETTING_AUTO ? STMT_MODE_UNNAMED : m;
}

void stmt_log_pooler(struct logger *log, bool *logged, enum stmt_setting s, enum stmt_mode m,
		     int server_pid, int given_pid)
{
	char seen[160];

	if (*logged)
		return;
	*logged = true;
	snprintf(seen, sizeof(seen),
		 "database_url reaches the server through a pooler (its backend pid %d is not the "
		 "%d the connection was given)",
		 server_pid, given_pid);
	switch (s) {
	case STMT_SETTING_AUTO:
		log_info(log, "db", "%s: statement timeouts are sent with each transaction (%s)",
			 seen, stmt_mode_name(m));
		break;
	case STMT_SETTING_ON:
		log_warn(log, "db",
			 "%s, but prepared_statements = on keeps the statement timeouts as session "
			 "settings, which the pooler may hand to other clients, and a transaction "
			 "pooler loses named statements: set prepared_statements = auto",
			 seen);
		break;
	case STMT_SETTING_OFF:
		log_info(log, "db", "%s: unnamed statements (prepared_statements = off)", seen);
		break;
	}
}

void stmt_log_lost(struct logger *log, bool *logged, enum stmt_setting s, const char *sqlstate)
{
	if (s == STMT_SETTING_ON) {
		log_error(
		    log, "db",
		    "the server does not have the statements this connection prepared "
		    "(SQLSTATE %s): is database_url a transaction pooler (PgBouncer pool_mode "
		    "= transaction)? Set prepared_statements = auto (or off) behind one",
		    sqlstate);
		return;
	}
	if (*logged)
		return;
	*logged = true;
	log_warn(log, "db",
		 "a named statement is not the one this connection prepared (SQLSTATE %s: %s): "
		 "the server connection is not its own, so the pooler does not keep them; "
		 "using unnamed statements from now on",
		 sqlstate, strcmp(sqlstate, "42P05") == 0 ? "already exists" : "does not exist");
}
