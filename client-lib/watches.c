/*
 * watches.c — quota.watch, permit.watch, record.watch and watch.cancel.
 * What the watches push (quota.changed, permit.changed, record.orphaned)
 * arrives through the notification callback like every notification.
 */
#include <msgpack.h>

#include "handle.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

/* method {param: target}; *watch receives the id the agent gave it. */
static pgcoord_err watch(pgcoord *c, const char *method, const char *param, const char *target,
			 int timeout_ms, int64_t *watch_id)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	int64_t id = 0;

	if (!c)
		return PGCOORD_E_ARG;
	if (!target || !*target) {
		pgcoord__set_message(c, "the %s to watch is empty", param);
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, param, target);
	pgcoord_err err = pgcoord__call_decoded(c, method, &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	if (!pgc_obj_int64(pgc_map_get(&u.data, "watch"), &id)) {
		pgcoord__set_message(c, "the %s result has no \"watch\"", method);
		err = PGCOORD_E_PROTOCOL;
	} else if (watch_id) {
		*watch_id = id;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}

pgcoord_err pgcoord_quota_watch(pgcoord *c, const char *key, int timeout_ms, int64_t *watch_id)
{
	return watch(c, "quota.watch", "key", key, timeout_ms, watch_id);
}

pgcoord_err pgcoord_permit_watch(pgcoord *c, const char *id, int timeout_ms, int64_t *watch_id)
{
	return watch(c, "permit.watch", "id", id, timeout_ms, watch_id);
}

pgcoord_err pgcoord_record_watch(pgcoord *c, const char *kind, int timeout_ms, int64_t *watch_id)
{
	return watch(c, "record.watch", "kind", kind, timeout_ms, watch_id);
}

pgcoord_err pgcoord_watch_cancel(pgcoord *c, int64_t watch_id, int timeout_ms, bool *cancelled)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0;
	bool done = false;

	if (!c)
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_int(&w.pk, "watch", watch_id);
	pgcoord_err err =
	    pgcoord__call_decoded(c, "watch.cancel", &w, timeout_ms, &u, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	if (!pgc_obj_bool(pgc_map_get(&u.data, "cancelled"), &done)) {
		pgcoord__set_message(c, "the watch.cancel result has no \"cancelled\"");
		err = PGCOORD_E_PROTOCOL;
	} else if (cancelled) {
		*cancelled = done;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	return err;
}
