/*
 * pgrow.h — reading cells of a text-format PGresult and packing them into
 * a reply, for handlers that turn rows into result maps. SQL NULL becomes
 * MessagePack nil. The one place that knows how Postgres spells an
 * integer, a boolean, a bytea (in either bytea_output format) or an array.
 */
#ifndef PGCOORD_AGENT_PGROW_H
#define PGCOORD_AGENT_PGROW_H

#include <libpq-fe.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when res has exactly `cols` columns: a statement and the code
 * reading it agree on its shape (a reply is never built from a misread). */
bool pgrow_has_cols(const PGresult *res, int cols);

/* The cell as an integer; 0 for NULL. */
int64_t pgrow_int(const PGresult *res, int row, int col);

bool pgrow_null(const PGresult *res, int row, int col);

/* A boolean cell ("t"); false for NULL. */
bool pgrow_bool(const PGresult *res, int row, int col);

/* A text cell; "" for NULL. */
const char *pgrow_text(const PGresult *res, int row, int col);

/*
 * A bytea cell in whichever format the server's bytea_output gives (hex
 * "\x0102" or escape "\001\002"), decoded by PQunescapeBytea. Returns a
 * buffer to free with PQfreemem, or NULL for NULL (or out of memory, which
 * *len = SIZE_MAX tells apart).
 */
unsigned char *pgrow_bytea(const PGresult *res, int row, int col, size_t *len);

/* An int[]/bigint[] cell ("{1,2,3}"): up to max elements into out; returns
 * how many there were (more than max when it did not fit), or -1 when the
 * cell is NULL or not an integer array. */
int pgrow_int_array(const PGresult *res, int row, int col, int64_t *out, int max);

/*
 * The bytes as bytea in Postgres' hex input form ("\x0102…"), for a
 * statement parameter. NULL when out of memory; the caller frees.
 */
char *pgrow_bytea_param(const char *data, size_t len);

/* key: the cell, as int/str/bin/nil. */
void pgrow_kv_int(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col);
void pgrow_kv_str(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col);
/* A bytea cell (pgrow_bytea) as bin. */
void pgrow_kv_bytea(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col);
/* A text cell of hex digits (what encode(bytea, 'hex') gives, whatever
 * bytea_output says) as bin. */
void pgrow_kv_hex_bin(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col);
/* An age by the database clock: now_at − the cell, or nil for NULL. */
void pgrow_kv_age(msgpack_packer *pk, const char *key, int64_t now_at, const PGresult *res, int row,
		  int col);

#endif
