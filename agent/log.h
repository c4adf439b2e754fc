/*
 * log.h — structured log lines (logfmt) on stderr.
 *
 * Every line carries level, component and msg; callers add key=value pairs
 * (request and session ids) through `kv`. Values are escaped (log_kv_str),
 * so a client-chosen name can neither end the line nor forge a key: one
 * event is always exactly one line, with no raw control characters. Under systemd (JOURNAL_STREAM
 * names the stream stderr is) lines start with a journald priority prefix
 * and omit the timestamp, which the journal records itself.
 */
#ifndef PGCOORD_AGENT_LOG_H
#define PGCOORD_AGENT_LOG_H

#include <stdbool.h>
#include <stdio.h>

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

struct logger {
	enum log_level level;
	bool journald; /* priority prefixes instead of timestamps */
	FILE *out;
};

void logger_init(struct logger *lg, enum log_level level);

/* Parses "error", "warn", "info", "debug". */
bool log_level_parse(const char *s, enum log_level *out);
const char *log_level_name(enum log_level level);

/*
 * Writes one line. kv is NULL or "key=value ..." pairs built with
 * log_kv_str / log_kv_int (any control character left in it is escaped
 * anyway); fmt makes the human message, always written quoted and escaped.
 */
__attribute__((format(printf, 5, 6))) void log_write(struct logger *lg, enum log_level level,
						     const char *component, const char *kv,
						     const char *fmt, ...);

/*
 * Writes value to buf (NUL-terminated, at most size bytes) as a logfmt value:
 * bare when it is non-empty printable text without space, '=' or '"';
 * otherwise quoted, with '"' and '\\' backslashed, \n \r \t by name, other
 * control bytes, DEL, C1 controls and invalid UTF-8 as \xNN. Truncation
 * never splits an escape and keeps the closing quote. Returns the length.
 */
size_t log_escape(char *buf, size_t size, const char *value);

/*
 * Copies msg to buf (NUL-terminated, at most size bytes) as one line: each
 * run of line breaks and tabs becomes one space and trailing ones go, so a
 * libpq message ("...failed: X\n\tIs the server running...\n") reads as
 * words rather than escapes.
 */
void log_one_line(char *buf, size_t size, const char *msg);

/* Append " key=value" (no leading space when buf is empty) to the
 * NUL-terminated buf of size bytes, value escaped by log_escape; a NULL
 * value is written as key=null. Keys are the caller's own literals. */
void log_kv_str(char *buf, size_t size, const char *key, const char *value);
void log_kv_int(char *buf, size_t size, const char *key, long long value);

#define log_error(lg, comp, ...) log_write((lg), LOG_LEVEL_ERROR, (comp), NULL, __VA_ARGS__)
#define log_warn(lg, comp, ...) log_write((lg), LOG_LEVEL_WARN, (comp), NULL, __VA_ARGS__)
#define log_info(lg, comp, ...) log_write((lg), LOG_LEVEL_INFO, (comp), NULL, __VA_ARGS__)
#define log_debug(lg, comp, ...) log_write((lg), LOG_LEVEL_DEBUG, (comp), NULL, __VA_ARGS__)

#endif
