/*
 * http.c — see http.h. The listener and routing; the pages are
 * http_probes.c and http_status.c, the replies and the requests that wait
 * for the database http_reply.c, which both sides call.
 */
#include "agent/http.h"

#include <sys/queue.h> /* before event2: TAILQ_FOREACH over its header list */

#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/http_internal.h"
#include "agent/http_request.h"

#define HTTP_TIMEOUT_S 10
#define HTTP_MAX_HEADERS 8192

/* --- routing --------------------------------------------------------- */

/*
 * What to answer is http_request_judge's (http_request.c), on the request
 * head as libevent parsed it, written out again (the request line and the
 * headers), so that what the fuzzer checks is what serves. libevent has
 * already refused a head over HTTP_MAX_HEADERS, a body, and methods other
 * than GET and HEAD.
 */
static bool head_of(struct evhttp_request *req, struct evbuffer *out)
{
	const char *uri = evhttp_request_get_uri(req);
	const char *method;
	struct evkeyval *kv;

	switch (evhttp_request_get_command(req)) {
	case EVHTTP_REQ_GET:
		method = "GET";
		break;
	case EVHTTP_REQ_HEAD:
		method = "HEAD";
		break;
	default:
		method = "OTHER";
		break;
	}
	if (!uri || evbuffer_add_printf(out, "%s %s HTTP/%d.%d\r\n", method, uri, req->major,
					req->minor) < 0)
		return false;
	TAILQ_FOREACH(kv, evhttp_request_get_input_headers(req), next)
	{
		if (evbuffer_add_printf(out, "%s: %s\r\n", kv->key, kv->value) < 0)
			return false;
	}
	return evbuffer_add(out, "\r\n", 2) == 0;
}

static void route(struct evhttp_request *req, void *arg)
{
	struct http *h = arg;
	struct evbuffer *head = evbuffer_new();
	struct http_verdict v;

	if (!head || !head_of(req, head)) {
		if (head)
			evbuffer_free(head);
		http_reply_text(req, 500, "Internal Server Error", "out of memory");
		return;
	}
	size_t len = evbuffer_get_length(head);
	const char *bytes = (const char *)evbuffer_pullup(head, -1);
	http_request_judge(h->listen_host, bytes ? bytes : "", bytes ? len : 0, &v);
	evbuffer_free(head);
	switch (v.page) {
	case HTTP_PAGE_METRICS:
		http_serve_metrics(h, req);
		return;
	case HTTP_PAGE_HEALTHZ:
		http_serve_healthz(h, req);
		return;
	case HTTP_PAGE_STATUS:
		http_serve_status(h, req);
		return;
	case HTTP_PAGE_WHY:
		http_serve_why(h, req, v.key);
		return;
	case HTTP_PAGE_NONE:
		break;
	}
	if (v.code == 421)
		log_debug(&h->ag->log, "http", "refused a request: %s", v.text);
	if (v.location)
		evhttp_add_header(evhttp_request_get_output_headers(req), "Location", v.location);
	if (v.allow)
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", v.allow);
	http_reply_text(req, v.code, v.reason, v.text);
}

/* metrics_listen's host part ("localhost:9187" -> "localhost"); empty for
 * a bracketed IPv6 address, whose loopback forms are allowed anyway. */
static void listen_host(const char *listen, char *out, size_t outlen)
{
	const char *colon = strrchr(listen, ':');
	size_t len = colon ? (size_t)(colon - listen) : strlen(listen);

	out[0] = '\0';
	if (listen[0] == '[' || len >= outlen)
		return;
	memcpy(out, listen, len);
	out[len] = '\0';
}

struct http *http_create(struct agent *ag, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	char why[256], host[INET6_ADDRSTRLEN];
	struct http *h;
	int fd = -1, one = 1;

	if (!config_parse_listen(ag->cfg.metrics_listen, &ss, &sslen, why, sizeof(why))) {
		snprintf(err, errlen, "metrics_listen: %s", why);
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	h->ag = ag;
	listen_host(ag->cfg.metrics_listen, h->listen_host, sizeof(h->listen_host));
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "metrics_listen: socket: %s", strerror(errno));
		goto fail;
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sslen) != 0 || listen(fd, 64) != 0) {
		snprintf(err, errlen, "metrics_listen: cannot listen on %s: %s",
			 ag->cfg.metrics_listen, strerror(errno));
		goto fail;
	}
	sslen = sizeof(ss);
	getsockname(fd, (struct sockaddr *)&ss, &sslen);
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
		snprintf(h->addr, sizeof(h->addr), "%s:%u", host, ntohs(v4->sin_port));
	} else {
		struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
		snprintf(h->addr, sizeof(h->addr), "[%s]:%u", host, ntohs(v6->sin6_port));
	}
	h->ev = evhttp_new(ag->base);
	if (!h->ev || !evhttp_accept_socket_with_handle(h->ev, fd)) {
		snprintf(err, errlen, "metrics_listen: cannot serve HTTP on %s", h->addr);
		goto fail;
	}
	fd = -1; /* evhttp owns it now */
	evhttp_set_allowed_methods(h->ev, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_timeout(h->ev, HTTP_TIMEOUT_S);
	evhttp_set_max_headers_size(h->ev, HTTP_MAX_HEADERS);
	evhttp_set_max_body_size(h->ev, 0);
	evhttp_set_gencb(h->ev, route, h);
	char kv[128];
	snprintf(kv, sizeof(kv), "metrics_listen=%s", h->addr);
	log_write(&ag->log, LOG_LEVEL_INFO, "http", kv,
		  "serving /status, /metrics and /healthz on http://%s/", h->addr);
	return h;
fail:
	if (fd >= 0)
		close(fd);
	if (h->ev)
		evhttp_free(h->ev);
	free(h);
	return NULL;
}

void http_destroy(struct http *h)
{
	if (!h)
		return;
	/* answer before evhttp_free frees the requests; the jobs' database
	 * callbacks, if any are still to come, find h gone and only free */
	while (h->jobs) {
		struct job *j = h->jobs;
		http_job_unlink(j);
		http_reply_text(j->req, 503, "Service Unavailable", "the agent is shutting down");
		j->h = NULL;
		j->req = NULL;
	}
	for (int i = 0; i < h->nstatus_waiters; i++)
		http_reply_text(h->status_waiters[i], 503, "Service Unavailable",
				"the agent is shutting down");
	if (h->status_page)
		evbuffer_free(h->status_page);
	evhttp_free(h->ev);
	free(h);
}
