/*
 * test_dispatch.c — the method table's authorisation classes: every method
 * has exactly one, and proto/PROTOCOL.md's "Who may call what" table gives
 * each method the class the agent enforces; the keys each method accepts
 * are the ones its heading under "Methods" lists; and the reply tables a
 * method declares have the fields, with the types, of its `Result:`; and
 * each notification's params table those of its row under "Notifications".
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/dispatch.h"
#include "agent/notices.h"
#include "agent/reply.h"

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

/* --- reply tables against the Result: of each method ------------------ */

/* The section of "### `name {" up to the next heading, or NULL. */
static const char *method_section(const char *text, const char *name, const char **end)
{
	char head[128];
	const char *p, *e1, *e2;

	snprintf(head, sizeof(head), "\n### `%s {", name);
	p = strstr(text, head);
	if (!p)
		return NULL;
	p += 1;
	e1 = strstr(p + 1, "\n### ");
	e2 = strstr(p + 1, "\n## ");
	*end = !e1 ? e2 : !e2 ? e1 : e1 < e2 ? e1 : e2;
	if (!*end)
		*end = p + strlen(p);
	return p;
}

/* Past the map starting at p ("{...}"): the matching close. */
static const char *map_end(const char *p)
{
	int depth = 0;

	for (; *p; p++) {
		if (*p == '{' || *p == '[')
			depth++;
		else if ((*p == '}' || *p == ']') && --depth == 0)
			return p;
		else if (*p == '`')
			break;
	}
	return p;
}

/* The type word PROTOCOL.md gives a field, from the text after its ':'
 * (NULL when it states none): "int", "str", "bool", "bin", "map", "array",
 * or a placeholder (an upper-case name standing for a map). */
static const char *doc_word(const char *t, size_t n)
{
	while (n && (*t == ' ' || *t == '\n'))
		t++, n--;
	if (!n)
		return NULL;
	if (*t == '"')
		return "str";
	if (*t == '{' || (n >= 3 && !strncmp(t, "nil", 3) && memchr(t, '{', n)))
		return "map";
	if (*t == '[')
		return "array";
	if (*t >= 'A' && *t <= 'Z')
		return "map";
	static const char *const words[] = {"int", "str", "bool", "bin"};
	for (size_t i = 0; i < 4; i++)
		if (n >= strlen(words[i]) && !strncmp(t, words[i], strlen(words[i])))
			return words[i];
	if (n >= 4 && (!strncmp(t, "true", 4) || !strncmp(t, "fals", 4)))
		return "bool";
	return NULL;
}

struct doc_field {
	char name[64];
	const char *word;  /* NULL: no type stated */
	const char *value; /* the text after ':' (for a nested map) */
	size_t value_len;
};

/* The top-level fields of the map at p ("{a, b: int, c: {d}}"). */
static size_t doc_fields(const char *p, struct doc_field *out, size_t max)
{
	const char *end = map_end(p);
	size_t n = 0;

	p++;
	while (p < end && n < max) {
		while (p < end && (*p == ' ' || *p == '\n' || *p == ','))
			p++;
		if (p >= end)
			break;
		size_t k = strcspn(p, "?:,} \n(");
		/* the value runs to the next comma at this depth */
		const char *v = p + k, *q = v;
		int depth = 0;
		for (; q < end; q++) {
			if (*q == '{' || *q == '[' || *q == '(')
				depth++;
			else if (*q == '}' || *q == ']' || *q == ')')
				depth--;
			else if (*q == ',' && depth == 0)
				break;
		}
		snprintf(out[n].name, sizeof(out[n].name), "%.*s", (int)k, p);
		out[n].word = NULL;
		out[n].value = NULL;
		out[n].value_len = 0;
		const char *colon = memchr(v, ':', (size_t)(q - v));
		if (colon && (colon == v || colon == v + 1)) {
			out[n].value = colon + 1;
			out[n].value_len = (size_t)(q - colon - 1);
			out[n].word = doc_word(out[n].value, out[n].value_len);
		}
		if (k)
			n++;
		p = q;
	}
	return n;
}

/* The result maps documented for a method: the backquoted map after each
 * "Result", following "as for `other`"; with "one of", each listed map. */
static size_t doc_results(const char *text, const char *name, const char **maps, size_t max)
{
	const char *end = NULL, *sec = method_section(text, name, &end), *p;
	size_t n = 0;

	cr_assert_not_null(sec, "PROTOCOL.md has no heading for %s", name);
	for (p = strstr(sec, "Result"); p && p < end && n < max; p = strstr(p + 1, "Result")) {
		const char *tick = strchr(p, '`');
		if (!tick || tick >= end)
			break;
		if (!strncmp(p, "Result, one of:", 15)) {
			for (const char *item = strstr(p, "\n- `{"); item && item < end && n < max;
			     item = strstr(item + 1, "\n- `{"))
				maps[n++] = item + 4;
			break;
		}
		if (tick[1] == '{') {
			maps[n++] = tick + 1;
		} else if (strstr(p, "as for") && strstr(p, "as for") < tick) {
			char other[64];
			sscanf(tick + 1, "%63[^`]", other);
			n += doc_results(text, other, maps + n, max - n);
		}
	}
	return n;
}

/* The map a placeholder stands for ("PERMIT is `{"), or NULL. */
static const char *placeholder_map(const char *text, const char *v, size_t len)
{
	char word[32], pat1[64], pat2[64];
	const char *p;

	while (len && (*v == ' ' || *v == '\n' || *v == '['))
		v++, len--;
	if (sscanf(v, "%31[A-Z]", word) != 1)
		return NULL;
	/* "[PERMIT without intent…]": a variant, not the placeholder itself
	 * ("RECORD + {more}" is the placeholder and more: see nested_extra) */
	if (v[strlen(word)] == ' ' && strncmp(v + strlen(word), " + {", 4))
		return NULL;
	snprintf(pat1, sizeof(pat1), "%s is `{", word);
	snprintf(pat2, sizeof(pat2), "%s, in the results below, is `{", word);
	/* a section may give a name its own meaning (permit.claim's HOLDER is
	 * not quota.why's): a definition after the use, before the next
	 * heading, comes first */
	const char *h1 = strstr(v, "\n### "), *h2 = strstr(v, "\n## ");
	const char *end = !h1 ? h2 : !h2 ? h1 : h1 < h2 ? h1 : h2;
	if (!end)
		end = v + strlen(v);
	p = strstr(v, pat1);
	if (p && p < end)
		return strchr(p, '{');
	p = strstr(text, pat1);
	if (p)
		return strchr(p, '{');
	p = strstr(text, pat2);
	return p ? strchr(p, '{') : NULL;
}

/* The map nested in a field's documented value, or NULL. */
static const char *nested_map(const char *text, const struct doc_field *f)
{
	const char *v = f->value;
	size_t len = f->value_len;

	if (!v)
		return NULL;
	while (len && (*v == ' ' || *v == '\n' || *v == '['))
		v++, len--;
	if (len && *v == '{')
		return v;
	return placeholder_map(text, f->value, f->value_len);
}

/* The declared fields of a table, each documented and with its type;
 * the documented ones, each declared. report: assert instead of answer. */
/* The fields "PLACEHOLDER + {more}" adds to the placeholder's, or NULL. */
static const char *nested_extra(const struct doc_field *f)
{
	const char *plus = f->value ? strstr(f->value, " + {") : NULL;

	return plus && plus < f->value + f->value_len ? plus + 3 : NULL;
}

static bool kind_matches(const char *text, const struct reply_kind *kind, const char *map,
			 const char *extra, const char *where, bool report)
{
	struct doc_field doc[64];
	size_t ndoc = doc_fields(map, doc, 64);

	if (extra)
		ndoc += doc_fields(extra, doc + ndoc, 64 - ndoc);

#define MISMATCH(...)                                                                              \
	do {                                                                                       \
		if (report)                                                                        \
			cr_assert_fail(__VA_ARGS__);                                               \
		return false;                                                                      \
	} while (0)
	for (size_t i = 0; i < kind->n; i++) {
		const struct reply_col *c = &kind->cols[i];
		const char *word = reply_col_word(c);
		size_t j;
		if (!word)
			continue;
		for (j = 0; j < ndoc && strcmp(doc[j].name, c->name); j++)
			;
		if (j == ndoc)
			MISMATCH("%s: the reply has \"%s\", PROTOCOL.md's Result does not", where,
				 c->name);
		if (doc[j].word && strcmp(doc[j].word, word))
			MISMATCH("%s: \"%s\" is %s in the reply, %s in PROTOCOL.md", where, c->name,
				 word, doc[j].word);
		const char *sub = nested_map(text, &doc[j]);
		if (c->sub && sub) {
			char inner[160];
			snprintf(inner, sizeof(inner), "%s.%s", where, c->name);
			if (!kind_matches(text, c->sub, sub, nested_extra(&doc[j]), inner, report))
				return false;
		}
	}
	for (size_t j = 0; j < ndoc; j++) {
		bool found = false;
		for (size_t i = 0; i < kind->n && !found; i++)
			found = reply_col_word(&kind->cols[i]) &&
				!strcmp(kind->cols[i].name, doc[j].name);
		if (!found)
			MISMATCH("%s: PROTOCOL.md's Result has \"%s\", the reply does not", where,
				 doc[j].name);
	}
#undef MISMATCH
	return true;
}

Test(dispatch, every_reply_table_is_the_result_protocol_md_documents)
{
	char *text = protocol_md();
	size_t declared = 0;

	for (size_t i = 0; i < dispatch_method_count(); i++) {
		const char *name = dispatch_method_name(i);
		const struct reply_kind *const *kinds = dispatch_method_results(i);
		const char *maps[8];
		size_t nmaps, nkinds = 0;
		if (!kinds)
			continue;
		declared++;
		nmaps = doc_results(text, name, maps, 8);
		cr_assert_gt(nmaps, 0, "PROTOCOL.md gives %s no `Result: {...}`", name);
		while (kinds[nkinds])
			nkinds++;
		if (nkinds == 1 && nmaps == 1) {
			kind_matches(text, kinds[0], maps[0], NULL, name, true);
			continue;
		}
		/* "one of": each table is one documented shape, each shape a table */
		for (size_t k = 0; k < nkinds; k++) {
			bool any = false;
			for (size_t m = 0; m < nmaps && !any; m++)
				any = kind_matches(text, kinds[k], maps[m], NULL, name, false);
			cr_assert(any, "%s: reply table %zu is none of PROTOCOL.md's results", name,
				  k);
		}
		for (size_t m = 0; m < nmaps; m++) {
			bool any = false;
			for (size_t k = 0; k < nkinds && !any; k++)
				any = kind_matches(text, kinds[k], maps[m], NULL, name, false);
			cr_assert(any, "%s: PROTOCOL.md's result %zu has no reply table", name, m);
		}
	}
	cr_assert_gt(declared, 0, "no method declares its reply tables");
	free(text);
}

/* The checker itself: a field missing on either side, or of another type,
 * is a mismatch (so a drift cannot pass). */
Test(dispatch, reply_checker_sees_missing_extra_and_mistyped_fields)
{
	static const struct reply_col cols[] = {
	    {"a", REPLY_INT, 0},
	    {"b", REPLY_STR, 1},
	};
	static const struct reply_kind kind = REPLY_KIND(cols);

	cr_assert(kind_matches("", &kind, "{a: int, b}`", NULL, "t", false));
	cr_assert(kind_matches("", &kind, "{a: int|nil, b: str}`", NULL, "t", false));
	cr_assert_not(kind_matches("", &kind, "{a: int}`", NULL, "t", false));
	cr_assert_not(kind_matches("", &kind, "{a, b, c}`", NULL, "t", false));
	cr_assert_not(kind_matches("", &kind, "{a: str, b}`", NULL, "t", false));
}

/* --- notification tables against PROTOCOL.md's "Notifications" ------- */

/* The "Notifications" section: its table has one row per notification,
 * "| `name` | `{params}` | when |". */
static const char *notices_section(const char *text, const char **end)
{
	const char *p = strstr(text, "\n## Notifications\n");

	cr_assert_not_null(p, "PROTOCOL.md has no section \"Notifications\"");
	*end = strstr(p + 1, "\n## ");
	if (!*end)
		*end = p + strlen(p);
	return p;
}

Test(dispatch, every_notification_table_is_the_params_protocol_md_documents)
{
	char *text = protocol_md();
	const char *end, *sec = notices_section(text, &end);

	for (int i = 0; i < NOTICE__COUNT; i++) {
		const char *name = notice_method((enum notice_id)i);
		char head[96];
		cr_assert_not_null(name, "notification %d has no name", i);
		cr_assert_not_null(notice_params((enum notice_id)i), "%s has no params table",
				   name);
		snprintf(head, sizeof(head), "\n| `%s` | `{", name);
		const char *row = strstr(sec, head);
		cr_assert(row && row < end,
			  "PROTOCOL.md's \"Notifications\" has no row \"| `%s` | `{...}` |\"",
			  name);
		kind_matches(text, notice_params((enum notice_id)i), row + strlen(head) - 1, NULL,
			     name, true);
	}
	/* and every documented notification is one the agent declares */
	size_t rows = 0;
	for (const char *p = strstr(sec, "\n| `"); p && p < end; p = strstr(p + 1, "\n| `")) {
		char name[64];
		bool found = false;
		if (sscanf(p, "\n| `%63[^`]`", name) != 1)
			continue;
		rows++;
		for (int i = 0; i < NOTICE__COUNT && !found; i++)
			found = !strcmp(notice_method((enum notice_id)i), name);
		cr_assert(found,
			  "PROTOCOL.md documents the notification %s, the agent declares none",
			  name);
	}
	cr_assert_eq(rows, (size_t)NOTICE__COUNT);
	free(text);
}
