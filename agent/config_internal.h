/*
 * config_internal.h — what the config files share; only they include it.
 *
 *   config.c         the option table
 *   config_value.c   one option's value: parsed, formatted, compared, moved
 *   config_load.c    the sources: file, environment, flags
 *   config_peers.c   who is an admin and who may open sessions
 *   config_check.c   cross-option checks, metrics_listen, conninfo redaction
 */
#ifndef PGCOORD_AGENT_CONFIG_INTERNAL_H
#define PGCOORD_AGENT_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "agent/config.h"

/* config_value.c: parses text into the option's field of cfg; why says
 * what is wrong with it. */
bool config_set_value(struct config *cfg, const struct option_def *def, const char *text, char *why,
		      size_t whylen);

/* config_peers.c: resolves admin_uids/admin_group and
 * client_uids/client_group into cfg->admins and cfg->clients. */
bool config_resolve_peer_sets(struct config *cfg, char *err, size_t errlen);

#endif
