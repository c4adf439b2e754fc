/*
 * listener.h — the agent's Unix socket: safe creation (an exclusive lock on
 * <socket_path>.lock for the process's life, refuse when a live agent
 * answers on the path, replace a stale file), its mode set without following
 * symlinks, its listen backlog, caps on connections (in all, per uid, a
 * reserve for admins), and removal on exit.
 */
#ifndef PGCOORD_AGENT_LISTENER_H
#define PGCOORD_AGENT_LISTENER_H

#include <stdbool.h>
#include <stddef.h>

struct agent;
struct listener;

/*
 * Binds and listens on ag->cfg.socket_path. Under systemd socket activation
 * (LISTEN_PID is this process, LISTEN_FDS >= 1; sd_listen_fds(3)) it takes
 * the listening socket systemd passed as fd 3 instead, which must be a
 * stream Unix socket bound to socket_path; that socket's file belongs to
 * the .socket unit, so it is neither replaced nor removed. On failure err
 * says why.
 */
__attribute__((warn_unused_result)) struct listener *listener_create(struct agent *ag, char *err,
								     size_t errlen);

/* Applies listen_backlog to the listening socket if it changed (SIGHUP);
 * logs and returns false when listen() refuses it. */
bool listener_set_backlog(struct listener *l, int backlog);

/* Stops accepting and removes the socket file if it is still ours. Accepts NULL. */
void listener_destroy(struct listener *l);

#endif
