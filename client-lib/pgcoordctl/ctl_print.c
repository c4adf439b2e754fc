/*
 * ctl_print.c — pgcoordctl's output: JSON and human tables. Everything the
 * agent sends is untrusted text on an operator's terminal, so strings are
 * escaped (JSON) or stripped of control bytes (tables).
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_msgpack.h"
#include "ctl_print.h"

#define CELL_MAX 256

/* --- UTF-8 --------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t left)
{
	unsigned char b = s[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xbf;

	if (b < 0x80)
		return 1;
	if (b >= 0xc2 && b <= 0xdf)
		n = 2;
	else if (b >= 0xe0 && b <= 0xef)
		n = 3;
	else if (b >= 0xf0 && b <= 0xf4)
		n = 4;
	else
		return 0;
	if (n > left)
		return 0;
	/* Second-byte ranges that rule out overlongs, surrogates and > U+10FFFF. */
	if (b == 0xe0)
		lo = 0xa0;
	else if (b == 0xed)
		hi = 0x9f;
	else if (b == 0xf0)
		lo = 0x90;
	else if (b == 0xf4)
		hi = 0x8f;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return n;
}

/* --- JSON ---------------------------------------------------------------- */

static void json_string(FILE *out, const char *p, size_t len)
{
	const unsigned char *s = (const unsigned char *)p;

	fputc('"', out);
	for (size_t i = 0; i < len;) {
		unsigned char b = s[i];
		size_t n = utf8_seq(s + i, len - i);
		if (n == 0) {
			fputs("\\ufffd", out);
			i++;
			continue;
		}
		if (n > 1) {
			fwrite(s + i, 1, n, out);
			i += n;
			continue;
		}
		switch (b) {
		case '"':
			fputs("\\\"", out);
			break;
		case '\\':
			fputs("\\\\", out);
			break;
		case '\n':
			fputs("\\n", out);
			break;
		case '\r':
			fputs("\\r", out);
			break;
		case '\t':
			fputs("\\t", out);
			break;
		default:
			if (b < 0x20 || b == 0x7f)
				fprintf(out, "\\u%04x", b);
			else
				fputc(b, out);
		}
		i++;
	}
	fputc('"', out);
}

static void base64(FILE *out, const unsigned char *s, size_t len)
{
	static const char tbl[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

	fputc('"', out);
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)s[i] << 16;
		if (i + 1 < len)
			v |= (uint32_t)s[i + 1] << 8;
		if (i + 2 < len)
			v |= s[i + 2];
		fputc(tbl[(v >> 18) & 63], out);
		fputc(tbl[(v >> 12) & 63], out);
		fputc(i + 1 < len ? tbl[(v >> 6) & 63] : '=', out);
		fputc(i + 2 < len ? tbl[v & 63] : '=', out);
	}
	fputc('"', out);
}

static void json_value(FILE *out, const msgpack_object *o, int indent);

static void newline(FILE *out, int indent)
{
	if (indent < 0)
		return;
	fputc('\n', out);
	for (int i = 0; i < indent; i++)
		fputs("  ", out);
}

/* JSON keys must be strings: other key types go in as their JSON text. */
static void json_key(FILE *out, const msgpack_object *k)
{
	if (k->type == MSGPACK_OBJECT_STR) {
		json_string(out, k->via.str.ptr, k->via.str.size);
		return;
	}
	char *text = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&text, &len);
	if (!mem) {
		fputs("\"?\"", out);
		return;
	}
	json_value(mem, k, -1);
	fclose(mem);
	json_string(out, text, len);
	free(text);
}

static void json_value(FILE *out, const msgpack_object *o, int indent)
{
	int inner = indent < 0 ? -1 : indent + 1;
	const char *sep = indent < 0 ? ":" : ": ";

	switch (o->type) {
	case MSGPACK_OBJECT_NIL:
		fputs("null", out);
		break;
	case MSGPACK_OBJECT_BOOLEAN:
		fputs(o->via.boolean ? "true" : "false", out);
		break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		fprintf(out, "%llu", (unsigned long long)o->via.u64);
		break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		fprintf(out, "%lld", (long long)o->via.i64);
		break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		if (isfinite(o->via.f64))
			fprintf(out, "%.17g", o->via.f64);
		else
			fputs("null", out);
		break;
	case MSGPACK_OBJECT_STR:
		json_string(out, o->via.str.ptr, o->via.str.size);
		break;
	case MSGPACK_OBJECT_BIN:
		base64(out, (const unsigned char *)o->via.bin.ptr, o->via.bin.size);
		break;
	case MSGPACK_OBJECT_EXT:
		fprintf(out, "{\"ext\"%s%d,", sep, o->via.ext.type);
		fputs(indent < 0 ? "" : " ", out);
		fprintf(out, "\"base64\"%s", sep);
		base64(out, (const unsigned char *)o->via.ext.ptr, o->via.ext.size);
		fputc('}', out);
		break;
	case MSGPACK_OBJECT_ARRAY:
		if (o->via.array.size == 0) {
			fputs("[]", out);
			break;
		}
		fputc('[', out);
		for (uint32_t i = 0; i < o->via.array.size; i++) {
			if (i)
				fputc(',', out);
			newline(out, inner);
			json_value(out, &o->via.array.ptr[i], inner);
		}
		newline(out, indent);
		fputc(']', out);
		break;
	case MSGPACK_OBJECT_MAP:
		if (o->via.map.size == 0) {
			fputs("{}", out);
			break;
		}
		fputc('{', out);
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			if (i)
				fputc(',', out);
			newline(out, inner);
			json_key(out, &o->via.map.ptr[i].key);
			fputs(sep, out);
			json_value(out, &o->via.map.ptr[i].val, inner);
		}
		newline(out, indent);
		fputc('}', out);
		break;
	default:
		fputs("null", out);
	}
}

void ctl_print_json(FILE *out, const msgpack_object *o)
{
	json_value(out, o, 0);
	fputc('\n', out);
}

void ctl_print_json_line(FILE *out, const msgpack_object *o)
{
	json_value(out, o, -1);
	fputc('\n', out);
}

/* --- human formats ------------------------------------------------------- */

int64_t ctl_now_ms(const msgpack_object *result)
{
	int64_t now;
	/* An agent that had no row to read the clock from sends 0. */
	if (ctl_obj_int64(ctl_map_get(result, "now_at"), &now) && now > 0)
		return now;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ctl_format_duration(char *buf, size_t len, int64_t ms)
{
	const char *sign = ms < 0 ? "-" : "";
	uint64_t a = ms < 0 ? (uint64_t)0 - (uint64_t)ms : (uint64_t)ms;
	uint64_t s = a / 1000;

	if (a < 1000)
		snprintf(buf, len, "%s%llums", sign, (unsigned long long)a);
	else if (a < 60 * 1000)
		snprintf(buf, len, "%s%.1fs", sign, (double)a / 1000.0);
	else if (s < 3600)
		snprintf(buf, len, "%s%llum%02llus", sign, (unsigned long long)(s / 60),
			 (unsigned long long)(s % 60));
	else if (s < 86400)
		snprintf(buf, len, "%s%lluh%02llum", sign, (unsigned long long)(s / 3600),
			 (unsigned long long)(s / 60 % 60));
	else
		snprintf(buf, len, "%s%llud%02lluh", sign, (unsigned long long)(s / 86400),
			 (unsigned long long)(s / 3600 % 24));
}

void ctl_format_age(char *buf, size_t len, int64_t at_ms, int64_t now_ms)
{
	char d[48];

	if (at_ms <= 0) {
		snprintf(buf, len, "-");
		return;
	}
	int64_t diff = at_ms - now_ms;
	ctl_format_duration(d, sizeof(d), diff < 0 ? -diff : diff);
	if (diff < 0)
		snprintf(buf, len, "%s ago", d);
	else if (diff > 0)
		snprintf(buf, len, "in %s", d);
	else
		snprintf(buf, len, "now");
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Copies text for a terminal cell: control bytes and broken UTF-8 become '?'. */
static void cell_text(char *buf, size_t len, const char *p, size_t n)
{
	const unsigned char *s = (const unsigned char *)p;
	size_t o = 0;

	for (size_t i = 0; i < n && o + 4 < len;) {
		size_t k = utf8_seq(s + i, n - i);
		if (k == 0 || (k == 1 && (s[i] < 0x20 || s[i] == 0x7f))) {
			buf[o++] = '?';
			i++;
			continue;
		}
		memcpy(buf + o, s + i, k);
		o += k;
		i += k;
	}
	buf[o] = '\0';
}

static enum ctl_fmt fmt_for_key(const char *key)
{
	if (!key)
		return CTL_FMT_AUTO;
	if (ends_with(key, "_at"))
		return CTL_FMT_AGE;
	if (ends_with(key, "_ms"))
		return CTL_FMT_DURATION;
	return CTL_FMT_AUTO;
}

void ctl_format_value(char *buf, size_t len, const char *key, const msgpack_object *o,
		      enum ctl_fmt fmt, int64_t now_ms)
{
	int64_t i;
	bool b;

	if (!o || o->type == MSGPACK_OBJECT_NIL) {
		snprintf(buf, len, "-");
		return;
	}
	if (fmt == CTL_FMT_AUTO)
		fmt = fmt_for_key(key);
	/* "…_ms_ago" is a duration into the past; -1 means "never happened". */
	if (key && ends_with(key, "_ms_ago") && ctl_obj_int64(o, &i)) {
		if (i < 0) {
			snprintf(buf, len, "never");
		} else {
			char d[48];
			ctl_format_duration(d, sizeof(d), i);
			snprintf(buf, len, "%s ago", d);
		}
		return;
	}
	if (fmt == CTL_FMT_AGE && ctl_obj_int64(o, &i)) {
		ctl_format_age(buf, len, i, now_ms);
		return;
	}
	if (fmt == CTL_FMT_DURATION && ctl_obj_int64(o, &i)) {
		ctl_format_duration(buf, len, i);
		return;
	}
	if (ctl_obj_bool(o, &b)) {
		snprintf(buf, len, "%s",
			 b ? (fmt == CTL_FMT_YESNO ? "yes" : "true")
			   : (fmt == CTL_FMT_YESNO ? "no" : "false"));
		return;
	}
	switch (o->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		snprintf(buf, len, "%llu", (unsigned long long)o->via.u64);
		return;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		snprintf(buf, len, "%lld", (long long)o->via.i64);
		return;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		snprintf(buf, len, "%g", o->via.f64);
		return;
	case MSGPACK_OBJECT_STR:
		cell_text(buf, len, o->via.str.ptr, o->via.str.size);
		if (buf[0] == '\0')
			snprintf(buf, len, "\"\"");
		return;
	default:
		break;
	}
	/* Nested values: their compact JSON, cut to the cell. */
	char *text = NULL;
	size_t tlen = 0;
	FILE *mem = open_memstream(&text, &tlen);
	if (!mem) {
		snprintf(buf, len, "?");
		return;
	}
	json_value(mem, o, -1);
	fclose(mem);
	cell_text(buf, len, text, tlen);
	free(text);
}

/* Display width, counting code points (good enough for the text we print). */
static size_t width(const char *s)
{
	size_t w = 0;
	for (; *s; s++)
		if (((unsigned char)*s & 0xc0) != 0x80)
			w++;
	return w;
}

static void pad(FILE *out, const char *s, size_t to)
{
	fputs(s, out);
	for (size_t w = width(s); w < to; w++)
		fputc(' ', out);
}

/*
 * The label a field is shown under: a value printed as a duration loses
 * the "_ms" of its key ("uptime 1m26s", not "uptime_ms 1m26s"), one printed
 * as "… ago" loses "_ms_ago"; anything else keeps its key.
 */
static void field_label(char *buf, size_t len, const char *prefix, const char *key,
			const msgpack_object *val)
{
	size_t n = strlen(key);
	int64_t i;

	if (val && ctl_obj_int64(val, &i)) {
		if (ends_with(key, "_ms_ago"))
			n -= strlen("_ms_ago");
		else if (ends_with(key, "_ms"))
			n -= strlen("_ms");
	}
	snprintf(buf, len, "%s%.*s", prefix, (int)n, key);
}

struct field {
	char label[CELL_MAX];
	char value[CELL_MAX];
};

/* Appends map's fields to *fs (a nested map's one level down, as
 * "parent.key", so a lease's holder reads as fields, not JSON). */
static bool collect_fields(struct field **fs, size_t *nfs, const msgpack_object *map,
			   const char *prefix, int64_t now_ms)
{
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		const msgpack_object *v = &map->via.map.ptr[i].val;
		char key[CELL_MAX];

		if (k->type == MSGPACK_OBJECT_STR)
			cell_text(key, sizeof(key), k->via.str.ptr, k->via.str.size);
		else
			ctl_format_value(key, sizeof(key), NULL, k, CTL_FMT_AUTO, now_ms);
		if (!*prefix && v->type == MSGPACK_OBJECT_MAP && v->via.map.size > 0) {
			char sub[CELL_MAX + 2];
			snprintf(sub, sizeof(sub), "%s.", key);
			if (!collect_fields(fs, nfs, v, sub, now_ms))
				return false;
			continue;
		}
		struct field *grown = realloc(*fs, (*nfs + 1) * sizeof(**fs));
		if (!grown)
			return false;
		*fs = grown;
		struct field *f = &grown[(*nfs)++];
		field_label(f->label, sizeof(f->label), prefix, key, v);
		ctl_format_value(f->value, sizeof(f->value), key, v, CTL_FMT_AUTO, now_ms);
	}
	return true;
}

void ctl_print_fields(FILE *out, const msgpack_object *map, int64_t now_ms)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP) {
		ctl_print_json(out, map);
		return;
	}
	struct field *fs = NULL;
	size_t nfs = 0, kw = 0;
	if (!collect_fields(&fs, &nfs, map, "", now_ms)) {
		free(fs);
		ctl_print_json(out, map);
		return;
	}
	for (size_t i = 0; i < nfs; i++)
		if (width(fs[i].label) > kw)
			kw = width(fs[i].label);
	for (size_t i = 0; i < nfs; i++) {
		pad(out, fs[i].label, kw + 2);
		fprintf(out, "%s\n", fs[i].value);
	}
	free(fs);
}

void ctl_print_table(FILE *out, const msgpack_object *rows, const struct ctl_column *cols,
		     size_t ncols, int64_t now_ms)
{
	uint32_t nrows = rows && rows->type == MSGPACK_OBJECT_ARRAY ? rows->via.array.size : 0;
	size_t ncells = (size_t)nrows * ncols;
	char(*cells)[CELL_MAX] = calloc(ncells ? ncells : 1, sizeof(*cells));
	size_t *w = calloc(ncols ? ncols : 1, sizeof(*w));

	if (!cells || !w)
		goto out;
	for (size_t c = 0; c < ncols; c++)
		w[c] = width(cols[c].header);
	for (uint32_t r = 0; r < nrows; r++) {
		const msgpack_object *row = &rows->via.array.ptr[r];
		for (size_t c = 0; c < ncols; c++) {
			char *cell = cells[r * ncols + c];
			ctl_format_value(cell, CELL_MAX, cols[c].key, ctl_map_get(row, cols[c].key),
					 cols[c].fmt, now_ms);
			if (width(cell) > w[c])
				w[c] = width(cell);
		}
	}
	for (size_t c = 0; c < ncols; c++) {
		if (c + 1 < ncols)
			pad(out, cols[c].header, w[c] + 2);
		else
			fputs(cols[c].header, out);
	}
	fputc('\n', out);
	for (uint32_t r = 0; r < nrows; r++) {
		for (size_t c = 0; c < ncols; c++) {
			if (c + 1 < ncols)
				pad(out, cells[r * ncols + c], w[c] + 2);
			else
				fputs(cells[r * ncols + c], out);
		}
		fputc('\n', out);
	}
	if (nrows == 0)
		fputs("(none)\n", out);
out:
	free(cells);
	free(w);
}
