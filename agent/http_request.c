/*
 * http_request.c — see http_request.h.
 */
#include "agent/http_request.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* A refusal; its text names at most 200 bytes of what was sent (%.*s of a
 * checked span, never of raw bytes with controls in them). */
__attribute__((format(printf, 4, 5))) static void refuse(struct http_verdict *v, int code,
							 const char *reason, const char *fmt, ...)
{
	va_list ap;
	v->page = HTTP_PAGE_NONE;
	v->code = code;
	v->reason = reason;
	va_start(ap, fmt);
	vsnprintf(v->text, sizeof(v->text), fmt, ap);
	va_end(ap);
}

static bool is_tchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* A header value's byte: visible, space, tab, or not ASCII (obs-text). */
static bool is_field_byte(unsigned char c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* unreserved, sub-delims, ":" and "@" (RFC 3986 pchar, but for %XX) */
static bool is_pchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c && strchr("-._~!$&'()*+,;=:@", c));
}

static int hex(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The next line of head from *at: its bytes [*at, end) without CRLF or LF.
 * False at the end of the head without a line end, or at a CR not
 * followed by LF. */
static bool next_line(const char *head, size_t len, size_t *at, size_t *line_len, bool *bare_cr)
{
	*bare_cr = false;
	for (size_t i = *at; i < len; i++) {
		if (head[i] == '\n') {
			*line_len = i - *at;
			*at = i + 1;
			return true;
		}
		if (head[i] == '\r') {
			if (i + 1 < len && head[i + 1] == '\n') {
				*line_len = i - *at;
				*at = i + 2;
				return true;
			}
			*bare_cr = true;
			return false;
		}
	}
	return false;
}

/* The path of an origin-form target, percent-decoded into out (cap bytes),
 * and a well-formed query after it. False with the refusal in *v. */
static bool decode_target(const char *t, size_t n, char *out, size_t cap, const char **q,
			  size_t *qlen, struct http_verdict *v)
{
	size_t i = 0, o = 0;
	bool query = false;

	*q = NULL;
	*qlen = 0;
	if (n == 0 || t[0] != '/') {
		refuse(v, 400, "Bad Request",
		       "the request target must be a path starting with /: try /status, /metrics "
		       "or /healthz");
		return false;
	}
	for (; i < n; i++) {
		unsigned char c = (unsigned char)t[i];
		if (c == '?' && !query) {
			query = true;
			*q = t + i + 1;
			*qlen = n - i - 1;
			continue;
		}
		if (c == '%') {
			int hi = i + 2 < n ? hex((unsigned char)t[i + 1]) : -1;
			int lo = i + 2 < n ? hex((unsigned char)t[i + 2]) : -1;
			if (hi < 0 || lo < 0 || (!query && hi == 0 && lo == 0)) {
				refuse(v, 400, "Bad Request",
				       "the request target has a bad percent-escape at byte %zu",
				       i);
				return false;
			}
			if (!query && o + 1 < cap)
				out[o++] = (char)(hi * 16 + lo);
			i += 2;
			continue;
		}
		if (!is_pchar(c) && c != '/' && !(query && c == '?')) {
			refuse(
			    v, 400, "Bad Request",
			    "the request target has a byte it may not carry (0x%02x) at byte %zu",
			    c, i);
			return false;
		}
		if (!query && o + 1 < cap)
			out[o++] = (char)c;
	}
	out[o < cap ? o : cap - 1] = '\0';
	return true;
}

bool http_host_allowed(const char *listen_host, const char *host, size_t len)
{
	char name[256];
	const char *end;
	size_t n;
	struct in_addr v4;
	struct in6_addr v6;

	if (memchr(host, '\0', len))
		return false;
	if (len > 0 && host[0] == '[') {
		end = memchr(host, ']', len);
		if (!end || (end + 1 != host + len && end[1] != ':'))
			return false;
		n = (size_t)(end - host - 1);
		if (n >= sizeof(name))
			return false;
		memcpy(name, host + 1, n);
		name[n] = '\0';
		return inet_pton(AF_INET6, name, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
	}
	end = memchr(host, ':', len);
	n = end ? (size_t)(end - host) : len;
	if (n == 0 || n >= sizeof(name))
		return false;
	memcpy(name, host, n);
	name[n] = '\0';
	if (strcasecmp(name, "localhost") == 0 || strcasecmp(name, "localhost.") == 0)
		return true;
	if (listen_host[0] && strcasecmp(name, listen_host) == 0)
		return true;
	return inet_pton(AF_INET, name, &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

/* Well-formed UTF-8 without control bytes: what a quota key may be. */
static bool key_text_ok(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned char c = s[i];
		size_t more;
		uint32_t cp;
		if (c < 0x80) {
			if (c < 0x20 || c == 0x7f)
				return false;
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			more = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			more = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			more = 3, cp = c & 0x07;
		else
			return false;
		if (n - i <= more)
			return false;
		for (size_t k = 1; k <= more; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		/* no overlong form, surrogate or code point past U+10FFFF */
		if ((more == 2 && cp < 0x800) || (more == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += more + 1;
	}
	return true;
}

/* /why's `key` from the query string (already checked by decode_target),
 * decoded into v->key; false after a 400 naming what is wrong. */
static bool why_key(const char *q, size_t n, struct http_verdict *v)
{
	bool found = false;
	size_t at = 0;

	while (q && at <= n) {
		const char *amp = memchr(q + at, '&', n - at);
		size_t end = amp ? (size_t)(amp - q) : n;
		if (end - at >= 4 && memcmp(q + at, "key=", 4) == 0) {
			size_t o = 0;
			if (found) {
				refuse(v, 400, "Bad Request", "/why takes one key=, not several");
				return false;
			}
			found = true;
			for (size_t i = at + 4; i < end; i++) {
				unsigned char c = (unsigned char)q[i];
				if (c == '%') {
					c = (unsigned char)(hex((unsigned char)q[i + 1]) * 16 +
							    hex((unsigned char)q[i + 2]));
					i += 2;
				} else if (c == '+') {
					c = ' ';
				}
				if (o == HTTP_WHY_KEY_MAX) {
					refuse(v, 400, "Bad Request",
					       "the quota key is longer than %d bytes",
					       HTTP_WHY_KEY_MAX);
					return false;
				}
				v->key[o++] = (char)c;
			}
			v->key[o] = '\0';
			if (o == 0 || !key_text_ok((const unsigned char *)v->key, o)) {
				refuse(v, 400, "Bad Request",
				       "the quota key must be 1..%d bytes of UTF-8 without control "
				       "bytes",
				       HTTP_WHY_KEY_MAX);
				return false;
			}
		}
		if (!amp)
			break;
		at = end + 1;
	}
	if (!found) {
		refuse(v, 400, "Bad Request", "/why needs the quota: /why?key=QUOTA");
		return false;
	}
	return true;
}

/* The request line: method SP target SP version. */
static bool judge_request_line(const char *line, size_t n, struct http_verdict *v, char *path,
			       size_t cap, const char **q, size_t *qlen)
{
	const char *sp1 = memchr(line, ' ', n);
	const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - line)) : NULL;
	size_t mlen, tlen, vlen;

	if (!sp1 || !sp2 || sp1 == line) {
		refuse(v, 400, "Bad Request", "the request line is not: METHOD /path HTTP/1.1");
		return false;
	}
	mlen = (size_t)(sp1 - line);
	tlen = (size_t)(sp2 - sp1 - 1);
	vlen = n - (size_t)(sp2 + 1 - line);
	for (size_t i = 0; i < mlen; i++)
		if (!is_tchar((unsigned char)line[i])) {
			refuse(v, 400, "Bad Request",
			       "the request line is not: METHOD /path HTTP/1.1");
			return false;
		}
	if (!(vlen == 8 &&
	      (memcmp(sp2 + 1, "HTTP/1.1", 8) == 0 || memcmp(sp2 + 1, "HTTP/1.0", 8) == 0))) {
		if (vlen >= 5 && memcmp(sp2 + 1, "HTTP/", 5) == 0)
			refuse(v, 505, "HTTP Version Not Supported",
			       "only HTTP/1.0 and HTTP/1.1 are served");
		else
			refuse(v, 400, "Bad Request",
			       "the request line is not: METHOD /path HTTP/1.1");
		return false;
	}
	if (mlen == 3 && memcmp(line, "GET", 3) == 0) {
		v->head_only = false;
	} else if (mlen == 4 && memcmp(line, "HEAD", 4) == 0) {
		v->head_only = true;
	} else {
		v->allow = "GET, HEAD";
		refuse(v, 405, "Method Not Allowed", "method %.*s is not served: GET and HEAD only",
		       (int)(mlen > 32 ? 32 : mlen), line);
		return false;
	}
	return decode_target(sp1 + 1, tlen, path, cap, q, qlen, v);
}

void http_request_judge(const char *listen_host, const char *head, size_t len,
			struct http_verdict *v)
{
	char path[64];
	size_t at = 0, n;
	bool bare_cr, have_host = false, host_ok = true;
	const char *host = NULL, *query;
	size_t host_len = 0, query_len;

	memset(v, 0, sizeof(*v));
	if (len > HTTP_REQUEST_HEAD_MAX) {
		refuse(v, 431, "Request Header Fields Too Large",
		       "the request head is over %d bytes", HTTP_REQUEST_HEAD_MAX);
		return;
	}
	if (!next_line(head, len, &at, &n, &bare_cr)) {
		refuse(v, 400, "Bad Request", "%s",
		       bare_cr ? "a CR not followed by LF" : "the request line does not end");
		return;
	}
	if (!judge_request_line(head, n, v, path, sizeof(path), &query, &query_len))
		return;
	for (;;) {
		size_t start = at;
		if (!next_line(head, len, &at, &n, &bare_cr)) {
			refuse(v, 400, "Bad Request", "%s",
			       bare_cr ? "a CR not followed by LF"
				       : "the request head does not end with an empty line");
			return;
		}
		if (n == 0)
			break;
		const char *line = head + start;
		const char *colon = memchr(line, ':', n);
		if (line[0] == ' ' || line[0] == '\t') {
			refuse(v, 400, "Bad Request",
			       "a folded header line (obsolete line folding)");
			return;
		}
		if (!colon || colon == line) {
			refuse(v, 400, "Bad Request", "a header line without a name and a colon");
			return;
		}
		for (const char *c = line; c < colon; c++)
			if (!is_tchar((unsigned char)*c)) {
				refuse(v, 400, "Bad Request",
				       "a header name with a byte it may not "
				       "carry");
				return;
			}
		const char *val = colon + 1, *vend = line + n;
		for (const char *c = val; c < vend; c++)
			if (!is_field_byte((unsigned char)*c)) {
				refuse(v, 400, "Bad Request", "header %.*s has a control byte",
				       (int)(colon - line > 64 ? 64 : colon - line), line);
				return;
			}
		while (val < vend && (*val == ' ' || *val == '\t'))
			val++;
		while (vend > val && (vend[-1] == ' ' || vend[-1] == '\t'))
			vend--;
		if (colon - line == 4 && strncasecmp(line, "Host", 4) == 0) {
			if (have_host) {
				refuse(v, 400, "Bad Request", "more than one Host header");
				return;
			}
			have_host = true;
			host = val;
			host_len = (size_t)(vend - val);
		}
	}
	if (at != len) {
		refuse(v, 400, "Bad Request", "a GET or HEAD request carries no body");
		return;
	}
	/* A request without Host (HTTP/1.0 tools) is served: browsers always
	 * send it, so it is no way in for a rebinding page. */
	if (have_host)
		host_ok = http_host_allowed(listen_host, host, host_len);
	if (!host_ok) {
		refuse(v, 421, "Misdirected Request",
		       "Host \"%.*s\" is not this agent: only localhost, loopback addresses and "
		       "the metrics_listen host are served",
		       (int)(host_len > 200 ? 200 : host_len), host);
		return;
	}
	v->code = 200;
	v->reason = "OK";
	if (strcmp(path, "/metrics") == 0) {
		v->page = HTTP_PAGE_METRICS;
	} else if (strcmp(path, "/healthz") == 0) {
		v->page = HTTP_PAGE_HEALTHZ;
	} else if (strcmp(path, "/status") == 0) {
		v->page = HTTP_PAGE_STATUS;
	} else if (strcmp(path, "/why") == 0) {
		if (why_key(query, query_len, v))
			v->page = HTTP_PAGE_WHY;
	} else if (strcmp(path, "/") == 0) {
		v->location = "/status";
		refuse(v, 302, "Found", "see /status");
	} else {
		refuse(v, 404, "Not Found", "not found: try /status, /metrics or /healthz");
	}
}
