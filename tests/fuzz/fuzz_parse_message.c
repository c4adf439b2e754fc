/*
 * fuzz_parse_message.c — libFuzzer target for the envelope check
 * (pgc_parse_message) and the typed readers handlers use on params.
 *
 * An input is taken the way the agent takes it: scanned by pgc_scanner with
 * the default limits (size, depth and object count), then decoded with msgpack-c. Whatever the
 * parser answers must be coherent (an accepted request has a method and a map or no params; a
 * refusal has a one-line reason). Every value in the tree then goes
 * through every typed reader, and an accepted request is packed again with
 * the codec's writers and must parse back to the same message.
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "parse message: " __VA_ARGS__);                            \
			fputc('\n', stderr);                                                       \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* Each reader must either refuse or give a value consistent with the type. */
static void read_every_way(const msgpack_object *o)
{
	const char *s;
	size_t n;
	int64_t i;
	uint64_t u;
	bool b;
	double d;

	CHECK(pgc_obj_type_name(o) != NULL, "no type name");
	if (pgc_obj_str(o, &s, &n)) {
		CHECK(o->type == MSGPACK_OBJECT_STR, "str read from a %s", pgc_obj_type_name(o));
		char *copy = pgc_obj_strdup(o);
		/* an empty str may have a NULL pointer: no mem* calls on it */
		CHECK(copy ? strlen(copy) == n && (n == 0 || memcmp(copy, s, n) == 0)
			   : n > 0 && memchr(s, '\0', n) != NULL,
		      "strdup of a %zu-byte str", n);
		if (copy)
			CHECK(pgc_obj_str_eq(o, copy), "a str differs from its own copy");
		free(copy);
		(void)pgc_error_from_name(s, n);
	} else {
		CHECK(pgc_obj_strdup(o) == NULL, "strdup of a %s", pgc_obj_type_name(o));
	}
	if (pgc_obj_int64(o, &i) && pgc_obj_uint64(o, &u))
		CHECK(i >= 0 && (uint64_t)i == u, "int64 %lld and uint64 %llu of one value",
		      (long long)i, (unsigned long long)u);
	if (pgc_obj_bool(o, &b))
		CHECK(o->type == MSGPACK_OBJECT_BOOLEAN, "bool read from a %s",
		      pgc_obj_type_name(o));
	(void)pgc_obj_double(o, &d);
}

/* Visits the tree; the scanner bounded its depth, so recursion is safe. */
static void walk(const msgpack_object *o)
{
	read_every_way(o);
	if (o->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t k = 0; k < o->via.array.size; k++)
			walk(&o->via.array.ptr[k]);
	} else if (o->type == MSGPACK_OBJECT_MAP) {
		for (uint32_t k = 0; k < o->via.map.size; k++) {
			const msgpack_object_kv *kv = &o->via.map.ptr[k];
			walk(&kv->key);
			walk(&kv->val);
			/* a lookup by this key finds this or an earlier equal key */
			char *key = pgc_obj_strdup(&kv->key);
			if (key) {
				const msgpack_object *found = pgc_map_get(o, key);
				CHECK(found != NULL && found <= &kv->val,
				      "map_get missed key \"%s\"", key);
				free(key);
			}
		}
	}
}

/* Packs an accepted request with the codec's writers and parses it again. */
static void round_trip(const struct pgc_message *m)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;
	struct pgc_message again;
	char err[256];
	size_t frame_len = 0, off = 0;
	char *method = malloc(m->method_len + 1);

	if (!method)
		return;
	memcpy(method, m->method, m->method_len);
	method[m->method_len] = '\0';
	if (strlen(method) != m->method_len) { /* a NUL inside: C strings cannot carry it */
		free(method);
		return;
	}
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_request_begin(&pk, m->msgid, method);
	if (m->params)
		msgpack_pack_object(&pk, *m->params);
	else
		msgpack_pack_map(&pk, 0);
	CHECK(pgc_frame_scan(sb.data, sb.size, (size_t)-1, PGC_DEFAULT_MAX_DEPTH, &frame_len) ==
		      PGC_SCAN_COMPLETE &&
		  frame_len == sb.size,
	      "a packed request is not one frame");
	msgpack_unpacked_init(&u);
	CHECK(msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS,
	      "a packed request does not decode");
	CHECK(pgc_parse_message(&u.data, &again, err, sizeof(err)), "a packed request refused: %s",
	      err);
	CHECK(again.type == PGC_RPC_REQUEST && again.msgid == m->msgid &&
		  again.method_len == m->method_len &&
		  memcmp(again.method, m->method, m->method_len) == 0,
	      "a packed request came back different");
	CHECK(again.params && again.params->type == MSGPACK_OBJECT_MAP &&
		  again.params->via.map.size == (m->params ? m->params->via.map.size : 0),
	      "a packed request's params came back different");
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	free(method);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	msgpack_unpacked u;
	struct pgc_scanner scan;
	struct pgc_message m;
	char err[128];
	size_t frame_len = 0, off = 0;

	/* Only what the agent would decode: a bounded, complete frame. */
	pgc_scanner_init(&scan, PGC_DEFAULT_MAX_MESSAGE, PGC_DEFAULT_MAX_DEPTH,
			 PGC_DEFAULT_MAX_OBJECTS);
	if (pgc_scanner_feed(&scan, data, size, &frame_len) != PGC_SCAN_COMPLETE)
		return 0;
	msgpack_unpacked_init(&u);
	CHECK(msgpack_unpack_next(&u, (const char *)data, frame_len, &off) ==
		  MSGPACK_UNPACK_SUCCESS,
	      "a scanned frame does not decode");

	memset(err, 0x7f, sizeof(err));
	if (pgc_parse_message(&u.data, &m, err, sizeof(err))) {
		CHECK(m.type >= PGC_RPC_REQUEST && m.type <= PGC_RPC_NOTIFY, "type %d", m.type);
		if (m.type != PGC_RPC_RESPONSE) {
			CHECK(m.method && m.method_len > 0, "accepted without a method");
			CHECK(!m.params || m.params->type == MSGPACK_OBJECT_MAP, "params are a %s",
			      pgc_obj_type_name(m.params));
		} else {
			CHECK(m.result, "a response without a result");
			CHECK(!m.error || m.error->type == MSGPACK_OBJECT_MAP, "error is a %s",
			      pgc_obj_type_name(m.error));
		}
		if (m.type == PGC_RPC_REQUEST)
			round_trip(&m);
	} else {
		CHECK(memchr(err, '\0', sizeof(err)) != NULL, "an unterminated reason");
		CHECK(err[0] != '\0' && strchr(err, '\n') == NULL, "reason \"%s\"", err);
	}
	walk(&u.data);
	msgpack_unpacked_destroy(&u);
	return 0;
}
