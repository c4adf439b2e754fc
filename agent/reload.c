/*
 * reload.c — see reload.h.
 */
#include "agent/reload.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "agent/agent.h"
#include "agent/db.h"
#include "agent/listener.h"
#include "agent/notify.h"

/* Makes the components that copied settings at start see the new values;
 * everything else reads ag->cfg when it needs it. */
static void apply(struct agent *ag)
{
	struct db_settings dbs = {
	    .conninfo = ag->cfg.database_url,
	    .pool_size = ag->cfg.pool_size,
	    .query_timeout_ms = ag->cfg.query_timeout_ms,
	    .connect_timeout_ms = ag->cfg.connect_timeout_ms,
	    .reconnect_max_ms = ag->cfg.reconnect_max_ms,
	};
	ag->log.level = ag->cfg.log_level;
	if (ag->db)
		db_update_timeouts(ag->db, &dbs);
	if (ag->listener)
		(void)listener_set_backlog(ag->listener, ag->cfg.listen_backlog);
}

int agent_reload(struct agent *ag)
{
	struct config next;
	char err[1024], was[4200], now[4200], kv[128];
	struct timespec ts;
	int applied = 0, restart = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(err, sizeof(err), "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)ts.tv_sec * 1000000ull +
		     (unsigned long long)ts.tv_nsec / 1000);
	notify_send(err);

	config_defaults(&next);
	if (!config_load(&next, ag->config_path, ag->config_path != NULL, ag->argc, ag->argv, err,
			 sizeof(err)) ||
	    !config_validate(&next, err, sizeof(err))) {
		log_error(&ag->log, "config",
			  "SIGHUP: the new configuration is refused, the running one stays: %s",
			  err);
		config_free(&next);
		notify_ready_again(ag);
		return -1;
	}
	for (size_t i = 0; i < config_options_count; i++) {
		const struct option_def *def = &config_options[i];
		if (config_equal(&ag->cfg, &next, def))
			continue;
		config_format(&ag->cfg, def, was, sizeof(was));
		config_format(&next, def, now, sizeof(now));
		snprintf(kv, sizeof(kv), "option=%s", def->name);
		if (def->reloadable) {
			config_take(&ag->cfg, &next, def);
			log_write(&ag->log, LOG_LEVEL_INFO, "config", kv,
				  "SIGHUP: %s = %s (was %s)", def->name, now, was);
			applied++;
		} else if (def->secret) {
			/* the redacted forms may be equal: say only that it changed */
			log_write(&ag->log, LOG_LEVEL_WARN, "config", kv,
				  "SIGHUP: %s changed but needs a restart to take effect",
				  def->name);
			restart++;
		} else {
			log_write(&ag->log, LOG_LEVEL_WARN, "config", kv,
				  "SIGHUP: %s changed to %s but needs a restart to take effect "
				  "(running with %s)",
				  def->name, now, was);
			restart++;
		}
	}
	config_free(&next);
	apply(ag);
	log_info(&ag->log, "config",
		 "SIGHUP: configuration reloaded: %d option(s) applied, %d need a restart", applied,
		 restart);
	notify_ready_again(ag);
	return applied;
}
