/*
 * test_dispatch.c — the method table's authorisation classes: every method
 * has exactly one, and proto/PROTOCOL.md's "Who may call what" table gives
 * each method the class the agent enforces; the keys each method accepts
 * are the ones its heading under "Methods" lists.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/dispatch.h"

/* All of PROTOCOL.md; caller frees. */
static char *protocol_md(void)
{
	const char *root = getenv("PGCOORD_SOURCE_ROOT");
	char path[4096];
	FILE *f;
	char *text;
	long n;

	cr_assert_not_null(root, "PGCOORD_SOURCE_ROOT is not set");
	snprintf(path, sizeof(path), "%s/proto/PROTOCOL.md", root);
	f = fopen(path, "re");
	cr_assert_not_null(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	text = calloc(1, (size_t)n + 1);
	cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return text;
}

/* The "Who may call what" section of PROTOCOL.md; caller frees. */
static char *authz_section(void)
{
	char *text = protocol_md(), *start, *end;

	start = strstr(text, "\n## Who may call what\n");
	cr_assert_not_null(start, "PROTOCOL.md has no section \"Who may call what\"");
	end = strstr(start + 1, "\n## ");
	if (end)
		*end = '\0';
	memmove(text, start, strlen(start) + 1);
	return text;
}

Test(dispatch, every_method_has_one_class_and_protocol_md_gives_it)
{
	char *section = authz_section();

	for (size_t i = 0; i < dispatch_method_count(); i++) {
		const char *name = dispatch_method_name(i), *cls = dispatch_method_class(i);
		char plain[96], with_params[96];
		int rows = 0;

		cr_assert_str_neq(cls, "unknown", "%s has no single authorisation class", name);
		snprintf(plain, sizeof(plain), "`%s`", name);
		snprintf(with_params, sizeof(with_params), "`%s {", name);
		/* every table row naming the method must give its class */
		for (char *line = section; line && *line; line = strchr(line, '\n')) {
			char first[512], second[64];
			line += *line == '\n';
			if (sscanf(line, "| %511[^|]| %63[a-z] |", first, second) != 2)
				continue;
			if (!strstr(first, plain) && !strstr(first, with_params))
				continue;
			rows++;
			cr_assert_str_eq(second, cls,
					 "PROTOCOL.md gives %s the class %s, the agent %s", name,
					 second, cls);
		}
		cr_assert_gt(rows, 0, "PROTOCOL.md's \"Who may call what\" does not list %s", name);
	}
	free(section);
}

/*
 * The top-level keys of the heading "### `name {a: str, b?: [{c: int}]}`"
 * as ", "-separated names ("a, b"), or NULL when there is no such heading.
 */
static char *heading_keys(const char *text, const char *name, char *out, size_t len)
{
	char head[128];
	const char *p;
	int depth = 0;
	size_t n = 0;
	bool at_key = true;

	snprintf(head, sizeof(head), "\n### `%s {", name);
	p = strstr(text, head);
	if (!p)
		return NULL;
	p += strlen(head);
	out[0] = '\0';
	for (; *p && *p != '\n' && depth >= 0; p++) {
		if (*p == '{' || *p == '[') {
			depth++;
		} else if (*p == '}' || *p == ']') {
			depth--;
		} else if (depth == 0 && *p == ',') {
			at_key = true;
		} else if (depth == 0 && at_key && *p != ' ') {
			size_t k = strcspn(p, "?:}");
			n += (size_t)snprintf(out + n, len - n, "%s%.*s", n ? ", " : "", (int)k, p);
			p += k - 1;
			at_key = false;
		}
	}
	return out;
}

Test(dispatch, every_method_accepts_the_keys_its_protocol_md_heading_lists)
{
	char *text = protocol_md();

	for (size_t i = 0; i < dispatch_method_count(); i++) {
		const char *name = dispatch_method_name(i);
		char keys[512];
		cr_assert_not_null(heading_keys(text, name, keys, sizeof(keys)),
				   "PROTOCOL.md has no heading \"### `%s {...}`\"", name);
		cr_assert_str_eq(dispatch_method_params(i), keys,
				 "%s accepts \"%s\", its PROTOCOL.md heading lists \"%s\"", name,
				 dispatch_method_params(i), keys);
	}
	free(text);
}

Test(dispatch, key_lists_match_whole_names_only)
{
	cr_assert(dispatch_key_listed("id, override, reason", "id", 2));
	cr_assert(dispatch_key_listed("id, override, reason", "reason", 6));
	cr_assert_not(dispatch_key_listed("id, override, reason", "overide", 7));
	cr_assert_not(dispatch_key_listed("id, override, reason", "over", 4));
	cr_assert_not(dispatch_key_listed("id, override, reason", "id, override", 12));
	cr_assert_not(dispatch_key_listed("", "id", 2));
	cr_assert_not(dispatch_key_listed("id", "", 0));
}
