/*
 * test_bytea_output.c — binary values come back byte for byte whatever the
 * server's bytea_output says: permit.get's intent and record.get's data,
 * with the database set to the old `escape` format (a server may be
 * configured so) as well as the default `hex`.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

/* Bytes that each format spells differently: NUL, a backslash, a quote,
 * high bytes and printable text. */
static const char payload[] = {'{', 0, '\\', '\'', (char)0xff, (char)0x80, 'o', 'k', '}', 1};

static void assert_bin(const msgpack_object *map, const char *key, const char *what)
{
	const msgpack_object *o = pgc_map_get(map, key);
	cr_assert(o && o->type == MSGPACK_OBJECT_BIN, "%s: %s is not bin (%s)", what, key,
		  o ? pgc_obj_type_name(o) : "absent");
	cr_assert_eq(o->via.bin.size, sizeof(payload), "%s: %s has %u bytes, not %zu", what, key,
		     (unsigned)o->via.bin.size, sizeof(payload));
	cr_assert_eq(memcmp(o->via.bin.ptr, payload, sizeof(payload)), 0,
		     "%s: %s is not the bytes sent", what, key);
}

static void round_trip(const char *format)
{
	struct harness_db *db = idb_migrated();
	struct ireply r;
	struct iparams p;
	msgpack_packer *pk;
	char replica[32], what[64];

	/* every new connection of the agent takes the database's setting */
	hdb_exec(db, "ALTER DATABASE %s SET bytea_output = '%s'", hdb_name(db), format);
	snprintf(replica, sizeof(replica), "bytea-%s", format);
	snprintf(what, sizeof(what), "bytea_output %s", format);
	struct hagent *ag = hagent_start(db, replica, NULL);
	iwait_janitor(ag);
	int fd = iconnect(hagent_socket(ag));
	isession_open(fd, "bytea");

	pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "key", "bytea-q");
	pgc_pack_kv_int(pk, "limit", 2);
	pgc_pack_kv_int(pk, "lapse_after_s", 0);
	icall_ok(fd, "quota.set", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);

	pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "id", "bytea-1");
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	pgc_pack_kv_str(pk, "key", "bytea-q");
	pgc_pack_cstr(pk, "intent");
	msgpack_pack_bin(pk, sizeof(payload));
	msgpack_pack_bin_body(pk, payload, sizeof(payload));
	icall_ok(fd, "permit.claim", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	/* stored byte for byte, read in a format both agree on */
	char *hex = hdb_query_value(db, "SELECT encode(intent, 'hex') FROM pgcoord.permits "
					"WHERE id = 'bytea-1'");
	cr_assert_str_eq(hex, "7b005c27ff806f6b7d01");
	free(hex);

	pk = iparams_begin(&p, 1);
	pgc_pack_kv_str(pk, "id", "bytea-1");
	const msgpack_object *res = icall_ok(fd, "permit.get", &p, &r);
	assert_bin(pgc_map_get(res, "permit"), "intent", what);
	ireply_destroy(&r);
	iparams_destroy(&p);

	pk = iparams_begin(&p, 4);
	pgc_pack_kv_str(pk, "kind", "bytea");
	pgc_pack_kv_str(pk, "key", "r-1");
	pgc_pack_kv_str(pk, "state", "new");
	pgc_pack_cstr(pk, "data");
	msgpack_pack_bin(pk, sizeof(payload));
	msgpack_pack_bin_body(pk, payload, sizeof(payload));
	icall_ok(fd, "record.put", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	hex = hdb_query_value(db, "SELECT encode(data, 'hex') FROM pgcoord.records "
				  "WHERE kind = 'bytea' AND key = 'r-1'");
	cr_assert_str_eq(hex, "7b005c27ff806f6b7d01");
	free(hex);

	pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "kind", "bytea");
	pgc_pack_kv_str(pk, "key", "r-1");
	res = icall_ok(fd, "record.get", &p, &r);
	assert_bin(pgc_map_get(res, "record"), "data", what);
	ireply_destroy(&r);
	iparams_destroy(&p);

	close(fd);
	hagent_destroy(ag);
	hdb_drop(db);
}

Test(bytea_output, escape_format_round_trips_intent_and_data)
{
	round_trip("escape");
}

Test(bytea_output, hex_format_round_trips_intent_and_data)
{
	round_trip("hex");
}
