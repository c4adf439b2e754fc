/*
 * value.c — scenario values as msgpack_objects: lookups, ${var}
 * substitution and the subset matching of tests/conformance/README.md.
 */
#include "conformance.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char conf_why[1024];

bool conf_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(conf_why, sizeof(conf_why), fmt, ap);
	va_end(ap);
	return false;
}

static bool key_is(const msgpack_object *k, const char *key)
{
	size_t len = strlen(key);

	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == len &&
	       memcmp(k->via.str.ptr, key, len) == 0;
}

const msgpack_object *conf_get(const msgpack_object *m, const char *key)
{
	if (m == NULL || m->type != MSGPACK_OBJECT_MAP)
		return NULL;
	for (uint32_t i = 0; i < m->via.map.size; i++)
		if (key_is(&m->via.map.ptr[i].key, key))
			return &m->via.map.ptr[i].val;
	return NULL;
}

char *conf_str(msgpack_zone *z, const msgpack_object *o)
{
	char *s;

	if (o == NULL || o->type != MSGPACK_OBJECT_STR)
		return NULL;
	s = msgpack_zone_malloc(z, o->via.str.size + 1);
	if (s == NULL)
		abort();
	memcpy(s, o->via.str.ptr, o->via.str.size);
	s[o->via.str.size] = '\0';
	return s;
}

char *conf_get_str(msgpack_zone *z, const msgpack_object *m, const char *key)
{
	return conf_str(z, conf_get(m, key));
}

bool conf_is_int(const msgpack_object *o)
{
	return o != NULL && (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
			     o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER);
}

int64_t conf_int(const msgpack_object *o)
{
	return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)o->via.u64 : o->via.i64;
}

int64_t conf_get_int(const msgpack_object *m, const char *key, int64_t def)
{
	const msgpack_object *o = conf_get(m, key);

	return conf_is_int(o) ? conf_int(o) : def;
}

bool conf_get_bool(const msgpack_object *m, const char *key, bool def)
{
	const msgpack_object *o = conf_get(m, key);

	return o != NULL && o->type == MSGPACK_OBJECT_BOOLEAN ? o->via.boolean : def;
}

bool conf_is_str(const msgpack_object *o, const char *s)
{
	return o != NULL && key_is(o, s);
}

char *conf_text(msgpack_zone *z, const msgpack_object *o)
{
	char buf[64];
	char *s;

	if (o->type == MSGPACK_OBJECT_STR)
		return conf_str(z, o);
	if (conf_is_int(o))
		snprintf(buf, sizeof(buf), "%" PRId64, conf_int(o));
	else if (o->type == MSGPACK_OBJECT_BOOLEAN)
		snprintf(buf, sizeof(buf), "%s", o->via.boolean ? "true" : "false");
	else
		msgpack_object_print_buffer(buf, sizeof(buf), *o);
	s = msgpack_zone_malloc(z, strlen(buf) + 1);
	if (s == NULL)
		abort();
	strcpy(s, buf);
	return s;
}

void conf_vars_set(struct conf_vars *v, msgpack_zone *z, const char *name, msgpack_object value)
{
	size_t i;

	for (i = 0; i < v->n; i++)
		if (strcmp(v->names[i], name) == 0)
			break;
	if (i == v->n) {
		if (v->n == sizeof(v->names) / sizeof(v->names[0]))
			abort();
		v->names[i] = msgpack_zone_malloc(z, strlen(name) + 1);
		strcpy(v->names[i], name);
		v->n++;
	}
	/* Values saved are ints, bools or strings copied out of results that
	 * live as long as the run's zone. */
	v->values[i] = value;
}

static const msgpack_object *var_lookup(const struct conf_vars *v, const char *name, size_t len)
{
	for (size_t i = 0; i < v->n; i++)
		if (strlen(v->names[i]) == len && memcmp(v->names[i], name, len) == 0)
			return &v->values[i];
	return NULL;
}

msgpack_object conf_make_str(msgpack_zone *z, const char *s)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_STR};
	size_t len = strlen(s);
	char *p = msgpack_zone_malloc(z, len + 1);

	if (p == NULL)
		abort();
	memcpy(p, s, len + 1);
	o.via.str.ptr = p;
	o.via.str.size = (uint32_t)len;
	return o;
}

msgpack_object conf_make_int(int64_t i)
{
	msgpack_object o;

	if (i >= 0) {
		o.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
		o.via.u64 = (uint64_t)i;
	} else {
		o.type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
		o.via.i64 = i;
	}
	return o;
}

msgpack_object conf_make_bool(bool b)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_BOOLEAN};

	o.via.boolean = b;
	return o;
}

msgpack_object conf_make_map(msgpack_zone *z, size_t n, const char *const *keys,
			     const msgpack_object *values)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_MAP};
	msgpack_object_kv *kv = msgpack_zone_malloc(z, (n ? n : 1) * sizeof(*kv));

	if (kv == NULL)
		abort();
	for (size_t i = 0; i < n; i++) {
		kv[i].key = conf_make_str(z, keys[i]);
		kv[i].val = values[i];
	}
	o.via.map.ptr = kv;
	o.via.map.size = (uint32_t)n;
	return o;
}

/* A string with ${name}s: a whole-string ${name} becomes the value itself,
 * others are replaced by the value's text. */
static bool substitute_str(msgpack_zone *z, const struct conf_vars *v, const msgpack_object *o,
			   msgpack_object *out)
{
	const char *s = o->via.str.ptr, *end = s + o->via.str.size;
	char buf[4096];
	size_t n = 0;

	if (memchr(s, '$', o->via.str.size) == NULL) {
		*out = *o;
		return true;
	}
	while (s < end) {
		const char *close;
		const msgpack_object *val;
		const char *text;
		size_t len;

		if (s + 1 < end && s[0] == '$' && s[1] == '{' &&
		    (close = memchr(s, '}', (size_t)(end - s))) != NULL) {
			val = var_lookup(v, s + 2, (size_t)(close - s - 2));
			if (val == NULL)
				return conf_fail("nothing saved as %.*s", (int)(close - s - 2),
						 s + 2);
			if (s == o->via.str.ptr && close + 1 == end) {
				*out = *val;
				return true;
			}
			text = conf_text(z, val);
			len = strlen(text);
			s = close + 1;
		} else {
			text = s++;
			len = 1;
		}
		if (n + len >= sizeof(buf))
			return conf_fail("a string of the scenario is too long");
		memcpy(buf + n, text, len);
		n += len;
	}
	buf[n] = '\0';
	*out = conf_make_str(z, buf);
	return true;
}

bool conf_substitute(msgpack_zone *z, const struct conf_vars *v, const msgpack_object *o,
		     msgpack_object *out)
{
	switch (o->type) {
	case MSGPACK_OBJECT_STR:
		return substitute_str(z, v, o, out);
	case MSGPACK_OBJECT_ARRAY: {
		msgpack_object *a = msgpack_zone_malloc(z, (o->via.array.size + 1) * sizeof(*a));

		if (a == NULL)
			abort();
		for (uint32_t i = 0; i < o->via.array.size; i++)
			if (!conf_substitute(z, v, &o->via.array.ptr[i], &a[i]))
				return false;
		*out = *o;
		out->via.array.ptr = a;
		return true;
	}
	case MSGPACK_OBJECT_MAP: {
		msgpack_object_kv *kv = msgpack_zone_malloc(z, (o->via.map.size + 1) * sizeof(*kv));

		if (kv == NULL)
			abort();
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			kv[i].key = o->via.map.ptr[i].key;
			if (!conf_substitute(z, v, &o->via.map.ptr[i].val, &kv[i].val))
				return false;
		}
		*out = *o;
		out->via.map.ptr = kv;
		return true;
	}
	default:
		*out = *o;
		return true;
	}
}

static const char *print(const msgpack_object *o)
{
	static char buf[2][512];
	static int which;

	which ^= 1;
	msgpack_object_print_buffer(buf[which], sizeof(buf[which]), *o);
	return buf[which];
}

bool conf_match(const msgpack_object *want, const msgpack_object *got, const char *where)
{
	char sub[512];

	if (conf_is_str(want, "$any"))
		return true;
	if (conf_is_str(want, "$int"))
		return conf_is_int(got)
			   ? true
			   : conf_fail("%s: expected an integer, got %s", where, print(got));
	if (conf_is_str(want, "$str"))
		return got->type == MSGPACK_OBJECT_STR
			   ? true
			   : conf_fail("%s: expected a string, got %s", where, print(got));
	if (conf_is_str(want, "$bool"))
		return got->type == MSGPACK_OBJECT_BOOLEAN
			   ? true
			   : conf_fail("%s: expected a bool, got %s", where, print(got));
	if (want->type == MSGPACK_OBJECT_MAP) {
		if (got->type != MSGPACK_OBJECT_MAP)
			return conf_fail("%s: expected a map, got %s", where, print(got));
		for (uint32_t i = 0; i < want->via.map.size; i++) {
			const msgpack_object_kv *kv = &want->via.map.ptr[i];
			const msgpack_object *g;

			if (kv->key.type != MSGPACK_OBJECT_STR)
				return conf_fail("%s: a key that is not a string", where);
			if (kv->key.via.str.size > 0 && kv->key.via.str.ptr[0] == '$')
				continue; /* an instruction to the runner */
			snprintf(sub, sizeof(sub), "%s.%.*s", where, (int)kv->key.via.str.size,
				 kv->key.via.str.ptr);
			g = NULL;
			for (uint32_t j = 0; j < got->via.map.size; j++)
				if (msgpack_object_equal(got->via.map.ptr[j].key, kv->key))
					g = &got->via.map.ptr[j].val;
			if (g == NULL)
				return conf_fail("%s: missing in %s", sub, print(got));
			if (!conf_match(&kv->val, g, sub))
				return false;
		}
		return true;
	}
	if (want->type == MSGPACK_OBJECT_ARRAY) {
		if (got->type != MSGPACK_OBJECT_ARRAY ||
		    got->via.array.size != want->via.array.size)
			return conf_fail("%s: expected %s, got %s", where, print(want), print(got));
		for (uint32_t i = 0; i < want->via.array.size; i++) {
			snprintf(sub, sizeof(sub), "%s[%u]", where, i);
			if (!conf_match(&want->via.array.ptr[i], &got->via.array.ptr[i], sub))
				return false;
		}
		return true;
	}
	if (conf_is_int(want) && conf_is_int(got))
		return conf_int(want) == conf_int(got)
			   ? true
			   : conf_fail("%s: expected %s, got %s", where, print(want), print(got));
	if (want->type == MSGPACK_OBJECT_STR && got->type == MSGPACK_OBJECT_BIN &&
	    want->via.str.size == got->via.bin.size &&
	    memcmp(want->via.str.ptr, got->via.bin.ptr, want->via.str.size) == 0)
		return true;
	if (!msgpack_object_equal(*want, *got))
		return conf_fail("%s: expected %s, got %s", where, print(want), print(got));
	return true;
}

char *conf_pack(const msgpack_object *o, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_object(&pk, *o);
	*len = sb.size;
	return msgpack_sbuffer_release(&sb);
}
