/*
 * typed_read.h — the one way libpgcoord turns a reply into a C struct: a
 * field table per row kind (key, type, where it lands), a decoder for
 * arrays of rows, and one call that sends, checks the reply is a map,
 * decodes it into a box the library allocates and frees it all again
 * when anything is wrong. Each typed read is then its table and its
 * few special cases.
 */
#ifndef PGCOORD_CLIENT_TYPED_READ_H
#define PGCOORD_CLIENT_TYPED_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "handle.h"

enum pgcoord__field_type {
	PGCOORD__STR,  /* const char *, the library's copy; NULL when absent or nil */
	PGCOORD__INT,  /* int64_t; dflt when absent or nil */
	PGCOORD__BOOL, /* bool; false when absent or nil */
};

/* One field of a row: map[in][key] (map[key] when in is NULL) stored at
 * offset. A required field that is absent, nil or of another type makes
 * the row malformed. */
struct pgcoord__field {
	const char *key;
	const char *in;
	enum pgcoord__field_type type;
	size_t offset;
	int64_t dflt;
	bool required;
};

#define PGCOORD__NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* A table row for member of struct st; _IN for one inside map `in`. */
#define PGCOORD__FIELD(st, key, type, member, dflt, required)                                      \
	{                                                                                          \
		(key), NULL, PGCOORD__##type, offsetof(st, member), (dflt), (required)             \
	}
#define PGCOORD__FIELD_IN(st, in, key, type, member, dflt)                                         \
	{                                                                                          \
		(key), (in), PGCOORD__##type, offsetof(st, member), (dflt), false                  \
	}

/* Fills row from map by table f; false when a required field is missing or
 * memory ran out (what was copied stays for pgcoord__fields_free). */
bool pgcoord__fields_read(const msgpack_object *map, const struct pgcoord__field *f, size_t n,
			  void *row);
/* Frees the strings table f put into row. */
void pgcoord__fields_free(const struct pgcoord__field *f, size_t n, void *row);

/* map[key] as an integer, dflt when absent, nil or not an integer. */
int64_t pgcoord__int_or(const msgpack_object *map, const char *key, int64_t dflt);

/* map[key], which must be an array, decoded row by row (row_fn(m, row,
 * arg)) into a new array of row_size elements (*rows; freed by the caller,
 * also on failure). *count includes a half-read row, so a clear function
 * sees everything copied. */
bool pgcoord__rows_read(const msgpack_object *map, const char *key, size_t row_size,
			bool (*row_fn)(const msgpack_object *m, void *row, const void *arg),
			const void *arg, void **rows, size_t *count);
/* Clears count rows (clear may be NULL) and frees the array. */
void pgcoord__rows_free(void *rows, size_t count, size_t row_size, void (*clear)(void *row));

/* A row that is its field table and nothing else. */
struct pgcoord__row_kind {
	const struct pgcoord__field *fields;
	size_t nfields;
	size_t size;
};

#define PGCOORD__ROW_KIND(st, table)                                                               \
	{                                                                                          \
		(table), PGCOORD__NFIELDS(table), sizeof(st)                                       \
	}

/* pgcoord__rows_read and _free for rows of such a kind. */
bool pgcoord__table_read(const msgpack_object *map, const char *key,
			 const struct pgcoord__row_kind *k, void **rows, size_t *count);
void pgcoord__table_free(void *rows, size_t count, const struct pgcoord__row_kind *k);

/* What a typed read decodes: box_size bytes are allocated zeroed, read
 * fills them from the result map and free_box releases a (partly) filled
 * box. malformed is the message for a result read refuses. */
struct pgcoord__reply_kind {
	size_t box_size;
	bool (*read)(const msgpack_object *result, void *box);
	void (*free_box)(void *box);
	const char *malformed;
};

/* Decodes a raw result into a new box in *out, given what the call
 * answered (err; raw is freed here whatever happens). */
PGCOORD_WUR pgcoord_err pgcoord__typed_result(pgcoord *c, pgcoord_err err, void *raw,
					      size_t raw_len, const struct pgcoord__reply_kind *k,
					      void **out);

/* Calls method with the params in w (consumed) and decodes its result. */
PGCOORD_WUR pgcoord_err pgcoord__typed_call(pgcoord *c, const char *method,
					    struct pgcoord_writer *w, int timeout_ms,
					    const struct pgcoord__reply_kind *k, void **out);

/* A method that takes no params: checks c and out (PGCOORD_E_ARG), sends
 * {} and decodes the result. */
PGCOORD_WUR pgcoord_err pgcoord__typed_get(pgcoord *c, const char *method, int timeout_ms,
					   const struct pgcoord__reply_kind *k, void **out);

#endif
