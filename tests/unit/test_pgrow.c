/*
 * test_pgrow.c — the Postgres cell helpers on hand-built results (no
 * database): integers, booleans, text, bytea in both bytea_output formats,
 * integer arrays and the column-count check.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "agent/pgrow.h"
#include "proto/codec.h"

/* A one-row result of text cells; NULL in cells is SQL NULL. */
static PGresult *one_row(int n, const char *const *cells)
{
	PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
	PGresAttDesc attrs[8];

	cr_assert(res && n <= 8);
	memset(attrs, 0, sizeof(attrs));
	for (int i = 0; i < n; i++) {
		attrs[i].name = (char *)"c";
		attrs[i].format = 0;
	}
	cr_assert(PQsetResultAttrs(res, n, attrs));
	for (int i = 0; i < n; i++)
		cr_assert(
		    PQsetvalue(res, 0, i, (char *)cells[i], cells[i] ? (int)strlen(cells[i]) : -1));
	return res;
}

Test(pgrow, integers_booleans_text_and_nulls)
{
	const char *cells[] = {"42", "-9223372036854775808", NULL, "t", "f", "hello"};
	PGresult *res = one_row(6, cells);

	cr_assert(pgrow_has_cols(res, 6));
	cr_assert_not(pgrow_has_cols(res, 5));
	cr_assert_not(pgrow_has_cols(NULL, 0));
	cr_assert_eq(pgrow_int(res, 0, 0), 42);
	cr_assert_eq(pgrow_int(res, 0, 1), INT64_MIN);
	cr_assert_eq(pgrow_int(res, 0, 2), 0);
	cr_assert(pgrow_null(res, 0, 2));
	cr_assert(pgrow_bool(res, 0, 3));
	cr_assert_not(pgrow_bool(res, 0, 4));
	cr_assert_not(pgrow_bool(res, 0, 2));
	cr_assert_str_eq(pgrow_text(res, 0, 5), "hello");
	cr_assert_str_eq(pgrow_text(res, 0, 2), "");
	PQclear(res);
}

/* The same bytes as each bytea_output format spells them. */
static const unsigned char want[] = {'{', 0, '\\', '\'', 0xff, 0x80, 'o', 'k', '}', 1};

static void assert_bytes(const PGresult *res, int col)
{
	size_t len;
	unsigned char *b = pgrow_bytea(res, 0, col, &len);
	cr_assert_not_null(b, "column %d", col);
	cr_assert_eq(len, sizeof(want), "column %d: %zu bytes", col, len);
	cr_assert_eq(memcmp(b, want, len), 0, "column %d", col);
	PQfreemem(b);
}

Test(pgrow, bytea_in_hex_and_escape_output)
{
	const char *cells[] = {"\\x7b005c27ff806f6b7d01", "{\\000\\\\'\\377\\200ok}\\001", NULL,
			       "\\x"};
	PGresult *res = one_row(4, cells);
	size_t len = 99;

	assert_bytes(res, 0);
	assert_bytes(res, 1);
	cr_assert_null(pgrow_bytea(res, 0, 2, &len));
	cr_assert_eq(len, 0, "NULL is not out of memory");
	unsigned char *empty = pgrow_bytea(res, 0, 3, &len);
	cr_assert(empty && len == 0);
	PQfreemem(empty);
	PQclear(res);
}

/* pgrow_kv_bytea packs bin in either format, nil for NULL. */
Test(pgrow, bytea_packs_as_bin_or_nil)
{
	const char *cells[] = {"{\\000\\\\'\\377\\200ok}\\001", NULL};
	PGresult *res = one_row(2, cells);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;
	size_t off = 0;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 2);
	pgrow_kv_bytea(&pk, "data", res, 0, 0);
	pgrow_kv_bytea(&pk, "none", res, 0, 1);
	msgpack_unpacked_init(&u);
	cr_assert_eq(msgpack_unpack_next(&u, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
	const msgpack_object *d = pgc_map_get(&u.data, "data");
	cr_assert(d && d->type == MSGPACK_OBJECT_BIN && d->via.bin.size == sizeof(want));
	cr_assert_eq(memcmp(d->via.bin.ptr, want, sizeof(want)), 0);
	cr_assert_eq(pgc_map_get(&u.data, "none")->type, MSGPACK_OBJECT_NIL);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	PQclear(res);
}

Test(pgrow, bytea_param_is_hex_input_form)
{
	char *s = pgrow_bytea_param((const char *)want, sizeof(want));
	cr_assert_str_eq(s, "\\x7b005c27ff806f6b7d01");
	free(s);
	s = pgrow_bytea_param("", 0);
	cr_assert_str_eq(s, "\\x");
	free(s);
}

Test(pgrow, integer_arrays)
{
	const char *cells[] = {"{1,-2,30}", "{}", NULL, "{1,x}", "{1,2,3,4}", "1,2"};
	PGresult *res = one_row(6, cells);
	int64_t out[3];

	cr_assert_eq(pgrow_int_array(res, 0, 0, out, 3), 3);
	cr_assert(out[0] == 1 && out[1] == -2 && out[2] == 30);
	cr_assert_eq(pgrow_int_array(res, 0, 1, out, 3), 0);
	cr_assert_eq(pgrow_int_array(res, 0, 2, out, 3), -1);
	cr_assert_eq(pgrow_int_array(res, 0, 3, out, 3), -1);
	cr_assert_eq(pgrow_int_array(res, 0, 4, out, 3), 4, "more than fit is counted");
	cr_assert_eq(pgrow_int_array(res, 0, 5, out, 3), -1);
	PQclear(res);
}
