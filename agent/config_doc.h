/*
 * config_doc.h — the option table as Markdown, for docs/CONFIGURATION.md
 * (`pgcoord-agent --help-config-markdown`), so the reference is generated
 * from config_options[] and cannot drift from it.
 */
#ifndef PGCOORD_AGENT_CONFIG_DOC_H
#define PGCOORD_AGENT_CONFIG_DOC_H

#include <stdio.h>

/* Prints one Markdown table: option, type, default, SIGHUP, meaning. */
void config_print_markdown(FILE *out);

#endif
