/*
 * log.h — structured log lines (logfmt) on stderr.
 *
 * Every line carries level, component and msg; callers add key=value pairs
 * (request and session ids) through `kv`. Under systemd (JOURNAL_STREAM
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
 * Writes one line. kv is NULL or preformatted "key=value ..." pairs (values
 * already quoted where needed); fmt makes the human message.
 */
__attribute__((format(printf, 5, 6))) void log_write(struct logger *lg, enum log_level level,
						     const char *component, const char *kv,
						     const char *fmt, ...);

#define log_error(lg, comp, ...) log_write((lg), LOG_LEVEL_ERROR, (comp), NULL, __VA_ARGS__)
#define log_warn(lg, comp, ...) log_write((lg), LOG_LEVEL_WARN, (comp), NULL, __VA_ARGS__)
#define log_info(lg, comp, ...) log_write((lg), LOG_LEVEL_INFO, (comp), NULL, __VA_ARGS__)
#define log_debug(lg, comp, ...) log_write((lg), LOG_LEVEL_DEBUG, (comp), NULL, __VA_ARGS__)

#endif
