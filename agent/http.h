/*
 * http.h — the optional HTTP listener (metrics_listen) on the agent's own
 * event loop, for operators and monitoring:
 *
 *   GET /metrics   Prometheus text format (metrics.h)
 *   GET /healthz   200 "ok" while serving with the database up and the
 *                  heartbeat fresh, else 503 and the reason; never queries
 *   GET /status    an HTML page: this agent, the fleet's agents and live
 *                  sessions, leases with holder and epoch, the quotas
 *                  nearest their limit, uncertain permits with reason and
 *                  age — read from the database on the REQUESTS lane, so
 *                  the loop never blocks; built at most once a second and
 *                  shared by the hits meanwhile, capped in rows and bytes
 *
 * Loopback addresses only (config_parse_listen): nothing here asks who is
 * calling, but the Host header must be a loopback name or address (or the
 * metrics_listen host), against DNS rebinding. GET and HEAD only; small
 * header and body limits.
 */
#ifndef PGCOORD_AGENT_HTTP_H
#define PGCOORD_AGENT_HTTP_H

#include <stddef.h>

struct agent;
struct http;

/* Listens on ag->cfg.metrics_listen. NULL with err set on failure (address
 * in use, …). Logs the address it listens on (with the port the kernel
 * chose when the option asked for port 0). */
__attribute__((warn_unused_result)) struct http *http_create(struct agent *ag, char *err,
							     size_t errlen);

/* Answers what is still pending with 503 and closes the listener. Call
 * after db_destroy (whose callbacks may still answer requests). Accepts
 * NULL. */
void http_destroy(struct http *h);

/* Appends s to out with &, <, >, " and ' escaped. */
struct evbuffer;
void http_add_escaped(struct evbuffer *out, const char *s);

#endif
