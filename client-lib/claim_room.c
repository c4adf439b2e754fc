/*
 * claim_room.c — see claim_room.h.
 */
#include "claim_room.h"

#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"

/* A str or nil field as a malloc'd string (NULL for nil); false when it
 * is something else or memory ran out. */
static bool opt_str(const msgpack_object *map, const char *key, bool required, char **out)
{
	const msgpack_object *o = pgc_map_get(map, key);

	*out = NULL;
	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return !required;
	*out = pgc_obj_strdup(o);
	return *out != NULL;
}

static bool opt_int(const msgpack_object *map, const char *key, int64_t *out)
{
	const msgpack_object *o = pgc_map_get(map, key);

	*out = -1;
	return !o || o->type == MSGPACK_OBJECT_NIL || pgc_obj_int64(o, out);
}

static bool read_holder(pgcoord_holder *h, const msgpack_object *o)
{
	char *id, *state, *replica, *reason;
	bool ok = o->type == MSGPACK_OBJECT_MAP && opt_str(o, "id", true, &id);

	if (!ok)
		return false;
	ok = opt_str(o, "state", true, &state);
	ok = opt_str(o, "owner_replica", false, &replica) && ok;
	ok = opt_str(o, "reason", false, &reason) && ok;
	h->id = id;
	h->state = state;
	h->owner_replica = replica;
	h->reason = reason;
	return ok && pgc_obj_int64(pgc_map_get(o, "weight"), &h->weight) &&
	       opt_int(o, "owner_session", &h->owner_session) && opt_int(o, "age_ms", &h->age_ms);
}

bool pgcoord__room_read(struct pgcoord__room *room, const msgpack_object *result)
{
	const msgpack_object *holders = pgc_map_get(result, "holders");

	memset(room, 0, sizeof(*room));
	if (!holders)
		return true; /* not told: known stays false */
	if (holders->type != MSGPACK_OBJECT_ARRAY ||
	    !opt_str(result, "quota", true, &room->quota) ||
	    !pgc_obj_int64(pgc_map_get(result, "limit"), &room->limit) ||
	    !pgc_obj_int64(pgc_map_get(result, "in_flight"), &room->in_flight) ||
	    !pgc_obj_int64(pgc_map_get(result, "waiting"), &room->waiting) ||
	    !pgc_obj_int64(pgc_map_get(result, "hidden"), &room->hidden))
		return false;
	if (holders->via.array.size) {
		room->holders = calloc(holders->via.array.size, sizeof(*room->holders));
		if (!room->holders)
			return false;
	}
	for (uint32_t i = 0; i < holders->via.array.size; i++) {
		room->nholders++; /* freed by pgcoord__room_free, also half read */
		if (!read_holder(&room->holders[i], &holders->via.array.ptr[i]))
			return false;
	}
	room->known = true;
	return true;
}

void pgcoord__room_free(struct pgcoord__room *room)
{
	for (size_t i = 0; i < room->nholders; i++) {
		free((char *)room->holders[i].id);
		free((char *)room->holders[i].state);
		free((char *)room->holders[i].owner_replica);
		free((char *)room->holders[i].reason);
	}
	free(room->holders);
	free(room->quota);
	memset(room, 0, sizeof(*room));
}
