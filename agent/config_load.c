/*
 * config_load.c — the sources of the options, in the order the later wins:
 * the file, PGCOORD_* environment variables, --flags; each bad line or
 * value named. Separate from what a value means (config_value.c).
 */
#include "agent/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/config_internal.h"

static const struct option_def *find_option(const char *name, size_t len)
{
	for (size_t i = 0; i < config_options_count; i++) {
		const char *n = config_options[i].name;
		size_t j;
		if (strlen(n) != len)
			continue;
		/* flags spell options with dashes, files with underscores */
		for (j = 0; j < len; j++) {
			char c = name[j] == '-' ? '_' : name[j];
			if (c != n[j])
				break;
		}
		if (j == len)
			return &config_options[i];
	}
	return NULL;
}

static char *trim(char *s)
{
	char *end;
	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

static bool load_file(struct config *cfg, const char *path, bool required, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int lineno = 0;

	if (!f) {
		if (!required && errno == ENOENT)
			return true;
		snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		return false;
	}
	while (fgets(line, sizeof(line), f)) {
		char why[256];
		char *key, *value, *eq;
		const struct option_def *def;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			snprintf(err, errlen, "%s:%d: line longer than %zu bytes", path, lineno,
				 sizeof(line) - 1);
			goto fail;
		}
		key = trim(line);
		if (*key == '\0' || *key == '#')
			continue;
		eq = strchr(key, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%d: expected `key = value`, found \"%s\"", path,
				 lineno, key);
			goto fail;
		}
		*eq = '\0';
		key = trim(key);
		value = trim(eq + 1);
		/* allow "quoted values" so leading/trailing spaces can be kept */
		size_t vlen = strlen(value);
		if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') {
			value[vlen - 1] = '\0';
			value++;
		}
		def = find_option(key, strlen(key));
		if (!def || strchr(key, '-')) {
			snprintf(err, errlen,
				 "%s:%d: unknown option \"%s\" (see `pgcoord-agent --help` for the "
				 "list)",
				 path, lineno, key);
			goto fail;
		}
		if (!config_set_value(cfg, def, value, why, sizeof(why))) {
			snprintf(err, errlen, "%s:%d: %s: %s", path, lineno, def->name, why);
			goto fail;
		}
	}
	fclose(f);
	return true;
fail:
	fclose(f);
	return false;
}

static bool load_env(struct config *cfg, char *err, size_t errlen)
{
	for (size_t i = 0; i < config_options_count; i++) {
		char var[96] = "PGCOORD_";
		char why[256];
		size_t n = strlen(var);
		for (const char *p = config_options[i].name; *p && n < sizeof(var) - 1; p++)
			var[n++] = (char)toupper((unsigned char)*p);
		var[n] = '\0';
		const char *value = getenv(var);
		if (value && !config_set_value(cfg, &config_options[i], value, why, sizeof(why))) {
			snprintf(err, errlen, "environment %s: %s", var, why);
			return false;
		}
	}
	return true;
}

static bool load_flags(struct config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	for (int i = 0; i < argc; i++) {
		const char *arg = argv[i];
		const char *name, *value, *eq;
		const struct option_def *def;
		char why[256];
		size_t len;

		if (strncmp(arg, "--", 2) != 0) {
			snprintf(err, errlen,
				 "unexpected argument \"%s\" (options are --name value)", arg);
			return false;
		}
		name = arg + 2;
		eq = strchr(name, '=');
		len = eq ? (size_t)(eq - name) : strlen(name);
		def = find_option(name, len);
		if (!def) {
			snprintf(err, errlen, "unknown option \"%s\" (see `pgcoord-agent --help`)",
				 arg);
			return false;
		}
		if (eq) {
			value = eq + 1;
		} else if (i + 1 < argc) {
			value = argv[++i];
		} else {
			snprintf(err, errlen, "--%s needs a value", def->name);
			return false;
		}
		if (!config_set_value(cfg, def, value, why, sizeof(why))) {
			snprintf(err, errlen, "--%.*s: %s", (int)len, name, why);
			return false;
		}
	}
	return true;
}

bool config_load(struct config *cfg, const char *path, bool path_required, int argc, char **argv,
		 char *err, size_t errlen)
{
	if (!load_file(cfg, path ? path : CONFIG_DEFAULT_FILE, path_required, err, errlen))
		return false;
	if (!load_env(cfg, err, errlen))
		return false;
	if (!load_flags(cfg, argc, argv, err, errlen))
		return false;
	if (cfg->replica_id[0] == '\0') {
		char host[256] = "";
		if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
			snprintf(err, errlen,
				 "replica_id is empty and the host name is unknown: "
				 "set replica_id");
			return false;
		}
		free(cfg->replica_id);
		cfg->replica_id = strdup(host);
	}
	return config_resolve_peer_sets(cfg, err, errlen);
}
