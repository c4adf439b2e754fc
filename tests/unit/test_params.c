/*
 * test_params.c — the typed parameter readers on a hand-built request (no
 * agent, no database): what each reads from a params map when the value
 * is valid or absent. Their refusals answer on a connection, so
 * integration-bad-input covers those.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "agent/dispatch.h"

struct fixture {
	msgpack_sbuffer sb;
	msgpack_unpacked u;
	struct request req;
};

/* Params {name: "job", empty: nil, n: -5, on: true, mode: "release",
 * blob: bin(3 bytes), list: [1, 2]}. */
static void params_init(struct fixture *f)
{
	msgpack_packer pk;
	size_t off = 0;

	msgpack_sbuffer_init(&f->sb);
	msgpack_packer_init(&pk, &f->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 7);
	pgc_pack_kv_str(&pk, "name", "job");
	pgc_pack_kv_nil(&pk, "empty");
	pgc_pack_kv_int(&pk, "n", -5);
	pgc_pack_kv_bool(&pk, "on", true);
	pgc_pack_kv_str(&pk, "mode", "release");
	pgc_pack_cstr(&pk, "blob");
	msgpack_pack_bin(&pk, 3);
	msgpack_pack_bin_body(&pk, "a\0b", 3);
	pgc_pack_cstr(&pk, "list");
	msgpack_pack_array(&pk, 2);
	msgpack_pack_int(&pk, 1);
	msgpack_pack_int(&pk, 2);
	msgpack_unpacked_init(&f->u);
	cr_assert_eq(msgpack_unpack_next(&f->u, f->sb.data, f->sb.size, &off),
		     MSGPACK_UNPACK_SUCCESS);
	memset(&f->req, 0, sizeof(f->req));
	f->req.params = &f->u.data;
}

static void params_fini(struct fixture *f)
{
	msgpack_unpacked_destroy(&f->u);
	msgpack_sbuffer_destroy(&f->sb);
}

Test(params, strings_and_names)
{
	struct fixture f;
	char *s = NULL;

	params_init(&f);
	cr_assert(req_param_str(&f.req, "name", true, 3, &s));
	cr_assert_str_eq(s, "job");
	free(s);
	cr_assert(req_param_name(&f.req, "name", true, 200, &s));
	cr_assert_str_eq(s, "job");
	free(s);
	/* nil and absent are both "not given" */
	s = (char *)"x";
	cr_assert(req_param_name(&f.req, "empty", false, 200, &s));
	cr_assert_null(s);
	cr_assert(req_param_str(&f.req, "missing", false, 200, &s));
	cr_assert_null(s);
	params_fini(&f);
}

Test(params, integers_booleans_enums)
{
	struct fixture f;
	int64_t n = 0;
	bool b = false, present = true;
	int idx = -1;
	static const char *const modes[] = {"uncertain", "release", NULL};

	params_init(&f);
	cr_assert(req_param_int(&f.req, "n", true, -5, 5, &n, &present));
	cr_assert(present && n == -5);
	n = 7;
	cr_assert(req_param_int(&f.req, "empty", false, 0, 1, &n, &present));
	cr_assert(!present && n == 7, "an absent int leaves the default");
	cr_assert(req_param_bool(&f.req, "on", true, &b, &present));
	cr_assert(b && present);
	cr_assert(req_param_bool(&f.req, "missing", false, &b, &present));
	cr_assert_not(present);
	cr_assert(req_param_enum(&f.req, "mode", true, modes, &idx, &present));
	cr_assert(present && idx == 1);
	idx = 0;
	cr_assert(req_param_enum(&f.req, "missing", false, modes, &idx, &present));
	cr_assert(!present && idx == 0);
	params_fini(&f);
}

Test(params, bytes_and_arrays)
{
	struct fixture f;
	const char *data = NULL;
	size_t len = 0;
	bool present = false;
	const msgpack_object *arr = NULL;

	params_init(&f);
	cr_assert(req_param_bytes(&f.req, "blob", true, 3, &data, &len, &present));
	cr_assert(present && len == 3 && memcmp(data, "a\0b", 3) == 0);
	cr_assert(req_param_bytes(&f.req, "name", true, 3, &data, &len, &present));
	cr_assert(present && len == 3 && memcmp(data, "job", 3) == 0, "str is accepted too");
	cr_assert(req_param_array(&f.req, "list", true, 1, 2, &arr));
	cr_assert(arr && arr->via.array.size == 2);
	cr_assert(req_param_array(&f.req, "missing", false, 1, 2, &arr));
	cr_assert_null(arr);
	params_fini(&f);
}
