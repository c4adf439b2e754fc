/*
 * test_http_request.c — what the HTTP listener answers a request head
 * (agent/http_request.c): the pages, and each refusal with its status.
 * tests/fuzz/fuzz_http_request.c checks the same function's invariants on
 * any bytes; these pin its answers to chosen heads.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "agent/http_request.h"

static struct http_verdict judge(const char *listen_host, const char *head)
{
	struct http_verdict v;
	http_request_judge(listen_host, head, strlen(head), &v);
	return v;
}

#define H "\r\nHost: localhost\r\n\r\n"

Test(http_request, the_pages_with_and_without_query_strings)
{
	struct http_verdict v = judge("", "GET /metrics HTTP/1.1" H);
	cr_assert_eq(v.page, HTTP_PAGE_METRICS);
	cr_assert_eq(v.code, 200);
	cr_assert_not(v.head_only);
	cr_assert_eq(judge("", "GET /status?refresh=1&x=%41 HTTP/1.1" H).page, HTTP_PAGE_STATUS);
	cr_assert_eq(judge("", "GET /healthz HTTP/1.0\r\n\r\n").page, HTTP_PAGE_HEALTHZ);
	cr_assert_eq(judge("", "GET /metric%73 HTTP/1.1" H).page, HTTP_PAGE_METRICS);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\nHost: localhost\n\n").page, HTTP_PAGE_STATUS);
	v = judge("", "HEAD /metrics HTTP/1.1" H);
	cr_assert_eq(v.page, HTTP_PAGE_METRICS);
	cr_assert(v.head_only);
	v = judge("", "GET / HTTP/1.1" H);
	cr_assert_eq(v.code, 302);
	cr_assert_str_eq(v.location, "/status");
	cr_assert_eq(judge("", "GET /nope HTTP/1.1" H).code, 404);
	cr_assert_eq(judge("", "GET /metrics/ HTTP/1.1" H).code, 404);
}

Test(http_request, methods_versions_and_targets)
{
	struct http_verdict v = judge("", "POST /metrics HTTP/1.1" H);
	cr_assert_eq(v.code, 405);
	cr_assert_str_eq(v.allow, "GET, HEAD");
	cr_assert_eq(judge("", "get /metrics HTTP/1.1" H).code, 405);
	cr_assert_eq(judge("", "G(T /metrics HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET /metrics HTTP/2.0" H).code, 505);
	cr_assert_eq(judge("", "GET /metrics" H).code, 400);
	cr_assert_eq(judge("", "GET  /metrics HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET http://localhost/metrics HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET /status#x HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET /status%0 HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET /status%00 HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET /status?a=%zz HTTP/1.1" H).code, 400);
	cr_assert_eq(judge("", "GET %2Fstatus HTTP/1.1" H).code, 400);
}

Test(http_request, the_head_ends_in_an_empty_line_and_nothing_follows)
{
	cr_assert_eq(judge("", "GET /status HTTP/1.1\r\nHost: localhost\r\n").code, 400);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\r\r\nHost: localhost\r\n\r\n").code, 400);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\rHost: localhost\r\n\r\n").code, 400);
	cr_assert_eq(judge("", "GET /status HTTP/1.1" H "x=1").code, 400);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\r\nHost: localhost\r\n  more\r\n\r\n").code,
		     400);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\r\nHost localhost\r\n\r\n").code, 400);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\r\nX-A: a\x01z\r\n\r\n").code, 400);
	/* a NUL inside the head is a control byte, not its end */
	struct http_verdict v;
	static const char nul[] = "GET /status HTTP/1.1\r\nX-A: a\0b\r\n\r\n";
	http_request_judge("", nul, sizeof(nul) - 1, &v);
	cr_assert_eq(v.code, 400);
	char big[HTTP_REQUEST_HEAD_MAX + 2];
	memset(big, 'a', sizeof(big));
	http_request_judge("", big, sizeof(big), &v);
	cr_assert_eq(v.code, 431);
}

Test(http_request, only_this_agents_host_names_are_served)
{
	static const char *const good[] = {"localhost", "LOCALHOST.", "127.0.0.1:9187", "127.1.2.3",
					   "[::1]",	"[::1]:80",   " localhost ",	NULL};
	static const char *const bad[] = {
	    "evil.example", "127.0.0.1.evil.example", "[::2]", "[::1", "", "10.0.0.1", ":80", NULL};
	char head[256];
	for (const char *const *h = good; *h; h++) {
		snprintf(head, sizeof(head), "GET /status HTTP/1.1\r\nHost:%s\r\n\r\n", *h);
		cr_assert_eq(judge("", head).code, 200, "Host %s", *h);
	}
	for (const char *const *h = bad; *h; h++) {
		snprintf(head, sizeof(head), "GET /status HTTP/1.1\r\nHost: %s\r\n\r\n", *h);
		struct http_verdict v = judge("", head);
		cr_assert_eq(v.code, 421, "Host %s", *h);
		cr_assert(strstr(v.text, "is not this agent"));
	}
	cr_assert_eq(
	    judge("metrics.internal", "GET /status HTTP/1.1\r\nHost: metrics.internal:9187\r\n\r\n")
		.code,
	    200);
	cr_assert_eq(judge("", "GET /status HTTP/1.1\r\nHost: a\r\nhost: localhost\r\n\r\n").code,
		     400);
}

Test(http_request, why_takes_one_quota_key_from_the_query)
{
	struct http_verdict v = judge("", "GET /why?key=gpu HTTP/1.1" H);
	cr_assert_eq(v.page, HTTP_PAGE_WHY);
	cr_assert_str_eq(v.key, "gpu");
	v = judge("", "GET /why?x=1&key=a%2Fb+c%22%3C&y=2 HTTP/1.1" H);
	cr_assert_eq(v.page, HTTP_PAGE_WHY);
	cr_assert_str_eq(v.key, "a/b c\"<");
	v = judge("", "HEAD /why?key=caf%C3%A9 HTTP/1.1" H);
	cr_assert_eq(v.page, HTTP_PAGE_WHY);
	cr_assert(v.head_only);
	cr_assert_str_eq(v.key, "caf\xc3\xa9");

	/* a key of 200 bytes is taken, one of 201 is not */
	char head[512], key[202];
	memset(key, 'k', 201);
	key[201] = '\0';
	snprintf(head, sizeof(head), "GET /why?key=%.200s HTTP/1.1" H, key);
	v = judge("", head);
	cr_assert_eq(v.page, HTTP_PAGE_WHY);
	cr_assert_eq(strlen(v.key), 200);
	snprintf(head, sizeof(head), "GET /why?key=%s HTTP/1.1" H, key);
	cr_assert_eq(judge("", head).code, 400);

	static const char *const bad[] = {
	    "GET /why HTTP/1.1" H,		    /* no key */
	    "GET /why?keys=gpu HTTP/1.1" H,	    /* not key */
	    "GET /why?key= HTTP/1.1" H,		    /* empty */
	    "GET /why?key=a&key=b HTTP/1.1" H,	    /* twice */
	    "GET /why?key=a%00b HTTP/1.1" H,	    /* NUL */
	    "GET /why?key=a%0Ab HTTP/1.1" H,	    /* a control byte */
	    "GET /why?key=%C3 HTTP/1.1" H,	    /* cut UTF-8 */
	    "GET /why?key=%C0%AF HTTP/1.1" H,	    /* overlong */
	    "GET /why?key=%ED%A0%80 HTTP/1.1" H,    /* a surrogate */
	    "GET /why?key=%F4%90%80%80 HTTP/1.1" H, /* past U+10FFFF */
	    "GET /why?key=%4 HTTP/1.1" H,	    /* a bad escape */
	    "GET /why?key=<b> HTTP/1.1" H,	    /* bytes a target may not carry */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = judge("", bad[i]);
		cr_assert_eq(v.page, HTTP_PAGE_NONE, "%s", bad[i]);
		cr_assert_eq(v.code, 400, "%s: %d", bad[i], v.code);
	}
	/* the path is exact, as for the other pages */
	cr_assert_eq(judge("", "GET /why/?key=gpu HTTP/1.1" H).code, 404);
}
