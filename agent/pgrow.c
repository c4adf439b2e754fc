/*
 * pgrow.c — see pgrow.h.
 */
#include "agent/pgrow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"

bool pgrow_has_cols(const PGresult *res, int cols)
{
	return res && PQnfields(res) == cols;
}

bool pgrow_null(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col);
}

int64_t pgrow_int(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

bool pgrow_bool(const PGresult *res, int row, int col)
{
	return !PQgetisnull(res, row, col) && strcmp(PQgetvalue(res, row, col), "t") == 0;
}

const char *pgrow_text(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col) ? "" : PQgetvalue(res, row, col);
}

unsigned char *pgrow_bytea(const PGresult *res, int row, int col, size_t *len)
{
	unsigned char *out;

	*len = 0;
	if (PQgetisnull(res, row, col))
		return NULL;
	out = PQunescapeBytea((const unsigned char *)PQgetvalue(res, row, col), len);
	if (!out)
		*len = SIZE_MAX;
	return out;
}

int pgrow_int_array(const PGresult *res, int row, int col, int64_t *out, int max)
{
	const char *p;
	char *end;
	int n = 0;

	if (PQgetisnull(res, row, col))
		return -1;
	p = PQgetvalue(res, row, col);
	if (*p++ != '{')
		return -1;
	if (*p == '}')
		return p[1] ? -1 : 0;
	for (;;) {
		long long v;
		errno = 0;
		v = strtoll(p, &end, 10);
		if (errno || end == p)
			return -1;
		if (n < max)
			out[n] = (int64_t)v;
		n++;
		p = end;
		if (*p == '}')
			return p[1] ? -1 : n;
		if (*p++ != ',')
			return -1;
	}
}

char *pgrow_bytea_param(const char *data, size_t len)
{
	static const char digits[] = "0123456789abcdef";
	char *out = malloc(2 * len + 3), *o = out;
	if (!out)
		return NULL;
	*o++ = '\\';
	*o++ = 'x';
	for (size_t i = 0; i < len; i++) {
		*o++ = digits[(unsigned char)data[i] >> 4];
		*o++ = digits[(unsigned char)data[i] & 15];
	}
	*o = '\0';
	return out;
}

void pgrow_kv_int(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col)
{
	if (PQgetisnull(res, row, col))
		pgc_pack_kv_nil(pk, key);
	else
		pgc_pack_kv_int(pk, key, pgrow_int(res, row, col));
}

void pgrow_kv_str(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col)
{
	pgc_pack_cstr(pk, key);
	if (PQgetisnull(res, row, col))
		msgpack_pack_nil(pk);
	else
		pgc_pack_strn(pk, PQgetvalue(res, row, col), (size_t)PQgetlength(res, row, col));
}

void pgrow_kv_bytea(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col)
{
	size_t len;
	unsigned char *bytes = pgrow_bytea(res, row, col, &len);

	pgc_pack_cstr(pk, key);
	if (!bytes) {
		/* NULL, or out of memory: nil either way, the reply stays well-formed */
		msgpack_pack_nil(pk);
		return;
	}
	msgpack_pack_bin(pk, len);
	msgpack_pack_bin_body(pk, bytes, len);
	PQfreemem(bytes);
}

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

void pgrow_kv_hex_bin(msgpack_packer *pk, const char *key, const PGresult *res, int row, int col)
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
	/* decoded in chunks straight into the packer */
	msgpack_pack_bin(pk, n);
	for (size_t i = 0; i < n; i++) {
		int hi = hexval(v[2 * i]), lo = hexval(v[2 * i + 1]);
		chunk[used++] = (unsigned char)((hi < 0 ? 0 : hi) << 4 | (lo < 0 ? 0 : lo));
		if (used == sizeof(chunk) || i + 1 == n) {
			msgpack_pack_bin_body(pk, chunk, used);
			used = 0;
		}
	}
}

void pgrow_kv_age(msgpack_packer *pk, const char *key, int64_t now_at, const PGresult *res, int row,
		  int col)
{
	if (PQgetisnull(res, row, col))
		pgc_pack_kv_nil(pk, key);
	else
		pgc_pack_kv_int(pk, key, now_at - pgrow_int(res, row, col));
}
