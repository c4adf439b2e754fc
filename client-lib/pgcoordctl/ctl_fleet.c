/*
 * ctl_fleet.c — the commands about the agent and its fleet as a whole:
 * ping, status, agents, sessions, check (the permit ledger's conservation
 * across the fleet) and migrate (the schema; ctl_migrate.c runs it).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <msgpack.h>

#include "pgcoord/pgcoord.h"
#include "ctl.h"
#include "ctl_migrate.h"
#include "ctl_msgpack.h"
#include "ctl_print.h"

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int ctl_cmd_ping(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_result r;
	int rc = ctl_connect(ctx);
	if (rc != CTL_EXIT_OK)
		return rc;

	double t0 = mono_ms();
	rc = ctl_call(ctx, "agent.ping", NULL, 0, &r);
	double rtt = mono_ms() - t0;
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		printf("pong from %s in %.2f ms\n", ctx->socket_path, rtt);
	ctl_result_free(&r);
	return CTL_EXIT_OK;
}

/* Healthy means what a replica needs from its agent: serving, registered,
 * and its database reachable. Scripts (and scripts/dev) wait on this. */
static bool status_healthy(const struct pgcoord_agent_status *st, char *why, size_t whylen)
{
	if (strcmp(st->state, "serving") != 0 || !st->db_up || !st->registered) {
		snprintf(why, whylen, "state=%s db=%s registered=%s", st->state,
			 st->db_up ? "up" : "down", st->registered ? "true" : "false");
		return false;
	}
	return true;
}

int ctl_cmd_status(struct ctl *ctx, int argc, char **argv)
{
	struct ctl_result r;
	struct pgcoord_agent_status *st = NULL;
	char why[160];
	int rc = ctl_call(ctx, "agent.status", NULL, 0, &r);
	if (rc != CTL_EXIT_OK)
		return rc;
	if (ctx->json)
		ctl_print_json(stdout, r.obj);
	else
		ctl_print_fields(stdout, r.obj, ctl_now_ms(r.obj));
	ctl_result_free(&r);
	/* every field is printed as the agent sent it; the verdict is read
	 * from the typed status (agent.status never touches the database) */
	pgcoord_err err = pgcoord_agent_status_get(ctx->conn, ctx->timeout_ms, &st);
	if (err != PGCOORD_OK)
		return ctl_call_failed(ctx, "agent.status", err);
	rc = CTL_EXIT_OK;
	if (!status_healthy(st, why, sizeof(why))) {
		fprintf(stderr, "pgcoordctl: the agent is not healthy: %s\n", why);
		rc = CTL_EXIT_FAILED;
	}
	pgcoord_agent_status_free(st);
	return rc;
}

int ctl_cmd_agents(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"REPLICA", "replica_id", CTL_FMT_AUTO},
	    {"INCARNATION", "incarnation", CTL_FMT_AUTO},
	    {"HOST", "host", CTL_FMT_AUTO},
	    {"PID", "pid", CTL_FMT_AUTO},
	    {"LIVE", "live", CTL_FMT_YESNO},
	    {"STARTED", "started_at", CTL_FMT_AGE},
	    {"HEARTBEAT", "heartbeat_at", CTL_FMT_AGE},
	    {"EXPIRES", "expires_at", CTL_FMT_AGE},
	};
	return ctl_list_command(ctx, "fleet.agents", "agents", cols,
				sizeof(cols) / sizeof(cols[0]));
}

int ctl_cmd_sessions(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"SESSION", "session", CTL_FMT_AUTO},	  {"NAME", "name", CTL_FMT_AUTO},
	    {"UID", "owner_uid", CTL_FMT_AUTO},		  {"REPLICA", "replica_id", CTL_FMT_AUTO},
	    {"INCARNATION", "incarnation", CTL_FMT_AUTO}, {"OPENED", "opened_at", CTL_FMT_AGE},
	    {"EXPIRES", "expires_at", CTL_FMT_AGE},
	};
	return ctl_list_command(ctx, "fleet.sessions", "sessions", cols,
				sizeof(cols) / sizeof(cols[0]));
}

int ctl_cmd_migrate(struct ctl *ctx, int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return ctl_migrate(ctx->database_url, ctx->runtime_role, ctx->json) == 0 ? CTL_EXIT_OK
										 : CTL_EXIT_FAILED;
}

/* permit.check's violations as table rows. */
static void pack_violations(msgpack_packer *pk, const struct pgcoord_check_report *r)
{
	msgpack_pack_array(pk, r->nviolations);
	for (size_t i = 0; i < r->nviolations; i++) {
		const struct pgcoord_check_violation *v = &r->violations[i];
		msgpack_pack_map(pk, 6);
		ctl_pack_kv_str(pk, "key", v->key);
		ctl_pack_kv_int(pk, "limit", v->limit);
		ctl_pack_kv_int(pk, "in_flight", v->in_flight);
		ctl_pack_kv_int(pk, "permit_weights", v->permit_weights);
		ctl_pack_kv_int(pk, "audit_sum", v->audit_sum);
		ctl_pack_kv_str(pk, "problem", v->problem ? v->problem : "");
	}
}

int ctl_cmd_check(struct ctl *ctx, int argc, char **argv)
{
	static const struct ctl_column cols[] = {
	    {"KEY", "key", CTL_FMT_AUTO},
	    {"LIMIT", "limit", CTL_FMT_AUTO},
	    {"IN_FLIGHT", "in_flight", CTL_FMT_AUTO},
	    {"PERMIT_WEIGHTS", "permit_weights", CTL_FMT_AUTO},
	    {"AUDIT_SUM", "audit_sum", CTL_FMT_AUTO},
	    {"PROBLEM", "problem", CTL_FMT_AUTO},
	};
	struct pgcoord_check_report *r = NULL;
	struct ctl_result raw;
	bool ok = false;

	if (ctx->json) { /* the agent's result as it came */
		int rc = ctl_call(ctx, "permit.check", NULL, 0, &raw);
		if (rc != CTL_EXIT_OK)
			return rc;
		bool has_ok = ctl_obj_bool(ctl_map_get(raw.obj, "ok"), &ok);
		if (has_ok)
			ctl_print_json(stdout, raw.obj);
		else
			fprintf(stderr, "pgcoordctl: permit.check: the result has no \"ok\"\n");
		ctl_result_free(&raw);
		return !has_ok ? CTL_EXIT_IO : ok ? CTL_EXIT_OK : CTL_EXIT_FAILED;
	}
	if (!ctx->conn) {
		int rc = ctl_connect(ctx);
		if (rc != CTL_EXIT_OK)
			return rc;
	}
	pgcoord_err err = pgcoord_permit_check_get(ctx->conn, ctx->timeout_ms, &r);
	if (err != PGCOORD_OK)
		return ctl_call_failed(ctx, "permit.check", err);
	ok = r->ok;
	if (ok) {
		printf("ok: %lld quota%s conserved (in_flight = permit weights = audit sum, none "
		       "over its limit)\n",
		       (long long)r->quotas, r->quotas == 1 ? "" : "s");
	} else {
		msgpack_sbuffer sb;
		msgpack_packer pk;
		msgpack_unpacked u;
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		pack_violations(&pk, r);
		msgpack_unpacked_init(&u);
		printf("FAILED: the permit ledger breaks conservation:\n");
		if (msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
			ctl_print_table(stdout, &u.data, cols, sizeof(cols) / sizeof(cols[0]),
					r->now_at);
		msgpack_unpacked_destroy(&u);
		msgpack_sbuffer_destroy(&sb);
	}
	pgcoord_check_report_free(r);
	return ok ? CTL_EXIT_OK : CTL_EXIT_FAILED;
}
