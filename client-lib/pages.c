/*
 * pages.c — the paged lists (PROTOCOL.md, "Paging"): one page with its
 * next_cursor (pgcoord_list_page), and a walk of every page answered as
 * the one result map those lists gave before they paged
 * (pgcoord__list_all), so the calls that returned every row still do.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "handle.h"
#include "pages.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

/* Packs params (a map, or nothing) without its limit and cursor, then
 * those two as given, into w. */
static pgcoord_err pack_page_params(pgcoord *c, struct pgcoord_writer *w, const void *params,
				    size_t params_len, int64_t limit, const char *cursor)
{
	msgpack_unpacked u;
	const msgpack_object_map *m = NULL;
	uint32_t kept = 0;

	msgpack_unpacked_init(&u);
	if (params && params_len) {
		if (msgpack_unpack_next(&u, params, params_len, NULL) != MSGPACK_UNPACK_SUCCESS ||
		    u.data.type != MSGPACK_OBJECT_MAP) {
			msgpack_unpacked_destroy(&u);
			pgcoord__set_message(c, "params is not one MessagePack map");
			return PGCOORD_E_ARG;
		}
		m = &u.data.via.map;
		for (uint32_t i = 0; i < m->size; i++)
			kept += !pgc_obj_str_eq(&m->ptr[i].key, "limit") &&
				!pgc_obj_str_eq(&m->ptr[i].key, "cursor");
	}
	msgpack_pack_map(&w->pk, kept + (limit > 0) + (cursor != NULL));
	for (uint32_t i = 0; m && i < m->size; i++) {
		if (pgc_obj_str_eq(&m->ptr[i].key, "limit") ||
		    pgc_obj_str_eq(&m->ptr[i].key, "cursor"))
			continue;
		msgpack_pack_object(&w->pk, m->ptr[i].key);
		msgpack_pack_object(&w->pk, m->ptr[i].val);
	}
	if (limit > 0)
		pgc_pack_kv_int(&w->pk, "limit", limit);
	if (cursor)
		pgc_pack_kv_str(&w->pk, "cursor", cursor);
	msgpack_unpacked_destroy(&u);
	return PGCOORD_OK;
}

/* A malloc'd copy of result's next_cursor in *next, NULL when nil or
 * absent; false when it is another type or memory ran out. */
static bool read_next(const msgpack_object *result, char **next)
{
	const msgpack_object *v = pgc_map_get(result, "next_cursor");

	*next = NULL;
	if (!v || v->type == MSGPACK_OBJECT_NIL)
		return true;
	if (v->type != MSGPACK_OBJECT_STR)
		return false;
	*next = strndup(v->via.str.ptr, v->via.str.size);
	return *next != NULL;
}

/* One page, decoded: u holds the result map, *raw its bytes. */
static pgcoord_err page_decoded(pgcoord *c, const char *method, const void *params,
				size_t params_len, int64_t limit, const char *cursor,
				int timeout_ms, msgpack_unpacked *u, void **raw, size_t *raw_len,
				char **next)
{
	struct pgcoord_writer w;

	pgcoord__writer_init(&w);
	pgcoord_err err = pack_page_params(c, &w, params, params_len, limit, cursor);
	if (err != PGCOORD_OK) {
		pgcoord__writer_destroy(&w);
		return err;
	}
	err = pgcoord__call_decoded(c, method, &w, timeout_ms, u, raw, raw_len);
	if (err != PGCOORD_OK)
		return err;
	if (!read_next(&u->data, next)) {
		msgpack_unpacked_destroy(u);
		pgcoord_free(*raw);
		*raw = NULL;
		pgcoord__set_message(c, "the %s result has a next_cursor that is not a string",
				     method);
		return PGCOORD_E_PROTOCOL;
	}
	return PGCOORD_OK;
}

pgcoord_err pgcoord_list_page(pgcoord *c, const char *method, const void *params, size_t params_len,
			      int64_t limit, const char *cursor, int timeout_ms, void **result,
			      size_t *result_len, char **next_cursor)
{
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	char *next = NULL;

	if (result)
		*result = NULL;
	if (result_len)
		*result_len = 0;
	if (next_cursor)
		*next_cursor = NULL;
	if (!c || !method || limit < 0)
		return PGCOORD_E_ARG;
	pgcoord_err err = page_decoded(c, method, params, params_len, limit, cursor, timeout_ms, &u,
				       &raw, &raw_len, &next);
	if (err != PGCOORD_OK)
		return err;
	msgpack_unpacked_destroy(&u);
	if (next_cursor)
		*next_cursor = next;
	else
		free(next);
	if (result) {
		*result = raw;
		if (result_len)
			*result_len = raw_len;
	} else {
		pgcoord_free(raw);
	}
	return PGCOORD_OK;
}

/* The pages a walk has read so far. */
struct walk {
	msgpack_unpacked *pages;
	void **raws;
	size_t n, cap;
};

static void walk_free(struct walk *wk)
{
	for (size_t i = 0; i < wk->n; i++) {
		msgpack_unpacked_destroy(&wk->pages[i]);
		pgcoord_free(wk->raws[i]);
	}
	free(wk->pages);
	free(wk->raws);
}

static bool walk_grow(struct walk *wk)
{
	if (wk->n < wk->cap)
		return true;
	size_t cap = wk->cap ? wk->cap * 2 : 4;
	msgpack_unpacked *p = realloc(wk->pages, cap * sizeof(*p));
	if (!p)
		return false;
	wk->pages = p;
	void **r = realloc(wk->raws, cap * sizeof(*r));
	if (!r)
		return false;
	wk->raws = r;
	wk->cap = cap;
	return true;
}

/* The rows of every page under items, the other keys of the last page,
 * next_cursor nil: one map, as a single reply would have been. */
static pgcoord_err walk_pack(pgcoord *c, const struct walk *wk, const char *method,
			     const char *items, void **result, size_t *result_len)
{
	const msgpack_object *last = &wk->pages[wk->n - 1].data;
	size_t total = 0;
	struct pgcoord_writer w;

	for (size_t i = 0; i < wk->n; i++) {
		const msgpack_object *a = pgc_map_get(&wk->pages[i].data, items);
		if (!a || a->type != MSGPACK_OBJECT_ARRAY) {
			pgcoord__set_message(c, "a page of %s has no %s array", method, items);
			return PGCOORD_E_PROTOCOL;
		}
		total += a->via.array.size;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, last->via.map.size);
	for (uint32_t k = 0; k < last->via.map.size; k++) {
		const msgpack_object_kv *kv = &last->via.map.ptr[k];
		msgpack_pack_object(&w.pk, kv->key);
		if (pgc_obj_str_eq(&kv->key, "next_cursor")) {
			msgpack_pack_nil(&w.pk);
		} else if (pgc_obj_str_eq(&kv->key, "truncated")) {
			msgpack_pack_false(&w.pk);
		} else if (pgc_obj_str_eq(&kv->key, items)) {
			msgpack_pack_array(&w.pk, total);
			for (size_t i = 0; i < wk->n; i++) {
				const msgpack_object *a = pgc_map_get(&wk->pages[i].data, items);
				for (uint32_t j = 0; j < a->via.array.size; j++)
					msgpack_pack_object(&w.pk, a->via.array.ptr[j]);
			}
		} else {
			msgpack_pack_object(&w.pk, kv->val);
		}
	}
	size_t len = 0;
	char *out = pgcoord__writer_release(&w, &len);
	if (!out)
		return PGCOORD_E_NOMEM;
	if (result) {
		*result = out;
		if (result_len)
			*result_len = len;
	} else {
		pgcoord_free(out);
	}
	return PGCOORD_OK;
}

pgcoord_err pgcoord__list_all(pgcoord *c, const char *method, const void *params, size_t params_len,
			      const char *items, int timeout_ms, void **result, size_t *result_len)
{
	struct walk wk = {0};
	int64_t deadline = pgcoord__deadline(timeout_ms);
	char *cursor = NULL;
	pgcoord_err err;

	if (result)
		*result = NULL;
	if (result_len)
		*result_len = 0;
	if (!c)
		return PGCOORD_E_ARG;
	do {
		char *next = NULL;
		size_t raw_len = 0;
		if (!walk_grow(&wk)) {
			err = PGCOORD_E_NOMEM;
			break;
		}
		/* the whole walk has the caller's one timeout */
		err = page_decoded(c, method, params, params_len, PGCOORD__PAGE_MAX, cursor,
				   pgcoord__remaining(deadline), &wk.pages[wk.n], &wk.raws[wk.n],
				   &raw_len, &next);
		free(cursor);
		cursor = next;
		if (err != PGCOORD_OK)
			break;
		wk.n++;
	} while (cursor);
	free(cursor);
	if (err == PGCOORD_OK)
		err = walk_pack(c, &wk, method, items, result, result_len);
	walk_free(&wk);
	return err;
}

/* The array each paged list answers its rows in. */
static const char *items_of(const char *method)
{
	static const char *const lists[][2] = {
	    {"lease.list", "leases"},	    {"quota.list", "quotas"},	{"fleet.agents", "agents"},
	    {"fleet.sessions", "sessions"}, {"permit.list", "permits"}, {"record.list", "records"},
	};
	for (size_t i = 0; method && i < sizeof(lists) / sizeof(lists[0]); i++)
		if (strcmp(lists[i][0], method) == 0)
			return lists[i][1];
	return NULL;
}

pgcoord_err pgcoord_list_all(pgcoord *c, const char *method, const void *params, size_t params_len,
			     int timeout_ms, void **result, size_t *result_len)
{
	const char *items = items_of(method);

	if (result)
		*result = NULL;
	if (!c)
		return PGCOORD_E_ARG;
	if (!items) {
		pgcoord__set_message(c, "%s is not a paged list", method ? method : "(null)");
		return PGCOORD_E_ARG;
	}
	return pgcoord__list_all(c, method, params, params_len, items, timeout_ms, result,
				 result_len);
}
