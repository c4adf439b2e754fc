/*
 * identity.c — see identity.h. The heartbeat statement itself is
 * heartbeat.c's; this file decides what its answers mean.
 */
#include "agent/identity.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/conn.h"
#include "agent/db.h"
#include "agent/heartbeat.h"
#include "agent/janitor.h"
#include "agent/leases.h"
#include "agent/migrate.h"
#include "agent/notify.h"
#include "agent/reply.h"
#include "agent/sessions.h"

#define REGISTER_RETRY_MS 250

static void try_register(struct agent *ag, int64_t takeover);

static int64_t new_incarnation(void)
{
	uint64_t v = 0;
	/* random, not a counter: no coordination needed to make it unique,
	 * and a restarted agent can never reuse its predecessor's */
	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = ((uint64_t)getpid() << 32) ^ mono_ms() ^ (uint64_t)time(NULL);
	v &= INT64_MAX;
	return v ? (int64_t)v : 1;
}

static void schedule_register(struct agent *ag)
{
	struct timeval tv = {0, REGISTER_RETRY_MS * 1000};
	evtimer_add(ag->id.register_timer, &tv);
}

/* A holder on this host whose pid is gone (or a zombie) is a crashed
 * predecessor; taking over at once lets a restarted agent keep its
 * sessions resumable instead of waiting out the ttl. */
static bool local_pid_is_dead(pid_t pid)
{
	char path[64], buf[256];
	FILE *f;
	if (pid <= 0)
		return false;
	if (pid == getpid())
		return true; /* a pid is one process: that holder was not us */
	if (kill(pid, 0) != 0)
		return errno == ESRCH;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	bool zombie = false;
	if (fgets(buf, sizeof(buf), f)) {
		char *paren = strrchr(buf, ')');
		zombie = paren && paren[1] == ' ' && paren[2] == 'Z';
	}
	fclose(f);
	return zombie;
}

/* --- self-fencing (guarantee 10) ------------------------------------- */

/*
 * A session's row expires no earlier than the send time of the agent's
 * last successful heartbeat + session_ttl_ms. Clients are told
 * session.suspended halfway there and session.lost one heartbeat interval
 * before it, so they stop their work while the database still holds it.
 */
static uint64_t safe_until(const struct agent *ag)
{
	return ag->id.hb_last_ok_ms + (uint64_t)ag->cfg.session_ttl_ms -
	       (uint64_t)ag->cfg.heartbeat_interval_ms;
}

static uint64_t suspend_at(const struct agent *ag)
{
	return ag->id.hb_last_ok_ms + (uint64_t)ag->cfg.session_ttl_ms / 2;
}

static void arm_fence(struct agent *ag, uint64_t at)
{
	uint64_t now = mono_ms(), ms = at > now ? at - now : 0;
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	evtimer_del(ag->id.fence_timer);
	evtimer_add(ag->id.fence_timer, &tv);
}

/* A session event's params: its session id and safe_ms. */
struct session_event {
	int64_t session, safe_ms;
};

static const struct reply_col session_event_cols[] = {
    REPLY_FIELD("session", REPLY_FIELD_INT, struct session_event, session),
    REPLY_FIELD("safe_ms", REPLY_FIELD_INT, struct session_event, safe_ms),
};
const struct reply_kind session_event_params = REPLY_KIND(session_event_cols);

static void tell_sessions(struct agent *ag, enum notice_id id, int64_t safe_ms)
{
	for (struct session *s = ag->sessions; s; s = s->next) {
		struct session_event v = {s->id, safe_ms};
		if (s->conn)
			conn_notify_struct(s->conn, id, &v);
	}
}

static void fence_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	uint64_t now = mono_ms();
	(void)fd;
	(void)what;

	if (ag->state != AGENT_SERVING)
		return;
	if (now >= safe_until(ag)) {
		if (ag->nsessions > 0) {
			log_error(&ag->log, "identity",
				  "no successful heartbeat for %llu ms: declaring every session "
				  "lost before the database can expire it",
				  (unsigned long long)(now - ag->id.hb_last_ok_ms));
			sessions_lose_all(ag,
					  "the agent could not renew the session in time "
					  "(database unreachable); it may already have "
					  "expired",
					  LOG_LEVEL_WARN);
		}
		ag->id.suspended = false;
		/* sessions opened meanwhile are fenced too until a heartbeat succeeds */
		arm_fence(ag, now + (uint64_t)ag->cfg.heartbeat_interval_ms);
		return;
	}
	if (now >= suspend_at(ag)) {
		if (!ag->id.suspended) {
			log_warn(
			    &ag->log, "identity",
			    "heartbeats failing: sessions suspended, lost in %llu ms unless one "
			    "succeeds",
			    (unsigned long long)(safe_until(ag) - now));
			ag->id.suspended = true;
			tell_sessions(ag, NOTICE_SESSION_SUSPENDED,
				      (int64_t)(safe_until(ag) - now));
		}
		arm_fence(ag, safe_until(ag));
		return;
	}
	arm_fence(ag, suspend_at(ag));
}

/* --- superseded ------------------------------------------------------ */

static void superseded(struct agent *ag)
{
	if (ag->state == AGENT_SUPERSEDED)
		return;
	log_error(&ag->log, "identity",
		  "replica_id \"%s\" was taken over by another incarnation; this agent stops "
		  "serving",
		  ag->cfg.replica_id);
	ag->state = AGENT_SUPERSEDED;
	ag->id.registered = false;
	sessions_lose_all(ag, "superseded: the agent lost its replica_id to another incarnation",
			  LOG_LEVEL_WARN);
	agent_exit(ag, 1);
}

/* The heartbeat's hooks: the fencing decision stays here. */
static void heartbeat_renewed(struct agent *ag)
{
	if (ag->id.suspended) {
		ag->id.suspended = false;
		log_info(&ag->log, "identity", "heartbeat succeeded again: sessions restored");
		tell_sessions(ag, NOTICE_SESSION_RESTORED, (int64_t)(safe_until(ag) - mono_ms()));
	}
	arm_fence(ag, suspend_at(ag));
}

static const struct heartbeat_hooks hb_hooks = {heartbeat_renewed, superseded};

/* --- registration ---------------------------------------------------- */

static void registered(struct agent *ag, const char *taken_over)
{
	int n = 0;

	for (const char *p = taken_over; p && *p;) {
		if (*p < '0' || *p > '9') {
			p++;
			continue;
		}
		char *end;
		sessions_adopt_detached(ag, strtoll(p, &end, 10));
		n++;
		p = end;
	}
	ag->id.registered = true;
	ag->id.hb_last_ok_ms = mono_ms();
	ag->state = AGENT_SERVING;
	heartbeat_run(ag);
	arm_fence(ag, suspend_at(ag));
	if (!janitor_start(ag))
		log_error(&ag->log, "identity", "out of memory starting the janitor");
	char kv[1024] = "";
	log_kv_str(kv, sizeof(kv), "replica_id", ag->cfg.replica_id);
	log_kv_int(kv, sizeof(kv), "incarnation", ag->id.incarnation);
	log_kv_str(kv, sizeof(kv), "host", ag->id.host);
	log_kv_int(kv, sizeof(kv), "pid", getpid());
	log_write(&ag->log, LOG_LEVEL_INFO, "identity", kv, "registered%s",
		  n ? " (took over a crashed predecessor's live sessions)" : "");
	notify_ready(ag);
}

static void register_done(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;

	if (ag->state != AGENT_STARTING)
		return;
	if (!r->ok) {
		log_warn(&ag->log, "identity", "registration failed: %s; retrying", r->message);
		schedule_register(ag);
		return;
	}
	if (strcmp(PQgetvalue(r->res, 0, 0), "t") == 0) {
		registered(ag, PQgetvalue(r->res, 0, 5));
		return;
	}
	const char *host = PQgetvalue(r->res, 0, 1);
	pid_t pid = (pid_t)atoi(PQgetvalue(r->res, 0, 2));
	int64_t holder = strtoll(PQgetvalue(r->res, 0, 3), NULL, 10);
	long long expires_in = strtoll(PQgetvalue(r->res, 0, 4), NULL, 10);
	if (strcmp(host, ag->id.host) == 0 && local_pid_is_dead(pid)) {
		log_info(&ag->log, "identity",
			 "replica_id \"%s\" is held by incarnation %" PRId64
			 " of pid %d on this host, which is no longer running; taking over",
			 ag->cfg.replica_id, holder, (int)pid);
		try_register(ag, holder);
		return;
	}
	log_error(&ag->log, "identity",
		  "replica_id \"%s\" is held by a live agent on host %s pid %d (its heartbeat "
		  "expires in %lld ms); refusing to start. Give this agent a unique replica_id.",
		  ag->cfg.replica_id, host, (int)pid, expires_in);
	agent_exit(ag, 1);
}

static void try_register(struct agent *ag, int64_t takeover)
{
	char inc[24], pid[16], ttl[24], take[24];

	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	snprintf(ttl, sizeof(ttl), "%d", ag->cfg.session_ttl_ms);
	snprintf(take, sizeof(take), "%" PRId64, takeover);
	const char *params[7] = {ag->cfg.replica_id,	 inc, ag->id.host,	     pid,
				 PGCOORD_VERSION_STRING, ttl, takeover ? take : NULL};
	if (!db_query(ag->db, DB_LANE_HEARTBEAT,
		      "SELECT ok, holder_host, holder_pid, holder_incarnation, "
		      "holder_expires_in_ms, taken_over "
		      "FROM pgcoord.agent_register($1, $2, $3, $4, $5, $6, $7)",
		      7, params, register_done, ag))
		schedule_register(ag);
}

static void schema_done(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;
	int version = 0;
	char err[512];

	if (ag->state != AGENT_STARTING)
		return;
	if (r->ok) {
		/* a schema made by other migration texts is refused before any use */
		if (!migrate_check_applied(r->res, &version, err, sizeof(err))) {
			log_error(&ag->log, "identity", "%s", err);
			agent_exit(ag, 1);
			return;
		}
	} else if (migrate_error_means_old_series(r->sqlstate)) {
		log_error(&ag->log, "identity", "%s", migrate_old_series_message);
		agent_exit(ag, 1);
		return;
	} else if (r->sqlstate && strcmp(r->sqlstate, "42501") == 0) {
		/* insufficient_privilege: a runtime role nobody granted yet */
		log_error(&ag->log, "identity",
			  "this database role may not read the schema version (%s): as the "
			  "schema's owner, run `pgcoord-agent migrate --runtime-role ROLE` (or "
			  "`pgcoordctl migrate --runtime-role ROLE`) for the role the agent uses",
			  r->message);
		agent_exit(ag, 1);
		return;
	} else if (!migrate_error_means_empty(r->sqlstate)) {
		log_warn(&ag->log, "identity", "cannot read the schema version: %s; retrying",
			 r->message);
		schedule_register(ag);
		return;
	}
	ag->id.schema_version = version;
	if (version < migrate_latest_version()) {
		log_error(&ag->log, "identity",
			  "the database schema is at version %d but this agent needs %d: run "
			  "`pgcoord-agent migrate` (or `pgcoordctl migrate`) against it first",
			  version, migrate_latest_version());
		agent_exit(ag, 1);
		return;
	}
	try_register(ag, 0);
}

static void register_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	(void)fd;
	(void)what;
	if (ag->state != AGENT_STARTING)
		return;
	if (!db_query(ag->db, DB_LANE_HEARTBEAT, migrate_version_sql, 0, NULL, schema_done, ag))
		schedule_register(ag);
}

bool identity_start(struct agent *ag)
{
	ag->id.incarnation = new_incarnation();
	if (gethostname(ag->id.host, sizeof(ag->id.host) - 1) != 0)
		snprintf(ag->id.host, sizeof(ag->id.host), "unknown");
	ag->id.register_timer = evtimer_new(ag->base, register_cb, ag);
	ag->id.fence_timer = evtimer_new(ag->base, fence_cb, ag);
	if (!ag->id.register_timer || !heartbeat_init(ag, &hb_hooks) || !ag->id.fence_timer)
		return false;
	struct timeval now = {0, 0};
	evtimer_add(ag->id.register_timer, &now);
	return true;
}

struct stop_ctx {
	struct agent *ag;
	void (*done)(struct agent *ag);
};

static void stop_done(const struct db_result *r, void *arg)
{
	struct stop_ctx *ctx = arg;
	struct agent *ag = ctx->ag;
	void (*done)(struct agent *) = ctx->done;
	free(ctx);
	if (r->ok) {
		char kv[48] = "";
		log_kv_int(kv, sizeof(kv), "sessions_closed",
			   strtoll(PQgetvalue(r->res, 0, 0), NULL, 10));
		log_write(&ag->log, LOG_LEVEL_INFO, "identity", kv, "recorded the clean stop");
	} else {
		log_warn(&ag->log, "identity",
			 "could not record the clean stop (%s); sessions lapse by ttl instead",
			 r->message);
	}
	done(ag);
}

void identity_stop(struct agent *ag, void (*done)(struct agent *ag))
{
	char inc[24];
	struct stop_ctx *ctx;

	heartbeat_stop(ag);
	event_del(ag->id.register_timer);
	evtimer_del(ag->id.fence_timer);
	ctx = malloc(sizeof(*ctx));
	if (!ag->id.registered || !ctx) {
		free(ctx);
		done(ag);
		return;
	}
	ctx->ag = ag;
	ctx->done = done;
	snprintf(inc, sizeof(inc), "%" PRId64, ag->id.incarnation);
	const char *params[2] = {ag->cfg.replica_id, inc};
	if (!db_query(ag->db, DB_LANE_HEARTBEAT, "SELECT pgcoord.agent_stop($1, $2)", 2, params,
		      stop_done, ctx)) {
		free(ctx);
		log_warn(&ag->log, "identity",
			 "database unreachable at shutdown; sessions lapse by ttl instead");
		done(ag);
	}
}

void identity_finish(struct agent *ag)
{
	heartbeat_finish(ag);
	if (ag->id.register_timer)
		event_free(ag->id.register_timer);
	if (ag->id.fence_timer)
		event_free(ag->id.fence_timer);
	ag->id.register_timer = ag->id.fence_timer = NULL;
}
