/*
 * http_reply.c — what the router (http.c) and the pages (http_probes.c,
 * http_status.c) share: the requests that wait for the database (jobs),
 * the replies, and HTML escaping. It calls neither side, so the pages can
 * call it without calling back into the router.
 */
#include <sys/queue.h> /* before event2: TAILQ_FOREACH over its header list */

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdlib.h>
#include <string.h>

#include "agent/http.h"
#include "agent/http_internal.h"

void http_job_unlink(struct job *j)
{
	if (!j->h)
		return;
	if (j->prev)
		j->prev->next = j->next;
	else
		j->h->jobs = j->next;
	if (j->next)
		j->next->prev = j->prev;
	j->next = j->prev = NULL;
}

void http_job_free(struct job *j)
{
	http_job_unlink(j);
	if (j->body)
		evbuffer_free(j->body);
	free(j->arg);
	free(j);
}

struct job *http_job_new(struct http *h, struct evhttp_request *req, enum job_kind kind)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->body = evbuffer_new();
	if (!j->body) {
		free(j);
		return NULL;
	}
	j->h = h;
	j->req = req;
	j->kind = kind;
	j->next = h->jobs;
	if (h->jobs)
		h->jobs->prev = j;
	h->jobs = j;
	return j;
}

/* Sends the reply. The request stays valid until this call even when the
 * client went away meanwhile (libevent then just frees it). */
void http_reply(struct evhttp_request *req, int code, const char *reason, const char *content_type,
		struct evbuffer *body)
{
	struct evkeyvalq *hdr = evhttp_request_get_output_headers(req);
	evhttp_add_header(hdr, "Content-Type", content_type);
	evhttp_add_header(hdr, "Cache-Control", "no-store");
	evhttp_add_header(hdr, "X-Content-Type-Options", "nosniff");
	evhttp_send_reply(req, code, reason, body);
}

void http_reply_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
	struct evbuffer *b = evbuffer_new();
	if (b)
		evbuffer_add_printf(b, "%s\n", text);
	http_reply(req, code, reason, "text/plain; charset=utf-8", b);
	if (b)
		evbuffer_free(b);
}

void http_add_escaped(struct evbuffer *out, const char *s)
{
	const char *run = s;
	for (; *s; s++) {
		const char *rep = NULL;
		switch (*s) {
		case '&':
			rep = "&amp;";
			break;
		case '<':
			rep = "&lt;";
			break;
		case '>':
			rep = "&gt;";
			break;
		case '"':
			rep = "&quot;";
			break;
		case '\'':
			rep = "&#39;";
			break;
		}
		if (rep) {
			evbuffer_add(out, run, (size_t)(s - run));
			evbuffer_add(out, rep, strlen(rep));
			run = s + 1;
		}
	}
	evbuffer_add(out, run, (size_t)(s - run));
}

void http_add_query_escaped(struct evbuffer *out, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    c == '-' || c == '.' || c == '_' || c == '~')
			evbuffer_add(out, s, 1);
		else
			evbuffer_add_printf(out, "%%%02X", c);
	}
}
