/*
 * cursor.c — see cursor.h.
 */
#include "agent/cursor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/dispatch.h"
#include "agent/pgrow.h"
#include "proto/codec.h"

static const char hex[] = "0123456789abcdef";

static int unhex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1; /* the encoder writes lower case only */
}

/* Decodes the hex of s[0..len) into a new string; NULL when it is not
 * even, lower-case hex of at most max bytes of UTF-8 without NUL. */
static char *decode_part(const char *s, size_t len, size_t max)
{
	if (len == 0 || len % 2 || len / 2 > max)
		return NULL;
	char *out = malloc(len / 2 + 1);
	if (!out)
		return NULL;
	for (size_t i = 0; i < len; i += 2) {
		int hi = unhex(s[i]), lo = unhex(s[i + 1]);
		if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
			free(out);
			return NULL;
		}
		out[i / 2] = (char)(hi << 4 | lo);
	}
	out[len / 2] = '\0';
	if (!utf8_valid(out, len / 2)) {
		free(out);
		return NULL;
	}
	return out;
}

static bool decimal(const char *s)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	return *s >= '0' && *s <= '9' && *end == '\0' && errno == 0 && v >= 0;
}

void cursor_parts_free(const struct cursor_kind *kind, char **parts)
{
	for (size_t i = 0; i < kind->nparts; i++) {
		free(parts[i]);
		parts[i] = NULL;
	}
}

bool req_param_cursor(struct request *req, const struct cursor_kind *kind, char **parts)
{
	const msgpack_object *o = pgc_map_get(req->params, "cursor");

	for (size_t i = 0; i < kind->nparts; i++)
		parts[i] = NULL;
	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return true;
	if (o->type != MSGPACK_OBJECT_STR) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter 'cursor' must be a string (the next_cursor of a page of %s), "
			 "not %s",
			 req->method->name, pgc_obj_type_name(o));
		return false;
	}
	const char *s = o->via.str.ptr, *end = s + o->via.str.size;
	bool ok = end - s >= 2 && s[0] == kind->tag && s[1] == '.';
	size_t n = 0;
	for (const char *p = s + 2; ok && n < kind->nparts; n++) {
		const char *dot = memchr(p, '.', (size_t)(end - p));
		const char *stop = dot ? dot : end;
		parts[n] = decode_part(p, (size_t)(stop - p), kind->max_len);
		ok = parts[n] && (!kind->integer || decimal(parts[n])) &&
		     (n + 1 < kind->nparts ? dot != NULL : dot == NULL);
		p = dot ? dot + 1 : end;
	}
	if (ok && n == kind->nparts)
		return true;
	cursor_parts_free(kind, parts);
	req_fail(req, PGC_E_INVALID_PARAMS,
		 "parameter 'cursor' is not a cursor of %s: pass the next_cursor of its previous "
		 "page unchanged, or none for the first page",
		 req->method->name);
	return false;
}

/* The cursor of row `row`, malloc'd; NULL when out of memory. */
static char *cursor_string(const struct cursor_kind *kind, const PGresult *res, int row,
			   const int *cols)
{
	size_t len = 1;
	for (size_t i = 0; i < kind->nparts; i++)
		len += 1 + 2 * (size_t)PQgetlength(res, row, cols[i]);
	char *buf = malloc(len + 1);
	if (!buf)
		return NULL;
	size_t at = 0;
	buf[at++] = kind->tag;
	for (size_t i = 0; i < kind->nparts; i++) {
		const unsigned char *v = (const unsigned char *)PQgetvalue(res, row, cols[i]);
		int vlen = PQgetlength(res, row, cols[i]);
		buf[at++] = '.';
		for (int j = 0; j < vlen; j++) {
			buf[at++] = hex[v[j] >> 4];
			buf[at++] = hex[v[j] & 15];
		}
	}
	buf[at] = '\0';
	return buf;
}

bool page_view_cursor(struct request *req, struct page_view *v, const struct cursor_kind *kind,
		      const PGresult *res, int row, const int *cols)
{
	v->next_cursor = row < 0 ? NULL : cursor_string(kind, res, row, cols);
	if (row >= 0 && !v->next_cursor) {
		req_fail(req, PGC_E_INTERNAL, "out of memory");
		return false;
	}
	return true;
}

bool req_param_page(struct request *req, const struct cursor_kind *kind, int64_t def, int64_t max,
		    struct page *pg)
{
	pg->kind = kind;
	pg->limit = def;
	for (size_t i = 0; i < CURSOR_PARTS_MAX; i++)
		pg->parts[i] = NULL;
	if (!req_param_int(req, "limit", false, 1, max, &pg->limit, NULL) ||
	    !req_param_cursor(req, kind, pg->parts))
		return false;
	snprintf(pg->fetch, sizeof(pg->fetch), "%lld", (long long)pg->limit + 1);
	return true;
}

void page_free(struct page *pg)
{
	if (pg->kind)
		cursor_parts_free(pg->kind, pg->parts);
}

const char *page_after(const struct page *pg, size_t i)
{
	return pg->parts[i] ? pg->parts[i] : pg->kind->integer ? "0" : "";
}

static void page_ctx_free(void *ctx)
{
	page_free(ctx);
}

struct page *req_page_ctx(struct request *req, const struct cursor_kind *kind, int64_t def,
			  int64_t max)
{
	struct page *pg = req_ctx_alloc(req, sizeof(*pg), page_ctx_free);
	if (!pg || !req_param_page(req, kind, def, max, pg))
		return NULL;
	return pg;
}
