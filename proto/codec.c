/*
 * codec.c — the MessagePack-RPC wire format of proto/PROTOCOL.md: a frame
 * scanner that bounds size and depth before anything is buffered, envelope
 * checks, typed reads and writes, and the error-code table.
 */
#include "proto/codec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum head_kind {
	HEAD_SCALAR,	/* the header is the whole object */
	HEAD_BLOB,	/* str/bin/ext: a length field, then that many bytes */
	HEAD_ARRAY,	/* a count field, then count objects */
	HEAD_MAP,	/* a count field, then 2 * count objects */
	HEAD_MALFORMED, /* 0xc1, which starts no type */
};

struct head {
	enum head_kind kind;
	size_t size;	     /* bytes of the header, fixed payloads included */
	unsigned len_bytes;  /* width of the big-endian length/count after the type byte */
	uint32_t inline_len; /* the length or count carried in the type byte itself */
};

static struct head head_of(uint8_t b)
{
	struct head h = {HEAD_SCALAR, 1, 0, 0};

	if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
		return h;
	if (b <= 0x8f) {
		h.kind = HEAD_MAP;
		h.inline_len = b & 0x0f;
		return h;
	}
	if (b <= 0x9f) {
		h.kind = HEAD_ARRAY;
		h.inline_len = b & 0x0f;
		return h;
	}
	if (b <= 0xbf) {
		h.kind = HEAD_BLOB;
		h.inline_len = b & 0x1f;
		return h;
	}
	switch (b) {
	case 0xc4: /* bin 8/16/32 */
	case 0xd9: /* str 8/16/32 */
		h.kind = HEAD_BLOB;
		h.len_bytes = 1;
		break;
	case 0xc5:
	case 0xda:
		h.kind = HEAD_BLOB;
		h.len_bytes = 2;
		break;
	case 0xc6:
	case 0xdb:
		h.kind = HEAD_BLOB;
		h.len_bytes = 4;
		break;
	case 0xc7: /* ext 8/16/32: the type byte follows the length */
		h.kind = HEAD_BLOB;
		h.len_bytes = 1;
		h.size = 2;
		break;
	case 0xc8:
		h.kind = HEAD_BLOB;
		h.len_bytes = 2;
		h.size = 2;
		break;
	case 0xc9:
		h.kind = HEAD_BLOB;
		h.len_bytes = 4;
		h.size = 2;
		break;
	case 0xca: /* float 32/64 */
		h.size = 5;
		break;
	case 0xcb:
		h.size = 9;
		break;
	case 0xcc: /* uint 8/16/32/64 and int 8/16/32/64 */
	case 0xd0:
		h.size = 2;
		break;
	case 0xcd:
	case 0xd1:
		h.size = 3;
		break;
	case 0xce:
	case 0xd2:
		h.size = 5;
		break;
	case 0xcf:
	case 0xd3:
		h.size = 9;
		break;
	case 0xd4: /* fixext 1/2/4/8/16: type byte + data */
		h.size = 3;
		break;
	case 0xd5:
		h.size = 4;
		break;
	case 0xd6:
		h.size = 6;
		break;
	case 0xd7:
		h.size = 10;
		break;
	case 0xd8:
		h.size = 18;
		break;
	case 0xdc: /* array 16/32 */
		h.kind = HEAD_ARRAY;
		h.len_bytes = 2;
		break;
	case 0xdd:
		h.kind = HEAD_ARRAY;
		h.len_bytes = 4;
		break;
	case 0xde: /* map 16/32 */
		h.kind = HEAD_MAP;
		h.len_bytes = 2;
		break;
	case 0xdf:
		h.kind = HEAD_MAP;
		h.len_bytes = 4;
		break;
	default: /* 0xc1 */
		h.kind = HEAD_MALFORMED;
		break;
	}
	h.size += h.len_bytes;
	return h;
}

static uint32_t load_be(const uint8_t *p, unsigned n)
{
	uint32_t v = 0;

	for (unsigned i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

void pgc_scanner_init(struct pgc_scanner *s, size_t max_size, unsigned max_depth,
		      size_t max_objects)
{
	s->max_size = max_size;
	s->max_depth = max_depth > PGC_SCAN_DEPTH_CEILING ? PGC_SCAN_DEPTH_CEILING : max_depth;
	s->max_objects = max_objects;
	pgc_scanner_reset(s);
}

void pgc_scanner_reset(struct pgc_scanner *s)
{
	s->depth = 0;
	s->pos = 0;
	s->owed = 1;
	s->objects = 1;
	s->blob_end = 0;
	s->error = PGC_SCAN_COMPLETE;
	if (s->max_size < s->owed)
		s->error = PGC_SCAN_TOO_BIG;
	else if (s->max_objects < s->objects)
		s->error = PGC_SCAN_TOO_MANY;
}

/* Remembers an error so later calls on the same frame repeat it. */
static enum pgc_scan_result scan_fail(struct pgc_scanner *s, enum pgc_scan_result r)
{
	s->error = r;
	return r;
}

/*
 * Invariant: pos + owed <= max_size, where owed counts the objects still to be
 * read (each takes at least one byte). Every declared length or count is
 * checked against that bound before we wait for its bytes, so TOO_BIG is
 * reported as soon as the header is visible, and pos never passes max_size.
 * pos only moves past whole headers and whole payloads, so a call resumes
 * exactly where the previous one stopped.
 */
enum pgc_scan_result pgc_scanner_feed(struct pgc_scanner *s, const void *buf, size_t len,
				      size_t *frame_len)
{
	const uint8_t *p = buf;

	if (s->error != PGC_SCAN_COMPLETE)
		return s->error;
	if (s->blob_end > s->pos) {
		if (len < s->blob_end)
			goto need_more;
		s->pos = s->blob_end;
		while (s->depth > 0 && s->remaining[s->depth - 1] == 0)
			s->depth--;
	}
	while (s->owed > 0) {
		if (s->pos >= len)
			goto need_more;

		struct head h = head_of(p[s->pos]);
		if (h.kind == HEAD_MALFORMED)
			return scan_fail(s, PGC_SCAN_MALFORMED);
		/* owed already reserved one byte of this object. */
		if (h.size - 1 > s->max_size - s->pos - s->owed)
			return scan_fail(s, PGC_SCAN_TOO_BIG);
		if (len - s->pos < h.size)
			goto need_more;

		uint64_t n = h.inline_len;
		if (h.len_bytes > 0)
			n = load_be(p + s->pos + 1, h.len_bytes);
		s->pos += h.size;
		s->owed--;
		if (s->depth > 0)
			s->remaining[s->depth - 1]--;
		/* Room for everything still owed after this object, at one byte each. */
		uint64_t room = s->max_size - s->pos - s->owed;

		switch (h.kind) {
		case HEAD_BLOB:
			if (n > room)
				return scan_fail(s, PGC_SCAN_TOO_BIG);
			if (len - s->pos < n) {
				s->blob_end = s->pos + (size_t)n;
				goto need_more;
			}
			s->pos += n;
			break;
		case HEAD_MAP:
		case HEAD_ARRAY:
			if (h.kind == HEAD_MAP)
				n *= 2; /* at most 2 * UINT32_MAX, fits in 64 bits */
			if (n > room)
				return scan_fail(s, PGC_SCAN_TOO_BIG);
			if (s->depth >= s->max_depth)
				return scan_fail(s, PGC_SCAN_TOO_DEEP);
			/* objects <= max_objects, so this cannot wrap */
			if (n > s->max_objects - s->objects)
				return scan_fail(s, PGC_SCAN_TOO_MANY);
			if (n > 0) {
				s->remaining[s->depth++] = (size_t)n;
				s->owed += n;
				s->objects += n;
			}
			break;
		default:
			break;
		}
		while (s->depth > 0 && s->remaining[s->depth - 1] == 0)
			s->depth--;
	}
	*frame_len = s->pos;
	pgc_scanner_reset(s);
	return PGC_SCAN_COMPLETE;

need_more:
	/* The invariant already implies len <= max_size here; the promise that no
	 * caller buffers past max_size should not rest on that proof alone. */
	if (len > s->max_size)
		return scan_fail(s, PGC_SCAN_TOO_BIG);
	return PGC_SCAN_NEED_MORE;
}

enum pgc_scan_result pgc_frame_scan(const void *buf, size_t len, size_t max_size,
				    unsigned max_depth, size_t *frame_len)
{
	struct pgc_scanner s;

	pgc_scanner_init(&s, max_size, max_depth, SIZE_MAX);
	return pgc_scanner_feed(&s, buf, len, frame_len);
}

const char *pgc_scan_result_name(enum pgc_scan_result r)
{
	switch (r) {
	case PGC_SCAN_NEED_MORE:
		return "need_more";
	case PGC_SCAN_COMPLETE:
		return "complete";
	case PGC_SCAN_TOO_BIG:
		return "too_big";
	case PGC_SCAN_TOO_DEEP:
		return "too_deep";
	case PGC_SCAN_MALFORMED:
		return "malformed";
	case PGC_SCAN_TOO_MANY:
		return "too_many";
	}
	return "unknown";
}

static bool fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes the reason to err and returns false, so checks read as one line. */
static bool fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err != NULL && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return false;
}

static bool read_msgid(const msgpack_object *o, uint32_t *out)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
		return false;
	*out = (uint32_t)o->via.u64;
	return true;
}

static bool read_method(const msgpack_object *o, struct pgc_message *out)
{
	if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0)
		return false;
	out->method = o->via.str.ptr;
	out->method_len = o->via.str.size;
	return true;
}

/* params is [] (an empty map) or [map]. */
static bool read_params(const msgpack_object *o, const char *kind, struct pgc_message *out,
			char *err, size_t errlen)
{
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return fail(err, errlen, "%s params must be an array of 0 or 1 element, got %s",
			    kind, pgc_obj_type_name(o));
	if (o->via.array.size > 1)
		return fail(err, errlen,
			    "%s params must be an array of 0 or 1 element, got %u elements", kind,
			    o->via.array.size);
	if (o->via.array.size == 0)
		return true;
	const msgpack_object *map = &o->via.array.ptr[0];
	if (map->type != MSGPACK_OBJECT_MAP)
		return fail(err, errlen, "%s params[0] must be a map, got %s", kind,
			    pgc_obj_type_name(map));
	out->params = map;
	return true;
}

bool pgc_parse_message(const msgpack_object *root, struct pgc_message *out, char *err,
		       size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (root == NULL || root->type != MSGPACK_OBJECT_ARRAY)
		return fail(err, errlen, "message must be an array, got %s",
			    pgc_obj_type_name(root));

	const msgpack_object *el = root->via.array.ptr;
	uint32_t n = root->via.array.size;
	if (n == 0)
		return fail(err, errlen, "message must be a non-empty array");
	if (el[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || el[0].via.u64 > PGC_RPC_NOTIFY)
		return fail(err, errlen, "message type must be 0, 1 or 2");

	switch (el[0].via.u64) {
	case PGC_RPC_REQUEST:
		if (n != 4)
			return fail(err, errlen, "request must have 4 elements, got %u", n);
		if (!read_msgid(&el[1], &out->msgid))
			return fail(err, errlen,
				    "request msgid must be an unsigned 32-bit integer");
		out->type = PGC_RPC_REQUEST;
		if (!read_method(&el[2], out))
			return fail(err, errlen, "request method must be a non-empty str");
		return read_params(&el[3], "request", out, err, errlen);

	case PGC_RPC_RESPONSE:
		if (n != 4)
			return fail(err, errlen, "response must have 4 elements, got %u", n);
		if (!read_msgid(&el[1], &out->msgid))
			return fail(err, errlen,
				    "response msgid must be an unsigned 32-bit integer");
		out->type = PGC_RPC_RESPONSE;
		if (el[2].type == MSGPACK_OBJECT_MAP) {
			if (el[3].type != MSGPACK_OBJECT_NIL)
				return fail(err, errlen,
					    "response result must be nil when error is set, got %s",
					    pgc_obj_type_name(&el[3]));
			out->error = &el[2];
		} else if (el[2].type != MSGPACK_OBJECT_NIL) {
			return fail(err, errlen, "response error must be nil or a map, got %s",
				    pgc_obj_type_name(&el[2]));
		} else if (el[3].type != MSGPACK_OBJECT_MAP) {
			return fail(err, errlen, "response result must be a map, got %s",
				    pgc_obj_type_name(&el[3]));
		}
		out->result = &el[3];
		return true;

	default:
		if (n != 3)
			return fail(err, errlen, "notification must have 3 elements, got %u", n);
		out->type = PGC_RPC_NOTIFY;
		if (!read_method(&el[1], out))
			return fail(err, errlen, "notification method must be a non-empty str");
		return read_params(&el[2], "notification", out, err, errlen);
	}
}

/* The first matching key wins; duplicates are the sender's bug, not ours. */
const msgpack_object *pgc_map_get(const msgpack_object *map, const char *key)
{
	if (map == NULL || map->type != MSGPACK_OBJECT_MAP || key == NULL)
		return NULL;
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object_kv *kv = &map->via.map.ptr[i];
		if (pgc_obj_str_eq(&kv->key, key))
			return &kv->val;
	}
	return NULL;
}

bool pgc_obj_str(const msgpack_object *o, const char **s, size_t *len)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_STR)
		return false;
	*s = o->via.str.ptr;
	*len = o->via.str.size;
	return true;
}

bool pgc_obj_str_eq(const msgpack_object *o, const char *s)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_STR || s == NULL)
		return false;
	size_t n = strlen(s);
	return o->via.str.size == n && (n == 0 || memcmp(o->via.str.ptr, s, n) == 0);
}

bool pgc_obj_int64(const msgpack_object *o, int64_t *out)
{
	if (o == NULL)
		return false;
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
		*out = (int64_t)o->via.u64;
		return true;
	}
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*out = o->via.i64;
		return true;
	}
	return false;
}

bool pgc_obj_uint64(const msgpack_object *o, uint64_t *out)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return false;
	*out = o->via.u64;
	return true;
}

bool pgc_obj_bool(const msgpack_object *o, bool *out)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_BOOLEAN)
		return false;
	*out = o->via.boolean;
	return true;
}

bool pgc_obj_double(const msgpack_object *o, double *out)
{
	if (o == NULL)
		return false;
	switch (o->type) {
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		*out = o->via.f64;
		return true;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		*out = (double)o->via.u64;
		return true;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		*out = (double)o->via.i64;
		return true;
	default:
		return false;
	}
}

/* A NUL inside would silently truncate the value for every C consumer. */
char *pgc_obj_strdup(const msgpack_object *o)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_STR)
		return NULL;
	size_t n = o->via.str.size;
	if (n > 0 && memchr(o->via.str.ptr, '\0', n) != NULL)
		return NULL;
	char *s = malloc(n + 1);
	if (s == NULL)
		return NULL;
	if (n > 0)
		memcpy(s, o->via.str.ptr, n);
	s[n] = '\0';
	return s;
}

const char *pgc_obj_type_name(const msgpack_object *o)
{
	if (o == NULL)
		return "missing";
	switch (o->type) {
	case MSGPACK_OBJECT_NIL:
		return "nil";
	case MSGPACK_OBJECT_BOOLEAN:
		return "bool";
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		return "int";
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		return "float";
	case MSGPACK_OBJECT_STR:
		return "str";
	case MSGPACK_OBJECT_ARRAY:
		return "array";
	case MSGPACK_OBJECT_MAP:
		return "map";
	case MSGPACK_OBJECT_BIN:
		return "bin";
	case MSGPACK_OBJECT_EXT:
		return "ext";
	}
	return "unknown";
}

void pgc_pack_cstr(msgpack_packer *pk, const char *s)
{
	if (s == NULL) {
		msgpack_pack_nil(pk);
		return;
	}
	pgc_pack_strn(pk, s, strlen(s));
}

void pgc_pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
	if (s == NULL) {
		msgpack_pack_nil(pk);
		return;
	}
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void pgc_pack_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
	pgc_pack_cstr(pk, key);
	pgc_pack_cstr(pk, val);
}

void pgc_pack_kv_int(msgpack_packer *pk, const char *key, int64_t val)
{
	pgc_pack_cstr(pk, key);
	msgpack_pack_int64(pk, val);
}

void pgc_pack_kv_bool(msgpack_packer *pk, const char *key, bool val)
{
	pgc_pack_cstr(pk, key);
	if (val)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

void pgc_pack_kv_double(msgpack_packer *pk, const char *key, double val)
{
	pgc_pack_cstr(pk, key);
	msgpack_pack_double(pk, val);
}

void pgc_pack_kv_nil(msgpack_packer *pk, const char *key)
{
	pgc_pack_cstr(pk, key);
	msgpack_pack_nil(pk);
}

void pgc_pack_request_begin(msgpack_packer *pk, uint32_t msgid, const char *method)
{
	msgpack_pack_array(pk, 4);
	msgpack_pack_uint8(pk, PGC_RPC_REQUEST);
	msgpack_pack_uint32(pk, msgid);
	pgc_pack_cstr(pk, method);
	msgpack_pack_array(pk, 1);
}

void pgc_pack_response_ok_begin(msgpack_packer *pk, uint32_t msgid)
{
	msgpack_pack_array(pk, 4);
	msgpack_pack_uint8(pk, PGC_RPC_RESPONSE);
	msgpack_pack_uint32(pk, msgid);
	msgpack_pack_nil(pk);
}

void pgc_pack_notify_begin(msgpack_packer *pk, const char *method)
{
	msgpack_pack_array(pk, 3);
	msgpack_pack_uint8(pk, PGC_RPC_NOTIFY);
	pgc_pack_cstr(pk, method);
	msgpack_pack_array(pk, 1);
}

void pgc_pack_response_error(msgpack_packer *pk, uint32_t msgid, const char *code,
			     const char *message, bool retryable)
{
	msgpack_pack_array(pk, 4);
	msgpack_pack_uint8(pk, PGC_RPC_RESPONSE);
	msgpack_pack_uint32(pk, msgid);
	msgpack_pack_map(pk, 3);
	pgc_pack_kv_str(pk, "code", code);
	/* The spec says message is a str; never let a NULL become nil. */
	pgc_pack_kv_str(pk, "message", message != NULL ? message : "");
	pgc_pack_kv_bool(pk, "retryable", retryable);
	msgpack_pack_nil(pk);
}

/* Indexed by enum pgc_error_code; order is the table in PROTOCOL.md. */
static const struct {
	const char *name;
	bool retryable;
} error_table[PGC_E__COUNT] = {
    [PGC_E_INVALID_REQUEST] = {"invalid_request", false},
    [PGC_E_METHOD_NOT_FOUND] = {"method_not_found", false},
    [PGC_E_INVALID_PARAMS] = {"invalid_params", false},
    [PGC_E_UNAVAILABLE] = {"unavailable", true},
    [PGC_E_TIMEOUT] = {"timeout", true},
    [PGC_E_BUSY] = {"busy", true},
    [PGC_E_NOT_FOUND] = {"not_found", false},
    [PGC_E_FORBIDDEN] = {"forbidden", false},
    [PGC_E_NO_SESSION] = {"no_session", false},
    [PGC_E_SESSION_EXPIRED] = {"session_expired", false},
    [PGC_E_CONFLICT] = {"conflict", false},
    [PGC_E_FENCED] = {"fenced", false},
    [PGC_E_SUPERSEDED] = {"superseded", false},
    [PGC_E_SHUTTING_DOWN] = {"shutting_down", true},
    [PGC_E_INTERNAL] = {"internal", false},
    [PGC_E_TOO_LARGE] = {"too_large", false},
};

static bool error_code_valid(enum pgc_error_code code)
{
	return (int)code >= PGC_E_INVALID_REQUEST && (int)code < PGC_E__COUNT;
}

/* An unknown code still goes out as a valid wire name rather than nil. */
const char *pgc_error_name(enum pgc_error_code code)
{
	if (!error_code_valid(code))
		return error_table[PGC_E_INTERNAL].name;
	return error_table[code].name;
}

bool pgc_error_retryable(enum pgc_error_code code)
{
	return error_code_valid(code) && error_table[code].retryable;
}

enum pgc_error_code pgc_error_from_name(const char *name, size_t len)
{
	if (name == NULL)
		return PGC_E_INTERNAL;
	for (int c = PGC_E_INVALID_REQUEST; c < PGC_E__COUNT; c++) {
		const char *known = error_table[c].name;
		if (strlen(known) == len && memcmp(known, name, len) == 0)
			return (enum pgc_error_code)c;
	}
	return PGC_E_INTERNAL;
}
