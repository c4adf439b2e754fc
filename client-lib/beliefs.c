/*
 * beliefs.c — what this handle believes about the leases its session
 * leads, as the agent's messages move it (see leases.c for the belief
 * rule and how messages are dated). Below the framing, which applies every
 * lease message here as it is read, and below handle.c, which ends every
 * belief when the socket closes; the lease calls (leases.c) ask it.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

struct pgcoord_belief *pgcoord__belief_find(const pgcoord *c, const char *name, size_t len)
{
	for (struct pgcoord_belief *b = c->beliefs; b; b = b->next)
		if (strlen(b->name) == len && memcmp(b->name, name, len) == 0)
			return b;
	return NULL;
}

/* The belief for name, created not leading; NULL when out of memory. */
struct pgcoord_belief *pgcoord__belief_get(pgcoord *c, const char *name, size_t len)
{
	struct pgcoord_belief *b = pgcoord__belief_find(c, name, len);
	if (b)
		return b;
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->name = strndup(name, len);
	if (!b->name) {
		free(b);
		return NULL;
	}
	b->next = c->beliefs;
	c->beliefs = b;
	return b;
}

void pgcoord__belief_drop(pgcoord *c, const char *name)
{
	for (struct pgcoord_belief **pp = &c->beliefs; *pp; pp = &(*pp)->next) {
		struct pgcoord_belief *b = *pp;
		if (strcmp(b->name, name) == 0) {
			*pp = b->next;
			free(b->name);
			free(b);
			return;
		}
	}
}

/* The deadline a message grants: stamp + valid_ms, capped by the agent's
 * own monotonic deadline when it sent one. */
int64_t pgcoord__belief_deadline(const msgpack_object *params, int64_t stamp_ms, int64_t valid_ms)
{
	int64_t until = stamp_ms + valid_ms, mono = 0;
	if (params && pgc_obj_int64(pgc_map_get(params, "valid_until_mono_ms"), &mono) &&
	    mono > 0 && mono < until)
		until = mono;
	return until;
}

bool pgcoord__belief_live(const struct pgcoord_belief *b, int64_t now)
{
	return b && b->leader && now < b->until_ms;
}

/* Belief starts or ends, as a lease.changed or an acquire result says. */
void pgcoord__belief_set(pgcoord *c, const char *name, size_t len, bool leader, int64_t epoch,
			 int64_t until_ms)
{
	struct pgcoord_belief *b;

	if (!leader) {
		b = pgcoord__belief_find(c, name, len);
		if (b) {
			b->leader = false;
			b->until_ms = 0;
		}
		return;
	}
	/* Out of memory: no belief, which is the safe side. */
	b = pgcoord__belief_get(c, name, len);
	if (!b)
		return;
	b->leader = true;
	b->epoch = epoch;
	b->until_ms = until_ms;
}

bool pgcoord__tracking_leases(const pgcoord *c)
{
	return c->beliefs != NULL;
}

void pgcoord__beliefs_end(pgcoord *c)
{
	while (c->beliefs) {
		struct pgcoord_belief *b = c->beliefs;
		c->beliefs = b->next;
		free(b->name);
		free(b);
	}
}

static bool method_is(const char *s, size_t len, const char *lit)
{
	return strlen(lit) == len && memcmp(s, lit, len) == 0;
}

/* {name, epoch, leader, valid_ms}; false unless name is there. *leader is
 * true only for a well-formed leading message. */
static bool read_belief(const msgpack_object *params, const char **name, size_t *name_len,
			bool *leader, int64_t *epoch, int64_t *valid_ms)
{
	bool said = false;

	*leader = false;
	if (!pgc_obj_str(pgc_map_get(params, "name"), name, name_len) || *name_len == 0)
		return false;
	if (pgc_obj_bool(pgc_map_get(params, "leader"), &said) && said &&
	    pgc_obj_int64(pgc_map_get(params, "epoch"), epoch) &&
	    pgc_obj_int64(pgc_map_get(params, "valid_ms"), valid_ms) && *valid_ms >= 0)
		*leader = true;
	return true;
}

void pgcoord__lease_note(pgcoord *c, const char *method, size_t method_len,
			 const msgpack_object *params, int64_t stamp_ms)
{
	const char *name;
	size_t name_len;
	bool leader;
	int64_t epoch = 0, valid_ms = 0, session = 0;

	if (!params || params->type != MSGPACK_OBJECT_MAP)
		return;
	if (method_is(method, method_len, "lease.changed")) {
		if (!read_belief(params, &name, &name_len, &leader, &epoch, &valid_ms))
			return;
		/* Only this handle's session can lead for us. */
		if (leader && (c->session_id == 0 ||
			       (pgc_obj_int64(pgc_map_get(params, "session"), &session) &&
				session != c->session_id)))
			return;
		/* Anything but a well-formed "leader: true" ends the belief. */
		pgcoord__belief_set(c, name, name_len, leader, epoch,
				    pgcoord__belief_deadline(params, stamp_ms, valid_ms));
	} else if (method_is(method, method_len, "lease.renewed")) {
		if (!read_belief(params, &name, &name_len, &leader, &epoch, &valid_ms) || !leader)
			return;
		/* A renewal extends only the belief a lease.changed started,
		 * under the same epoch; the newest word of the agent wins. */
		struct pgcoord_belief *b = pgcoord__belief_find(c, name, name_len);
		if (b && b->leader && b->epoch == epoch)
			b->until_ms = pgcoord__belief_deadline(params, stamp_ms, valid_ms);
	} else if (method_is(method, method_len, "session.lost")) {
		if (pgc_obj_int64(pgc_map_get(params, "session"), &session) &&
		    session == c->session_id)
			pgcoord__beliefs_end(c);
	} else if (method_is(method, method_len, "session.suspended")) {
		/* The session may be gone in safe_ms; no belief outlives it
		 * unless a renewal comes first. */
		int64_t safe_ms;
		if (!pgc_obj_int64(pgc_map_get(params, "session"), &session) ||
		    session != c->session_id ||
		    !pgc_obj_int64(pgc_map_get(params, "safe_ms"), &safe_ms))
			return;
		for (struct pgcoord_belief *b = c->beliefs; b; b = b->next)
			if (b->until_ms > stamp_ms + safe_ms)
				b->until_ms = stamp_ms + (safe_ms > 0 ? safe_ms : 0);
	}
}
