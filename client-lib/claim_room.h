/*
 * claim_room.h — who holds the room a denied or queued claim did not get
 * (PROTOCOL.md, permit.claim: "Who holds the room"), read from its answer.
 * Private to libpgcoord: permits.c keeps one in each pgcoord_claim.
 */
#ifndef PGCOORD_CLIENT_CLAIM_ROOM_H
#define PGCOORD_CLIENT_CLAIM_ROOM_H

#include <msgpack.h>
#include <stdbool.h>

#include "pgcoord/pgcoord.h"

struct pgcoord__room {
	bool known; /* the answer carried the quota's numbers and holders */
	char *quota;
	int64_t limit, in_flight, waiting, hidden;
	pgcoord_holder *holders;
	size_t nholders;
};

/* Reads the room from a denied or queued answer. An answer without it
 * (an older agent, or its read failed) leaves known false and is no
 * error; false only when it is there and malformed, or out of memory. */
bool pgcoord__room_read(struct pgcoord__room *room, const msgpack_object *result);
void pgcoord__room_free(struct pgcoord__room *room);

#endif
