/*
 * reply.c — see reply.h.
 */
#include "agent/reply.h"

#include <msgpack.h>

#include "agent/pgrow.h"
#include "proto/codec.h"

static bool is_cell(const struct reply_col *c)
{
	return c->type <= REPLY_HIDDEN;
}

int reply_kind_width(const struct reply_kind *kind)
{
	int width = 0;

	for (size_t i = 0; i < kind->n; i++) {
		const struct reply_col *c = &kind->cols[i];
		int w = 0;
		if (is_cell(c))
			w = c->col + 1;
		else if (c->type == REPLY_MAP || c->type == REPLY_ROWS)
			w = c->col + reply_kind_width(c->sub);
		else if (c->sub)
			w = reply_kind_width(c->sub);
		if (w > width)
			width = w;
	}
	return width;
}

const char *reply_col_word(const struct reply_col *c)
{
	switch (c->type) {
	case REPLY_INT:
	case REPLY_AGE:
	case REPLY_FIELD_INT:
		return "int";
	case REPLY_STR:
	case REPLY_FIELD_STR:
		return "str";
	case REPLY_BOOL:
	case REPLY_FIELD_BOOL:
		return "bool";
	case REPLY_BYTEA:
	case REPLY_HEX_BIN:
		return "bin";
	case REPLY_FN:
		return c->word;
	case REPLY_MAP:
	case REPLY_MAP_OR_NIL:
		return "map";
	case REPLY_ROWS:
		return "array";
	case REPLY_HIDDEN:
		break;
	}
	return NULL;
}

uint32_t reply_kind_entries(const struct reply_kind *kind)
{
	uint32_t n = 0;

	for (size_t i = 0; i < kind->n; i++)
		if (kind->cols[i].type != REPLY_HIDDEN)
			n++;
	return n;
}

bool reply_kind_fits(const struct reply_kind *kind, const PGresult *res, int offset)
{
	return pgrow_has_cols(res, offset + reply_kind_width(kind));
}

static void pack_col(msgpack_packer *pk, const struct reply_col *c, const struct reply_src *src)
{
	const PGresult *res = src->res;
	int row = src->row, col = src->offset + c->col;
	/* a reply from a result alone has no struct: no pointer arithmetic on NULL */
	const char *field = src->c ? (const char *)src->c + c->off : NULL;

	if (is_cell(c) && (!res || row < 0)) {
		/* no row (a watched permit that does not exist): each cell nil */
		if (c->type != REPLY_HIDDEN)
			pgc_pack_kv_nil(pk, c->name);
		return;
	}
	switch (c->type) {
	case REPLY_INT:
		pgrow_kv_int(pk, c->name, res, row, col);
		return;
	case REPLY_STR:
		pgrow_kv_str(pk, c->name, res, row, col);
		return;
	case REPLY_BOOL:
		pgc_pack_kv_bool(pk, c->name, pgrow_bool(res, row, col));
		return;
	case REPLY_BYTEA:
		pgrow_kv_bytea(pk, c->name, res, row, col);
		return;
	case REPLY_HEX_BIN:
		pgrow_kv_hex_bin(pk, c->name, res, row, col);
		return;
	case REPLY_AGE:
		pgrow_kv_age(pk, c->name, pgrow_int(res, row, src->offset + c->now_col), res, row,
			     col);
		return;
	case REPLY_HIDDEN:
		return;
	default:
		break;
	}
	pgc_pack_cstr(pk, c->name);
	switch (c->type) {
	case REPLY_FIELD_INT:
		msgpack_pack_int64(pk, *(const int64_t *)(const void *)field);
		break;
	case REPLY_FIELD_STR: {
		const char *str = *(const char *const *)(const void *)field;
		if (str)
			pgc_pack_cstr(pk, str);
		else
			msgpack_pack_nil(pk);
		break;
	}
	case REPLY_FIELD_BOOL:
		if (*(const bool *)(const void *)field)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		break;
	case REPLY_FN:
		c->fn(pk, field, src);
		break;
	case REPLY_MAP: {
		struct reply_src sub = *src;
		sub.c = field;
		sub.offset += c->col;
		reply_pack(pk, c->sub, &sub);
		break;
	}
	case REPLY_MAP_OR_NIL: {
		struct reply_src sub = *src;
		sub.c = *(const void *const *)(const void *)field;
		if (sub.c)
			reply_pack(pk, c->sub, &sub);
		else
			msgpack_pack_nil(pk);
		break;
	}
	case REPLY_ROWS: {
		struct reply_src sub = *src;
		sub.offset += c->col;
		msgpack_pack_array(pk, (size_t)(src->nrows > 0 ? src->nrows : 0));
		for (int i = 0; i < src->nrows; i++) {
			sub.row = src->row + i;
			sub.nrows = 1;
			reply_pack(pk, c->sub, &sub);
		}
		break;
	}
	default:
		break;
	}
}

void reply_pack(msgpack_packer *pk, const struct reply_kind *kind, const struct reply_src *src)
{
	msgpack_pack_map(pk, reply_kind_entries(kind));
	for (size_t i = 0; i < kind->n; i++)
		pack_col(pk, &kind->cols[i], src);
}

void reply_pack_struct(msgpack_packer *pk, const struct reply_kind *kind, const void *c)
{
	struct reply_src src = {.c = c};

	reply_pack(pk, kind, &src);
}

void reply_pack_row(msgpack_packer *pk, const struct reply_kind *kind, const PGresult *res, int row,
		    int offset)
{
	struct reply_src src = {.res = res, .row = row, .nrows = 1, .offset = offset};

	reply_pack(pk, kind, &src);
}
