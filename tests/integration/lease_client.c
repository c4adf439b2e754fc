/*
 * lease_client.c — see lease_client.h.
 */
#include "lease_client.h"

#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/codec.h"

int64_t lc_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --- packing params ----------------------------------------------------- */

struct lparams {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static msgpack_packer *lparams_begin(struct lparams *p, uint32_t nkeys)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&p->pk, nkeys);
	return &p->pk;
}

/* A decoded result map; its strings point into raw, so both live together. */
struct lresult {
	msgpack_unpacked u;
	void *raw;
};

static void lresult_destroy(struct lresult *r)
{
	msgpack_unpacked_destroy(&r->u);
	pgcoord_free(r->raw);
}

/* Calls method with p's map; on PGCOORD_OK and a non-NULL r, r holds the
 * decoded result map (lresult_destroy it). Frees p. */
static pgcoord_err call(struct lclient *lc, const char *method, struct lparams *p,
			struct lresult *r)
{
	size_t len = 0;
	void *raw = NULL;
	pgcoord_err err = pgcoord_call(lc->c, method, p ? p->sb.data : NULL, p ? p->sb.size : 0,
				       LC_CALL_MS, r ? &raw : NULL, r ? &len : NULL);

	if (p)
		msgpack_sbuffer_destroy(&p->sb);
	if (err != PGCOORD_OK || !r) {
		pgcoord_free(raw);
		return err;
	}
	r->raw = raw;
	msgpack_unpacked_init(&r->u);
	if (msgpack_unpack_next(&r->u, raw, len, NULL) != MSGPACK_UNPACK_SUCCESS ||
	    r->u.data.type != MSGPACK_OBJECT_MAP) {
		lresult_destroy(r);
		return PGCOORD_E_PROTOCOL;
	}
	return PGCOORD_OK;
}

static int64_t get_int(const msgpack_object *map, const char *key)
{
	int64_t v = 0;

	pgc_obj_int64(pgc_map_get(map, key), &v);
	return v;
}

static bool get_bool(const msgpack_object *map, const char *key)
{
	bool v = false;

	pgc_obj_bool(pgc_map_get(map, key), &v);
	return v;
}

static void get_str(const msgpack_object *map, const char *key, char *buf, size_t size)
{
	const char *s = NULL;
	size_t n = 0;

	buf[0] = '\0';
	if (pgc_obj_str(pgc_map_get(map, key), &s, &n))
		snprintf(buf, size, "%.*s", (int)n, s);
}

/* holder: {session, replica_id} | nil */
static bool get_holder(const msgpack_object *map, int64_t *session, char *replica, size_t size)
{
	const msgpack_object *h = pgc_map_get(map, "holder");

	*session = 0;
	replica[0] = '\0';
	if (!h || h->type != MSGPACK_OBJECT_MAP)
		return false;
	*session = get_int(h, "session");
	get_str(h, "replica_id", replica, size);
	return true;
}

static void parse_lease(const msgpack_object *map, struct lreply *out)
{
	memset(out, 0, sizeof(*out));
	out->epoch = get_int(map, "epoch");
	out->leader = get_bool(map, "leader");
	out->valid_ms = get_int(map, "valid_ms");
	out->campaigning = get_bool(map, "campaigning");
	out->ttl_ms = get_int(map, "ttl_ms");
	out->expires_in_ms = get_int(map, "expires_in_ms");
	out->has_holder =
	    get_holder(map, &out->holder_session, out->holder_replica, sizeof(out->holder_replica));
}

/* --- notifications ------------------------------------------------------ */

static void on_notify(void *user, const char *method, const void *params, size_t params_len)
{
	struct lclient *lc = user;
	struct lnote n;
	msgpack_unpacked u;

	memset(&n, 0, sizeof(n));
	n.at_ms = hnow_ms();
	n.wall_ms = lc_wall_ms();
	snprintf(n.method, sizeof(n.method), "%s", method);
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, params_len, NULL) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_MAP) {
		const msgpack_object *m = &u.data;

		get_str(m, "name", n.name, sizeof(n.name));
		n.epoch = get_int(m, "epoch");
		n.leader = get_bool(m, "leader");
		n.valid_ms = get_int(m, "valid_ms");
		n.session = get_int(m, "session");
		n.has_holder =
		    get_holder(m, &n.holder_session, n.holder_replica, sizeof(n.holder_replica));
		n.safe_ms = get_int(m, "safe_ms");
		get_str(m, "reason", n.reason, sizeof(n.reason));
	}
	msgpack_unpacked_destroy(&u);
	if (lc->nnotes == lc->cap) {
		size_t cap = lc->cap ? lc->cap * 2 : 64;
		struct lnote *bigger = realloc(lc->notes, cap * sizeof(*bigger));

		if (!bigger)
			return; /* the test then misses a note and fails on it */
		lc->notes = bigger;
		lc->cap = cap;
	}
	lc->notes[lc->nnotes++] = n;
	if (lc->hook)
		lc->hook(lc, &lc->notes[lc->nnotes - 1]);
}

pgcoord_err lc_poll(struct lclient *lc, int timeout_ms)
{
	if (!lc->c)
		return PGCOORD_E_CLOSED;
	return pgcoord_poll(lc->c, timeout_ms, NULL);
}

/* --- connection and session --------------------------------------------- */

pgcoord_err lc_open(struct lclient *lc, const char *socket_path, const char *session_name)
{
	pgcoord_err err = pgcoord_connect(socket_path, LC_CALL_MS, &lc->c);

	lc->session = 0;
	if (err != PGCOORD_OK) {
		lc->c = NULL;
		return err;
	}
	pgcoord_set_notify(lc->c, on_notify, lc);
	if (session_name) {
		err = lc_session_open(lc, session_name);
		if (err != PGCOORD_OK) {
			pgcoord_close(lc->c);
			lc->c = NULL;
		}
	}
	return err;
}

void lc_close(struct lclient *lc)
{
	pgcoord_close(lc->c);
	lc->c = NULL;
	lc->session = 0;
	free(lc->notes);
	lc->notes = NULL;
	lc->nnotes = lc->cap = lc->cursor = 0;
}

pgcoord_err lc_session_open(struct lclient *lc, const char *name)
{
	return pgcoord_session_open(lc->c, name, LC_CALL_MS, &lc->session);
}

pgcoord_err lc_session_resume(struct lclient *lc, int64_t session)
{
	pgcoord_err err = pgcoord_session_resume(lc->c, session, LC_CALL_MS);

	lc->session = err == PGCOORD_OK ? session : 0;
	return err;
}

pgcoord_err lc_session_close(struct lclient *lc)
{
	pgcoord_err err = pgcoord_session_close(lc->c, LC_CALL_MS);

	lc->session = 0;
	return err;
}

/* --- lease calls -------------------------------------------------------- */

pgcoord_err lc_acquire(struct lclient *lc, const char *name, int ttl_ms, bool wait,
		       struct lreply *out)
{
	struct lparams p;
	struct lresult u;
	msgpack_packer *pk = lparams_begin(&p, ttl_ms > 0 ? 3 : 2);

	pgc_pack_kv_str(pk, "name", name);
	pgc_pack_kv_bool(pk, "wait", wait);
	if (ttl_ms > 0)
		pgc_pack_kv_int(pk, "ttl_ms", ttl_ms);
	pgcoord_err err = call(lc, "lease.acquire", &p, &u);
	if (err != PGCOORD_OK)
		return err;
	if (out)
		parse_lease(&u.u.data, out);
	lresult_destroy(&u);
	return PGCOORD_OK;
}

pgcoord_err lc_release(struct lclient *lc, const char *name, bool *released)
{
	struct lparams p;
	struct lresult u;
	msgpack_packer *pk = lparams_begin(&p, 1);

	pgc_pack_kv_str(pk, "name", name);
	pgcoord_err err = call(lc, "lease.release", &p, &u);
	if (err != PGCOORD_OK)
		return err;
	if (released)
		*released = get_bool(&u.u.data, "released");
	lresult_destroy(&u);
	return PGCOORD_OK;
}

pgcoord_err lc_status(struct lclient *lc, const char *name, bool watch, struct lreply *out)
{
	struct lparams p;
	struct lresult u;
	msgpack_packer *pk = lparams_begin(&p, 2);

	pgc_pack_kv_str(pk, "name", name);
	pgc_pack_kv_bool(pk, "watch", watch);
	pgcoord_err err = call(lc, "lease.status", &p, &u);
	if (err != PGCOORD_OK)
		return err;
	if (out)
		parse_lease(&u.u.data, out);
	lresult_destroy(&u);
	return PGCOORD_OK;
}

/* --- the test's thread -------------------------------------------------- */

void lc_open_ok(struct lclient *lc, struct hagent *a, const char *session_name)
{
	pgcoord_err err = lc_open(lc, hagent_socket(a), session_name);

	cr_assert_eq(err, PGCOORD_OK, "%s: connecting to %s: %s; agent log:\n%s", lc->label,
		     hagent_replica_id(a), pgcoord_strerror(err), hagent_log(a));
}

void lc_acquire_ok(struct lclient *lc, const char *name, int ttl_ms, bool wait, struct lreply *out)
{
	pgcoord_err err = lc_acquire(lc, name, ttl_ms, wait, out);

	cr_assert_eq(err, PGCOORD_OK, "%s: lease.acquire %s: %s (%s)", lc->label, name,
		     pgcoord_strerror(err), pgcoord_last_message(lc->c));
}

bool lc_release_ok(struct lclient *lc, const char *name)
{
	bool released = false;
	pgcoord_err err = lc_release(lc, name, &released);

	cr_assert_eq(err, PGCOORD_OK, "%s: lease.release %s: %s (%s)", lc->label, name,
		     pgcoord_strerror(err), pgcoord_last_message(lc->c));
	return released;
}

void lc_status_ok(struct lclient *lc, const char *name, bool watch, struct lreply *out)
{
	pgcoord_err err = lc_status(lc, name, watch, out);

	cr_assert_eq(err, PGCOORD_OK, "%s: lease.status %s: %s (%s)", lc->label, name,
		     pgcoord_strerror(err), pgcoord_last_message(lc->c));
}

/* Finds the next matching note from the cursor on. */
static bool take_note(struct lclient *lc, const char *method, int leader, struct lnote *out)
{
	for (; lc->cursor < lc->nnotes; lc->cursor++) {
		const struct lnote *n = &lc->notes[lc->cursor];

		if (strcmp(n->method, method) == 0 && (leader < 0 || n->leader == leader)) {
			if (out)
				*out = *n;
			lc->cursor++;
			return true;
		}
	}
	return false;
}

bool lc_wait(struct lclient *lc, const char *method, int leader, int timeout_ms, struct lnote *out)
{
	int64_t deadline = hnow_ms() + timeout_ms;

	for (;;) {
		if (take_note(lc, method, leader, out))
			return true;
		int64_t left = deadline - hnow_ms();
		/* polls at least once, so a timeout of 0 still takes what arrived */
		if (lc_poll(lc, left > 50 ? 50 : left > 0 ? (int)left : 0) != PGCOORD_OK)
			/* what arrived before the agent closed was delivered */
			return take_note(lc, method, leader, out);
		if (left <= 0)
			return take_note(lc, method, leader, out);
	}
}

struct lnote lc_expect(struct lclient *lc, const char *method, int leader, int timeout_ms,
		       const char *what)
{
	struct lnote n;

	cr_assert(lc_wait(lc, method, leader, timeout_ms, &n), "%s: no %s%s within %d ms (%s)",
		  lc->label, method, leader < 0 ? "" : (leader ? " leader=true" : " leader=false"),
		  timeout_ms, what);
	return n;
}

/* agent.status result field on a fresh connection; false when no answer. */
static bool status_field(struct hagent *a, const char *key, int timeout_ms, int64_t *v, bool *b)
{
	pgcoord *c = NULL;
	void *res = NULL;
	size_t len = 0;
	bool ok = false;

	if (pgcoord_connect(hagent_socket(a), timeout_ms, &c) != PGCOORD_OK)
		return false;
	if (pgcoord_call(c, "agent.status", NULL, 0, timeout_ms, &res, &len) == PGCOORD_OK) {
		msgpack_unpacked u;

		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, res, len, NULL) == MSGPACK_UNPACK_SUCCESS) {
			const msgpack_object *o = pgc_map_get(&u.data, key);

			ok = v ? pgc_obj_int64(o, v) : pgc_obj_bool(o, b);
		}
		msgpack_unpacked_destroy(&u);
	}
	pgcoord_free(res);
	pgcoord_close(c);
	return ok;
}

int64_t lc_agent_status_int(struct hagent *a, const char *key)
{
	int64_t v = 0;

	cr_assert(status_field(a, key, LC_CALL_MS, &v, NULL),
		  "agent.status of %s gave no integer %s; log:\n%s", hagent_replica_id(a), key,
		  hagent_log(a));
	return v;
}

bool lc_agent_status_bool(struct hagent *a, const char *key)
{
	bool v = false;

	cr_assert(status_field(a, key, LC_CALL_MS, NULL, &v),
		  "agent.status of %s gave no boolean %s; log:\n%s", hagent_replica_id(a), key,
		  hagent_log(a));
	return v;
}

bool lc_agent_status_try(struct hagent *a, const char *key, int timeout_ms, bool *value)
{
	return status_field(a, key, timeout_ms, NULL, value);
}
