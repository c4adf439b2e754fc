/*
 * test_reply.c — reply maps count their own entries: a row kind of N sent
 * columns packs a map of N, a NULL cell packs nil, hidden columns count
 * for the statement's width but are not sent, a whole reply packs its
 * fields, cells and rows in its table's order, and a source without a row
 * packs each cell nil.
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

/* A table mixing a struct's fields, cells and rows a callback packs,
 * the way permit.claim's denied answer is declared. */
struct view {
	const char *id;
	int64_t weight;
	bool mine;
};

static void pack_rows(msgpack_packer *pk, const void *field, const struct reply_src *src)
{
	(void)field;
	msgpack_pack_array(pk, (size_t)src->nrows);
	for (int i = 0; i < src->nrows; i++)
		reply_pack_row(pk, &row_kind, src->res, src->row + i, 0);
}

static const struct reply_col mixed_cols[] = {
    REPLY_FIELD("id", REPLY_FIELD_STR, struct view, id),
    REPLY_FIELD("weight", REPLY_FIELD_INT, struct view, weight),
    {"token", REPLY_INT, 2, 0},
    REPLY_FIELD("mine", REPLY_FIELD_BOOL, struct view, mine),
    REPLY_CALL_ROWS("rows", row_kind, pack_rows),
};
static const struct reply_kind mixed_kind = REPLY_KIND(mixed_cols);

Test(reply, a_table_packs_fields_cells_and_rows_in_its_order)
{
	const char *cells[] = {"1000", "p1", "7", "f", "5", "990", NULL};
	PGresult *res = one_row(7, cells);
	struct view v = {.id = "c1", .weight = 3, .mine = true};
	struct reply_src src = {.res = res, .row = 0, .nrows = 1, .c = &v};
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	reply_pack(&pk, &mixed_kind, &src);
	const msgpack_object *m = unpack(&sb, &u);
	cr_assert_eq(m->via.map.size, 5);
	static const char *const order[] = {"id", "weight", "token", "mine", "rows"};
	for (uint32_t i = 0; i < 5; i++)
		cr_assert_eq(memcmp(m->via.map.ptr[i].key.via.str.ptr, order[i], strlen(order[i])),
			     0, "key %u is not %s", i, order[i]);
	cr_assert_eq(get(m, "weight")->via.i64, 3);
	cr_assert_eq(get(m, "token")->via.i64, 7);
	cr_assert_eq(get(m, "mine")->via.boolean, true);
	const msgpack_object *rows = get(m, "rows");
	cr_assert_eq(rows->type, MSGPACK_OBJECT_ARRAY);
	cr_assert_eq(rows->via.array.size, 1);
	cr_assert_eq(get(&rows->via.array.ptr[0], "age_ms")->via.i64, 10);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	PQclear(res);
}

/* A source without a row (a watched permit that does not exist): every
 * cell is nil, the fields are still the struct's. */
Test(reply, a_source_without_a_row_packs_each_cell_nil)
{
	struct view v = {.id = "c1", .weight = 0, .mine = false};
	static const struct reply_col cols[] = {
	    REPLY_FIELD("id", REPLY_FIELD_STR, struct view, id),
	    {"token", REPLY_INT, 2, 0},
	    {"live", REPLY_BOOL, 3, 0},
	    {"hidden", REPLY_HIDDEN, 4, 0},
	};
	static const struct reply_kind kind = REPLY_KIND(cols);
	struct reply_src src = {.res = NULL, .row = -1, .nrows = 1, .c = &v};
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	reply_pack(&pk, &kind, &src);
	const msgpack_object *m = unpack(&sb, &u);
	cr_assert_eq(m->via.map.size, 3);
	cr_assert_eq(get(m, "id")->type, MSGPACK_OBJECT_STR);
	cr_assert_eq(get(m, "token")->type, MSGPACK_OBJECT_NIL);
	cr_assert_eq(get(m, "live")->type, MSGPACK_OBJECT_NIL);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}

Test(reply, an_empty_table_is_an_empty_map)
{
	static const struct reply_kind none = {NULL, 0};
	struct reply_src src = {0};
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	reply_pack(&pk, &none, &src);
	cr_assert_eq(sb.size, 1, "{} is one byte (fixmap 0)");
	cr_assert_eq(unpack(&sb, &u)->via.map.size, 0);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}
