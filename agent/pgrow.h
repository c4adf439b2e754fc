/*
 * pgrow.h — reading cells of a text-format PGresult and packing them into
 * a reply, for handlers that turn rows into result maps. SQL NULL becomes
 * MessagePack nil.
 */
#ifndef PGCOORD_AGENT_PGROW_H
#define PGCOORD_AGENT_PGROW_H

#include <libpq-fe.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"

/* The cell as an integer; 0 for NULL. */
static inline int64_t pgrow_int(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

static inline bool pgrow_null(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col);
}

/* A boolean cell ("t"); false for NULL. */
static inline bool pgrow_bool(const PGresult *res, int row, int col)
{
	return !PQgetisnull(res, row, col) && strcmp(PQgetvalue(res, row, col), "t") == 0;
}

static inline void pgrow_kv_int(msgpack_packer *pk, const char *key, const PGresult *res, int row,
				int col)
{
	if (PQgetisnull(res, row, col))
		pgc_pack_kv_nil(pk, key);
	else
		pgc_pack_kv_int(pk, key, pgrow_int(res, row, col));
}

static inline void pgrow_kv_str(msgpack_packer *pk, const char *key, const PGresult *res, int row,
				int col)
{
	pgc_pack_cstr(pk, key);
	if (PQgetisnull(res, row, col))
		msgpack_pack_nil(pk);
	else
		pgc_pack_strn(pk, PQgetvalue(res, row, col), (size_t)PQgetlength(res, row, col));
}

static inline int pgrow_hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A text cell of hex digits (what encode(bytea, 'hex') gives, whatever
 * bytea_output says) as MessagePack bin; nil for NULL. Decoded in chunks
 * straight into the packer. */
static inline void pgrow_kv_hex_bin(msgpack_packer *pk, const char *key, const PGresult *res,
				    int row, int col)
{
	const char *v = PQgetvalue(res, row, col);
	size_t n = (size_t)PQgetlength(res, row, col) / 2;
	unsigned char chunk[256];
	size_t used = 0;

	pgc_pack_cstr(pk, key);
	if (PQgetisnull(res, row, col)) {
		msgpack_pack_nil(pk);
		return;
	}
	msgpack_pack_bin(pk, n);
	for (size_t i = 0; i < n; i++) {
		int hi = pgrow_hexval(v[2 * i]), lo = pgrow_hexval(v[2 * i + 1]);
		chunk[used++] = (unsigned char)((hi < 0 ? 0 : hi) << 4 | (lo < 0 ? 0 : lo));
		if (used == sizeof(chunk) || i + 1 == n) {
			msgpack_pack_bin_body(pk, chunk, used);
			used = 0;
		}
	}
}

/* An age by the database clock: now_at − the cell, or nil for NULL. */
static inline void pgrow_kv_age(msgpack_packer *pk, const char *key, int64_t now_at,
				const PGresult *res, int row, int col)
{
	if (PQgetisnull(res, row, col))
		pgc_pack_kv_nil(pk, key);
	else
		pgc_pack_kv_int(pk, key, now_at - pgrow_int(res, row, col));
}

#endif
