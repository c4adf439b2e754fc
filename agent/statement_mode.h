/*
 * statement_mode.h — how the agent sends its statements to the database:
 * the prepared_statements setting (auto, on, off) and the effective mode
 * it leads to, decided from what the connections see.
 *
 *   named         each connection prepares a text once and runs it by
 *                 name; statement_timeout and lock_timeout are session
 *                 settings, sent once per connection. Right when each
 *                 agent connection is its own server session.
 *   named-pooled  named statements, but the timeouts travel with each
 *                 transaction (set_config(..., true)): a pooler in between
 *                 may hand the server connection to other clients, and a
 *                 session setting would follow it there.
 *   unnamed       each call sends its timeouts and an unnamed statement:
 *                 nothing outlives the transaction (PgBouncer transaction
 *                 pooling before 1.21, or without max_prepared_statements).
 *
 * With auto the mode only ever moves down that list, for the life of the
 * process: a pooler seen at connect (the server's pg_backend_pid() is not
 * the one the connection was given) makes named named-pooled; a named
 * statement the server does not have (SQLSTATE 26000) or already has
 * (42P05) makes either unnamed. on is named and off unnamed, whatever is
 * seen.
 */
#ifndef PGCOORD_AGENT_STATEMENT_MODE_H
#define PGCOORD_AGENT_STATEMENT_MODE_H

#include <stdbool.h>

#include "agent/log.h"

enum stmt_setting { STMT_SETTING_AUTO, STMT_SETTING_ON, STMT_SETTING_OFF };

enum stmt_mode { STMT_MODE_NAMED, STMT_MODE_NAMED_POOLED, STMT_MODE_UNNAMED, STMT_MODE__COUNT };

/* "auto", "on" or "off"; false for any other word. */
bool stmt_setting_parse(const char *text, enum stmt_setting *out);
const char *stmt_setting_name(enum stmt_setting s);

/* "named", "named-pooled" or "unnamed". */
const char *stmt_mode_name(enum stmt_mode m);

/* The mode before any connection has said anything. */
enum stmt_mode stmt_mode_initial(enum stmt_setting s);

/* The mode once a connection reached the server through a pooler. */
enum stmt_mode stmt_mode_after_pooler(enum stmt_setting s, enum stmt_mode m);

/* True when the SQLSTATE says a named statement is not what the agent
 * prepared on this session: 26000 (does not exist), 42P05 (already exists). */
bool stmt_sqlstate_lost_statement(const char *sqlstate);

/* The mode once a named statement went missing (stmt_sqlstate_lost_statement). */
enum stmt_mode stmt_mode_after_lost(enum stmt_setting s, enum stmt_mode m);

/* Logs, once per process (the caller keeps *logged), that a connection
 * reached the server through a pooler and what the setting does with it. */
void stmt_log_pooler(struct logger *log, bool *logged, enum stmt_setting s, enum stmt_mode m,
		     int server_pid, int given_pid);

/* Logs, once per process, that a named statement went missing (sqlstate)
 * and what the setting does about it; with on, every time (at error): the
 * call failed. */
void stmt_log_lost(struct logger *log, bool *logged, enum stmt_setting s, const char *sqlstate);

#endif
