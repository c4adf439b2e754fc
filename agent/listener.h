/*
 * listener.h — the agent's Unix socket: safe creation (refuse when a live
 * agent answers on the path, replace a stale file), explicit mode, a cap on
 * connections, and removal on exit.
 */
#ifndef PGCOORD_AGENT_LISTENER_H
#define PGCOORD_AGENT_LISTENER_H

#include <stdbool.h>
#include <stddef.h>

struct agent;
struct listener;

/* Binds and listens on ag->cfg.socket_path. On failure err says why. */
__attribute__((warn_unused_result)) struct listener *listener_create(struct agent *ag, char *err,
								     size_t errlen);

/* Stops accepting and removes the socket file if it is still ours. Accepts NULL. */
void listener_destroy(struct listener *l);

#endif
