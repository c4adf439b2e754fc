/*
 * codec.h — the MessagePack-RPC wire format shared by pgcoord-agent and
 * libpgcoord: frame scanning, envelopes, typed reads from decoded maps,
 * typed writes, and the error-code table. proto/PROTOCOL.md is the normative
 * description; this file must stay true to it.
 */
#ifndef PGCOORD_PROTO_CODEC_H
#define PGCOORD_PROTO_CODEC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PGC_RPC_REQUEST 0
#define PGC_RPC_RESPONSE 1
#define PGC_RPC_NOTIFY 2

/* Protocol version reported by agent.hello. Bump on incompatible changes. */
#define PGC_PROTOCOL_VERSION 1

#define PGC_DEFAULT_MAX_MESSAGE (1024 * 1024)
#define PGC_DEFAULT_MAX_DEPTH 32
#define PGC_DEFAULT_MAX_OBJECTS 65536

enum pgc_scan_result {
	PGC_SCAN_NEED_MORE, /* the buffer holds only a prefix of one object */
	PGC_SCAN_COMPLETE,  /* *frame_len bytes form exactly one object */
	PGC_SCAN_TOO_BIG,   /* the object is, or declares itself, larger than max_size */
	PGC_SCAN_TOO_DEEP,  /* arrays/maps nest deeper than max_depth */
	PGC_SCAN_MALFORMED, /* a byte that starts no MessagePack type (0xc1) */
	PGC_SCAN_TOO_MANY,  /* the object holds, or declares, more than max_objects objects */
};

/*
 * Finds where the first MessagePack object in buf[0..len) ends, without
 * allocating and without trusting declared lengths: a str/bin/ext header or
 * an array/map count that could not fit in max_size is TOO_BIG at once, so a
 * hostile peer cannot make the reader buffer or allocate more than max_size.
 * Nesting deeper than max_depth is TOO_DEEP. On COMPLETE, *frame_len is set.
 */
enum pgc_scan_result pgc_frame_scan(const void *buf, size_t len, size_t max_size,
				    unsigned max_depth, size_t *frame_len);

const char *pgc_scan_result_name(enum pgc_scan_result r);

/*
 * The scanner keeps one remaining-element count per open container, so it
 * needs a fixed ceiling; a larger max_depth is treated as this one.
 */
#define PGC_SCAN_DEPTH_CEILING 256

/*
 * The same scan, resumable: a reader that receives a frame a few bytes at a
 * time feeds the growing buffer again and again, and each call examines only
 * the bytes it has not seen before (at most a header's few bytes twice), so
 * a peer dribbling one byte per read costs O(1) per read, not O(frame).
 * It also counts the objects a frame holds, so the decoder's allocation
 * (one msgpack_object per element) is bounded before it is made: a container
 * declaring more than max_objects elements in all is TOO_MANY at its header.
 */
struct pgc_scanner {
	size_t max_size;
	size_t max_objects;
	unsigned max_depth;
	unsigned depth;
	size_t pos;		    /* bytes of the frame examined so far */
	size_t owed;		    /* objects still to be read */
	size_t objects;		    /* objects the frame holds, declared ones included */
	size_t blob_end;	    /* > pos while inside a str/bin/ext payload */
	enum pgc_scan_result error; /* COMPLETE while none was found */
	size_t remaining[PGC_SCAN_DEPTH_CEILING];
};

/* Limits as for pgc_frame_scan; max_objects counts every object, the root
 * and each array element, map key and map value (SIZE_MAX = no cap). */
void pgc_scanner_init(struct pgc_scanner *s, size_t max_size, unsigned max_depth,
		      size_t max_objects);

/*
 * buf[0..len) is the frame so far, from its first byte, and begins with the
 * bytes of every earlier call since init/reset (len never shrinks). Returns
 * what pgc_frame_scan would return for the same buffer. After COMPLETE the
 * scanner is reset for the next frame; after an error it keeps returning
 * that error until reset.
 */
enum pgc_scan_result pgc_scanner_feed(struct pgc_scanner *s, const void *buf, size_t len,
				      size_t *frame_len);

/* Starts a new frame with the same limits. */
void pgc_scanner_reset(struct pgc_scanner *s);

/* A decoded envelope. Pointers borrow from the msgpack_object tree. */
struct pgc_message {
	int type;	    /* PGC_RPC_* */
	uint32_t msgid;	    /* requests and responses */
	const char *method; /* requests and notifications; not NUL-terminated */
	size_t method_len;
	const msgpack_object *params; /* the params map; NULL when params is [] */
	const msgpack_object *error;  /* responses: NULL when nil */
	const msgpack_object *result; /* responses */
};

/*
 * Checks the envelope shape: [0, msgid, method, [params_map]],
 * [1, msgid, error, result] or [2, method, [params_map]]. On failure writes a
 * one-line reason to err (which names the offending element) and returns
 * false. When the failure happens after a request's msgid was read,
 * out->type and out->msgid are already set so the caller can still reply.
 */
bool pgc_parse_message(const msgpack_object *root, struct pgc_message *out, char *err,
		       size_t errlen);

/* Typed reads. All return false (and leave *out alone) on a type mismatch. */
const msgpack_object *pgc_map_get(const msgpack_object *map, const char *key);
bool pgc_obj_str(const msgpack_object *o, const char **s, size_t *len);
bool pgc_obj_str_eq(const msgpack_object *o, const char *s);
bool pgc_obj_int64(const msgpack_object *o, int64_t *out);
bool pgc_obj_uint64(const msgpack_object *o, uint64_t *out);
bool pgc_obj_bool(const msgpack_object *o, bool *out);
bool pgc_obj_double(const msgpack_object *o, double *out); /* ints accepted too */
/* A malloc'd NUL-terminated copy of a str; NULL if not a str or if it holds a NUL. */
char *pgc_obj_strdup(const msgpack_object *o);
const char *pgc_obj_type_name(const msgpack_object *o);

/* Typed writes. A NULL string packs nil. */
void pgc_pack_cstr(msgpack_packer *pk, const char *s);
void pgc_pack_strn(msgpack_packer *pk, const char *s, size_t n);
void pgc_pack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void pgc_pack_kv_int(msgpack_packer *pk, const char *key, int64_t val);
void pgc_pack_kv_bool(msgpack_packer *pk, const char *key, bool val);
void pgc_pack_kv_double(msgpack_packer *pk, const char *key, double val);
void pgc_pack_kv_nil(msgpack_packer *pk, const char *key);

/* Envelopes. *_begin packs the head; the caller then packs exactly one object
 * (the params map, or the result). */
void pgc_pack_request_begin(msgpack_packer *pk, uint32_t msgid, const char *method);
void pgc_pack_response_ok_begin(msgpack_packer *pk, uint32_t msgid);
void pgc_pack_notify_begin(msgpack_packer *pk, const char *method);
void pgc_pack_response_error(msgpack_packer *pk, uint32_t msgid, const char *code,
			     const char *message, bool retryable);

/*
 * Error codes carried in the `code` field of an error map. Append only: the
 * numeric values are part of libpgcoord's ABI (pgcoord_err mirrors them).
 */
enum pgc_error_code {
	PGC_E_INVALID_REQUEST = 1, /* envelope is not a MessagePack-RPC request */
	PGC_E_METHOD_NOT_FOUND,
	PGC_E_INVALID_PARAMS,  /* a parameter is missing, of the wrong type or out of range */
	PGC_E_UNAVAILABLE,     /* the database could not be reached or answered an error; retry */
	PGC_E_TIMEOUT,	       /* the database did not answer in time; outcome unknown; retry */
	PGC_E_BUSY,	       /* too many requests in flight on this connection; retry */
	PGC_E_NOT_FOUND,       /* the named object does not exist */
	PGC_E_FORBIDDEN,       /* the caller's uid may not make this call */
	PGC_E_NO_SESSION,      /* the call needs session.open first */
	PGC_E_SESSION_EXPIRED, /* the session is closed or no longer live */
	PGC_E_CONFLICT,	       /* the request contradicts existing state */
	PGC_E_FENCED,	       /* the caller's ownership was taken over */
	PGC_E_SUPERSEDED,      /* the agent lost its identity to another incarnation */
	PGC_E_SHUTTING_DOWN,   /* the agent is stopping */
	PGC_E_INTERNAL,	       /* a bug or an unexpected database reply */
	PGC_E_TOO_LARGE,       /* a message or field is over its limit */
	PGC_E__COUNT
};

const char *pgc_error_name(enum pgc_error_code code); /* "unavailable", … */
bool pgc_error_retryable(enum pgc_error_code code);
/* Maps a wire name back to its code; PGC_E_INTERNAL for names it does not know. */
enum pgc_error_code pgc_error_from_name(const char *name, size_t len);

#endif
