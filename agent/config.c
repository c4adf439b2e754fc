/*
 * config.c — option table, parsing and validation; see config.h.
 */
#include "agent/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <grp.h>
#include <libpq-fe.h>
#include <limits.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OFF(field) offsetof(struct config, field)
#define STR(x) #x
#define XSTR(x) STR(x) /* the value of a macro as a string */

const struct option_def config_options[] = {
    {"database_url", OPT_STRING, OFF(database_url), "", 0, 0, true, false,
     "libpq conninfo string or URI of the coordination database; empty uses libpq's "
     "environment (PGHOST, PGDATABASE, PGPASSFILE, ...). With several hosts and "
     "target_session_attrs=read-write the agent follows the primary; a failover keeps every "
     "acknowledged grant only with a synchronous standby (docs/OPERATIONS.md)."},
    {"replica_id", OPT_STRING, OFF(replica_id), "", 0, 0, false, false,
     "This agent's identity, unique in the fleet; empty means the host name."},
    {"socket_path", OPT_STRING, OFF(socket_path), "/run/pgcoord/agent.sock", 0, 0, false, false,
     "Unix socket the agent listens on."},
    {"socket_mode", OPT_MODE, OFF(socket_mode), "0660", 0, 0777, false, false,
     "Permission bits of the socket (octal)."},
    {"listen_backlog", OPT_INT, OFF(listen_backlog), XSTR(SOMAXCONN), 1, 65535, false, true,
     "Connections the kernel queues on the socket before the agent accepts them (the "
     "listen(2) backlog; the default is the system's SOMAXCONN). A burst of connects beyond "
     "it gets EAGAIN before the agent sees them (the clients retry within their connect "
     "timeout); accepted ones are then held to max_connections and max_connections_per_uid. "
     "The kernel caps it at net.core.somaxconn (/proc/sys/net/core/somaxconn), and the agent "
     "warns when it does. Also applied to a socket systemd passes, in place of the unit's "
     "Backlog=."},
    {"pool_size", OPT_INT, OFF(pool_size), "8", 1, 64, false, false,
     "Database connections for requests (the heartbeat has its own)."},
    {"group_statements_max", OPT_INT, OFF(group_statements_max), "1", 0, 64, false, false,
     "Group statements of one kind (permit claims, permit releases) in flight at once "
     "before a call on a quota key that one of them names waits in the agent and rides the "
     "next, larger group instead of queueing on that key's row lock in the database; a call "
     "on other keys goes at once. 0 never holds a call back."},
    {"group_kind_statements_max", OPT_INT, OFF(group_kind_statements_max), "2", 0, 64, false, false,
     "Group statements of one kind in flight at once, whatever keys they name, before a new "
     "call of that kind waits in the agent and rides the next statement, queued as soon as "
     "one of them ends (fewer, larger groups: fewer commits). A call never waits while none "
     "of its kind is in flight. 0 never holds a call back for this bound."},
    {"group_kind_hold_members", OPT_INT, OFF(group_kind_hold_members), "0", 0, 256, false, false,
     "Calls per group statement, averaged over the recent statements of a kind, from which "
     "a new call of that kind waits for the next statement even below "
     "group_kind_statements_max whenever one is in flight: under load that fills groups this "
     "large, one more commit "
     "costs the database more than a larger group, so the bound adapts to one; lighter load "
     "keeps the parallel statements. 0 = only group_kind_statements_max holds; 4 separates "
     "the load of 8 workers on one agent from that of 32 (docs/PERFORMANCE.md)."},
    {"heartbeat_interval_ms", OPT_INT, OFF(heartbeat_interval_ms), "1000", 50, 60000, false, false,
     "How often the agent renews itself and all its sessions."},
    {"session_ttl_ms", OPT_INT, OFF(session_ttl_ms), "10000", 200, 600000, false, false,
     "How far ahead of database now() each heartbeat renews liveness; a dead agent's "
     "sessions stop being live this long after its last heartbeat."},
    {"session_grace_ms", OPT_INT, OFF(session_grace_ms), "10000", 0, 3600000, false, true,
     "How long a session whose client disconnected stays resumable."},
    {"query_timeout_ms", OPT_INT, OFF(query_timeout_ms), "5000", 100, 600000, false, true,
     "Longest wait for a database answer (queueing included) before a request fails "
     "with a retryable timeout. Each statement also carries this bound, less max(100 ms, "
     "10 %), as its statement_timeout and lock_timeout, so the database stops and rolls it "
     "back first: the timeout then says nothing changed."},
    {"connect_timeout_ms", OPT_INT, OFF(connect_timeout_ms), "5000", 100, 600000, false, true,
     "Longest wait for one database connection attempt."},
    {"reconnect_max_ms", OPT_INT, OFF(reconnect_max_ms), "5000", 100, 600000, false, true,
     "Ceiling of the exponential reconnect backoff."},
    {"prepared_statements", OPT_STATEMENTS, OFF(prepared_statements), "auto", 0, 0, false, false,
     "auto, on or off: how statements reach the database. on: each database connection "
     "prepares the agent's statements once (named) and keeps statement_timeout and "
     "lock_timeout as session settings, so a call is one statement; right only when each "
     "connection is its own server session. off: each call sends its timeouts local to its "
     "transaction and an unnamed statement, so nothing outlives the transaction. auto "
     "decides, and agent.status, /status and /metrics (pgcoord_db_statement_mode) say what: "
     "named (as on) when the server's pg_backend_pid() is the one the connection was given; "
     "named-pooled (named statements, timeouts with each transaction) when it is not, i.e. a "
     "pooler is in between (PgBouncer in any pool mode); unnamed (as off) from the first "
     "named statement the server does not have or already has (SQLSTATE 26000 or 42P05: "
     "PgBouncer transaction pooling before 1.21 or without max_prepared_statements), for "
     "the life of the process, the call that met it sent again unnamed. See "
     "docs/OPERATIONS.md for each pooler."},
    {"shutdown_timeout_ms", OPT_INT, OFF(shutdown_timeout_ms), "3000", 0, 600000, false, true,
     "On SIGTERM, how long to wait for the database to record the clean stop."},
    {"lease_ttl_ms", OPT_INT, OFF(lease_ttl_ms), "15000", 1000, 600000, false, true,
     "Default ttl of a leadership lease; a lease.acquire may ask for another."},
    {"lease_retry_ms", OPT_INT, OFF(lease_retry_ms), "1000", 50, 60000, false, false,
     "How often a waiting campaign retries, and how often watched leases are polled."},
    {"janitor_interval_ms", OPT_INT, OFF(janitor_interval_ms), "1000", 100, 600000, false, false,
     "How often the elected janitor sweeps expired sessions and lapsed permits."},
    {"retention_s", OPT_INT, OFF(retention_s), "0", 0, 315360000, false, true,
     "How long released permits, settled records and their audit rows are kept before "
     "the janitor deletes them; 0 keeps them forever. A duplicate claim of a deleted "
     "permit's id is new work, so keep this far beyond any client's retries (at least "
     "3600)."},
    {"max_message_bytes", OPT_INT, OFF(max_message_bytes), "1048576", 1024, 67108864, false, false,
     "Largest request a client may send; checked before buffering."},
    {"max_depth", OPT_INT, OFF(max_depth), "32", 2, 32, false, false,
     "Deepest nesting of arrays and maps in a request (at most 32, the decoder's limit)."},
    {"max_connections", OPT_INT, OFF(max_connections), "1024", 1, 65536, false, false,
     "Client connections served at once; more get a busy error and are closed."},
    {"max_inflight_per_conn", OPT_INT, OFF(max_inflight_per_conn), "64", 1, 4096, false, false,
     "Requests one connection may have in flight; more get a busy error."},
    {"max_lease_watches_per_session", OPT_INT, OFF(max_lease_watches_per_session), "64", 1, 100000,
     false, true,
     "Leases one session may watch (lease.status {watch: true}); more get a busy error."},
    {"max_lease_campaigns_per_session", OPT_INT, OFF(max_lease_campaigns_per_session), "64", 1,
     100000, false, true,
     "Waiting campaigns (lease.acquire {wait: true} not yet won) one session may have; more "
     "get a busy error."},
    {"watch_poll_ms", OPT_INT, OFF(watch_poll_ms), "500", 50, 60000, false, false,
     "How often the agent reads everything its sessions watch (quota.watch, permit.watch, "
     "record.watch), in one statement whatever the number of watches."},
    {"wait_poll_ms", OPT_INT, OFF(wait_poll_ms), "100", 10, 10000, false, false,
     "How often the agent asks the database which of its sessions' waiting claims were "
     "admitted or expired (permit.claim {wait_ms}), in one statement whatever their number, "
     "and only while there are some."},
    {"max_watches_per_session", OPT_INT, OFF(max_watches_per_session), "64", 1, 100000, false, true,
     "Quotas, permits and record kinds one session may watch, together; more get a busy "
     "error."},
    {"max_output_bytes", OPT_INT, OFF(max_output_bytes), "4194304", 65536, 1073741824, false, false,
     "Output queued for a client that does not read before it is dropped."},
    {"max_message_objects", OPT_INT, OFF(max_message_objects), "65536", 16, 16777216, false, false,
     "Most MessagePack objects (array elements, map keys and values, the message itself) one "
     "request may hold; checked before decoding, which allocates 24 bytes or more for each."},
    {"partial_frame_timeout_ms", OPT_INT, OFF(partial_frame_timeout_ms), "10000", 100, 3600000,
     false, true,
     "How long a client may take to send the rest of a request it has begun; then the "
     "connection is closed."},
    {"idle_timeout_ms", OPT_INT, OFF(idle_timeout_ms), "600000", 0, 86400000, false, true,
     "How long a connection with no session and no request in flight may stay silent before "
     "it is closed; 0 never closes one. Connections with a session are never closed for "
     "idling."},
    {"max_connections_per_uid", OPT_INT, OFF(max_connections_per_uid), "64", 1, 65536, false, false,
     "Client connections one non-admin uid may hold at once; more are refused with a busy "
     "error."},
    {"admin_connection_reserve", OPT_INT, OFF(admin_connection_reserve), "16", 0, 65535, false,
     false,
     "Slots of max_connections only admin peers may use, so an operator can still connect "
     "when other clients fill the rest (at most max_connections - 1 of them)."},
    {"log_level", OPT_LEVEL, OFF(log_level), "info", 0, 0, false, true,
     "error, warn, info or debug."},
    {"admin_uids", OPT_STRING, OFF(admin_uids), "", 0, 0, false, false,
     "Comma-separated uids, besides root and the agent's own user, whose clients may make "
     "admin calls (quota.set, permit overrides)."},
    {"admin_group", OPT_STRING, OFF(admin_group), "", 0, 0, false, false,
     "A group whose members (by primary gid or membership) may make admin calls; empty "
     "for none. Resolved at start."},
    {"client_uids", OPT_STRING, OFF(client_uids), "", 0, 0, false, false,
     "Comma-separated uids whose clients may open sessions; with client_group empty too, "
     "every peer that can open the socket may. Admins always may."},
    {"client_group", OPT_STRING, OFF(client_group), "", 0, 0, false, false,
     "A group whose members (by primary gid or membership) may open sessions, besides "
     "client_uids; empty for none. Resolved at start."},
    {"metrics_listen", OPT_STRING, OFF(metrics_listen), "", 0, 0, false, false,
     "Loopback address:port of the HTTP listener for /metrics, /healthz and /status, e.g. "
     "127.0.0.1:9187 or [::1]:9187 (port 0 picks a free one); empty turns it off. Only "
     "loopback addresses are accepted: the pages are unauthenticated."},
};
const size_t config_options_count = sizeof(config_options) / sizeof(config_options[0]);

static const struct option_def *find_option(const char *name, size_t len)
{
	for (size_t i = 0; i < config_options_count; i++) {
		const char *n = config_options[i].name;
		size_t j;
		if (strlen(n) != len)
			continue;
		/* flags spell options with dashes, files with underscores */
		for (j = 0; j < len; j++) {
			char c = name[j] == '-' ? '_' : name[j];
			if (c != n[j])
				break;
		}
		if (j == len)
			return &config_options[i];
	}
	return NULL;
}

static bool set_value(struct config *cfg, const struct option_def *def, const char *text, char *why,
		      size_t whylen)
{
	void *field = (char *)cfg + def->offset;

	switch (def->type) {
	case OPT_STRING: {
		char *copy = strdup(text);
		if (!copy) {
			snprintf(why, whylen, "out of memory");
			return false;
		}
		free(*(char **)field);
		*(char **)field = copy;
		return true;
	}
	case OPT_INT: {
		char *end;
		errno = 0;
		long v = strtol(text, &end, 10);
		if (errno || end == text || *end != '\0') {
			snprintf(why, whylen, "\"%s\" is not a whole number (expected %ld..%ld)",
				 text, def->min, def->max);
			return false;
		}
		if (v < def->min || v > def->max) {
			snprintf(why, whylen, "%ld is out of range (expected %ld..%ld)", v,
				 def->min, def->max);
			return false;
		}
		*(int *)field = (int)v;
		return true;
	}
	case OPT_MODE: {
		char *end;
		errno = 0;
		long v = strtol(text, &end, 8);
		if (errno || end == text || *end != '\0' || v < 0 || v > def->max) {
			snprintf(why, whylen, "\"%s\" is not an octal mode like 0660", text);
			return false;
		}
		*(int *)field = (int)v;
		return true;
	}
	case OPT_LEVEL:
		if (!log_level_parse(text, (enum log_level *)field)) {
			snprintf(why, whylen,
				 "\"%s\" is not a log level (expected error, warn, info or debug)",
				 text);
			return false;
		}
		return true;
	case OPT_STATEMENTS:
		if (stmt_setting_parse(text, (enum stmt_setting *)field))
			return true;
		snprintf(why, whylen, "\"%s\" is not auto, on or off", text);
		return false;
	}
	return false;
}

void config_defaults(struct config *cfg)
{
	char why[256];
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < config_options_count; i++) {
		/* the table's defaults are tested to parse; a failure here is a bug */
		if (!set_value(cfg, &config_options[i], config_options[i].default_value, why,
			       sizeof(why)))
			abort();
	}
}

void config_free(struct config *cfg)
{
	free(cfg->admins.uids);
	memset(&cfg->admins, 0, sizeof(cfg->admins));
	free(cfg->clients.uids);
	memset(&cfg->clients, 0, sizeof(cfg->clients));
	for (size_t i = 0; i < config_options_count; i++) {
		if (config_options[i].type == OPT_STRING) {
			char **field = (char **)((char *)cfg + config_options[i].offset);
			free(*field);
			*field = NULL;
		}
	}
}

static char *trim(char *s)
{
	char *end;
	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

static bool load_file(struct config *cfg, const char *path, bool required, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int lineno = 0;

	if (!f) {
		if (!required && errno == ENOENT)
			return true;
		snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		return false;
	}
	while (fgets(line, sizeof(line), f)) {
		char why[256];
		char *key, *value, *eq;
		const struct option_def *def;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			snprintf(err, errlen, "%s:%d: line longer than %zu bytes", path, lineno,
				 sizeof(line) - 1);
			goto fail;
		}
		key = trim(line);
		if (*key == '\0' || *key == '#')
			continue;
		eq = strchr(key, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%d: expected `key = value`, found \"%s\"", path,
				 lineno, key);
			goto fail;
		}
		*eq = '\0';
		key = trim(key);
		value = trim(eq + 1);
		/* allow "quoted values" so leading/trailing spaces can be kept */
		size_t vlen = strlen(value);
		if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') {
			value[vlen - 1] = '\0';
			value++;
		}
		def = find_option(key, strlen(key));
		if (!def || strchr(key, '-')) {
			snprintf(err, errlen,
				 "%s:%d: unknown option \"%s\" (see `pgcoord-agent --help` for the "
				 "list)",
				 path, lineno, key);
			goto fail;
		}
		if (!set_value(cfg, def, value, why, sizeof(why))) {
			snprintf(err, errlen, "%s:%d: %s: %s", path, lineno, def->name, why);
			goto fail;
		}
	}
	fclose(f);
	return true;
fail:
	fclose(f);
	return false;
}

static bool load_env(struct config *cfg, char *err, size_t errlen)
{
	for (size_t i = 0; i < config_options_count; i++) {
		char var[96] = "PGCOORD_";
		char why[256];
		size_t n = strlen(var);
		for (const char *p = config_options[i].name; *p && n < sizeof(var) - 1; p++)
			var[n++] = (char)toupper((unsigned char)*p);
		var[n] = '\0';
		const char *value = getenv(var);
		if (value && !set_value(cfg, &config_options[i], value, why, sizeof(why))) {
			snprintf(err, errlen, "environment %s: %s", var, why);
			return false;
		}
	}
	return true;
}

static bool load_flags(struct config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	for (int i = 0; i < argc; i++) {
		const char *arg = argv[i];
		const char *name, *value, *eq;
		const struct option_def *def;
		char why[256];
		size_t len;

		if (strncmp(arg, "--", 2) != 0) {
			snprintf(err, errlen,
				 "unexpected argument \"%s\" (options are --name value)", arg);
			return false;
		}
		name = arg + 2;
		eq = strchr(name, '=');
		len = eq ? (size_t)(eq - name) : strlen(name);
		def = find_option(name, len);
		if (!def) {
			snprintf(err, errlen, "unknown option \"%s\" (see `pgcoord-agent --help`)",
				 arg);
			return false;
		}
		if (eq) {
			value = eq + 1;
		} else if (i + 1 < argc) {
			value = argv[++i];
		} else {
			snprintf(err, errlen, "--%s needs a value", def->name);
			return false;
		}
		if (!set_value(cfg, def, value, why, sizeof(why))) {
			snprintf(err, errlen, "--%.*s: %s", (int)len, name, why);
			return false;
		}
	}
	return true;
}

static bool admins_add(struct admin_set *a, uid_t uid)
{
	uid_t *grown = realloc(a->uids, (a->nuids + 1) * sizeof(*grown));
	if (!grown)
		return false;
	a->uids = grown;
	a->uids[a->nuids++] = uid;
	return true;
}

/* Turns a uid list option and a group option (admin_uids/admin_group,
 * client_uids/client_group) into a set, with a message that names the bad
 * value: a typo here would silently lock operators or clients out. */
static bool resolve_uid_set(struct admin_set *a, const char *uids_name, const char *uids,
			    const char *group_name, const char *group, char *err, size_t errlen)
{
	const char *p = uids;

	free(a->uids);
	memset(a, 0, sizeof(*a));
	while (*p) {
		char *end;
		unsigned long v;
		while (*p == ' ' || *p == ',')
			p++;
		if (!*p)
			break;
		errno = 0;
		v = strtoul(p, &end, 10);
		if (errno || end == p || !isdigit((unsigned char)*p) || v >= UINT_MAX ||
		    (*end && *end != ',' && *end != ' ')) {
			snprintf(err, errlen,
				 "%s: \"%s\" is not a comma-separated list of numeric uids",
				 uids_name, uids);
			return false;
		}
		if (!admins_add(a, (uid_t)v)) {
			snprintf(err, errlen, "%s: out of memory", uids_name);
			return false;
		}
		p = end;
	}
	if (group[0]) {
		struct group *g;
		errno = 0;
		g = getgrnam(group);
		if (!g && errno) {
			snprintf(err, errlen, "%s: cannot look up group \"%s\": %s", group_name,
				 group, strerror(errno));
			return false;
		}
		if (!g) {
			snprintf(err, errlen, "%s: no group named \"%s\" on this host", group_name,
				 group);
			return false;
		}
		a->has_group = true;
		a->gid = g->gr_gid;
		/* members listed by name; a name with no user is skipped (it
		 * can authenticate nobody) */
		for (char **m = g->gr_mem; m && *m; m++) {
			struct passwd *pw = getpwnam(*m);
			if (pw && !admins_add(a, pw->pw_uid)) {
				snprintf(err, errlen, "%s: out of memory", group_name);
				return false;
			}
		}
	}
	return true;
}

/* Who is an admin, and who may open sessions. */
static bool resolve_peer_sets(struct config *cfg, char *err, size_t errlen)
{
	return resolve_uid_set(&cfg->admins, "admin_uids", cfg->admin_uids, "admin_group",
			       cfg->admin_group, err, errlen) &&
	       resolve_uid_set(&cfg->clients, "client_uids", cfg->client_uids, "client_group",
			       cfg->client_group, err, errlen);
}

bool config_load(struct config *cfg, const char *path, bool path_required, int argc, char **argv,
		 char *err, size_t errlen)
{
	if (!load_file(cfg, path ? path : CONFIG_DEFAULT_FILE, path_required, err, errlen))
		return false;
	if (!load_env(cfg, err, errlen))
		return false;
	if (!load_flags(cfg, argc, argv, err, errlen))
		return false;
	if (cfg->replica_id[0] == '\0') {
		char host[256] = "";
		if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
			snprintf(err, errlen,
				 "replica_id is empty and the host name is unknown: "
				 "set replica_id");
			return false;
		}
		free(cfg->replica_id);
		cfg->replica_id = strdup(host);
	}
	return resolve_peer_sets(cfg, err, errlen);
}

/*
 * Parses database_url as libpq will, so a malformed one stops the agent at
 * start rather than failing every connection attempt later. libpq's message
 * may quote a fragment of the string (`missing "=" after "b"`), which can be
 * part of an unquoted password: when the string holds a password, the
 * message is withheld and only a hint given.
 */
static bool check_database_url(const char *url, char *err, size_t errlen)
{
	char *pqerr = NULL, *redacted;
	PQconninfoOption *opts;
	bool secret;

	if (!url[0])
		return true;
	opts = PQconninfoParse(url, &pqerr);
	if (opts) {
		PQconninfoFree(opts);
		return true;
	}
	redacted = config_redact_conninfo(url);
	secret = !redacted || strcmp(redacted, url) != 0;
	free(redacted);
	if (pqerr) {
		for (char *p = pqerr; *p; p++)
			if (*p == '\n')
				*p = p[1] ? ' ' : '\0';
	}
	if (secret || !pqerr)
		snprintf(err, errlen,
			 "database_url: libpq cannot parse it (its message is withheld: it may "
			 "quote the password); check the key=value pairs, and quote values "
			 "with spaces in single quotes, or the URI's percent-encoding");
	else
		snprintf(err, errlen, "database_url: libpq cannot parse it: %s", pqerr);
	PQfreemem(pqerr);
	return false;
}

bool config_validate(const struct config *cfg, char *err, size_t errlen)
{
	if (strlen(cfg->replica_id) > 200) {
		snprintf(err, errlen, "replica_id: longer than 200 bytes");
		return false;
	}
	if (cfg->socket_path[0] != '/') {
		snprintf(err, errlen, "socket_path: \"%s\" must be an absolute path",
			 cfg->socket_path);
		return false;
	}
	if (strlen(cfg->socket_path) >= 108) {
		snprintf(err, errlen,
			 "socket_path: longer than a Unix socket path may be (107 bytes)");
		return false;
	}
	if (!check_database_url(cfg->database_url, err, errlen))
		return false;
	if (cfg->metrics_listen[0]) {
		struct sockaddr_storage ss;
		socklen_t sslen;
		char why[256];
		if (!config_parse_listen(cfg->metrics_listen, &ss, &sslen, why, sizeof(why))) {
			snprintf(err, errlen, "metrics_listen: %s", why);
			return false;
		}
	}
	/* a purged tombstone stops guarding its id: refuse a window a retry
	 * could plausibly outlive */
	if (cfg->retention_s > 0 && cfg->retention_s < 3600) {
		snprintf(err, errlen,
			 "retention_s (%d) must be 0 (keep everything) or at least 3600: a "
			 "duplicate claim arriving after its permit was deleted is admitted as new",
			 cfg->retention_s);
		return false;
	}
	/* three heartbeats must fit in a ttl, so one slow or lost heartbeat
	 * never lets a live session lapse */
	if (cfg->heartbeat_interval_ms * 3 > cfg->session_ttl_ms) {
		snprintf(err, errlen,
			 "heartbeat_interval_ms (%d) must be at most a third of session_ttl_ms "
			 "(%d): raise session_ttl_ms or lower heartbeat_interval_ms",
			 cfg->heartbeat_interval_ms, cfg->session_ttl_ms);
		return false;
	}
	return true;
}

bool config_parse_listen(const char *text, struct sockaddr_storage *out, socklen_t *outlen,
			 char *why, size_t whylen)
{
	char host[64];
	const char *colon, *port;
	size_t hlen;
	char *end;
	long pnum;

	if (text[0] == '[') {
		const char *close = strchr(text, ']');
		if (!close || close[1] != ':') {
			snprintf(why, whylen, "\"%s\" is not [ipv6]:port (example: [::1]:9187)",
				 text);
			return false;
		}
		hlen = (size_t)(close - text - 1);
		if (hlen >= sizeof(host))
			hlen = sizeof(host) - 1;
		memcpy(host, text + 1, hlen);
		port = close + 2;
	} else {
		colon = strrchr(text, ':');
		if (!colon) {
			snprintf(why, whylen,
				 "\"%s\" has no port (expected address:port, example: "
				 "127.0.0.1:9187)",
				 text);
			return false;
		}
		hlen = (size_t)(colon - text);
		if (hlen >= sizeof(host))
			hlen = sizeof(host) - 1;
		memcpy(host, text, hlen);
		port = colon + 1;
	}
	host[hlen] = '\0';
	errno = 0;
	pnum = strtol(port, &end, 10);
	if (errno || end == port || *end || pnum < 0 || pnum > 65535) {
		snprintf(why, whylen, "\"%s\" is not a port number (0..65535)", port);
		return false;
	}
	memset(out, 0, sizeof(*out));
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	struct sockaddr_in *v4 = (struct sockaddr_in *)out;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)out;
	if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)pnum);
		*outlen = sizeof(*v4);
		/* 127.0.0.0/8 */
		if ((ntohl(v4->sin_addr.s_addr) >> 24) == 127)
			return true;
	} else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)pnum);
		*outlen = sizeof(*v6);
		if (IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr))
			return true;
	} else {
		snprintf(why, whylen,
			 "\"%s\" is not a numeric IP address (use 127.0.0.1, [::1] or localhost)",
			 host);
		return false;
	}
	snprintf(why, whylen,
		 "%s is not a loopback address; the HTTP pages have no authentication, so the "
		 "agent serves them on 127.0.0.0/8 or ::1 only (put a proxy in front to expose "
		 "them)",
		 host);
	return false;
}

char *config_redact_conninfo(const char *conninfo)
{
	size_t len = strlen(conninfo);
	/* each redaction writes 4 bytes where at least "password=" stood, plus
	 * at most one in a URI's user info */
	char *out = malloc(2 * len + 16);
	const char *in = conninfo;
	const char *scheme = strstr(conninfo, "://");
	char *o = out;

	if (!out)
		return NULL;
	if (scheme) {
		const char *creds = scheme + 3;
		const char *at = strchr(creds, '@');
		const char *colon = strchr(creds, ':');
		const char *slash = strchr(creds, '/');
		if (at && colon && colon < at && (!slash || at < slash)) {
			memcpy(o, in, (size_t)(colon + 1 - in));
			o += colon + 1 - in;
			memcpy(o, "****", 4);
			o += 4;
			in = at;
		}
	}
	while (*in) {
		if (strncmp(in, "password", 8) == 0) {
			const char *v = in + 8;
			while (*v == ' ')
				v++;
			if (*v == '=') {
				v++;
				while (*v == ' ')
					v++;
				memcpy(o, "password=****", 13);
				o += 13;
				if (*v == '\'') {
					for (v++; *v && *v != '\'';
					     v += (*v == '\\' && v[1]) ? 2 : 1)
						;
					if (*v)
						v++;
				} else {
					while (*v && *v != ' ' && *v != '&')
						v++;
				}
				in = v;
				continue;
			}
		}
		*o++ = *in++;
	}
	*o = '\0';
	return out;
}

void config_format(const struct config *cfg, const struct option_def *def, char *buf, size_t len)
{
	const void *field = (const char *)cfg + def->offset;
	switch (def->type) {
	case OPT_STRING: {
		const char *v = *(char *const *)field;
		if (def->secret) {
			char *r = config_redact_conninfo(v);
			snprintf(buf, len, "\"%s\"", r ? r : "****");
			free(r);
		} else {
			snprintf(buf, len, "\"%s\"", v);
		}
		break;
	}
	case OPT_INT:
		snprintf(buf, len, "%d", *(const int *)field);
		break;
	case OPT_MODE:
		snprintf(buf, len, "0%o", (unsigned)*(const int *)field);
		break;
	case OPT_LEVEL:
		snprintf(buf, len, "%s", log_level_name(*(const enum log_level *)field));
		break;
	case OPT_STATEMENTS:
		snprintf(buf, len, "%s", stmt_setting_name(*(const enum stmt_setting *)field));
		break;
	}
}

bool config_equal(const struct config *a, const struct config *b, const struct option_def *def)
{
	const void *fa = (const char *)a + def->offset, *fb = (const char *)b + def->offset;
	switch (def->type) {
	case OPT_STRING:
		return strcmp(*(char *const *)fa, *(char *const *)fb) == 0;
	case OPT_INT:
	case OPT_MODE:
		return *(const int *)fa == *(const int *)fb;
	case OPT_LEVEL:
		return *(const enum log_level *)fa == *(const enum log_level *)fb;
	case OPT_STATEMENTS:
		return *(const enum stmt_setting *)fa == *(const enum stmt_setting *)fb;
	}
	return false;
}

void config_take(struct config *dst, struct config *src, const struct option_def *def)
{
	void *fd = (char *)dst + def->offset, *fs = (char *)src + def->offset;
	switch (def->type) {
	case OPT_STRING: {
		/* swap, so each config still owns exactly one string */
		char *tmp = *(char **)fd;
		*(char **)fd = *(char **)fs;
		*(char **)fs = tmp;
		break;
	}
	case OPT_INT:
	case OPT_MODE:
		*(int *)fd = *(const int *)fs;
		break;
	case OPT_LEVEL:
		*(enum log_level *)fd = *(const enum log_level *)fs;
		break;
	case OPT_STATEMENTS:
		*(enum stmt_setting *)fd = *(const enum stmt_setting *)fs;
		break;
	}
}

void config_print(const struct config *cfg, FILE *out)
{
	char value[4200];
	for (size_t i = 0; i < config_options_count; i++) {
		config_format(cfg, &config_options[i], value, sizeof(value));
		fprintf(out, "%s = %s\n", config_options[i].name, value);
	}
}

bool uid_set_has(const struct admin_set *set, uid_t uid, gid_t gid)
{
	if (set->has_group && gid == set->gid)
		return true;
	for (size_t i = 0; i < set->nuids; i++)
		if (set->uids[i] == uid)
			return true;
	return false;
}
