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

struct admission {
	const char *status; /* "admitted" or "held" */
	int64_t token, owner_session;
	int64_t queued_ms; /* -1: it did not queue */
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
	msgpack_pack_map(&pk, a->queued_ms >= 0 ? 5 : 4);
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
	fprintf(stderr, "pgcoordctl: claim %s: queued at position %lld\n", opt->id,
		(long long)pgcoord_claim_queue_position(cl));
	pgcoord_err err =
	    pgcoord_permit_await(c, opt->id, (int)(opt->wait_ms + CTL_CLAIM_NOTICE_MS), &ev);
	int rc;
	if (err == PGCOORD_OK) {
		struct admission a = {"admitted", ev->token, ev->owner_session, ev->queued_ms};
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
		    pgcoord_claim_get_token(cl), pgcoord_claim_get_owner_session(cl), -1};
		print_admission(opt, &a);
		rc = EXIT_OK;
		break;
	}
	case PGCOORD_CLAIM_DENIED:
		fprintf(stderr,
			"pgcoordctl: claim %s: denied: quota %s has no room (in flight %lld of "
			"limit %lld)\n",
			opt->id, pgcoord_claim_denied_quota(cl),
			(long long)pgcoord_claim_denied_in_flight(cl),
			(long long)pgcoord_claim_denied_limit(cl));
		rc = EXIT_FAILED;
		break;
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
