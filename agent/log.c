/*
 * log.c — logfmt lines; see log.h.
 */
#include "agent/log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};
/* journald/syslog priorities: err, warning, info, debug */
static const int level_priority[] = {3, 4, 6, 7};

/*
 * systemd sets JOURNAL_STREAM=<dev>:<inode> of the stream it connected to
 * stderr. A child that inherited the variable but whose stderr was
 * redirected elsewhere (a test harness, a shell pipe) must not write
 * priority prefixes, so the identity is compared, as systemd.exec(5) asks.
 */
static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2)
		return false;
	if (fstat(STDERR_FILENO, &st) != 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void logger_init(struct logger *lg, enum log_level level)
{
	lg->level = level;
	lg->out = stderr;
	lg->journald = stderr_is_journal();
}

bool log_level_parse(const char *s, enum log_level *out)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return true;
		}
	}
	return false;
}

const char *log_level_name(enum log_level level)
{
	return level_names[level];
}

/*
 * Length of the valid UTF-8 sequence at p that is safe to show as is, or 0:
 * invalid or overlong sequences, surrogates, C1 controls (U+0080..U+009F,
 * which terminals obey) and the line/paragraph separators U+2028/U+2029
 * are escaped byte by byte instead.
 */
static size_t utf8_safe_len(const unsigned char *p)
{
	unsigned cp;
	size_t n;

	if (p[0] < 0xc2)
		return 0;
	else if (p[0] < 0xe0)
		n = 2, cp = p[0] & 0x1f;
	else if (p[0] < 0xf0)
		n = 3, cp = p[0] & 0x0f;
	else if (p[0] < 0xf5)
		n = 4, cp = p[0] & 0x07;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 ||
	    cp == 0x2029)
		return 0;
	return n;
}

static bool needs_quotes(const char *s)
{
	if (!*s)
		return true;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p <= ' ' || *p == '=' || *p == '"' || *p == '\\' || *p >= 0x7f)
			return true;
	return false;
}

/* Appends the escaped form of the character at p to buf[*len] when the
 * whole of it fits before the closing quote and the NUL; *used is how many
 * bytes of the input it took. */
static bool put_escaped_char(char *buf, size_t size, size_t *len, const unsigned char *p,
			     size_t *used)
{
	char tmp[8];
	size_t n;

	*used = 1;
	if (*p == '"' || *p == '\\') {
		tmp[0] = '\\', tmp[1] = (char)*p, n = 2;
	} else if (*p == '\n') {
		memcpy(tmp, "\\n", 2), n = 2;
	} else if (*p == '\r') {
		memcpy(tmp, "\\r", 2), n = 2;
	} else if (*p == '\t') {
		memcpy(tmp, "\\t", 2), n = 2;
	} else if (*p >= 0x20 && *p < 0x7f) {
		tmp[0] = (char)*p, n = 1;
	} else if ((n = utf8_safe_len(p)) > 0) {
		memcpy(tmp, p, n);
		*used = n;
	} else {
		snprintf(tmp, sizeof(tmp), "\\x%02x", *p);
		n = 4;
	}
	if (*len + n + 2 > size) /* room for the closing quote and the NUL */
		return false;
	memcpy(buf + *len, tmp, n);
	*len += n;
	return true;
}

static size_t escape_value(char *buf, size_t size, const char *value, bool always_quote)
{
	size_t len = 0;

	if (size == 0)
		return 0;
	if (!always_quote && !needs_quotes(value)) {
		snprintf(buf, size, "%s", value);
		len = strlen(value);
		return len < size ? len : size - 1;
	}
	if (size < 3) {
		buf[0] = '\0';
		return 0;
	}
	buf[len++] = '"';
	for (const unsigned char *p = (const unsigned char *)value; *p;) {
		size_t used;
		if (!put_escaped_char(buf, size, &len, p, &used))
			break;
		p += used;
	}
	buf[len++] = '"';
	buf[len] = '\0';
	return len;
}

size_t log_escape(char *buf, size_t size, const char *value)
{
	return escape_value(buf, size, value ? value : "", false);
}

static bool is_break(char c)
{
	return c == '\n' || c == '\r' || c == '\t';
}

void log_one_line(char *buf, size_t size, const char *msg)
{
	size_t o = 0;

	if (size == 0)
		return;
	for (const char *p = msg ? msg : ""; *p && o + 1 < size;) {
		if (!is_break(*p)) {
			buf[o++] = *p++;
			continue;
		}
		while (is_break(*p))
			p++;
		if (*p && o > 0 && buf[o - 1] != ' ')
			buf[o++] = ' ';
	}
	buf[o] = '\0';
}

void log_kv_str(char *buf, size_t size, const char *key, const char *value)
{
	size_t len = strnlen(buf, size);
	int n;

	if (len + 1 >= size)
		return;
	n = snprintf(buf + len, size - len, "%s%s=", len ? " " : "", key);
	if (n < 0 || (size_t)n >= size - len) {
		buf[len] = '\0'; /* never leave half a key */
		return;
	}
	len += (size_t)n;
	if (value)
		escape_value(buf + len, size - len, value, false);
	else
		snprintf(buf + len, size - len, "null");
}

void log_kv_int(char *buf, size_t size, const char *key, long long value)
{
	size_t len = strnlen(buf, size);
	if (len + 1 < size)
		snprintf(buf + len, size - len, "%s%s=%lld", len ? " " : "", key, value);
}

/* The kv part is built by log_kv_*; should a caller have formatted a raw
 * value into it anyway, its control bytes still never reach the line. */
static void put_kv(FILE *out, const char *kv)
{
	for (const unsigned char *p = (const unsigned char *)kv; *p; p++) {
		if (*p < 0x20 || *p == 0x7f)
			fprintf(out, "\\x%02x", *p);
		else
			fputc(*p, out);
	}
}

void log_write(struct logger *lg, enum log_level level, const char *component, const char *kv,
	       const char *fmt, ...)
{
	char msg[1024], quoted[4 * sizeof(msg) + 3];
	va_list ap;

	if (level > lg->level)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	if (lg->journald) {
		fprintf(lg->out, "<%d>", level_priority[level]);
	} else {
		struct timespec ts;
		struct tm tm;
		char when[32];
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
		fprintf(lg->out, "ts=%s.%03ldZ ", when, ts.tv_nsec / 1000000);
	}
	fprintf(lg->out, "level=%s component=%s msg=", level_names[level], component);
	escape_value(quoted, sizeof(quoted), msg, true);
	fputs(quoted, lg->out);
	if (kv && kv[0]) {
		fputc(' ', lg->out);
		put_kv(lg->out, kv);
	}
	fputc('\n', lg->out);
	fflush(lg->out);
}
