/*
 * session.c — typed helpers over pgcoord_call for agent.ping and the
 * session.* methods, and the handle's record of its session id.
 */
#include <stdlib.h>

#include <msgpack.h>

#include "proto/codec.h"
#include "handle.h"

/*
 * Calls method with the params packed in w (consumed) and reads the
 * session id out of the result map. A result without one is a protocol
 * error but leaves the connection usable: framing is intact.
 */
static pgcoord_err call_for_session(pgcoord *c, const char *method, struct pgcoord_writer *w,
				    int timeout_ms, int64_t *session)
{
	size_t plen;
	char *params = pgcoord__writer_release(w, &plen);
	if (!params) {
		pgcoord__set_message(c, "out of memory encoding %s", method);
		return PGCOORD_E_NOMEM;
	}

	void *res = NULL;
	size_t res_len = 0;
	pgcoord_err err = pgcoord_call(c, method, params, plen, timeout_ms, &res, &res_len);
	free(params);
	if (err != PGCOORD_OK)
		return err;

	msgpack_unpacked u;
	size_t off = 0;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, res, res_len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP ||
	    !pgc_obj_int64(pgc_map_get(&u.data, "session"), session) || *session <= 0) {
		pgcoord__set_message(c, "the %s result has no valid session id", method);
		err = PGCOORD_E_PROTOCOL;
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);
	return err;
}

pgcoord_err pgcoord_ping(pgcoord *c, int timeout_ms)
{
	return pgcoord_call(c, "agent.ping", NULL, 0, timeout_ms, NULL, NULL);
}

pgcoord_err pgcoord_session_open(pgcoord *c, const char *name, int timeout_ms, int64_t *session_id)
{
	struct pgcoord_writer w;
	int64_t id = 0;

	if (session_id)
		*session_id = 0;
	if (!c)
		return PGCOORD_E_ARG;
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, (name ? 1 : 0) + (c->keepalive_ms ? 1 : 0));
	if (name)
		pgc_pack_kv_str(&w.pk, "name", name);
	if (c->keepalive_ms)
		pgc_pack_kv_int(&w.pk, "keepalive_ms", c->keepalive_ms);
	pgcoord_err err = call_for_session(c, "session.open", &w, timeout_ms, &id);
	if (err != PGCOORD_OK)
		return err;
	c->session_id = id;
	if (session_id)
		*session_id = id;
	return PGCOORD_OK;
}

pgcoord_err pgcoord_session_resume(pgcoord *c, int64_t session_id, int timeout_ms)
{
	struct pgcoord_writer w;
	int64_t id = 0;

	if (!c)
		return PGCOORD_E_ARG;
	if (session_id <= 0) {
		pgcoord__set_message(c, "session id %lld is not a session", (long long)session_id);
		return PGCOORD_E_ARG;
	}
	pgcoord__writer_init(&w);
	msgpack_pack_map(&w.pk, c->keepalive_ms ? 2 : 1);
	pgc_pack_kv_int(&w.pk, "resume", session_id);
	/* counts only for a session the agent took over from a crashed
	 * predecessor, which could not pass it on */
	if (c->keepalive_ms)
		pgc_pack_kv_int(&w.pk, "keepalive_ms", c->keepalive_ms);
	pgcoord_err err = call_for_session(c, "session.open", &w, timeout_ms, &id);
	if (err != PGCOORD_OK)
		return err;
	if (id != session_id) {
		pgcoord__set_message(c, "asked to resume session %lld, the agent attached %lld",
				     (long long)session_id, (long long)id);
		return PGCOORD_E_PROTOCOL;
	}
	c->session_id = id;
	return PGCOORD_OK;
}

pgcoord_err pgcoord_session_close(pgcoord *c, int timeout_ms)
{
	if (!c)
		return PGCOORD_E_ARG;
	/* The agent ends the session's beliefs before it hands leases back;
	 * this side ends them before even asking. */
	pgcoord__beliefs_end(c);
	pgcoord_err err = pgcoord_call(c, "session.close", NULL, 0, timeout_ms, NULL, NULL);
	/* Whichever way, the agent holds no session for this connection now. */
	if (err == PGCOORD_OK || err == PGCOORD_E_NO_SESSION || err == PGCOORD_E_SESSION_EXPIRED)
		c->session_id = 0;
	return err;
}

pgcoord_err pgcoord_set_session_keepalive(pgcoord *c, int keepalive_ms)
{
	if (!c)
		return PGCOORD_E_ARG;
	if (keepalive_ms != 0 && (keepalive_ms < 100 || keepalive_ms > 600000)) {
		pgcoord__set_message(c, "keepalive_ms must be 0 (none) or 100..600000, not %d",
				     keepalive_ms);
		return PGCOORD_E_ARG;
	}
	c->keepalive_ms = keepalive_ms;
	return PGCOORD_OK;
}

pgcoord_err pgcoord_session_keepalive(pgcoord *c, int timeout_ms, int64_t *next_due_ms)
{
	void *res = NULL;
	size_t res_len = 0;

	if (next_due_ms)
		*next_due_ms = 0;
	if (!c)
		return PGCOORD_E_ARG;
	pgcoord_err err = pgcoord_call(c, "session.keepalive", NULL, 0, timeout_ms, &res, &res_len);
	if (err == PGCOORD_E_SESSION_EXPIRED || err == PGCOORD_E_NO_SESSION) {
		/* the agent holds no session for this connection any more */
		pgcoord__beliefs_end(c);
		c->session_id = 0;
	}
	if (err != PGCOORD_OK)
		return err;

	msgpack_unpacked u;
	size_t off = 0;
	int64_t due = 0;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, res, res_len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		pgcoord__set_message(c, "the session.keepalive result is not a map");
		err = PGCOORD_E_PROTOCOL;
	} else if (pgc_obj_int64(pgc_map_get(&u.data, "next_due_ms"), &due) && next_due_ms) {
		*next_due_ms = due; /* absent from an older agent: 0 */
	}
	msgpack_unpacked_destroy(&u);
	pgcoord_free(res);
	return err;
}
