/*
 * test_failover.c — the database fails over under load (issue 14): a primary
 * and a streaming standby (hpg_standby_start), three agents on a two-host
 * conninfo with target_session_attrs=read-write, and clients claiming,
 * releasing, writing records and taking turns at a lease. The primary is
 * stopped (immediate) and the standby promoted while the load runs.
 *
 * failover/sync: with a synchronous standby nothing acknowledged is lost:
 * every grant a client was told of is on the new primary with its token,
 * every acknowledged release stays released, every acknowledged record.put
 * is there, conservation holds (permit.check and a recount in SQL), and no
 * two clients ever believed they led at once (belief windows on the
 * clients' CLOCK_MONOTONIC). It prints how long service was unavailable.
 *
 * failover/async: the same with an asynchronous standby whose WAL receiver
 * is stopped for the last second before the failover (a standby that lags):
 * what the clients were told and the new primary lacks is counted and
 * printed, not failed — that is what asynchronous replication can lose.
 * Conservation still holds: the standby is a consistent prefix.
 *
 * failover/stalled_standby: what the agent tells the operator, a standby it
 * must not use, and a commit whose wait for a stalled synchronous standby is
 * cancelled: the client is never told `admitted`, nor `held` on a retry,
 * until the standby has the permit.
 *
 * Each runs in a with-postgres of its own (meson.build), as the primary does
 * not survive a failover test. PGCOORD_FAILOVER_LOAD_MS lengthens the load
 * before the failover (default 3000): the longer form of docs/OPERATIONS.md,
 * "Running the failover tests".
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "itest.h"

#define NAGENTS 3
#define QUOTA_LIMIT 8
#define MAX_GRANTS 200000
#define MAX_PUTS 100000
#define MAX_BELIEFS 100000
#define LEASE_TTL_MS 1000
#define LEASE_HOLD_MS 300

struct grant {
	char id[32];
	int64_t token;
	bool release_acked;
};

struct belief {
	int client;
	int64_t from_ms, to_ms; /* hnow_ms: answer received .. call sent + valid_ms */
	int64_t epoch;
};

struct client {
	struct hagent *agent;
	int fd;
	int n;
	char retry_id[32];	   /* a claim whose answer was an error: asked again */
	int held[QUOTA_LIMIT * 2]; /* indexes into grants, oldest first */
	int nheld;
	bool failed;	       /* the last call was answered with an error */
	int64_t leading_since; /* hnow_ms of the first answer leader: true, or 0 */
};

static struct grant grants[MAX_GRANTS];
static int ngrants;
static char (*puts_acked)[32];
static int nputs;
static struct belief beliefs[MAX_BELIEFS];
static int nbeliefs;
/* The longest time without an answered claim (admitted, held or denied)
 * since watch_from: how long service was unavailable. */
static int64_t watch_from, last_claim_ok_ms, longest_gap_ms;

static int load_ms(void)
{
	const char *v = getenv("PGCOORD_FAILOVER_LOAD_MS");
	return v && atoi(v) > 0 ? atoi(v) : 3000;
}

static bool reply_ok(const struct ireply *r)
{
	return r->m.error == NULL;
}

static bool str_is(const msgpack_object *map, const char *key, const char *want)
{
	return pgc_obj_str_eq(pgc_map_get(map, key), want);
}

static void do_claim(struct client *c, int idx)
{
	struct iparams p;
	struct ireply r;
	char id[32];

	if (c->retry_id[0])
		snprintf(id, sizeof(id), "%s", c->retry_id);
	else
		snprintf(id, sizeof(id), "a%d-%d", idx, c->n);
	msgpack_packer *pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "id", id);
	pgc_pack_kv_int(pk, "limit", QUOTA_LIMIT);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	pgc_pack_kv_str(pk, "key", "work");
	icall(c->fd, "permit.claim", &p, &r);
	iparams_destroy(&p);
	c->failed = !reply_ok(&r);
	if (!reply_ok(&r)) {
		snprintf(c->retry_id, sizeof(c->retry_id), "%s", id);
	} else {
		c->retry_id[0] = '\0';
		const msgpack_object *res = r.m.result;
		if (str_is(res, "status", "admitted") || str_is(res, "status", "held")) {
			cr_assert_lt(ngrants, MAX_GRANTS);
			struct grant *g = &grants[ngrants];
			snprintf(g->id, sizeof(g->id), "%s", id);
			g->token = iint(res, "token");
			if (c->nheld < (int)(sizeof(c->held) / sizeof(c->held[0])))
				c->held[c->nheld++] = ngrants;
			ngrants++;
		}
		if (watch_from) {
			int64_t now = hnow_ms(), since = last_claim_ok_ms > watch_from
							     ? last_claim_ok_ms
							     : watch_from;
			if (now - since > longest_gap_ms)
				longest_gap_ms = now - since;
			last_claim_ok_ms = now;
		}
	}
	ireply_destroy(&r);
}

static void do_release(struct client *c)
{
	struct iparams p;
	struct ireply r;

	if (c->nheld == 0)
		return;
	struct grant *g = &grants[c->held[0]];
	msgpack_packer *pk = iparams_begin(&p, 1);
	pgc_pack_kv_str(pk, "id", g->id);
	icall(c->fd, "permit.release", &p, &r);
	iparams_destroy(&p);
	/* released: false is a retry of a release that did happen */
	bool done = reply_ok(&r) || pgc_obj_str_eq(pgc_map_get(r.m.error, "code"), "not_found");
	if (reply_ok(&r))
		g->release_acked = true;
	if (done) {
		memmove(c->held, c->held + 1, sizeof(c->held[0]) * (size_t)(c->nheld - 1));
		c->nheld--;
	}
	ireply_destroy(&r);
}

static void do_put(struct client *c, int idx)
{
	struct iparams p;
	struct ireply r;
	char key[32];

	snprintf(key, sizeof(key), "r%d-%d", idx, c->n);
	msgpack_packer *pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "kind", "job");
	pgc_pack_kv_str(pk, "key", key);
	pgc_pack_kv_str(pk, "state", "new");
	icall(c->fd, "record.put", &p, &r);
	iparams_destroy(&p);
	if (reply_ok(&r) && nputs < MAX_PUTS)
		snprintf(puts_acked[nputs++], sizeof(puts_acked[0]), "%s", key);
	ireply_destroy(&r);
}

/* One attempt at the lease; a leader's belief runs from the answer to the
 * call's send time plus valid_ms (the agent measured valid_ms later). */
static void do_lease(struct client *c, int idx)
{
	struct iparams p;
	struct ireply r;
	int64_t sent = hnow_ms();

	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "name", "leader");
	pgc_pack_kv_int(pk, "ttl_ms", LEASE_TTL_MS);
	icall(c->fd, "lease.acquire", &p, &r);
	iparams_destroy(&p);
	int64_t got = hnow_ms();
	bool leader = reply_ok(&r) && ibool(r.m.result, "leader");
	if (leader) {
		int64_t to = sent + iint(r.m.result, "valid_ms");
		if (to > got && nbeliefs < MAX_BELIEFS)
			beliefs[nbeliefs++] =
			    (struct belief){idx, got, to, iint(r.m.result, "epoch")};
		if (!c->leading_since)
			c->leading_since = got;
	} else {
		c->leading_since = 0;
	}
	ireply_destroy(&r);
	/* hand the lease on now and then, so that it changes hands under load;
	 * belief ends before the hand-back is sent */
	if (leader && got - c->leading_since > LEASE_HOLD_MS) {
		msgpack_packer *rp = iparams_begin(&p, 1);
		pgc_pack_kv_str(rp, "name", "leader");
		int64_t release_sent = hnow_ms();
		for (int i = nbeliefs - 1; i >= 0 && beliefs[i].client == idx; i--)
			if (beliefs[i].to_ms > release_sent)
				beliefs[i].to_ms = release_sent;
		icall(c->fd, "lease.release", &p, &r);
		iparams_destroy(&p);
		ireply_destroy(&r);
		c->leading_since = 0;
	}
}

/* Claims and releases in turn, a record now and then, and a try at the
 * lease every other step. */
static void client_step(struct client *c, int idx)
{
	switch (c->n % 5) {
	case 0:
	case 2:
		do_claim(c, idx);
		break;
	case 1:
	case 3:
		do_release(c);
		break;
	case 4:
		do_put(c, idx);
		break;
	}
	if (c->n % 2 == 0)
		do_lease(c, idx);
	c->n++;
}

/* The smallest gap between the belief windows of two different clients;
 * negative when two overlapped. INT64_MAX when the lease never changed
 * hands. */
static int64_t min_leader_gap(int *handovers)
{
	int64_t gap = INT64_MAX;
	*handovers = 0;
	for (int i = 0; i < nbeliefs; i++) {
		for (int j = i + 1; j < nbeliefs; j++) {
			if (beliefs[i].client == beliefs[j].client)
				continue;
			const struct belief *a = &beliefs[i], *b = &beliefs[j];
			int64_t g =
			    a->from_ms < b->from_ms ? b->from_ms - a->to_ms : a->from_ms - b->to_ms;
			if (g < gap)
				gap = g;
		}
		if (i > 0 && beliefs[i].client != beliefs[i - 1].client)
			(*handovers)++;
	}
	return gap;
}

static PGconn *connect_new_primary(const struct harness_db *db)
{
	char *ci = hpg_standby_conninfo(db);
	PGconn *conn = PQconnectdb(ci);
	cr_assert_eq(PQstatus(conn), CONNECTION_OK, "cannot reach the promoted standby: %s",
		     PQerrorMessage(conn));
	free(ci);
	return conn;
}

static char *one_value(PGconn *conn, const char *sql, int n, const char *const *params)
{
	PGresult *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s: %s", sql,
		     PQresultErrorMessage(res));
	char *v = PQntuples(res) && !PQgetisnull(res, 0, 0) ? strdup(PQgetvalue(res, 0, 0)) : NULL;
	PQclear(res);
	return v;
}

struct outcome {
	int grants_lost, tokens_changed, releases_undone, puts_lost;
	int64_t unavailable_ms, stopped_ms, promoted_ms;
	int64_t leader_gap_ms;
	int handovers;
};

/* What the new primary has of what the clients were told. */
static void count_losses(const struct harness_db *db, struct outcome *o)
{
	PGconn *conn = connect_new_primary(db);

	for (int i = 0; i < ngrants; i++) {
		const char *params[] = {grants[i].id};
		PGresult *res =
		    PQexecParams(conn, "SELECT token, state FROM pgcoord.permits WHERE id = $1", 1,
				 NULL, params, NULL, NULL, 0);
		cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQresultErrorMessage(res));
		if (PQntuples(res) == 0)
			o->grants_lost++;
		else if (atoll(PQgetvalue(res, 0, 0)) != grants[i].token)
			o->tokens_changed++;
		else if (grants[i].release_acked && strcmp(PQgetvalue(res, 0, 1), "released") != 0)
			o->releases_undone++;
		PQclear(res);
	}
	for (int i = 0; i < nputs; i++) {
		const char *params[] = {puts_acked[i]};
		char *v = one_value(
		    conn, "SELECT count(*) FROM pgcoord.records WHERE kind = 'job' AND key = $1", 1,
		    params);
		if (strcmp(v, "1") != 0)
			o->puts_lost++;
		free(v);
	}
	/* the recount, independent of the agent's permit.check */
	char *bad = one_value(conn,
			      "SELECT count(*) FROM pgcoord.quotas q WHERE q.in_flight <> "
			      "(SELECT coalesce(sum(pq.weight), 0) FROM pgcoord.permit_quotas pq "
			      "JOIN pgcoord.permits p ON p.id = pq.permit_id "
			      "WHERE pq.key = q.key AND p.state <> 'released') "
			      "OR q.in_flight > q.\"limit\" OR q.in_flight < 0",
			      0, NULL);
	cr_assert_str_eq(bad, "0", "quotas whose in_flight is not the sum of their permits");
	free(bad);
	PQfinish(conn);
}

static void assert_check_ok(struct hagent *a)
{
	struct ireply r;
	int fd = iconnect(hagent_socket(a));
	const msgpack_object *res = icall_ok(fd, "permit.check", NULL, &r);
	cr_assert(ibool(res, "ok"), "permit.check reports violations after the failover");
	ireply_destroy(&r);
	close(fd);
}

/* replication.<key> of agent.status, as a string (malloc'd; NULL for nil). */
static char *replication_field(struct hagent *a, const char *key)
{
	struct ireply r;
	int fd = iconnect(hagent_socket(a));
	const msgpack_object *res = icall_ok(fd, "agent.status", NULL, &r);
	const msgpack_object *repl = pgc_map_get(res, "replication");
	cr_assert_not_null(repl, "agent.status has no replication map");
	const msgpack_object *v = pgc_map_get(repl, key);
	char *out = NULL;
	int64_t n;
	if (v && v->type == MSGPACK_OBJECT_STR)
		out = pgc_obj_strdup(v);
	else if (v && pgc_obj_int64(v, &n) && asprintf(&out, "%lld", (long long)n) < 0)
		out = NULL;
	ireply_destroy(&r);
	close(fd);
	return out;
}

static int releases_acked(void)
{
	int k = 0;
	for (int i = 0; i < ngrants; i++)
		k += grants[i].release_acked;
	return k;
}

/* `pg-cluster verb dir [arg]` in the background, so the load goes on. */
static pid_t spawn_cluster(const char *verb, const char *dir, const char *arg)
{
	const char *argv[] = {henv("PGCOORD_TEST_CLUSTER"), verb, dir, arg, NULL};
	char *out = htmp_path("failover.log");
	pid_t pid = ispawn(argv, out);
	free(out);
	return pid;
}

/* True once pid exited 0; fails the test if it failed. */
static bool spawned_done(pid_t pid, const char *what)
{
	int status;
	if (waitpid(pid, &status, WNOHANG) != pid)
		return false;
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s failed", what);
	return true;
}

static void run_failover(bool sync, struct outcome *o)
{
	static const char *const agent_args[] = {"--heartbeat-interval-ms",
						 "200",
						 "--session-ttl-ms",
						 "10000",
						 "--query-timeout-ms",
						 "2000",
						 "--reconnect-max-ms",
						 "200",
						 NULL};
	/* reconnect_max_ms: retries as often as a real deployment might with a
	 * short ceiling; the default (5 s) would dominate the outage */
	struct harness_db *db = idb_migrated();
	struct client clients[NAGENTS];
	char name[32];

	hpg_standby_start(sync);
	char *url = hpg_failover_conninfo(db, henv("PGCOORD_TEST_RUNTIME_ROLE"));
	for (int i = 0; i < NAGENTS; i++) {
		snprintf(name, sizeof(name), "failover-%d", i);
		clients[i] = (struct client){.agent = hagent_start_url(url, name, agent_args)};
		clients[i].fd = iconnect(hagent_socket(clients[i].agent));
		isession_open(clients[i].fd, name);
	}
	char *word = replication_field(clients[0].agent, "failover");
	cr_assert_str_eq(word, sync ? "safe" : "at_risk");
	free(word);
	puts_acked = calloc(MAX_PUTS, sizeof(*puts_acked));
	cr_assert_not_null(puts_acked);

	int64_t end = hnow_ms() + load_ms();
	while (hnow_ms() < end)
		for (int i = 0; i < NAGENTS; i++)
			client_step(&clients[i], i);

	pid_t walreceiver = 0;
	if (!sync) {
		/* a lagging standby: it receives nothing of the last second */
		walreceiver = hpg_standby_walreceiver_pid();
		cr_assert_gt(walreceiver, 0);
		kill(walreceiver, SIGSTOP);
		end = hnow_ms() + 1000;
		while (hnow_ms() < end)
			for (int i = 0; i < NAGENTS; i++)
				client_step(&clients[i], i);
	}
	int told_before = ngrants;
	/* the primary stops (immediate: a crash) and the standby is promoted,
	 * as an operator or a failover manager would, while the load goes on */
	char *standby_dir;
	cr_assert(asprintf(&standby_dir, "%s/standby", henv("PGCOORD_TEST_TMP")) > 0);
	int64_t stop_at = hnow_ms(), stopped_at = 0, promoted_at = 0;
	watch_from = stop_at;
	pid_t stopping = spawn_cluster("shutdown", henv("PGCOORD_TEST_PGDATA"), "immediate");
	pid_t promoting = 0;
	while (!promoted_at || last_claim_ok_ms < promoted_at || hnow_ms() < promoted_at + 1000) {
		cr_assert_lt(hnow_ms(), stop_at + 40000,
			     "no claim answered within 40 s of the primary's stop (promoted: %s)",
			     promoted_at ? "yes" : "no");
		bool failing = false;
		for (int i = 0; i < NAGENTS; i++) {
			client_step(&clients[i], i);
			failing |= clients[i].failed;
		}
		if (failing)
			hsleep_ms(5); /* the agents answer at once while the database is down */
		if (!stopped_at && spawned_done(stopping, "stopping the primary")) {
			stopped_at = hnow_ms();
			if (walreceiver)
				kill(walreceiver, SIGCONT);
			promoting = spawn_cluster("promote", standby_dir, NULL);
		}
		if (promoting && !promoted_at && spawned_done(promoting, "promoting the standby"))
			promoted_at = hnow_ms();
	}

	/* the agents found the new primary on their own */
	for (int i = 0; i < NAGENTS; i++) {
		char *server = replication_field(clients[i].agent, "server");
		cr_assert(server && strstr(server, hpg_standby_host()),
			  "agent %d reports the server %s, not the promoted standby", i,
			  server ? server : "(nil)");
		free(server);
	}
	free(standby_dir);
	o->unavailable_ms = longest_gap_ms;
	o->stopped_ms = stopped_at - stop_at;
	o->promoted_ms = promoted_at - stopped_at;
	o->leader_gap_ms = min_leader_gap(&o->handovers);
	count_losses(db, o);
	assert_check_ok(clients[0].agent);
	fprintf(
	    stderr,
	    "failover (%s standby): %d grants told (%d before the stop), %d releases and %d "
	    "record.put acknowledged; lost: %d grants, %d tokens changed, %d releases undone, "
	    "%d puts; no claim answered for %lld ms (pg_ctl stop took %lld ms, promote %lld ms); "
	    "%d lease windows, %d hand-overs, min gap between leaders %lld ms\n",
	    sync ? "synchronous" : "asynchronous", ngrants, told_before, releases_acked(), nputs,
	    o->grants_lost, o->tokens_changed, o->releases_undone, o->puts_lost,
	    (long long)o->unavailable_ms, (long long)o->stopped_ms, (long long)o->promoted_ms,
	    nbeliefs, o->handovers,
	    (long long)(o->leader_gap_ms == INT64_MAX ? -1 : o->leader_gap_ms));
	for (int i = 0; i < NAGENTS; i++) {
		close(clients[i].fd);
		hagent_destroy(clients[i].agent);
	}
	free(url);
	free(puts_acked);
	hdb_drop(db);
}

Test(failover, sync, .timeout = 120)
{
	struct outcome o = {0};

	run_failover(true, &o);
	cr_assert_gt(ngrants, 0);
	cr_assert_eq(o.grants_lost, 0, "acknowledged grants lost on a synchronous standby");
	cr_assert_eq(o.tokens_changed, 0);
	cr_assert_eq(o.releases_undone, 0, "acknowledged releases undone");
	cr_assert_eq(o.puts_lost, 0, "acknowledged record.put lost");
	cr_assert_geq(o.leader_gap_ms, 0, "two clients believed they led at once (gap %lld ms)",
		      (long long)o.leader_gap_ms);
}

Test(failover, async, .timeout = 120)
{
	struct outcome o = {0};

	/* losses are expected and reported (run_failover prints them) */
	run_failover(false, &o);
	cr_assert_gt(ngrants, 0);
}

/* --- the agent tells the operator; a stalled synchronous standby ------- */

static void send_claim(int fd, const char *id)
{
	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "id", id);
	pgc_pack_kv_int(pk, "limit", 4);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	pgc_pack_kv_str(pk, "key", "stall");
	cr_assert(hraw_send_request(fd, inext_msgid(), "permit.claim", p.sb.data, p.sb.size));
	iparams_destroy(&p);
}

/* The reply to the request in flight on fd, if it comes within timeout_ms. */
static bool recv_reply(int fd, int timeout_ms, struct ireply *r)
{
	char err[200];
	msgpack_unpacked_init(&r->u);
	enum hraw_result got = hraw_recv_msg(fd, timeout_ms, &r->u);
	if (got == HRAW_TIMEOUT) {
		msgpack_unpacked_destroy(&r->u);
		return false;
	}
	cr_assert_eq(got, HRAW_MSG, "the agent closed the connection or sent garbage");
	cr_assert(pgc_parse_message(&r->u.data, &r->m, err, sizeof(err)), "%s", err);
	return true;
}

/* Cancels the backend whose commit waits for the synchronous standby (the
 * cancel a statement_timeout or an operator would make). */
static void cancel_sync_wait(struct harness_db *db)
{
	cr_assert(iwait_sql(db, 5000,
			    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
			    "AND query LIKE '%%permit_claim%%'"),
		  "no claim waits for the synchronous standby");
	/* the claim's backend only (sent alone, or in a group statement,
	 * permit_claim_group): heartbeats wait for the standby too */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) "
					"FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
					"AND query LIKE '%%permit_claim%%'"),
		     1);
}

static void assert_unavailable(const struct ireply *r, const char *what)
{
	cr_assert_not_null(r->m.error, "%s: answered without an error", what);
	static const char *const mentions[] = {"synchronous standby", NULL};
	ierr(r, "unavailable", true, mentions);
}

/* An agent whose only host is the standby: it must never use it. */
static void assert_standby_refused(void)
{
	char *sock = htmp_path("standby-only.sock");
	char *log = htmp_path("standby-only.log");
	char url[1024];
	snprintf(url, sizeof(url), "host=%s port=%s user=%s dbname=postgres", hpg_standby_host(),
		 henv("PGCOORD_TEST_PGPORT"), henv("PGCOORD_TEST_PGUSER"));
	const char *argv[] = {iagent_bin(),   "--database-url", url,  "--replica-id",
			      "standby-only", "--socket-path",	sock, NULL};
	pid_t pid = ispawn(argv, log);
	int64_t deadline = hnow_ms() + 10000;
	int64_t refusals = 0;
	while (refusals < 2) {
		cr_assert_lt(hnow_ms(), deadline,
			     "the agent on a standby did not report refusing it:\n%s",
			     hread_file(log));
		hsleep_ms(100);
		int fd = hraw_connect(sock);
		if (fd < 0)
			continue;
		struct ireply r;
		const msgpack_object *st = icall_ok(fd, "agent.status", NULL, &r);
		refusals = iint(st, "db_standby_refusals");
		cr_assert(str_is(st, "db", "down"), "the agent uses a standby");
		cr_assert_not(ibool(st, "registered"), "the agent registered on a standby");
		ireply_destroy(&r);
		close(fd);
	}
	char *text = hread_file(log);
	cr_assert(strstr(text, "is a standby (in recovery, read-only): not used"),
		  "the log does not say why:\n%s", text);
	free(text);
	kill(pid, SIGKILL);
	iwait_pid(pid);
	free(sock);
	free(log);
}

Test(failover, stalled_standby, .timeout = 120)
{
	static const char *const args[] = {"--query-timeout-ms", "5000", NULL};
	struct harness_db *db = idb_migrated();
	struct ireply r;

	hpg_standby_start(true);
	assert_standby_refused();
	struct hagent *a = hagent_start(db, "stall", args);
	char *v = replication_field(a, "failover");
	cr_assert_str_eq(v, "safe");
	free(v);
	v = replication_field(a, "synchronous_standby_names");
	cr_assert_str_eq(v, "standby");
	free(v);
	/* the runtime role may not see pg_stat_replication.sync_state */
	v = replication_field(a, "sync_standbys");
	cr_assert_str_eq(v, "-1");
	free(v);

	int fd = iconnect(hagent_socket(a));
	isession_open(fd, "stall");
	send_claim(fd, "s-1");
	cr_assert(recv_reply(fd, 5000, &r));
	cr_assert(str_is(iok(&r, "claim"), "status", "admitted"));
	ireply_destroy(&r);

	pid_t walreceiver = hpg_standby_walreceiver_pid();
	cr_assert_gt(walreceiver, 0);
	kill(walreceiver, SIGSTOP);

	/* the commit waits for the standby: no answer meanwhile */
	send_claim(fd, "s-2");
	cr_assert_not(recv_reply(fd, 1000, &r), "answered while the standby had not confirmed");
	cancel_sync_wait(db);
	cr_assert(recv_reply(fd, 5000, &r));
	assert_unavailable(&r, "a claim whose synchronous wait was cancelled");
	ireply_destroy(&r);
	/* the hole is real: the permit is committed on the primary */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.permits WHERE id = 's-2'"),
		     1);

	/* a retry finds the permit, but answers only once the standby has it */
	send_claim(fd, "s-2");
	cr_assert_not(recv_reply(fd, 1000, &r), "a retry answered from an unconfirmed commit");
	cancel_sync_wait(db);
	cr_assert(recv_reply(fd, 5000, &r));
	assert_unavailable(&r, "a retry whose synchronous wait was cancelled");
	ireply_destroy(&r);
	cr_assert_geq(istatus_int(a, "db_sync_waits_cancelled"), 2);

	kill(walreceiver, SIGCONT);
	send_claim(fd, "s-2");
	cr_assert(recv_reply(fd, 5000, &r));
	const msgpack_object *res = iok(&r, "the retry once the standby caught up");
	cr_assert(str_is(res, "status", "held"));
	cr_assert_eq(iint(res, "token"),
		     hdb_query_long(db, "SELECT token FROM pgcoord.permits WHERE id = 's-2'"));
	ireply_destroy(&r);

	/* and the standby has it */
	char *ci = hpg_standby_conninfo(db);
	PGconn *standby = PQconnectdb(ci);
	cr_assert_eq(PQstatus(standby), CONNECTION_OK);
	char *n =
	    one_value(standby, "SELECT count(*) FROM pgcoord.permits WHERE id = 's-2'", 0, NULL);
	cr_assert_str_eq(n, "1");
	free(n);
	PQfinish(standby);
	free(ci);
	close(fd);
	hagent_destroy(a);
	hdb_drop(db);
}
