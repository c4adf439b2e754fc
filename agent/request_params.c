/*
 * request_params.c — the parameter readers of dispatch.h: each key read
 * by its type and bounds, or answered `invalid_params` naming the key, and
 * the UTF-8 check that text must pass before it reaches Postgres. Pure
 * reading of the request's map, no I/O; apart so the answering code and
 * the method table stay short.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/dispatch.h"

bool utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	while (p < end) {
		unsigned c = *p++;
		int more;
		unsigned cp, min;
		if (c < 0x80)
			continue;
		if ((c & 0xe0) == 0xc0) {
			more = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			more = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			more = 3, cp = c & 0x07, min = 0x10000;
		} else {
			return false;
		}
		if (end - p < more)
			return false;
		while (more--) {
			if ((*p & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (*p++ & 0x3f);
		}
		/* overlong forms, surrogates and values past U+10FFFF are not
		 * UTF-8, and Postgres would refuse them with an error */
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
	}
	return true;
}

static const msgpack_object *param(struct request *req, const char *key)
{
	return req->params ? pgc_map_get(req->params, key) : NULL;
}

/* nil counts as absent, so clients may send explicit nils for defaults */
static bool absent(const msgpack_object *o)
{
	return !o || o->type == MSGPACK_OBJECT_NIL;
}

bool req_param_str(struct request *req, const char *key, bool required, size_t max_len, char **out)
{
	const msgpack_object *o = param(req, key);
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (a string)",
				 key);
			return false;
		}
		*out = NULL;
		return true;
	}
	if (o->type != MSGPACK_OBJECT_STR) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be a string, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (o->via.str.size > max_len) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' is longer than %zu bytes", key,
			 max_len);
		return false;
	}
	/* strings reach Postgres as text: refuse what it would refuse */
	if (!utf8_valid(o->via.str.ptr, o->via.str.size)) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' is not valid UTF-8", key);
		return false;
	}
	*out = pgc_obj_strdup(o);
	if (!*out) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must not contain NUL bytes",
			 key);
		return false;
	}
	return true;
}

bool req_param_name(struct request *req, const char *key, bool required, size_t max_len, char **out)
{
	if (!req_param_str(req, key, required, max_len, out))
		return false;
	if (*out && !(*out)[0]) {
		free(*out);
		*out = NULL;
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must not be empty", key);
		return false;
	}
	return true;
}

bool req_param_int(struct request *req, const char *key, bool required, int64_t min, int64_t max,
		   int64_t *out, bool *present)
{
	const msgpack_object *o = param(req, key);
	int64_t v;
	if (present)
		*present = false;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (an integer)",
				 key);
			return false;
		}
		return true;
	}
	if (!pgc_obj_int64(o, &v)) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter '%s' must be a 64-bit signed integer, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (v < min || v > max) {
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter '%s' = %lld is out of range (%lld..%lld)", key, (long long)v,
			 (long long)min, (long long)max);
		return false;
	}
	*out = v;
	if (present)
		*present = true;
	return true;
}

bool req_param_bool(struct request *req, const char *key, bool required, bool *out, bool *present)
{
	const msgpack_object *o = param(req, key);
	if (present)
		*present = false;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (a boolean)",
				 key);
			return false;
		}
		return true;
	}
	if (!pgc_obj_bool(o, out)) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be a boolean, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (present)
		*present = true;
	return true;
}

bool req_param_enum(struct request *req, const char *key, bool required, const char *const *allowed,
		    int *out, bool *present)
{
	const msgpack_object *o = param(req, key);
	char names[256];
	size_t n = 0;

	if (present)
		*present = false;
	if (!absent(o) && o->type == MSGPACK_OBJECT_STR) {
		for (int i = 0; allowed[i]; i++) {
			if (pgc_obj_str_eq(o, allowed[i])) {
				*out = i;
				if (present)
					*present = true;
				return true;
			}
		}
	} else if (absent(o) && !required) {
		return true;
	}
	names[0] = '\0';
	for (int i = 0; allowed[i] && n < sizeof(names); i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
				      allowed[i]);
	if (absent(o))
		req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (one of %s)", key,
			 names);
	else if (o->type != MSGPACK_OBJECT_STR)
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be one of %s, not %s", key,
			 names, pgc_obj_type_name(o));
	else
		req_fail(req, PGC_E_INVALID_PARAMS,
			 "parameter '%s' must be one of %s, not \"%.*s\"", key, names,
			 (int)(o->via.str.size > 64 ? 64 : o->via.str.size), o->via.str.ptr);
	return false;
}

bool req_param_bytes(struct request *req, const char *key, bool required, size_t max_len,
		     const char **data, size_t *len, bool *present)
{
	const msgpack_object *o = param(req, key);
	if (present)
		*present = false;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (bin or str)",
				 key);
			return false;
		}
		return true;
	}
	if (o->type == MSGPACK_OBJECT_BIN) {
		*data = o->via.bin.ptr;
		*len = o->via.bin.size;
	} else if (o->type == MSGPACK_OBJECT_STR) {
		*data = o->via.str.ptr;
		*len = o->via.str.size;
	} else {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be bin or str, not %s",
			 key, pgc_obj_type_name(o));
		return false;
	}
	if (*len > max_len) {
		req_fail(req, PGC_E_TOO_LARGE, "parameter '%s' is longer than %zu bytes", key,
			 max_len);
		return false;
	}
	if (present)
		*present = true;
	return true;
}

bool req_param_array(struct request *req, const char *key, bool required, size_t min_items,
		     size_t max_items, const msgpack_object **out)
{
	const msgpack_object *o = param(req, key);
	*out = NULL;
	if (absent(o)) {
		if (required) {
			req_fail(req, PGC_E_INVALID_PARAMS, "missing parameter '%s' (an array)",
				 key);
			return false;
		}
		return true;
	}
	if (o->type != MSGPACK_OBJECT_ARRAY) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must be an array, not %s", key,
			 pgc_obj_type_name(o));
		return false;
	}
	if (o->via.array.size < min_items || o->via.array.size > max_items) {
		req_fail(req, PGC_E_INVALID_PARAMS, "parameter '%s' must have %zu to %zu elements",
			 key, min_items, max_items);
		return false;
	}
	*out = o;
	return true;
}
