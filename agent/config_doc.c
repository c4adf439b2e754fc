/*
 * config_doc.c — the option table as Markdown; see config_doc.h.
 */
#include "agent/config_doc.h"

#include "agent/config.h"

/* Cell text with the one character that would end a table cell escaped. */
static void put_cell(FILE *out, const char *text)
{
	for (const char *p = text; *p; p++) {
		if (*p == '|')
			fputc('\\', out);
		fputc(*p, out);
	}
}

static void put_type(FILE *out, const struct option_def *o)
{
	switch (o->type) {
	case OPT_INT:
		fprintf(out, "integer %ld..%ld", o->min, o->max);
		return;
	case OPT_MODE:
		fputs("octal mode", out);
		return;
	case OPT_LEVEL:
		fputs("level", out);
		return;
	case OPT_STATEMENTS:
		fputs("auto, on or off", out);
		return;
	case OPT_STRING:
		fputs("string", out);
		return;
	default:
		/* a type this file does not know yet: the meaning says more */
		fputs("text", out);
		return;
	}
}

void config_print_markdown(FILE *out)
{
	fputs("| option | type | default | SIGHUP | meaning |\n"
	      "| --- | --- | --- | --- | --- |\n",
	      out);
	for (size_t i = 0; i < config_options_count; i++) {
		const struct option_def *o = &config_options[i];

		fprintf(out, "| `%s` | ", o->name);
		put_type(out, o);
		fputs(" | ", out);
		if (o->default_value[0]) {
			fputc('`', out);
			put_cell(out, o->default_value);
			fputc('`', out);
		} else {
			fputs("empty", out);
		}
		fprintf(out, " | %s | ", o->reloadable ? "applied" : "restart");
		put_cell(out, o->doc);
		fputs(o->secret ? " Redacted when printed. |\n" : " |\n", out);
	}
}
