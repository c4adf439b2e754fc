/*
 * ctl_msgpack.h — pgcoordctl's own small MessagePack helpers: typed reads
 * from decoded result maps and typed writes of request params. pgcoordctl
 * is a client of the public API only, so it keeps these rather than using
 * the agent's wire codec (proto/codec.h).
 */
#ifndef PGCOORD_CTL_MSGPACK_H
#define PGCOORD_CTL_MSGPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

/* Typed reads. All return false (and leave *out alone) on a type mismatch. */
const msgpack_object *ctl_map_get(const msgpack_object *map, const char *key);
bool ctl_obj_str(const msgpack_object *o, const char **s, size_t *len);
bool ctl_obj_str_eq(const msgpack_object *o, const char *s);
bool ctl_obj_int64(const msgpack_object *o, int64_t *out);
bool ctl_obj_bool(const msgpack_object *o, bool *out);

/* Typed writes. A NULL string packs nil. */
void ctl_pack_cstr(msgpack_packer *pk, const char *s);
void ctl_pack_strn(msgpack_packer *pk, const char *s, size_t n);
void ctl_pack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void ctl_pack_kv_int(msgpack_packer *pk, const char *key, int64_t val);
void ctl_pack_kv_bool(msgpack_packer *pk, const char *key, bool val);

#endif
