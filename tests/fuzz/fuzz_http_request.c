/*
 * fuzz_http_request.c — libFuzzer target for what the HTTP listener
 * answers a request head (agent/http_request.c, called by agent/http.c for
 * every request): the request line, the headers, the Host check, the paths
 * of /metrics, /healthz and /status with their query strings.
 *
 * Input: one control byte (which metrics_listen host the listener has,
 * listen_hosts below), then the request head's bytes.
 *
 * What must hold, beyond not crashing or leaking:
 * - the verdict is one of the answers the listener gives, each with its
 *   own reason phrase, and a page only with 200 (a Location only with 302,
 *   an Allow only with 405);
 * - the same bytes get the same verdict;
 * - the response written from it as http.c's http_reply() writes it is
 *   well-formed HTTP/1.1 (a status line, header lines, Content-Length equal
 *   to the body), whatever the request echoed into it, and bounded;
 * - a page is served only to a GET or HEAD whose head ends in an empty
 *   line, and only HEAD is answered without a body.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/http_request.h"

static const char *const listen_hosts[] = {"", "localhost", "metrics.internal", "127.0.0.1"};

/* The answers the listener gives, with their reason phrases. */
static const struct {
	int code;
	const char *reason;
} answers[] = {
    {200, "OK"},
    {302, "Found"},
    {400, "Bad Request"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {421, "Misdirected Request"},
    {431, "Request Header Fields Too Large"},
    {505, "HTTP Version Not Supported"},
};

/* A response, the longest a refusal can be: the status line, five headers
 * and the text. */
#define RESPONSE_MAX 2048

static void check(bool ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "fuzz_http_request: %s\n", what);
		abort();
	}
}

/* A header value or reason phrase: no CR, LF or other control but tab. */
static bool is_field(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return false;
	}
	return true;
}

/* Writes the response as http.c would send it (http_reply() and libevent's
 * status line and Content-Length). The body of a page is a placeholder. */
static size_t write_response(const struct http_verdict *v, char *out, size_t cap)
{
	char body[HTTP_VERDICT_TEXT_MAX + 32];
	int blen;

	if (v->page != HTTP_PAGE_NONE)
		blen = snprintf(body, sizeof(body), "page %d\n", (int)v->page);
	else
		blen = snprintf(body, sizeof(body), "%s\n", v->text);
	check(blen > 0 && (size_t)blen < sizeof(body), "the body does not fit");
	if (v->head_only)
		blen = 0; /* HEAD: Content-Length of the body, which is not sent */
	int n = snprintf(out, cap,
			 "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
			 "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
			 "%s%s%s%s%s%sContent-Length: %d\r\n\r\n%.*s",
			 v->code, v->reason, v->location ? "Location: " : "",
			 v->location ? v->location : "", v->location ? "\r\n" : "",
			 v->allow ? "Allow: " : "", v->allow ? v->allow : "",
			 v->allow ? "\r\n" : "", blen, blen, body);
	check(n > 0 && (size_t)n < cap, "the response is over its bound");
	return (size_t)n;
}

/* Parses a response back, strictly: the status line, header lines of a
 * token, a colon and a value, Content-Length equal to what follows. */
static void check_response(const char *r, size_t n)
{
	const char *end = r + n, *line = r, *eol;
	long content_length = -1;

	eol = memchr(line, '\r', (size_t)(end - line));
	check(eol && eol + 1 < end && eol[1] == '\n', "the status line does not end in CRLF");
	check(eol - line >= 13 && memcmp(line, "HTTP/1.1 ", 9) == 0 && line[9] >= '1' &&
		  line[9] <= '5' && line[10] >= '0' && line[10] <= '9' && line[11] >= '0' &&
		  line[11] <= '9' && line[12] == ' ',
	      "the status line is not HTTP/1.1 NNN reason");
	check(is_field(line + 13, (size_t)(eol - line - 13)) && eol - line > 13,
	      "the reason phrase is empty or has a control byte");
	for (line = eol + 2;; line = eol + 2) {
		eol = memchr(line, '\r', (size_t)(end - line));
		check(eol && eol + 1 < end && eol[1] == '\n', "a header line does not end in CRLF");
		if (eol == line)
			break;
		const char *colon = memchr(line, ':', (size_t)(eol - line));
		check(colon && colon > line, "a header line without a name");
		for (const char *c = line; c < colon; c++)
			check((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || *c == '-',
			      "a header name with a byte it may not carry");
		check(colon + 1 < eol && colon[1] == ' ', "a header without a value");
		check(is_field(colon + 2, (size_t)(eol - colon - 2)),
		      "a header value with a control byte");
		if ((size_t)(colon - line) == 14 && strncmp(line, "Content-Length", 14) == 0) {
			check(content_length < 0, "two Content-Length headers");
			content_length = strtol(colon + 2, NULL, 10);
		}
	}
	check(content_length >= 0, "no Content-Length");
	check((long)(end - (eol + 2)) == content_length, "Content-Length is not the body's");
}

/* Whether the head ends a request the way a served one must: its last
 * line is empty. */
static bool ends_in_empty_line(const char *h, size_t n)
{
	return (n >= 2 && h[n - 1] == '\n' && h[n - 2] == '\n') ||
	       (n >= 3 && memcmp(h + n - 3, "\n\r\n", 3) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct http_verdict v, again;
	char response[RESPONSE_MAX];
	size_t i;

	if (size < 1)
		return 0;
	const char *listen_host =
	    listen_hosts[data[0] % (sizeof(listen_hosts) / sizeof(*listen_hosts))];
	/* a copy of exactly the head's bytes, so ASan sees any read past it */
	size_t n = size - 1;
	char *head = malloc(n ? n : 1);
	check(head != NULL, "out of memory");
	memcpy(head, data + 1, n);

	http_request_judge(listen_host, head, n, &v);
	http_request_judge(listen_host, head, n, &again);
	check(memcmp(&v, &again, sizeof(v)) == 0, "the same head got two verdicts");

	for (i = 0; i < sizeof(answers) / sizeof(*answers); i++)
		if (answers[i].code == v.code)
			break;
	check(i < sizeof(answers) / sizeof(*answers), "a status code the listener does not give");
	check(v.reason && strcmp(v.reason, answers[i].reason) == 0, "the wrong reason phrase");
	check((v.page != HTTP_PAGE_NONE) == (v.code == 200), "a page without 200, or 200 without");
	check((v.location != NULL) == (v.code == 302), "a Location without 302, or 302 without");
	check((v.allow != NULL) == (v.code == 405), "an Allow without 405, or 405 without");
	check(memchr(v.text, '\0', sizeof(v.text)) != NULL, "the text is not terminated");
	check(is_field(v.text, strlen(v.text)), "the text has a control byte");
	check(v.page != HTTP_PAGE_NONE || v.text[0], "a refusal without a text");
	if (v.page != HTTP_PAGE_NONE) {
		bool get = n >= 4 && memcmp(head, "GET ", 4) == 0;
		bool is_head = n >= 5 && memcmp(head, "HEAD ", 5) == 0;
		check(get || is_head, "a page served to a method other than GET and HEAD");
		check(v.head_only == is_head, "HEAD and its bodiless answer disagree");
		check(ends_in_empty_line(head, n), "a page served to a head that does not end");
		check(n <= HTTP_REQUEST_HEAD_MAX, "a page served to a head over its bound");
	}
	if (v.page == HTTP_PAGE_WHY) {
		/* the key goes to the database and into HTML: bounded, no NUL
		 * inside, no control byte */
		size_t klen = strnlen(v.key, sizeof(v.key));
		check(klen >= 1 && klen <= HTTP_WHY_KEY_MAX, "a /why key empty or over its bound");
		for (size_t k = 0; k < klen; k++)
			check((unsigned char)v.key[k] >= 0x20 && v.key[k] != 0x7f,
			      "a /why key with a control byte");
	}

	size_t rlen = write_response(&v, response, sizeof(response));
	check_response(response, rlen);

	/* the Host check on the raw bytes: no NUL, no empty name is ours */
	if (http_host_allowed(listen_host, head, n))
		check(n > 0 && !memchr(head, '\0', n) && head[0] != ':',
		      "an empty or NUL-carrying Host allowed");
	free(head);
	return 0;
}
