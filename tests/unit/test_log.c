/*
 * test_log.c — log lines: values are escaped in logfmt style, so a
 * client-chosen name can neither end a line nor forge a key, and no raw
 * control character ever reaches the output.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/log.h"

static const char *escaped(const char *value)
{
	static char buf[512];
	log_escape(buf, sizeof(buf), value);
	return buf;
}

Test(log_escape, plain_values_stay_bare)
{
	cr_assert_str_eq(escaped("db-migrate"), "db-migrate");
	cr_assert_str_eq(escaped("a/b:c.d"), "a/b:c.d");
}

Test(log_escape, quotes_what_would_split_the_pair)
{
	cr_assert_str_eq(escaped(""), "\"\"");
	cr_assert_str_eq(escaped("two words"), "\"two words\"");
	cr_assert_str_eq(escaped("a=b"), "\"a=b\"");
	cr_assert_str_eq(escaped("say \"hi\""), "\"say \\\"hi\\\"\"");
	cr_assert_str_eq(escaped("back\\slash"), "\"back\\\\slash\"");
}

Test(log_escape, control_characters_never_pass_raw)
{
	cr_assert_str_eq(escaped("a\nb"), "\"a\\nb\"");
	cr_assert_str_eq(escaped("a\rb\tc"), "\"a\\rb\\tc\"");
	cr_assert_str_eq(escaped("\x1b[31m"), "\"\\x1b[31m\"");
	cr_assert_str_eq(escaped("del\x7f"), "\"del\\x7f\"");
	cr_assert_str_eq(escaped("\x01"), "\"\\x01\"");
}

Test(log_escape, utf8_stays_readable_but_c1_and_invalid_bytes_do_not)
{
	cr_assert_str_eq(escaped("gr\xc3\xbc\xc3\x9f"), "\"gr\xc3\xbc\xc3\x9f\"");
	/* U+009B (CSI as a C1 control), a lone continuation byte, an overlong '/',
	 * U+2028 LINE SEPARATOR */
	cr_assert_str_eq(escaped("\xc2\x9b"), "\"\\xc2\\x9b\"");
	cr_assert_str_eq(escaped("\x80"), "\"\\x80\"");
	cr_assert_str_eq(escaped("\xc0\xaf"), "\"\\xc0\\xaf\"");
	cr_assert_str_eq(escaped("\xe2\x80\xa8"), "\"\\xe2\\x80\\xa8\"");
	/* cut short: the sequence's bytes are escaped, not swallowed */
	cr_assert_str_eq(escaped("\xe2\x82"), "\"\\xe2\\x82\"");
}

Test(log_escape, truncation_keeps_escapes_whole_and_the_closing_quote)
{
	char buf[8];
	size_t n = log_escape(buf, sizeof(buf), "\n\n\n\n");
	/* 7 bytes of room: the quote, two escapes, the closing quote */
	cr_assert_str_eq(buf, "\"\\n\\n\"");
	cr_assert_eq(n, strlen(buf));
	log_escape(buf, sizeof(buf), "\x01\x02");
	cr_assert_str_eq(buf, "\"\\x01\"");
}

Test(log_kv, builds_pairs_with_escaped_values)
{
	char kv[128] = "";
	log_kv_str(kv, sizeof(kv), "lease", "x\nlevel=error msg=\"forged\"");
	log_kv_int(kv, sizeof(kv), "session", -7);
	log_kv_str(kv, sizeof(kv), "replica", NULL);
	cr_assert_str_eq(kv,
			 "lease=\"x\\nlevel=error msg=\\\"forged\\\"\" session=-7 replica=null");
}

Test(log_kv, never_leaves_half_a_key)
{
	char kv[12] = "";
	log_kv_int(kv, sizeof(kv), "a", 1);
	log_kv_str(kv, sizeof(kv), "longer_key", "v");
	cr_assert_str_eq(kv, "a=1");
}

/* The whole line: exactly one newline, at the end, and nothing below 0x20
 * or DEL anywhere else, whatever msg and kv hold. */
Test(log_write, one_event_is_one_line_without_raw_controls)
{
	char *text = NULL;
	size_t len = 0;
	struct logger lg;
	logger_init(&lg, LOG_LEVEL_DEBUG);
	lg.journald = false;
	lg.out = open_memstream(&text, &len);
	cr_assert(lg.out);

	char kv[256] = "";
	log_kv_str(kv, sizeof(kv), "lease", "a\nts=x level=error component=permits msg=\"forged\"");
	log_write(&lg, LOG_LEVEL_INFO, "leases", kv, "name %s\r\n\x1b\x7f end",
		  "b\nlevel=error msg=\"operator uid 0 released permit\"");
	/* a caller that formatted a raw value into kv: still no raw controls */
	log_write(&lg, LOG_LEVEL_WARN, "leases", "lease=raw\nlevel=error", "m");
	fclose(lg.out);

	int lines = 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)text[i];
		if (ch == '\n')
			lines++;
		else
			cr_assert(ch >= 0x20 && ch != 0x7f, "raw control byte 0x%02x at %zu in %s",
				  ch, i, text);
	}
	cr_assert_eq(lines, 2, "%s", text);
	cr_assert(strstr(text, "level=info component=leases msg=\"name b\\nlevel=error "
			       "msg=\\\"operator uid 0 released permit\\\"\\r\\n\\x1b\\x7f end\" "
			       "lease=\"a\\nts=x level=error component=permits "
			       "msg=\\\"forged\\\"\"\n"),
		  "%s", text);
	cr_assert(strstr(text, "lease=raw\\x0alevel=error\n"), "%s", text);
	free(text);
}

Test(log_one_line, libpq_breaks_and_tabs_become_single_spaces)
{
	char buf[256];

	log_one_line(buf, sizeof(buf),
		     "connection to server on socket \"/s/.s.PGSQL.5432\" failed: No such file "
		     "or directory\n\tIs the server running locally and accepting connections "
		     "on that socket?\n");
	cr_assert_str_eq(buf, "connection to server on socket \"/s/.s.PGSQL.5432\" failed: No such "
			      "file or directory Is the server running locally and accepting "
			      "connections on that socket?");
	log_one_line(buf, sizeof(buf), "a\r\n\t\tb \tc\n");
	cr_assert_str_eq(buf, "a b c");
	log_one_line(buf, 4, "abcdef");
	cr_assert_str_eq(buf, "abc");
	log_one_line(buf, sizeof(buf), NULL);
	cr_assert_str_eq(buf, "");
}

Test(log_one_line, a_libpq_message_logs_without_escapes)
{
	char *text = NULL, line[256];
	size_t len = 0;
	FILE *mem = open_memstream(&text, &len);
	struct logger lg;

	cr_assert_not_null(mem);
	logger_init(&lg, LOG_LEVEL_INFO);
	lg.journald = false;
	lg.out = mem;
	log_one_line(line, sizeof(line),
		     "server closed the connection unexpectedly\n\tThis probably means the "
		     "server terminated abnormally\n");
	log_write(&lg, LOG_LEVEL_WARN, "db", NULL, "requests connection lost: %s", line);
	fclose(mem);
	cr_assert(strstr(text, "msg=\"requests connection lost: server closed the connection "
			       "unexpectedly This probably means the server terminated "
			       "abnormally\"\n"),
		  "%s", text);
	cr_assert_not(strstr(text, "\\t") || strstr(text, "\\x09") || strstr(text, "\\n"), "%s",
		      text);
	free(text);
}
