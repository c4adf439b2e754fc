/*
 * reload.h — SIGHUP: the configuration is read again from the same file,
 * environment and flags as at start; options marked reloadable take effect
 * at once, a change to any other is logged as needing a restart.
 */
#ifndef PGCOORD_AGENT_RELOAD_H
#define PGCOORD_AGENT_RELOAD_H

struct agent;

/*
 * Re-reads and applies the configuration. A file or value that fails to
 * load or validate leaves the running configuration untouched and logs the
 * error (with file and line) instead. Returns the number of options whose
 * new value was applied, or -1 when the new configuration was refused.
 */
int agent_reload(struct agent *ag);

#endif
