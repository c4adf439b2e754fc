/*
 * reply.h — reply maps that count their own entries, and row kinds
 * declared once as column tables.
 *
 * A row kind is a table of {wire name, type, result column}: the one
 * place that says which cell of a statement becomes which key. Packing a
 * row from it counts the map itself, and the table also says how many
 * columns the statement must have (reply_kind_fits), so a statement and
 * the code reading it cannot silently disagree.
 *
 * A whole reply is a table too: besides result cells, a column can be a
 * field of a C struct the handler fills (by offsetof), a value a callback
 * packs, or a nested map or array of maps declared by another table.
 * dispatch.c names each method's reply tables, and unit-dispatch checks
 * them against the `Result:` of the method in proto/PROTOCOL.md.
 *
 * Notifications are tables too (notices.h), checked against PROTOCOL.md's
 * "Notifications" the same way. No reply or notification is packed by
 * hand: only this file (and the cell packers of pgrow.c it calls) writes
 * a map size or a key.
 */
#ifndef PGCOORD_AGENT_REPLY_H
#define PGCOORD_AGENT_REPLY_H

#include <libpq-fe.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum reply_type {
	REPLY_INT,     /* integer cell */
	REPLY_STR,     /* text cell */
	REPLY_BOOL,    /* boolean cell ("t"); false for NULL */
	REPLY_BYTEA,   /* bytea cell, in either bytea_output format, as bin */
	REPLY_HEX_BIN, /* text of hex digits (encode(…, 'hex')) as bin */
	REPLY_AGE,     /* the cell `now_col` minus this cell, in ms; nil for NULL */
	REPLY_HIDDEN,  /* a column the handler reads itself: counted, not sent */
	/* not cells: from the source's C struct, or packed by code */
	REPLY_FIELD_INT,  /* int64_t at .off */
	REPLY_FIELD_STR,  /* const char * at .off; nil when NULL */
	REPLY_FIELD_BOOL, /* bool at .off */
	REPLY_FN,	  /* .fn packs one value; .word is its type in PROTOCOL.md */
	REPLY_MAP,	  /* a map of .sub, from the struct embedded at .off; its cells
			     shifted by .col */
	REPLY_MAP_OR_NIL, /* a map of .sub from the struct a pointer at .off points to;
			     nil when it is NULL */
	REPLY_ROWS,	  /* an array of .sub maps, one per row of the source; cells
			     shifted by .col */
};

struct reply_kind;

/* What a reply table is packed from: rows of a result (row .. row +
 * nrows - 1; cells are read from .row, their columns shifted by .offset)
 * and a C struct for the fields. With no result, or row < 0 (what it
 * describes does not exist), every cell is nil. */
struct reply_src {
	const PGresult *res;
	int row;
	int nrows;
	int offset;
	const void *c;
};

struct reply_col {
	const char *name;
	enum reply_type type;
	int col;
	int now_col; /* REPLY_AGE only: the column of the database's now */
	size_t off;  /* REPLY_FIELD_*, REPLY_MAP*, REPLY_FN: where in the source struct */
	/* REPLY_MAP*, REPLY_ROWS; for REPLY_FN, the shape of what it packs */
	const struct reply_kind *sub;
	/* REPLY_FN: packs the value from field (the source struct + .off) */
	void (*fn)(msgpack_packer *pk, const void *field, const struct reply_src *src);
	const char *word; /* REPLY_FN */
};

/* Columns that are not cells, declared by their source. */
#define REPLY_FIELD(key, t, type_, member)                                                         \
	{                                                                                          \
		.name = (key), .type = (t), .col = -1, .off = offsetof(type_, member)              \
	}
#define REPLY_CALL(key, word_, fn_)                                                                \
	{                                                                                          \
		.name = (key), .type = REPLY_FN, .col = -1, .fn = (fn_), .word = (word_)           \
	}
#define REPLY_CALL_AT(key, word_, fn_, type_, member)                                              \
	{                                                                                          \
		.name = (key), .type = REPLY_FN, .col = -1, .fn = (fn_), .word = (word_),          \
		.off = offsetof(type_, member)                                                     \
	}
#define REPLY_NESTED(key, kind, type_, member)                                                     \
	{                                                                                          \
		.name = (key), .type = REPLY_MAP, .col = 0, .sub = &(kind),                        \
		.off = offsetof(type_, member)                                                     \
	}
#define REPLY_NESTED_OR_NIL(key, kind, type_, member)                                              \
	{                                                                                          \
		.name = (key), .type = REPLY_MAP_OR_NIL, .col = -1, .sub = &(kind),                \
		.off = offsetof(type_, member)                                                     \
	}
#define REPLY_EACH_ROW(key, kind, shift)                                                           \
	{                                                                                          \
		.name = (key), .type = REPLY_ROWS, .col = (shift), .sub = &(kind)                  \
	}
/* An array of kind's maps that fn packs (it picks the rows). */
#define REPLY_CALL_ROWS(key, kind, fn_)                                                            \
	{                                                                                          \
		.name = (key), .type = REPLY_FN, .col = -1, .fn = (fn_), .word = "array",          \
		.sub = &(kind)                                                                     \
	}
/* A map of kind, or nil, that fn packs. */
#define REPLY_CALL_MAP(key, kind, fn_)                                                             \
	{                                                                                          \
		.name = (key), .type = REPLY_FN, .col = -1, .fn = (fn_), .word = "map",            \
		.sub = &(kind)                                                                     \
	}
/* A map of kind from the source's row, its cells shifted by shift. */
#define REPLY_ROW_AT(key, kind, shift)                                                             \
	{                                                                                          \
		.name = (key), .type = REPLY_MAP, .col = (shift), .sub = &(kind)                   \
	}

/* A row kind, or a whole reply: its columns, in the order they go on the
 * wire. */
struct reply_kind {
	const struct reply_col *cols;
	size_t n;
};

#define REPLY_KIND(table)                                                                          \
	{                                                                                          \
		(table), sizeof(table) / sizeof((table)[0])                                        \
	}

/* The type a column shows on the wire, as PROTOCOL.md writes it ("int",
 * "str", "bool", "bin", "map", "array"); NULL for REPLY_HIDDEN. */
const char *reply_col_word(const struct reply_col *c);

/* One reply of a table as a map, from src. */
void reply_pack(msgpack_packer *pk, const struct reply_kind *kind, const struct reply_src *src);

/* A reply of a table whose columns are all fields of the struct c. */
void reply_pack_struct(msgpack_packer *pk, const struct reply_kind *kind, const void *c);

/* How many columns a statement of this kind has: one past the highest
 * column the table names (every column must be named, REPLY_HIDDEN for
 * those the handler reads itself). */
int reply_kind_width(const struct reply_kind *kind);

/* How many entries a row of this kind packs (REPLY_HIDDEN not counted). */
uint32_t reply_kind_entries(const struct reply_kind *kind);

/* True when res has exactly offset + reply_kind_width() columns. */
bool reply_kind_fits(const struct reply_kind *kind, const PGresult *res, int offset);

/* One row of a kind as a map of its own. */
void reply_pack_row(msgpack_packer *pk, const struct reply_kind *kind, const PGresult *res, int row,
		    int offset);

#endif
