/*
 * ctl_claim.c — see ctl_claim.h.
 */
#include "ctl_claim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "ctl_msgpack.h"
#include "ctl_print.h"
#include "pgcoord/pgcoord.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_NOCONNECT = 3, EXIT_IO = 4 };

/* The agent may notice an admission or expiry up to one wait_poll_ms (at
 * most 10 s) after it happened: the await allows that much past wait_ms
 * before it cancels. */
#define CTL_CLAIM_NOTICE_MS 11000

static int exit_for(pgcoord_err err)
{
	switch (err) {
	case PGCOORD_OK:
		return EXIT_OK;
	case PGCOORD_E_CONNECT:
		return EXIT_NOCONNECT;
	case PGCOORD_E_IO:
	case PGCOORD_E_CALL_TIMEOUT:
	case PGCOORD_E_CLOSED:
	case PGCOORD_E_PROTOCOL:
		return EXIT_IO;
	default:
		return EXIT_FAILED;
	}
}

static int fail(pgcoord *c, const char *what, const char *id, pgcoord_err err)
{
	const char *msg = c ? pgcoord_last_message(c) : "";
	const char *name = pgcoord_err_name(err);
	fprintf(stderr, "pgcoordctl: %s %s: %s%s%s\n", what, id,
		name ? name : pgcoord_strerror(err), *msg ? ": " : "", msg);
	return exit_for(err);
}

/* Connects and opens a session named after the command. */
static int open_session(const struct ctl_claim_options *opt, const char *what, pgcoord **out)
{
	pgcoord_err err = pgcoord_connect(opt->socket_path, opt->call_timeout_ms, out);
	if (err != PGCOORD_OK) {
		fprintf(stderr, "pgcoordctl: cannot connect to the agent at %s: %s\n",
			opt->socket_path, pgcoord_strerror(err));
		return exit_for(err);
	}
	char name[32];
	snprintf(name, sizeof(name), "pgcoordctl %s", what);
	err = pgcoord_session_open(*out, name, opt->call_timeout_ms, NULL);
	if (err != PGCOORD_OK)
		return fail(*out, what, opt->id, err);
	return EXIT_OK;
}

/* Who holds the room a denied or queued claim did not get (quota.why's
 * holders, as the answer carries them): the columns the text shows. */
static const struct ctl_column holder_cols[] = {
    {"ID", "id", CTL_FMT_AUTO},
    {"WEIGHT", "weight", CTL_FMT_AUTO},
    {"STATE", "state", CTL_FMT_AUTO},
    {"OWNER_REPLICA", "owner_replica", CTL_FMT_AUTO},
    {"SESSION", "owner_session", CTL_FMT_AUTO},
    {"AGE", "age_ms", CTL_FMT_DURATION},
    {"REASON", "reason", CTL_FMT_AUTO},
};
#define N_HOLDER_COLS (sizeof(holder_cols) / sizeof(holder_cols[0]))

/*
 * The room a denied or queued answer names, as one map: {quota, limit,
 * in_flight, waiting, hidden, holders: [...]} (a denial with `id` and
 * `status` first; a queued claim with its `position`). Without what the agent's read of the holders
 * told (an older agent, or that read failed) a denial has its own quota and numbers only, and a
 * queued claim nothing but its position.
 */
static void pack_room(msgpack_packer *pk, const pgcoord_claim *cl, const char *id)
{
	const char *quota = NULL;
	int64_t limit = 0, in_flight = 0, waiting = 0, hidden = 0;
	bool denied = pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_DENIED;
	bool known = pgcoord_claim_room(cl, &quota, &limit, &in_flight, &waiting, &hidden);
	size_t nholders = pgcoord_claim_holder_count(cl);

	if (denied && !known) {
		quota = pgcoord_claim_denied_quota(cl);
		limit = pgcoord_claim_denied_limit(cl);
		in_flight = pgcoord_claim_denied_in_flight(cl);
	}
	msgpack_pack_map(pk, (id ? 2 : 0) + (denied ? 0 : 1) + (denied || known ? 3 : 0) +
				 (known ? 3 : 0));
	if (id) {
		ctl_pack_kv_str(pk, "id", id);
		ctl_pack_kv_str(pk, "status", denied ? "denied" : "queued");
	}
	if (!denied)
		ctl_pack_kv_int(pk, "position", pgcoord_claim_queue_position(cl));
	if (denied || known) {
		ctl_pack_kv_str(pk, "quota", quota);
		ctl_pack_kv_int(pk, "limit", limit);
		ctl_pack_kv_int(pk, "in_flight", in_flight);
	}
	if (!known)
		return;
	ctl_pack_kv_int(pk, "waiting", waiting);
	ctl_pack_kv_int(pk, "hidden", hidden);
	ctl_pack_cstr(pk, "holders");
	msgpack_pack_array(pk, nholders);
	for (size_t i = 0; i < nholders; i++) {
		const pgcoord_holder *h = pgcoord_claim_holder_at(cl, i);
		msgpack_pack_map(pk, 7);
		ctl_pack_kv_str(pk, "id", h->id);
		ctl_pack_kv_int(pk, "weight", h->weight);
		ctl_pack_kv_str(pk, "state", h->state);
		ctl_pack_kv_str(pk, "owner_replica", h->owner_replica);
		ctl_pack_cstr(pk, "owner_session");
		if (h->owner_session < 0)
			msgpack_pack_nil(pk);
		else
			msgpack_pack_int64(pk, h->owner_session);
		ctl_pack_kv_int(pk, "age_ms", h->age_ms);
		ctl_pack_kv_str(pk, "reason", h->reason);
	}
}

/* For people, on stderr after the line that says denied or queued: the
 * quota's queue and its largest holders the caller may see. */
static void print_holders(const struct ctl_claim_options *opt, const msgpack_object *room)
{
	const msgpack_object *holders = ctl_map_get(room, "holders");
	int64_t waiting = 0, hidden = 0;

	if (!holders || holders->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(stderr,
			"pgcoordctl: claim %s: who holds the room is not known (ask "
			"`pgcoordctl why QUOTA`)\n",
			opt->id);
		return;
	}
	ctl_obj_int64(ctl_map_get(room, "waiting"), &waiting);
	ctl_obj_int64(ctl_map_get(room, "hidden"), &hidden);
	fprintf(stderr, "pgcoordctl: claim %s: %lld claim(s) waiting; held by, largest first:\n",
		opt->id, (long long)waiting);
	ctl_print_table(stderr, holders, holder_cols, N_HOLDER_COLS, 0);
	if (hidden > 0)
		fprintf(stderr, "(and %lld open permit(s) of other users, not shown)\n",
			(long long)hidden);
}

/* The room as a msgpack object in *u (the caller destroys *u and *sb). */
static const msgpack_object *room_object(const pgcoord_claim *cl, const char *id,
					 msgpack_sbuffer *sb, msgpack_unpacked *u)
{
	msgpack_packer pk;

	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	pack_room(&pk, cl, id);
	msgpack_unpacked_init(u);
	if (msgpack_unpack_next(u, sb->data, sb->size, NULL) != MSGPACK_UNPACK_SUCCESS)
		return NULL;
	return &u->data;
}

struct admission {
	const char *status; /* "admitted" or "held" */
	int64_t token, owner_session;
	int64_t queued_ms;	     /* -1: it did not queue */
	const pgcoord_claim *queued; /* the queued answer, or NULL */
};

static void print_admission(const struct ctl_claim_options *opt, const struct admission *a)
{
	if (!opt->json) {
		printf("%s %s token=%lld session=%lld", opt->id, a->status, (long long)a->token,
		       (long long)a->owner_session);
		if (a->queued_ms >= 0)
			printf(" queued_ms=%lld", (long long)a->queued_ms);
		printf("\n");
		return;
	}
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked u;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 4 + (a->queued_ms >= 0) + (a->queued != NULL));
	ctl_pack_cstr(&pk, "id");
	ctl_pack_cstr(&pk, opt->id);
	ctl_pack_cstr(&pk, "status");
	ctl_pack_cstr(&pk, a->status);
	ctl_pack_cstr(&pk, "token");
	msgpack_pack_int64(&pk, a->token);
	ctl_pack_cstr(&pk, "owner_session");
	msgpack_pack_int64(&pk, a->owner_session);
	if (a->queued_ms >= 0) {
		ctl_pack_cstr(&pk, "queued_ms");
		msgpack_pack_int64(&pk, a->queued_ms);
	}
	if (a->queued) {
		/* what it waited for, as the queued answer told it */
		ctl_pack_cstr(&pk, "queued_for");
		pack_room(&pk, a->queued, NULL);
	}
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
		ctl_print_json(stdout, &u.data);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}

/* The claim was queued: wait for its outcome. */
static int await_outcome(const struct ctl_claim_options *opt, pgcoord *c, const pgcoord_claim *cl)
{
	struct pgcoord_permit_event *ev = NULL;
	const char *quota = NULL;
	int64_t limit = 0, in_flight = 0;
	msgpack_sbuffer sb;
	msgpack_unpacked u;
	const msgpack_object *room = room_object(cl, NULL, &sb, &u);

	if (pgcoord_claim_room(cl, &quota, &limit, &in_flight, NULL, NULL))
		fprintf(stderr,
			"pgcoordctl: claim %s: queued at position %lld for quota %s (in flight "
			"%lld of limit %lld)\n",
			opt->id, (long long)pgcoord_claim_queue_position(cl), quota,
			(long long)in_flight, (long long)limit);
	else
		fprintf(stderr, "pgcoordctl: claim %s: queued at position %lld\n", opt->id,
			(long long)pgcoord_claim_queue_position(cl));
	if (room)
		print_holders(opt, room);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
	pgcoord_err err =
	    pgcoord_permit_await(c, opt->id, (int)(opt->wait_ms + CTL_CLAIM_NOTICE_MS), &ev);
	int rc;
	if (err == PGCOORD_OK) {
		struct admission a = {"admitted", ev->token, ev->owner_session, ev->queued_ms, cl};
		print_admission(opt, &a);
		rc = EXIT_OK;
	} else if (err == PGCOORD_E_EXPIRED) {
		fprintf(stderr, "pgcoordctl: claim %s: not admitted: %s\n", opt->id, ev->reason);
		rc = EXIT_FAILED;
	} else {
		rc = fail(c, "claim", opt->id, err);
		fprintf(stderr,
			"pgcoordctl: the claim may still wait or hold a permit: check with "
			"`pgcoordctl permits show %s`\n",
			opt->id);
	}
	pgcoord_permit_event_free(ev);
	return rc;
}

int ctl_claim(const struct ctl_claim_options *opt)
{
	pgcoord *c = NULL;
	pgcoord_claim *cl = NULL;
	struct pgcoord_claim_opts o = PGCOORD_CLAIM_OPTS_INIT;
	int rc = open_session(opt, "claim", &c);

	if (rc != EXIT_OK)
		goto out;
	o.keys = opt->keys;
	o.weights = opt->weights;
	o.nquotas = opt->nquotas;
	o.intent = opt->intent;
	o.intent_len = opt->intent ? strlen(opt->intent) : 0;
	o.wait_ms = opt->wait_ms;
	pgcoord_err err = pgcoord_permit_claim(c, opt->id, &o, opt->call_timeout_ms, &cl);
	if (err != PGCOORD_OK) {
		rc = fail(c, "claim", opt->id, err);
		goto out;
	}
	switch (pgcoord_claim_get_status(cl)) {
	case PGCOORD_CLAIM_ADMITTED:
	case PGCOORD_CLAIM_HELD: {
		struct admission a = {
		    pgcoord_claim_get_status(cl) == PGCOORD_CLAIM_HELD ? "held" : "admitted",
		    pgcoord_claim_get_token(cl), pgcoord_claim_get_owner_session(cl), -1, NULL};
		print_admission(opt, &a);
		rc = EXIT_OK;
		break;
	}
	case PGCOORD_CLAIM_DENIED: {
		msgpack_sbuffer sb;
		msgpack_unpacked u;
		const msgpack_object *room = room_object(cl, opt->id, &sb, &u);
		fprintf(stderr,
			"pgcoordctl: claim %s: denied: quota %s has no room (in flight %lld of "
			"limit %lld)\n",
			opt->id, pgcoord_claim_denied_quota(cl),
			(long long)pgcoord_claim_denied_in_flight(cl),
			(long long)pgcoord_claim_denied_limit(cl));
		if (room)
			print_holders(opt, room);
		if (room && opt->json)
			ctl_print_json(stdout, room);
		msgpack_unpacked_destroy(&u);
		msgpack_sbuffer_destroy(&sb);
		rc = EXIT_FAILED;
		break;
	}
	case PGCOORD_CLAIM_QUEUED:
		rc = await_outcome(opt, c, cl);
		break;
	}
out:
	pgcoord_claim_free(cl);
	pgcoord_close(c);
	return rc;
}

int ctl_cancel(const struct ctl_claim_options *opt)
{
	pgcoord *c = NULL;
	pgcoord_cancel_status st = 0;
	int rc = open_session(opt, "cancel", &c);

	if (rc != EXIT_OK)
		goto out;
	pgcoord_err err = pgcoord_permit_cancel(c, opt->id, opt->call_timeout_ms, &st);
	if (err != PGCOORD_OK) {
		rc = fail(c, "cancel", opt->id, err);
		goto out;
	}
	if (st == PGCOORD_CANCEL_CANCELLED) {
		printf("%s cancelled\n", opt->id);
		rc = EXIT_OK;
	} else {
		fprintf(stderr,
			"pgcoordctl: cancel %s: not waiting: it was admitted and %s (release it "
			"with `pgcoordctl permits release %s --override`)\n",
			opt->id,
			st == PGCOORD_CANCEL_RELEASED ? "released already" : "holds a permit",
			opt->id);
		rc = EXIT_FAILED;
	}
out:
	pgcoord_close(c);
	return rc;
}
