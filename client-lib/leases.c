/*
 * leases.c — typed helpers over pgcoord_call for the lease.* methods
 * (PROTOCOL.md, "Leases"), and the questions about what this handle
 * believes of the leases its session leads (the beliefs themselves, moved by
 * every lease message as it is read, are beliefs.c's): one deadline per
 * lease on CLOCK_MONOTONIC, moved only by what the agent says
 * (lease.changed, lease.renewed, acquire results) and checked against the
 * clock at every question, so a silent or frozen agent still ends the
 * belief on time.
 *
 * Dating the agent's messages: valid_ms is the belief the agent had left
 * when it sent the message, but the message may have waited in our socket
 * for as long as the application did not read it. So a message is dated by
 * the last moment our receive queue was seen empty before it was read
 * (pgcoord.quiet_ms, kept by inbound.c): it was sent after that, so the
 * deadline we derive is never later than the agent's — unless the agent
 * itself stalled between computing valid_ms and writing the message. For
 * that, the agent also sends its deadline on CLOCK_MONOTONIC
 * (valid_until_mono_ms), which a client on its host shares, and the
 * earlier of the two counts. Where the clocks are not shared (another time
 * namespace) the minimum can only shorten the belief, never lengthen it.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"
#include "pages.h"

/*
 * Takes in what the agent has already sent, without waiting: the one place
 * the belief questions' answers can move by I/O. Notifications read here
 * are queued for pgcoord_poll as usual. A broken connection closes the
 * handle (and so ends every belief).
 */
pgcoord_err pgcoord_lease_refresh(pgcoord *c)
{
	if (!c)
		return PGCOORD_E_ARG;
	if (c->fd < 0)
		return PGCOORD_E_CLOSED;
	/* Bounded, so an agent that floods us cannot keep us here. */
	for (int i = 0; i < 64 && c->fd >= 0; i++) {
		pgcoord_err err = pgcoord__drain_frames(c, NULL);
		if (err != PGCOORD_OK)
			return err;
		if (c->fd < 0)
			return PGCOORD_E_IO;
		err = pgcoord__read_more(c, pgcoord__deadline(0));
		if (err == PGCOORD_E_CALL_TIMEOUT)
			return PGCOORD_OK; /* nothing more to read now */
		if (err != PGCOORD_OK)
			return err;
	}
	return PGCOORD_OK;
}

/* --- calls --------------------------------------------------------------- */

static bool check_name(pgcoord *c, const char *name)
{
	if (!name || !*name) {
		pgcoord__set_message(c, "the lease name is empty");
		return false;
	}
	return true;
}

pgcoord_err pgcoord_lease_acquire(pgcoord *c, const char *name, int ttl_ms, bool wait,
				  int timeout_ms, bool *leader, int64_t *epoch)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0, off = 0;
	bool said = false;
	int64_t ep = 0, valid_ms = 0, ttl = 0, until = 0;

	if (leader)
		*leader = false;
	if (epoch)
		*epoch = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_name(c, name))
		return PGCOORD_E_ARG;
	if (ttl_ms < 0) {
		pgcoord__set_message(c, "ttl_ms %d is negative (0 asks for the agent's default)",
				     ttl_ms);
		return PGCOORD_E_ARG;
	}
	/* Track the lease from now on, so a win pushed while we wait is dated
	 * precisely (reads are sliced while something is tracked). */
	struct pgcoord_belief *b = pgcoord__belief_get(c, name, strlen(name));
	if (!b) {
		pgcoord__set_message(c, "out of memory");
		return PGCOORD_E_NOMEM;
	}

	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 2 + (ttl_ms > 0));
	pgc_pack_kv_str(&w.pk, "name", name);
	pgc_pack_kv_bool(&w.pk, "wait", wait);
	if (ttl_ms > 0)
		pgc_pack_kv_int(&w.pk, "ttl_ms", ttl_ms);
	pgcoord_err err = pgcoord__call_packed(c, "lease.acquire", &w, timeout_ms, &raw, &raw_len);
	if (err != PGCOORD_OK) {
		/* After a retryable error the agent may have won or be
		 * campaigning (a lease.changed will say): keep tracking. */
		b = pgcoord__belief_find(c, name, strlen(name));
		if (b && !b->leader && !pgcoord_err_retryable(err))
			pgcoord__belief_drop(c, name);
		return err;
	}

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, raw, raw_len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP ||
	    !pgc_obj_bool(pgc_map_get(&u.data, "leader"), &said) ||
	    !pgc_obj_int64(pgc_map_get(&u.data, "epoch"), &ep) ||
	    (said &&
	     (!pgc_obj_int64(pgc_map_get(&u.data, "valid_ms"), &valid_ms) || valid_ms < 0))) {
		pgcoord__set_message(c, "the lease.acquire result has no valid leader/epoch");
		err = PGCOORD_E_PROTOCOL;
		said = false;
	} else {
		pgc_obj_int64(pgc_map_get(&u.data, "ttl_ms"), &ttl);
		until = pgcoord__belief_deadline(&u.data, c->reply_stamp_ms, valid_ms);
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);

	/* The result is the agent's belief when it answered, in stream order
	 * with its notifications. */
	pgcoord__belief_set(c, name, strlen(name), said, ep, until);
	if ((b = pgcoord__belief_find(c, name, strlen(name))) && ttl > 0)
		b->ttl_ms = ttl;
	if (!said && !wait) /* the agent keeps nothing for a lost one-shot try */
		pgcoord__belief_drop(c, name);
	if (err != PGCOORD_OK)
		return err;
	if (leader)
		*leader = pgcoord__belief_live(pgcoord__belief_find(c, name, strlen(name)),
					       pgcoord__now_ms());
	if (epoch)
		*epoch = ep;
	return PGCOORD_OK;
}

void pgcoord_lease_opts_init(struct pgcoord_lease_opts *opts)
{
	if (opts)
		*opts = (struct pgcoord_lease_opts)PGCOORD_LEASE_OPTS_INIT;
}

pgcoord_err pgcoord_lease_acquire_with(pgcoord *c, const char *name,
				       const struct pgcoord_lease_opts *opts, int timeout_ms,
				       bool *leader, int64_t *epoch)
{
	if (leader)
		*leader = false;
	if (epoch)
		*epoch = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (!pgcoord__opts_size_ok(c, opts, opts ? opts->size : 0,
				   sizeof(struct pgcoord_lease_opts),
				   sizeof(struct pgcoord_lease_opts), "PGCOORD_LEASE_OPTS_INIT"))
		return PGCOORD_E_ARG;
	return pgcoord_lease_acquire(c, name, opts->ttl_ms, opts->wait, timeout_ms, leader, epoch);
}

pgcoord_err pgcoord_lease_release(pgcoord *c, const char *name, int timeout_ms, bool *released)
{
	struct pgcoord_writer w;
	msgpack_unpacked u;
	void *raw = NULL;
	size_t raw_len = 0, off = 0;
	bool rel = false;

	if (released)
		*released = false;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_name(c, name))
		return PGCOORD_E_ARG;
	/* Belief ends before the hand-back is even asked for. */
	pgcoord__belief_drop(c, name);

	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "name", name);
	pgcoord_err err = pgcoord__call_packed(c, "lease.release", &w, timeout_ms, &raw, &raw_len);
	if (err != PGCOORD_OK)
		return err;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, raw, raw_len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP ||
	    !pgc_obj_bool(pgc_map_get(&u.data, "released"), &rel)) {
		pgcoord__set_message(c, "the lease.release result has no \"released\"");
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(raw);
	if (err == PGCOORD_OK && released)
		*released = rel;
	return err;
}

pgcoord_err pgcoord_lease_status(pgcoord *c, const char *name, int timeout_ms, void **result,
				 size_t *result_len)
{
	struct pgcoord_writer w;

	if (result)
		*result = NULL;
	if (result_len)
		*result_len = 0;
	if (!c)
		return PGCOORD_E_ARG;
	if (!check_name(c, name))
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, 1);
	pgc_pack_kv_str(&w.pk, "name", name);
	return pgcoord__call_packed(c, "lease.status", &w, timeout_ms, result, result_len);
}

pgcoord_err pgcoord_lease_list(pgcoord *c, int timeout_ms, void **result, size_t *result_len)
{
	/* every page: the whole list, as before lease.list paged */
	return pgcoord__list_all(c, "lease.list", NULL, 0, "leases", timeout_ms, result,
				 result_len);
}

/* --- the local belief ---------------------------------------------------- */

bool pgcoord_lease_is_leader(const pgcoord *c, const char *name)
{
	if (!c || !name)
		return false;
	return pgcoord__belief_live(pgcoord__belief_find(c, name, strlen(name)), pgcoord__now_ms());
}

int64_t pgcoord_lease_valid_ms(const pgcoord *c, const char *name)
{
	if (!c || !name)
		return 0;
	const struct pgcoord_belief *b = pgcoord__belief_find(c, name, strlen(name));
	int64_t now = pgcoord__now_ms();
	return pgcoord__belief_live(b, now) ? b->until_ms - now : 0;
}

int64_t pgcoord_lease_epoch(const pgcoord *c, const char *name)
{
	if (!c || !name)
		return 0;
	const struct pgcoord_belief *b = pgcoord__belief_find(c, name, strlen(name));
	return pgcoord__belief_live(b, pgcoord__now_ms()) ? b->epoch : 0;
}

int64_t pgcoord_lease_ttl_ms(const pgcoord *c, const char *name)
{
	const struct pgcoord_belief *b =
	    c && name ? pgcoord__belief_find(c, name, strlen(name)) : NULL;
	return b ? b->ttl_ms : 0;
}
