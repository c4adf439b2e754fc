/*
 * http_internal.h — what the HTTP files share; only they include it: the
 * listener's state, the requests waiting for the database (jobs), and the
 * replies.
 *
 *   http.c         the listener and routing
 *   http_reply.c   jobs, replies and HTML escaping, called by both sides
 *   http_probes.c  /healthz and /metrics, what monitoring polls
 *   http_status.c  the /status page
 *   http_why.c     the /why?key=QUOTA page
 */
#ifndef PGCOORD_AGENT_HTTP_INTERNAL_H
#define PGCOORD_AGENT_HTTP_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

struct agent;
struct evbuffer;
struct evhttp;
struct evhttp_request;

/* /status hits held while the page is being built */
#define STATUS_MAX_WAITERS 64
/* the schema versions that bring quotas and permits (0004_permits.sql) and
 * waiting claims (0006_waiting_claims.sql) */
#define SCHEMA_PERMITS 4
#define SCHEMA_WAITS 6

struct job;

struct http {
	struct agent *ag;
	struct evhttp *ev;
	struct job *jobs;     /* requests waiting for the database */
	char addr[80];	      /* as listened on, for logs */
	char listen_host[64]; /* metrics_listen's host part, an allowed Host */
	/* /status: the last page, and the hits waiting for the one being built */
	struct evbuffer *status_page;
	uint64_t status_built_ms;
	bool status_building;
	struct evhttp_request *status_waiters[STATUS_MAX_WAITERS];
	int nstatus_waiters;
};

enum job_kind { JOB_STATUS, JOB_METRICS, JOB_WHY };

struct job {
	struct job *next, *prev;
	struct http *h; /* NULL once the listener is gone: just free on completion */
	struct evhttp_request *req;
	enum job_kind kind;
	struct evbuffer *body;
	int step;
	char *arg; /* JOB_WHY: the quota key */
};

/* http_reply.c */
struct job *http_job_new(struct http *h, struct evhttp_request *req, enum job_kind kind);
void http_job_free(struct job *j);
/* Takes the job off the listener's list (http_destroy orphans them). */
void http_job_unlink(struct job *j);
void http_reply(struct evhttp_request *req, int code, const char *reason, const char *content_type,
		struct evbuffer *body);
void http_reply_text(struct evhttp_request *req, int code, const char *reason, const char *text);

/* http_probes.c */
void http_serve_healthz(struct http *h, struct evhttp_request *req);
void http_serve_metrics(struct http *h, struct evhttp_request *req);

/* http_status.c */
void http_serve_status(struct http *h, struct evhttp_request *req);

/* http_why.c */
void http_serve_why(struct http *h, struct evhttp_request *req, const char *key);

/* http_reply.c: s percent-encoded for a query string (every byte but
 * A-Z a-z 0-9 - . _ ~), which is also safe in an HTML attribute. */
void http_add_query_escaped(struct evbuffer *out, const char *s);

#endif
