/*
 * ctl_print.h — how pgcoordctl shows agent results: generic MessagePack →
 * JSON, aligned "key  value" blocks and column tables for people, with
 * `*_at` instants shown as ages and `*_ms` durations in human units.
 */
#ifndef PGCOORD_CTL_PRINT_H
#define PGCOORD_CTL_PRINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <msgpack.h>

/* How a table cell or field renders its value. */
enum ctl_fmt {
	CTL_FMT_AUTO,	  /* by type, and by key suffix: _at, _ms_ago, _ms */
	CTL_FMT_AGE,	  /* an epoch-ms instant: "3.2s ago", "in 8.1s" */
	CTL_FMT_DURATION, /* milliseconds: "850ms", "4m05s" */
	CTL_FMT_YESNO,	  /* a bool: yes / no */
};

struct ctl_column {
	const char *header;
	const char *key;
	enum ctl_fmt fmt;
};

/*
 * Writes o as JSON followed by a newline: pretty-printed with two-space
 * indents, strings escaped (invalid UTF-8 becomes U+FFFD), bin as a base64
 * string, ext as {"ext": type, "base64": data}, non-string map keys as
 * their JSON text in a string, non-finite floats as null.
 */
void ctl_print_json(FILE *out, const msgpack_object *o);

/* As ctl_print_json, compact on one line (a stream of events). */
void ctl_print_json_line(FILE *out, const msgpack_object *o);

/*
 * The "now" that ages are measured against. *_at values come from the
 * database clock; a result's own `now_at` (database time) is used when it has one,
 * otherwise this host's clock (close enough for display).
 */
int64_t ctl_now_ms(const msgpack_object *result);

/*
 * Prints each field of a map on its own line, labels aligned: a nested map's
 * fields as "parent.key", and a key's unit suffix ("_ms", "_ms_ago") dropped
 * where the value is shown as a duration.
 */
void ctl_print_fields(FILE *out, const msgpack_object *map, int64_t now_ms);

/*
 * Prints rows (an array of maps) as a table under the column headers.
 * Missing values show as "-"; an empty array prints the headers and "(none)".
 */
void ctl_print_table(FILE *out, const msgpack_object *rows, const struct ctl_column *cols,
		     size_t ncols, int64_t now_ms);

/* Renders one value as ctl_print_table would (for callers with their own layout). */
void ctl_format_value(char *buf, size_t len, const char *key, const msgpack_object *o,
		      enum ctl_fmt fmt, int64_t now_ms);

void ctl_format_duration(char *buf, size_t len, int64_t ms);
void ctl_format_age(char *buf, size_t len, int64_t at_ms, int64_t now_ms);

#endif
