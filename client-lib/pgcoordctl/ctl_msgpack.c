/*
 * ctl_msgpack.c — typed reads and writes of MessagePack for pgcoordctl
 * (see ctl_msgpack.h).
 */
#include "ctl_msgpack.h"

#include <string.h>

/* The first matching key wins; duplicates are the sender's bug. */
const msgpack_object *ctl_map_get(const msgpack_object *map, const char *key)
{
	if (map == NULL || map->type != MSGPACK_OBJECT_MAP || key == NULL)
		return NULL;
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object_kv *kv = &map->via.map.ptr[i];
		if (ctl_obj_str_eq(&kv->key, key))
			return &kv->val;
	}
	return NULL;
}

bool ctl_obj_str(const msgpack_object *o, const char **s, size_t *len)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_STR)
		return false;
	*s = o->via.str.ptr;
	*len = o->via.str.size;
	return true;
}

bool ctl_obj_str_eq(const msgpack_object *o, const char *s)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_STR || s == NULL)
		return false;
	size_t n = strlen(s);
	return o->via.str.size == n && (n == 0 || memcmp(o->via.str.ptr, s, n) == 0);
}

bool ctl_obj_int64(const msgpack_object *o, int64_t *out)
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

bool ctl_obj_bool(const msgpack_object *o, bool *out)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_BOOLEAN)
		return false;
	*out = o->via.boolean;
	return true;
}

void ctl_pack_cstr(msgpack_packer *pk, const char *s)
{
	if (s == NULL) {
		msgpack_pack_nil(pk);
		return;
	}
	ctl_pack_strn(pk, s, strlen(s));
}

void ctl_pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
	if (s == NULL) {
		msgpack_pack_nil(pk);
		return;
	}
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void ctl_pack_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
	ctl_pack_cstr(pk, key);
	ctl_pack_cstr(pk, val);
}

void ctl_pack_kv_int(msgpack_packer *pk, const char *key, int64_t val)
{
	ctl_pack_cstr(pk, key);
	msgpack_pack_int64(pk, val);
}

void ctl_pack_kv_bool(msgpack_packer *pk, const char *key, bool val)
{
	ctl_pack_cstr(pk, key);
	if (val)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}
