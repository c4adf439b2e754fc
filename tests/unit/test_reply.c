/*
 * test_reply.c — reply maps count their own entries: a row kind of N sent
 * columns packs a map of N, a NULL cell packs nil, hidden columns count
 * for the statement's width but are not sent, and a builder's map size is
 * the number of keys given to it, nested maps included.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "agent/reply.h"

static PGresult *one_row(int n, const char *const *cells)
{
	PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
	PGresAttDesc attrs[8];

	cr_assert(res && n <= 8);
	memset(attrs, 0, sizeof(attrs));
	for (int i = 0; i < n; i++)
		attrs[i].name = (char *)"c";
	cr_assert(PQsetResultAttrs(res, n, attrs));
	for (int i = 0; i < n; i++)
		cr_assert(
		    PQsetvalue(res, 0, i, (char *)cells[i], cells[i] ? (int)strlen(cells[i]) : -1));
	return res;
}

/* The packed bytes as one object; the caller destroys *u. */
static const msgpack_object *unpack(msgpack_sbuffer *sb, msgpack_unpacked *u)
{
	size_t off = 0;

	msgpack_unpacked_init(u);
	cr_assert_eq(msgpack_unpack_next(u, sb->data, sb->size, &off), MSGPACK_UNPACK_SUCCESS);
	cr_assert_eq(off, sb->size, "trailing bytes after the map");
	return &u->data;
}

static const msgpack_object *get(const msgpack_object *map, const char *key)
{
	cr_assert_eq(map->type, MSGPACK_OBJECT_MAP);
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object_kv *kv = &map->via.map.ptr[i];
		if (kv->key.via.str.size == strlen(key) &&
		    memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) == 0)
			return &kv->val;
	}
	cr_assert_fail("no key %s", key);
	return NULL;
}

static const struct reply_col row_cols[] = {
    {"id", REPLY_STR, 1, 0},	    {"token", REPLY_INT, 2, 0},	 {"live", REPLY_BOOL, 3, 0},
    {"gone_at", REPLY_INT, 4, 0},   {"age_ms", REPLY_AGE, 5, 0}, {"data", REPLY_HEX_BIN, 6, 0},
    {"now_at", REPLY_HIDDEN, 0, 0},
};
static const struct reply_kind row_kind = REPLY_KIND(row_cols);

Test(reply, a_row_kind_counts_its_map_and_packs_nil_for_null)
{
	const char *cells[] = {"1000", "p1", "7", "t", NULL, "400", "6869"};
	PGresult *res = one_row(7, cells);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;

	cr_assert_eq(reply_kind_width(&row_kind), 7);
	cr_assert_eq(reply_kind_entries(&row_kind), 6);
	cr_assert(reply_kind_fits(&row_kind, res, 0));
	cr_assert_not(reply_kind_fits(&row_kind, res, 1));
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	reply_pack_row(&pk, &row_kind, res, 0, 0);
	const msgpack_object *m = unpack(&sb, &u);
	cr_assert_eq(m->via.map.size, 6);
	cr_assert_eq(get(m, "token")->via.i64, 7);
	cr_assert_eq(get(m, "live")->via.boolean, true);
	cr_assert_eq(get(m, "gone_at")->type, MSGPACK_OBJECT_NIL);
	cr_assert_eq(get(m, "age_ms")->via.i64, 600);
	cr_assert_eq(get(m, "data")->type, MSGPACK_OBJECT_BIN);
	cr_assert_eq(memcmp(get(m, "data")->via.bin.ptr, "hi", 2), 0);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	PQclear(res);
}

Test(reply, a_builder_counts_its_keys_nested_maps_included)
{
	const char *cells[] = {"1000", "p1", "7", "f", "5", "990", NULL};
	PGresult *res = one_row(7, cells);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;
	struct reply_map outer, inner;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	reply_map_begin(&outer, &pk);
	reply_kv_int(&outer, "n", 1);
	reply_map_begin(&inner, reply_key(&outer, "row"));
	reply_kv_row(&inner, &row_kind, res, 0, 0);
	reply_kv_str_or_nil(&inner, "extra", NULL);
	reply_map_end(&inner);
	reply_kv_str(&outer, "s", "x");
	reply_kv_bool(&outer, "b", false);
	reply_map_end(&outer);
	const msgpack_object *m = unpack(&sb, &u);
	cr_assert_eq(m->via.map.size, 4);
	const msgpack_object *row = get(m, "row");
	cr_assert_eq(row->via.map.size, 7);
	cr_assert_eq(get(row, "age_ms")->via.i64, 10);
	cr_assert_eq(get(row, "data")->type, MSGPACK_OBJECT_NIL);
	cr_assert_eq(get(row, "extra")->type, MSGPACK_OBJECT_NIL);
	cr_assert_eq(get(m, "b")->via.boolean, false);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	PQclear(res);
}

Test(reply, an_empty_builder_is_an_empty_map)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;
	struct reply_map m;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	reply_map_begin(&m, &pk);
	reply_map_end(&m);
	cr_assert_eq(unpack(&sb, &u)->via.map.size, 0);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}
