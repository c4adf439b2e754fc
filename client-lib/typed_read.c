/*
 * typed_read.c — field tables, row arrays and the send-check-decode-free
 * sequence shared by every typed read (see typed_read.h).
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "typed_read.h"

int64_t pgcoord__int_or(const msgpack_object *map, const char *key, int64_t dflt)
{
	int64_t v;
	return pgc_obj_int64(pgc_map_get(map, key), &v) ? v : dflt;
}

static const msgpack_object *field_obj(const msgpack_object *map, const struct pgcoord__field *f)
{
	if (f->in) {
		map = pgc_map_get(map, f->in);
		if (!map || map->type != MSGPACK_OBJECT_MAP)
			return NULL;
	}
	const msgpack_object *o = pgc_map_get(map, f->key);
	return o && o->type != MSGPACK_OBJECT_NIL ? o : NULL;
}

/* Stores one field; false when it is required and missing or mistyped,
 * or memory ran out. */
static bool field_read(const msgpack_object *map, const struct pgcoord__field *f, char *row)
{
	const msgpack_object *o = field_obj(map, f);
	void *at = row + f->offset;

	switch (f->type) {
	case PGCOORD__STR:
		if (!o || o->type != MSGPACK_OBJECT_STR)
			return !f->required;
		return (*(char **)at = pgc_obj_strdup(o)) != NULL;
	case PGCOORD__INT: {
		int64_t v;
		bool ok = o && pgc_obj_int64(o, &v);
		*(int64_t *)at = ok ? v : f->dflt;
		return ok || !f->required;
	}
	case PGCOORD__BOOL: {
		bool v = false;
		bool ok = o && pgc_obj_bool(o, &v);
		*(bool *)at = v;
		return ok || !f->required;
	}
	}
	return false;
}

bool pgcoord__fields_read(const msgpack_object *map, const struct pgcoord__field *f, size_t n,
			  void *row)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!field_read(map, &f[i], row))
			return false;
	return true;
}

void pgcoord__fields_free(const struct pgcoord__field *f, size_t n, void *row)
{
	if (!row)
		return;
	for (size_t i = 0; i < n; i++) {
		if (f[i].type != PGCOORD__STR)
			continue;
		char **s = (char **)((char *)row + f[i].offset);
		free(*s);
		*s = NULL;
	}
}

bool pgcoord__rows_read(const msgpack_object *map, const char *key, size_t row_size,
			bool (*row_fn)(const msgpack_object *m, void *row, const void *arg),
			const void *arg, void **rows, size_t *count)
{
	const msgpack_object *a = pgc_map_get(map, key);

	*rows = NULL;
	*count = 0;
	if (!a || a->type != MSGPACK_OBJECT_ARRAY)
		return false;
	size_t n = a->via.array.size;
	char *r = calloc(n ? n : 1, row_size);
	if (!r)
		return false;
	*rows = r;
	for (size_t i = 0; i < n; i++) {
		*count = i + 1; /* a half-read row is cleared too */
		if (!row_fn(&a->via.array.ptr[i], r + i * row_size, arg))
			return false;
	}
	return true;
}

void pgcoord__rows_free(void *rows, size_t count, size_t row_size, void (*clear)(void *row))
{
	for (size_t i = 0; clear && rows && i < count; i++)
		clear((char *)rows + i * row_size);
	free(rows);
}

static bool table_row_read(const msgpack_object *m, void *row, const void *arg)
{
	const struct pgcoord__row_kind *k = arg;
	return pgcoord__fields_read(m, k->fields, k->nfields, row);
}

bool pgcoord__table_read(const msgpack_object *map, const char *key,
			 const struct pgcoord__row_kind *k, void **rows, size_t *count)
{
	return pgcoord__rows_read(map, key, k->size, table_row_read, k, rows, count);
}

void pgcoord__table_free(void *rows, size_t count, const struct pgcoord__row_kind *k)
{
	for (size_t i = 0; rows && i < count; i++)
		pgcoord__fields_free(k->fields, k->nfields, (char *)rows + i * k->size);
	free(rows);
}

pgcoord_err pgcoord__typed_result(pgcoord *c, pgcoord_err err, void *raw, size_t raw_len,
				  const struct pgcoord__reply_kind *k, void **out)
{
	msgpack_unpacked u;

	*out = NULL;
	if (err != PGCOORD_OK) {
		pgcoord_free(raw);
		return err;
	}
	void *box = calloc(1, k->box_size);
	bool ok = false;
	msgpack_unpacked_init(&u);
	if (box && msgpack_unpack_next(&u, raw, raw_len, NULL) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_MAP)
		ok = k->read(&u.data, box);
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	if (!ok) {
		if (box)
			k->free_box(box);
		pgcoord__set_message(c, "%s (or memory ran out)", k->malformed);
		return PGCOORD_E_PROTOCOL;
	}
	*out = box;
	return PGCOORD_OK;
}

pgcoord_err pgcoord__typed_call(pgcoord *c, const char *method, struct pgcoord_writer *w,
				int timeout_ms, const struct pgcoord__reply_kind *k, void **out)
{
	void *raw = NULL;
	size_t raw_len = 0;
	pgcoord_err err = pgcoord__call_packed(c, method, w, timeout_ms, &raw, &raw_len);
	return pgcoord__typed_result(c, err, raw, raw_len, k, out);
}

pgcoord_err pgcoord__typed_get(pgcoord *c, const char *method, int timeout_ms,
			       const struct pgcoord__reply_kind *k, void **out)
{
	struct pgcoord_writer w;

	if (out)
		*out = NULL;
	if (!c || !out)
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 0);
	return pgcoord__typed_call(c, method, &w, timeout_ms, k, out);
}
