/*
 * http_request.h — what the HTTP listener (http.h) answers a request head:
 * one of its pages, or a refusal with its status, reason and text. A pure
 * function of the bytes and of the listener's allowed host name, so that it
 * can be fuzzed without sockets (tests/fuzz/fuzz_http_request.c); http.c
 * calls it for every request, on the head as libevent parsed it.
 *
 * The head is the request line and the header lines, each ended by CRLF
 * (or a lone LF), then an empty line; nothing may follow it (GET and HEAD
 * carry no body). Served: GET and HEAD of /metrics, /healthz and /status
 * (and / as a redirect to /status), in origin form, with any well-formed
 * query string (ignored), and /why?key=QUOTA (the key percent-decoded, '+'
 * a space: 1..HTTP_WHY_KEY_MAX bytes of UTF-8 without control bytes, given
 * once; 400 otherwise), over HTTP/1.0 or 1.1, with at most one Host that
 * names this host (see http_host_allowed).
 */
#ifndef PGCOORD_AGENT_HTTP_REQUEST_H
#define PGCOORD_AGENT_HTTP_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

/* The longest head judged; a longer one is refused 431. libevent's own
 * bound on headers (HTTP_MAX_HEADERS in http.c) is below it, so only the
 * fuzzer meets it. */
#define HTTP_REQUEST_HEAD_MAX 16384
/* A refusal's text, which names at most 200 bytes of what was sent. */
#define HTTP_VERDICT_TEXT_MAX 400
/* The longest quota key /why takes (a quota key's bound, PROTOCOL.md). */
#define HTTP_WHY_KEY_MAX 200

enum http_page {
	HTTP_PAGE_NONE, /* refused: code, reason, text */
	HTTP_PAGE_METRICS,
	HTTP_PAGE_HEALTHZ,
	HTTP_PAGE_STATUS,
	HTTP_PAGE_WHY, /* key: the quota */
};

struct http_verdict {
	enum http_page page;
	bool head_only;			  /* HEAD: the same answer without its body */
	int code;			  /* 200 for a page */
	const char *reason;		  /* the status line's reason phrase (static) */
	const char *location;		  /* a Location header (static), or NULL */
	const char *allow;		  /* an Allow header (static), or NULL */
	char text[HTTP_VERDICT_TEXT_MAX]; /* a refusal's one-line body */
	char key[HTTP_WHY_KEY_MAX + 1];	  /* HTTP_PAGE_WHY: the quota key */
};

/* Judges the head of len bytes (not NUL-terminated; may hold NULs) for a
 * listener whose metrics_listen host is listen_host ("" for none). Always
 * fills *v. */
void http_request_judge(const char *listen_host, const char *head, size_t len,
			struct http_verdict *v);

/* Whether a Host value (len bytes) names this agent: localhost, a loopback
 * address (127/8, ::1 in brackets), or listen_host, each with an optional
 * port. Against DNS rebinding: a browser sends the name it resolved. */
bool http_host_allowed(const char *listen_host, const char *host, size_t len);

#endif
