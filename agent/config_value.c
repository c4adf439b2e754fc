/*
 * config_value.c — one option's value: parsed from text (the same for the
 * defaults, the file, the environment and flags), formatted, compared and
 * moved between configs for a reload. Separate from the table (config.c)
 * and from where the text comes from (config_load.c).
 */
#include "agent/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/config_internal.h"

bool config_set_value(struct config *cfg, const struct option_def *def, const char *text, char *why,
		      size_t whylen)
{
	void *field = (char *)cfg + def->offset;

	switch (def->type) {
	case OPT_STRING: {
		char *copy = strdup(text);
		if (!copy) {
			snprintf(why, whylen, "out of memory");
			return false;
		}
		free(*(char **)field);
		*(char **)field = copy;
		return true;
	}
	case OPT_INT: {
		char *end;
		errno = 0;
		long v = strtol(text, &end, 10);
		if (errno || end == text || *end != '\0') {
			snprintf(why, whylen, "\"%s\" is not a whole number (expected %ld..%ld)",
				 text, def->min, def->max);
			return false;
		}
		if (v < def->min || v > def->max) {
			snprintf(why, whylen, "%ld is out of range (expected %ld..%ld)", v,
				 def->min, def->max);
			return false;
		}
		*(int *)field = (int)v;
		return true;
	}
	case OPT_MODE: {
		char *end;
		errno = 0;
		long v = strtol(text, &end, 8);
		if (errno || end == text || *end != '\0' || v < 0 || v > def->max) {
			snprintf(why, whylen, "\"%s\" is not an octal mode like 0660", text);
			return false;
		}
		*(int *)field = (int)v;
		return true;
	}
	case OPT_LEVEL:
		if (!log_level_parse(text, (enum log_level *)field)) {
			snprintf(why, whylen,
				 "\"%s\" is not a log level (expected error, warn, info or debug)",
				 text);
			return false;
		}
		return true;
	case OPT_STATEMENTS:
		if (stmt_setting_parse(text, (enum stmt_setting *)field))
			return true;
		snprintf(why, whylen, "\"%s\" is not auto, on or off", text);
		return false;
	}
	return false;
}

void config_defaults(struct config *cfg)
{
	char why[256];
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < config_options_count; i++) {
		/* the table's defaults are tested to parse; a failure here is a bug */
		if (!config_set_value(cfg, &config_options[i], config_options[i].default_value, why,
				      sizeof(why)))
			abort();
	}
}

void config_free(struct config *cfg)
{
	free(cfg->admins.uids);
	memset(&cfg->admins, 0, sizeof(cfg->admins));
	free(cfg->clients.uids);
	memset(&cfg->clients, 0, sizeof(cfg->clients));
	for (size_t i = 0; i < config_options_count; i++) {
		if (config_options[i].type == OPT_STRING) {
			char **field = (char **)((char *)cfg + config_options[i].offset);
			free(*field);
			*field = NULL;
		}
	}
}

void config_format(const struct config *cfg, const struct option_def *def, char *buf, size_t len)
{
	const void *field = (const char *)cfg + def->offset;
	switch (def->type) {
	case OPT_STRING: {
		const char *v = *(char *const *)field;
		if (def->secret) {
			char *r = config_redact_conninfo(v);
			snprintf(buf, len, "\"%s\"", r ? r : "****");
			free(r);
		} else {
			snprintf(buf, len, "\"%s\"", v);
		}
		break;
	}
	case OPT_INT:
		snprintf(buf, len, "%d", *(const int *)field);
		break;
	case OPT_MODE:
		snprintf(buf, len, "0%o", (unsigned)*(const int *)field);
		break;
	case OPT_LEVEL:
		snprintf(buf, len, "%s", log_level_name(*(const enum log_level *)field));
		break;
	case OPT_STATEMENTS:
		snprintf(buf, len, "%s", stmt_setting_name(*(const enum stmt_setting *)field));
		break;
	}
}

bool config_equal(const struct config *a, const struct config *b, const struct option_def *def)
{
	const void *fa = (const char *)a + def->offset, *fb = (const char *)b + def->offset;
	switch (def->type) {
	case OPT_STRING:
		return strcmp(*(char *const *)fa, *(char *const *)fb) == 0;
	case OPT_INT:
	case OPT_MODE:
		return *(const int *)fa == *(const int *)fb;
	case OPT_LEVEL:
		return *(const enum log_level *)fa == *(const enum log_level *)fb;
	case OPT_STATEMENTS:
		return *(const enum stmt_setting *)fa == *(const enum stmt_setting *)fb;
	}
	return false;
}

void config_take(struct config *dst, struct config *src, const struct option_def *def)
{
	void *fd = (char *)dst + def->offset, *fs = (char *)src + def->offset;
	switch (def->type) {
	case OPT_STRING: {
		/* swap, so each config still owns exactly one string */
		char *tmp = *(char **)fd;
		*(char **)fd = *(char **)fs;
		*(char **)fs = tmp;
		break;
	}
	case OPT_INT:
	case OPT_MODE:
		*(int *)fd = *(const int *)fs;
		break;
	case OPT_LEVEL:
		*(enum log_level *)fd = *(const enum log_level *)fs;
		break;
	case OPT_STATEMENTS:
		*(enum stmt_setting *)fd = *(const enum stmt_setting *)fs;
		break;
	}
}

void config_print(const struct config *cfg, FILE *out)
{
	char value[4200];
	for (size_t i = 0; i < config_options_count; i++) {
		config_format(cfg, &config_options[i], value, sizeof(value));
		fprintf(out, "%s = %s\n", config_options[i].name, value);
	}
}
