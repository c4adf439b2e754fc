/*
 * cursor.h — keyset paging of the list methods: the `limit` and `cursor`
 * parameters and the `next_cursor` of a reply.
 *
 * A cursor is the key of the last row a page sent, so the next page is
 * `WHERE key > last ORDER BY key LIMIT n + 1`: an index range scan, never
 * an offset. On the wire it is an opaque string, "<tag>.<hex>[.<hex>]":
 * the tag names the list it came from (a lease cursor is refused by
 * quota.list), each part is one column of the key in hex, so any key
 * travels as plain ASCII. Clients must not build or read one.
 */
#ifndef PGCOORD_AGENT_CURSOR_H
#define PGCOORD_AGENT_CURSOR_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/reply.h"

struct request;

/* Page sizes of the lists that had no limit before paging. */
#define PAGE_LIMIT_DEFAULT 100
#define PAGE_LIMIT_MAX 1000

/* The most columns a list's key has (record.list: kind, key). */
#define CURSOR_PARTS_MAX 2

/* One list's cursor: its tag and the columns of its key. */
struct cursor_kind {
	char tag;
	size_t nparts;
	size_t max_len; /* bytes of each decoded part */
	bool integer;	/* the parts are decimal integers (session ids) */
};

/*
 * Reads the optional `cursor` parameter into parts[0..nparts), each a
 * malloc'd NUL-terminated string the caller frees; all NULL when absent.
 * A cursor of another list, or one not made by this agent's encoding,
 * answers `invalid_params` and returns false.
 */
bool req_param_cursor(struct request *req, const struct cursor_kind *kind, char **parts);

/* Frees what req_param_cursor read. */
void cursor_parts_free(const struct cursor_kind *kind, char **parts);

/* A list call's page: its size and where it starts. */
struct page {
	const struct cursor_kind *kind;
	int64_t limit;
	char *parts[CURSOR_PARTS_MAX]; /* the cursor's key; NULL for the first page */
	char fetch[24];		       /* limit + 1, as text: one more row says "more" */
};

/*
 * Reads `limit` (1..max, default def) and `cursor` into pg. Returns false
 * after answering `invalid_params`. Free with page_free.
 */
bool req_param_page(struct request *req, const struct cursor_kind *kind, int64_t def, int64_t max,
		    struct page *pg);
void page_free(struct page *pg);
/* Part i of the key the page starts after, as a statement parameter:
 * the first page starts after "" (text) or 0 (ids), below every key, so
 * one statement `WHERE key > $n` serves every page. */
const char *page_after(const struct page *pg, size_t i);

/* For the lists whose handler keeps nothing else: a request context
 * holding only the page (req_ctx_alloc), and its free function. */
struct page *req_page_ctx(struct request *req, const struct cursor_kind *kind, int64_t def,
			  int64_t max);

/* What a page's reply says besides its rows, for a reply table: the
 * columns PAGE_TRUNCATED, PAGE_NOW_AT, PAGE_NEXT_CURSOR. */
struct page_view {
	bool truncated;
	int64_t now_at;
	char *next_cursor;   /* nil on the last page */
	struct request *req; /* for rows that depend on the caller */
	int count;	     /* items on the page, for a packer that groups rows */
};
#define PAGE_TRUNCATED REPLY_FIELD("truncated", REPLY_FIELD_BOOL, struct page_view, truncated)
#define PAGE_NOW_AT REPLY_FIELD("now_at", REPLY_FIELD_INT, struct page_view, now_at)
#define PAGE_NEXT_CURSOR REPLY_FIELD("next_cursor", REPLY_FIELD_STR, struct page_view, next_cursor)

/* Sets v->next_cursor to the key of row `row` (its columns cols[]),
 * NULL when row < 0. False when out of memory, answered. Free it with
 * free(v->next_cursor). */
bool page_view_cursor(struct request *req, struct page_view *v, const struct cursor_kind *kind,
		      const PGresult *res, int row, const int *cols);

#endif
