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

/* Writes s as a logfmt value: quoted, with quotes, backslashes and control
 * characters escaped, so one event is always one line. */
static void put_quoted(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(out, "\\%c", ch);
		else if (ch == '\n')
			fputs("\\n", out);
		else if (ch < 0x20)
			fprintf(out, "\\x%02x", ch);
		else
			fputc(ch, out);
	}
	fputc('"', out);
}

void log_write(struct logger *lg, enum log_level level, const char *component, const char *kv,
	       const char *fmt, ...)
{
	char msg[1024];
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
	put_quoted(lg->out, msg);
	if (kv && kv[0]) {
		fputc(' ', lg->out);
		fputs(kv, lg->out);
	}
	fputc('\n', lg->out);
	fflush(lg->out);
}
