/*
 * test_ops.c — what an operator relies on, against real agents and a real
 * Postgres: the sd_notify protocol (this test plays the service manager on
 * a datagram socket), SIGHUP reload, the metrics, health and status pages
 * (the status page also in headless Chromium), socket activation, libpq's
 * own environment, and passwords kept out of logs.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "proto/codec.h"

#define CALL_MS 5000

TestSuite(ops, .timeout = 60);

/* --- small helpers --------------------------------------------------------- */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	va_start(ap, fmt);
	cr_assert(vasprintf(&s, fmt, ap) >= 0);
	va_end(ap);
	return s;
}

static struct harness_db *migrated_db(void)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	return db;
}

/* Polls the agent's log until it contains needle; fails after timeout_ms. */
static void wait_log(struct hagent *a, const char *needle, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	while (!strstr(hagent_log(a), needle)) {
		cr_assert(hnow_ms() < deadline, "no \"%s\" in the agent's log after %d ms:\n%s",
			  needle, timeout_ms, hagent_log(a));
		hsleep_ms(20);
	}
}

/* Request params: a map packed into an sbuffer. */
struct params {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static msgpack_packer *params_map(struct params *p, uint32_t n)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&p->pk, n);
	return &p->pk;
}

/*
 * Calls method and returns the error code name ("" on success); when
 * result is non-NULL and the call succeeded, *result receives a copy of
 * the result's field `key` as an integer (0 when absent).
 */
static char *call(int fd, const char *method, struct params *p, const char *key, int64_t *value)
{
	static uint32_t msgid = 100;
	msgpack_unpacked u;
	struct pgc_message m;
	char err[256];
	char *code;

	msgpack_unpacked_init(&u);
	cr_assert_eq(
	    hraw_call(fd, ++msgid, method, p ? p->sb.data : NULL, p ? p->sb.size : 0, CALL_MS, &u),
	    HRAW_MSG, "%s: no reply", method);
	cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s: %s", method, err);
	if (m.error) {
		const msgpack_object *c = pgc_map_get(m.error, "code");
		code = c ? pgc_obj_strdup(c) : strdup("?");
	} else {
		code = strdup("");
		if (key && value) {
			*value = 0;
			pgc_obj_int64(pgc_map_get(m.result, key), value);
		}
	}
	msgpack_unpacked_destroy(&u);
	if (p)
		msgpack_sbuffer_destroy(&p->sb);
	return code;
}

static void call_ok(int fd, const char *method, struct params *p, const char *key, int64_t *value)
{
	char *code = call(fd, method, p, key, value);
	cr_assert_str_eq(code, "", "%s failed: %s", method, code);
	free(code);
}

static int64_t session_open(int fd, const char *name)
{
	struct params p;
	int64_t id = 0;
	pgc_pack_kv_str(params_map(&p, 1), "name", name);
	call_ok(fd, "session.open", &p, "session", &id);
	return id;
}

/* permit.claim {id, quotas: [{key, weight: 1}]}; returns the status. */
static char *claim(int fd, const char *id, const char *quota)
{
	static uint32_t msgid = 5000;
	struct params p;
	msgpack_unpacked u;
	struct pgc_message m;
	char err[256], *status;
	msgpack_packer *pk = params_map(&p, 2);
	pgc_pack_kv_str(pk, "id", id);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 2);
	pgc_pack_kv_str(pk, "key", quota);
	pgc_pack_kv_int(pk, "weight", 1);
	msgpack_unpacked_init(&u);
	cr_assert_eq(hraw_call(fd, ++msgid, "permit.claim", p.sb.data, p.sb.size, CALL_MS, &u),
		     HRAW_MSG);
	cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
	cr_assert_null(m.error, "permit.claim %s failed", id);
	status = pgc_obj_strdup(pgc_map_get(m.result, "status"));
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&p.sb);
	return status;
}

/* The port an agent started with --metrics-listen 127.0.0.1:0 listens on. */
static int http_port(struct hagent *a)
{
	const char *at;
	wait_log(a, "metrics_listen=127.0.0.1:", 5000);
	at = strstr(hagent_log(a), "metrics_listen=127.0.0.1:");
	return atoi(at + strlen("metrics_listen=127.0.0.1:"));
}

/* One HTTP/1.0 request; returns the status code, *body gets the body. */
static int http_request(int port, const char *method, const char *path, char **body)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct timeval tv = {10, 0};
	char *resp = NULL, *sep, buf[4096];
	size_t len = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), status = 0;

	cr_assert(fd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	cr_assert(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect :%d: %s", port,
		  strerror(errno));
	char *req = xasprintf("%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
	cr_assert(hraw_send(fd, req, strlen(req)));
	free(req);
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		resp = realloc(resp, len + (size_t)n + 1);
		memcpy(resp + len, buf, (size_t)n);
		len += (size_t)n;
	}
	close(fd);
	cr_assert(resp, "no HTTP response for %s %s", method, path);
	resp[len] = '\0';
	sscanf(resp, "HTTP/1.%*d %d", &status);
	sep = strstr(resp, "\r\n\r\n");
	*body = strdup(sep ? sep + 4 : "");
	free(resp);
	return status;
}

static char *http_get(int port, const char *path, int expect)
{
	char *body;
	int status = http_request(port, "GET", path, &body);
	cr_assert_eq(status, expect, "GET %s: %d, expected %d:\n%s", path, status, expect, body);
	return body;
}

/* The value of the first metric line starting with `series ` (-1 when absent). */
static double metric(const char *text, const char *series)
{
	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		size_t n = strlen(series);
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	}
	return -1;
}

/* --- sd_notify ------------------------------------------------------------ */

/* Reads datagrams from fd for up to ms, appending each to *log (separated
 * by "|"); returns how many contained WATCHDOG=1. */
static int read_notify(int fd, int ms, char **log)
{
	int64_t deadline = hnow_ms() + ms;
	int pings = 0;
	for (;;) {
		int64_t left = deadline - hnow_ms();
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		char buf[1024];
		if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
			break;
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
		if (n <= 0)
			break;
		buf[n] = '\0';
		pings += strstr(buf, "WATCHDOG=1") != NULL;
		char *joined = xasprintf("%s%s|", *log ? *log : "", buf);
		free(*log);
		*log = joined;
	}
	return pings;
}

Test(ops, sd_notify_ready_status_watchdog_only_while_heartbeats_succeed_then_stopping)
{
	struct harness_db *db = migrated_db();
	char *path = htmp_path("notify.sock"), *seen = NULL, *expect;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	const char *args[] = {"--heartbeat-interval-ms", "200", "--session-ttl-ms", "1200", NULL};

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	cr_assert(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "%s", strerror(errno));
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", "200000", 1); /* a ping every 100 ms */
	unsetenv("WATCHDOG_PID");
	struct hagent *a = hagent_start(db, "notify-1", args);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");

	int pings = read_notify(fd, 700, &seen);
	/* STATUS while starting, then READY with the pid and a summary */
	cr_assert(strstr(seen, "STATUS=starting replica_id=notify-1"), "%s", seen);
	expect = xasprintf("READY=1\nMAINPID=%d\nSTATUS=serving replica_id=notify-1 on %s: "
			   "database up",
			   (int)hagent_pid(a), hagent_socket(a));
	cr_assert(strstr(seen, expect), "expected %s in %s", expect, seen);
	cr_assert(strstr(seen, "STATUS=starting") < strstr(seen, "READY=1"), "%s", seen);
	cr_assert_geq(pings, 3, "only %d WATCHDOG=1 in 700 ms: %s", pings, seen);

	/* the database goes away for good: heartbeats fail, and once the last
	 * success is session_ttl_ms old the pings stop */
	hdb_drop(db);
	free(seen);
	seen = NULL;
	read_notify(fd, 1500, &seen);
	pings = read_notify(fd, 800, &seen);
	cr_assert_eq(pings, 0, "WATCHDOG=1 kept coming without heartbeats: %s", seen);
	cr_assert(strstr(seen, "database DOWN"), "STATUS never said so: %s", seen);

	free(seen);
	seen = NULL;
	kill(hagent_pid(a), SIGTERM);
	read_notify(fd, 500, &seen);
	cr_assert(strstr(seen, "STOPPING=1\nSTATUS=stopping replica_id=notify-1"), "%s", seen);
	cr_assert_eq(hagent_wait(a, 10000), 0);
	hagent_destroy(a);
	close(fd);
	free(seen);
	free(expect);
	free(path);
}

/* --- SIGHUP ----------------------------------------------------------------- */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert(f, "%s: %s", path, strerror(errno));
	fputs(text, f);
	fclose(f);
}

Test(ops, sighup_applies_reloadable_options_keeps_the_rest_and_survives_a_bad_file)
{
	struct harness_db *db = migrated_db();
	char *conf = htmp_path("agent.conf");
	int64_t grace = 0;
	write_file(conf, "log_level = info\nsession_grace_ms = 1000\n");
	const char *args[] = {"--config", conf, NULL};
	struct hagent *a = hagent_start(db, "hup-1", args);
	int fd = hraw_connect(hagent_socket(a));

	write_file(conf, "log_level = debug\nsession_grace_ms = 2500\npool_size = 2\n");
	kill(hagent_pid(a), SIGHUP);
	wait_log(a, "configuration reloaded: 2 option(s) applied, 1 need a restart", 5000);
	cr_assert(strstr(hagent_log(a), "pool_size changed to 2 but needs a restart"), "%s",
		  hagent_log(a));
	/* applied at once: new sessions get the new grace, debug lines appear
	 * and carry the request's ids */
	session_open(fd, "after-hup");
	call_ok(fd, "session.keepalive", NULL, NULL, NULL);
	struct params p;
	params_map(&p, 0);
	call_ok(fd, "agent.ping", &p, NULL, NULL);
	int fd2 = hraw_connect(hagent_socket(a));
	pgc_pack_kv_str(params_map(&p, 1), "name", "grace");
	call_ok(fd2, "session.open", &p, "grace_ms", &grace);
	cr_assert_eq(grace, 2500);
	wait_log(a, "method=agent.ping session=", 2000);
	cr_assert(strstr(hagent_log(a), "level=debug component=dispatch msg=\"answered ok in"),
		  "%s", hagent_log(a));

	/* a file that does not load keeps everything as it runs */
	write_file(conf, "log_level = debug\nsession_grace_ms = twice\n");
	kill(hagent_pid(a), SIGHUP);
	wait_log(a, "the running one stays", 5000);
	cr_assert(
	    strstr(hagent_log(a), ":2: session_grace_ms: \\\"twice\\\" is not a whole number"),
	    "%s", hagent_log(a));
	pgc_pack_kv_str(params_map(&p, 1), "name", "still");
	int fd3 = hraw_connect(hagent_socket(a));
	call_ok(fd3, "session.open", &p, "grace_ms", &grace);
	cr_assert_eq(grace, 2500);
	/* stderr is a file here: no journald priority prefixes */
	cr_assert(!strstr(hagent_log(a), "\n<"), "%s", hagent_log(a));
	close(fd);
	close(fd2);
	close(fd3);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
	free(conf);
}

/* --- /metrics and /healthz -------------------------------------------------- */

Test(ops, metrics_count_requests_claims_and_uncertain_permits_with_bounded_labels)
{
	struct harness_db *db = migrated_db();
	const char *args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "metrics-1", args);
	int port = http_port(a), fd = hraw_connect(hagent_socket(a));
	struct params p;
	char *s, *body;

	for (int i = 0; i < 3; i++)
		call_ok(fd, "agent.ping", NULL, NULL, NULL);
	/* method names clients make up never become labels */
	for (int i = 0; i < 5; i++) {
		char name[32];
		snprintf(name, sizeof(name), "made.up.%d", i);
		s = call(fd, name, NULL, NULL, NULL);
		cr_assert_str_eq(s, "method_not_found");
		free(s);
	}
	s = call(fd, "permit.claim", NULL, NULL, NULL); /* no session yet */
	cr_assert_str_eq(s, "no_session");
	free(s);
	session_open(fd, "metrics-client");
	msgpack_packer *pk = params_map(&p, 2);
	pgc_pack_kv_str(pk, "key", "gpu");
	pgc_pack_kv_int(pk, "limit", 1);
	call_ok(fd, "quota.set", &p, NULL, NULL);
	s = claim(fd, "job-1", "gpu");
	cr_assert_str_eq(s, "admitted");
	free(s);
	s = claim(fd, "job-1", "gpu");
	cr_assert_str_eq(s, "held");
	free(s);
	s = claim(fd, "job-2", "gpu");
	cr_assert_str_eq(s, "denied");
	free(s);
	pk = params_map(&p, 2);
	pgc_pack_kv_str(pk, "id", "job-1");
	pgc_pack_kv_str(pk, "reason", "connector lost before confirm");
	call_ok(fd, "permit.mark_uncertain", &p, NULL, NULL);

	body = http_get(port, "/metrics", 200);
	cr_assert_eq(
	    metric(body, "pgcoord_rpc_requests_total{method=\"agent.ping\",outcome=\"ok\"}"), 3,
	    "%s", body);
	cr_assert_eq(
	    metric(body,
		   "pgcoord_rpc_requests_total{method=\"unknown\",outcome=\"method_not_found\"}"),
	    5, "%s", body);
	cr_assert(!strstr(body, "made.up"), "a client-chosen name became a label:\n%s", body);
	cr_assert_eq(
	    metric(body,
		   "pgcoord_rpc_requests_total{method=\"permit.claim\",outcome=\"no_session\"}"),
	    1, "%s", body);
	cr_assert_eq(
	    metric(body, "pgcoord_rpc_requests_total{method=\"permit.claim\",outcome=\"ok\"}"), 3,
	    "%s", body);
	cr_assert_eq(metric(body, "pgcoord_rpc_duration_seconds_count{method=\"agent.ping\","
				  "outcome=\"ok\"}"),
		     3, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_rpc_duration_seconds_bucket{method=\"agent.ping\","
				  "outcome=\"ok\",le=\"+Inf\"}"),
		     3, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_claims_total{result=\"admitted\"}"), 1, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_claims_total{result=\"held\"}"), 1, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_claims_total{result=\"denied\"}"), 1, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_permits_uncertain"), 1, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_db_up"), 1, "%s", body);
	cr_assert_gt(metric(body, "pgcoord_db_query_duration_seconds_count{lane=\"requests\"}"), 3,
		     "%s", body);
	cr_assert_gt(metric(body, "pgcoord_db_query_duration_seconds_count{lane=\"heartbeat\"}"), 0,
		     "%s", body);
	cr_assert_geq(metric(body, "pgcoord_heartbeat_lag_seconds"), 0, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_agent_state{state=\"serving\"}"), 1, "%s", body);
	cr_assert_eq(metric(body, "pgcoord_janitor"), 1, "%s", body);
	/* every line is a comment or `name{labels} value` */
	for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
		if (line[0] == '#') {
			cr_assert(!strncmp(line, "# HELP pgcoord_", 15) ||
				      !strncmp(line, "# TYPE pgcoord_", 15),
				  "%s", line);
			continue;
		}
		char *space = strrchr(line, ' ');
		cr_assert(!strncmp(line, "pgcoord_", 8) && space, "not a sample: %s", line);
		char *end;
		strtod(space + 1, &end);
		cr_assert(*end == '\0' && end != space + 1, "bad value: %s", line);
	}
	free(body);

	body = http_get(port, "/healthz", 200);
	cr_assert_str_eq(body, "ok\n");
	free(body);
	/* libevent refuses methods other than GET and HEAD with 501 */
	cr_assert_eq(http_request(port, "POST", "/metrics", &body), 501);
	free(body);
	body = http_get(port, "/nowhere", 404);
	free(body);
	body = http_get(port, "/", 302);
	free(body);

	/* the database goes: /healthz says so, /metrics still answers */
	hdb_drop(db);
	int64_t deadline = hnow_ms() + 10000;
	int status;
	do {
		hsleep_ms(50);
		status = http_request(port, "GET", "/healthz", &body);
		if (status == 200)
			free(body);
	} while (status == 200 && hnow_ms() < deadline);
	cr_assert_eq(status, 503);
	cr_assert(strstr(body, "database") || strstr(body, "heartbeat"), "%s", body);
	free(body);
	body = http_get(port, "/metrics", 200);
	cr_assert_eq(metric(body, "pgcoord_db_up"), 0, "%s", body);
	free(body);
	close(fd);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
}

/* --- /status ---------------------------------------------------------------- */

/* Fills a database with something of every kind the status page shows;
 * names carry HTML metacharacters. */
static void populate(struct hagent *a, int *fds)
{
	struct params p;
	msgpack_packer *pk;
	char *s;

	fds[0] = hraw_connect(hagent_socket(a));
	fds[1] = hraw_connect(hagent_socket(a));
	session_open(fds[0], "worker <b>&amp;</b>");
	session_open(fds[1], "reconciler");
	pk = params_map(&p, 1);
	pgc_pack_kv_str(pk, "name", "billing.leader");
	call_ok(fds[1], "lease.acquire", &p, NULL, NULL);
	pk = params_map(&p, 2);
	pgc_pack_kv_str(pk, "key", "gpu-pool");
	pgc_pack_kv_int(pk, "limit", 2);
	call_ok(fds[0], "quota.set", &p, NULL, NULL);
	s = claim(fds[0], "vm-<42>", "gpu-pool");
	cr_assert_str_eq(s, "admitted");
	free(s);
	pk = params_map(&p, 2);
	pgc_pack_kv_str(pk, "id", "vm-<42>");
	pgc_pack_kv_str(pk, "reason", "connector lost \"mid-flight\"");
	call_ok(fds[0], "permit.mark_uncertain", &p, NULL, NULL);
}

Test(ops, status_page_shows_agents_sessions_leases_quotas_and_uncertain_permits_escaped)
{
	struct harness_db *db = migrated_db();
	const char *args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "status-<1>", args);
	int port = http_port(a), fds[2];
	char *body;

	populate(a, fds);
	body = http_get(port, "/status", 200);
	cr_assert(strstr(body, "<table id=\"agents\">"), "%s", body);
	cr_assert(strstr(body, "<td>status-&lt;1&gt;</td><td class=\"ok\">live</td>"), "%s", body);
	cr_assert(strstr(body, "<td>worker &lt;b&gt;&amp;amp;&lt;/b&gt;</td>"), "%s", body);
	cr_assert(!strstr(body, "<b>"), "unescaped markup from the database:\n%s", body);
	cr_assert(strstr(body, "<td>billing.leader</td><td class=\"ok\">status-&lt;1&gt;</td>"),
		  "%s", body);
	/* each quota links to its /why page, which names the holder */
	cr_assert(strstr(body, "<td><a href=\"/why?key=gpu-pool\">gpu-pool</a></td><td>2</td>"
			       "<td>1</td><td>0</td><td class=\"warn\">1</td>"),
		  "%s", body);
	char *why = http_get(port, "/why?key=gpu-pool", 200);
	cr_assert(strstr(why, "vm-&lt;42&gt;"), "the linked /why page lacks the holder:\n%s", why);
	free(why);
	cr_assert(strstr(body, "<td>vm-&lt;42&gt;</td><td class=\"warn\">connector lost "
			       "&quot;mid-flight&quot;</td>"),
		  "%s", body);
	free(body);

	/* the page still renders when the database is gone, and says why */
	hdb_drop(db);
	int64_t deadline = hnow_ms() + 10000;
	do {
		hsleep_ms(50);
		body = http_get(port, "/status", 200);
		if (strstr(body, "class=\"err\""))
			break;
		free(body);
		body = NULL;
	} while (hnow_ms() < deadline);
	cr_assert(body, "the status page never reported the database failure");
	cr_assert(strstr(body, "<h1>pgcoord-agent status-&lt;1&gt;</h1>"), "%s", body);
	free(body);
	close(fds[0]);
	close(fds[1]);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
}

/* The browser Debian ships, or NULL. */
static const char *find_chromium(void)
{
	static const char *const candidates[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser",
						 "/usr/bin/google-chrome", NULL};
	for (int i = 0; candidates[i]; i++)
		if (access(candidates[i], X_OK) == 0)
			return candidates[i];
	return NULL;
}

/* Runs headless Chromium on url with one extra mode flag; its stdout in *out. */
static int chromium(const char *bin, const char *mode, const char *url, char **out)
{
	char *profile = htmp_path("chromium-profile");
	cr_assert(mkdir(profile, 0700) == 0);
	char *udd = xasprintf("--user-data-dir=%s", profile);
	const char *argv[] = {"timeout",
			      "-k",
			      "5",
			      "60",
			      bin,
			      "--headless",
			      "--no-sandbox",
			      "--disable-gpu",
			      "--disable-quic",
			      "--no-first-run",
			      "--disable-background-networking",
			      "--disable-component-update",
			      "--disable-sync",
			      "--disable-dev-shm-usage",
			      udd,
			      "--window-size=1200,900",
			      mode,
			      url,
			      NULL};
	int rc = hrun(argv, out);
	free(udd);
	free(profile);
	return rc;
}

Test(ops, status_page_renders_its_tables_in_headless_chromium)
{
	const char *bin = find_chromium();
	if (!bin)
		cr_skip_test("chromium is not installed (scripts/install-deps installs it; CI "
			     "runs this test)");
	struct harness_db *db = migrated_db();
	const char *args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "browser-1", args);
	int port = http_port(a), fds[2];
	char *url = xasprintf("http://127.0.0.1:%d/status", port), *out = NULL;
	char *png = htmp_path("status.png");

	populate(a, fds);
	/* the DOM as the browser built it: every table with its rows */
	int rc = chromium(bin, "--dump-dom", url, &out);
	cr_assert_eq(rc, 0, "chromium --dump-dom exited %d:\n%s", rc, out);
	static const char *const want[] = {
	    "<table id=\"agent\">",
	    "<table id=\"agents\">",
	    "<td>browser-1</td><td class=\"ok\">live</td>",
	    "<table id=\"sessions\">",
	    "<td>worker &lt;b&gt;&amp;amp;&lt;/b&gt;</td>",
	    "<td>reconciler</td>",
	    "<table id=\"leases\">",
	    "<td>billing.leader</td><td class=\"ok\">browser-1</td>",
	    "<table id=\"quotas\">",
	    "<td><a href=\"/why?key=gpu-pool\">gpu-pool</a></td>",
	    "<table id=\"permits\">",
	    "<td>vm-&lt;42&gt;</td>",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert(strstr(out, want[i]), "the rendered DOM lacks %s:\n%s", want[i], out);
	free(out);
	out = NULL;

	/* and a screenshot, kept beside the test log when the build asks */
	char *shot = xasprintf("--screenshot=%s", png);
	rc = chromium(bin, shot, url, &out);
	cr_assert_eq(rc, 0, "chromium --screenshot exited %d:\n%s", rc, out);
	char *bytes = hread_file(png);
	struct stat st;
	cr_assert(stat(png, &st) == 0, "no screenshot at %s:\n%s", png, out);
	cr_assert(st.st_size > 10000, "a %lld-byte screenshot is an empty page",
		  (long long)st.st_size);
	cr_assert(!memcmp(bytes, "\x89PNG", 4), "the screenshot is not a PNG");
	const char *keep = getenv("PGCOORD_TEST_ARTIFACTS");
	if (keep && *keep) {
		char *dst = xasprintf("%s/status-page.png", keep);
		const char *cp[] = {"cp", png, dst, NULL};
		hrun(cp, NULL);
		free(dst);
	}
	free(bytes);
	free(shot);
	free(out);
	free(url);
	free(png);
	close(fds[0]);
	close(fds[1]);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
}

/* --- socket activation ---------------------------------------------------- */

/* Starts the agent as systemd would for a .socket unit: the listening socket
 * as fd 3, LISTEN_PID and LISTEN_FDS set. Returns the pid. */
static pid_t spawn_activated(int listen_fd, const char *conninfo, const char *socket_path,
			     const char *log_path)
{
	const char *bin = henv("PGCOORD_TEST_AGENT_BIN");
	pid_t parent = getpid(), pid;
	int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	cr_assert(log_fd >= 0);
	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		char pidbuf[24];
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(log_fd, 1);
		dup2(log_fd, 2);
		if (listen_fd != 3) {
			dup2(listen_fd, 3);
			close(listen_fd);
		}
		fcntl(3, F_SETFD, 0); /* survives exec */
		snprintf(pidbuf, sizeof(pidbuf), "%d", (int)getpid());
		setenv("LISTEN_PID", pidbuf, 1);
		setenv("LISTEN_FDS", "1", 1);
		execl(bin, bin, "--database-url", conninfo, "--replica-id", "activated-1",
		      "--socket-path", socket_path, (char *)NULL);
		_exit(127);
	}
	close(log_fd);
	return pid;
}

static int listening_unix_socket(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	cr_assert(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "%s", strerror(errno));
	cr_assert(listen(fd, 16) == 0);
	return fd;
}

static int wait_exit(pid_t pid, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	int status;
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (hnow_ms() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			cr_assert_fail("pid %d did not exit in %d ms", (int)pid, timeout_ms);
		}
		hsleep_ms(20);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Test(ops, socket_activation_serves_clients_that_connected_before_the_agent_started)
{
	struct harness_db *db = migrated_db();
	char *path = htmp_path("activated.sock"), *log = htmp_path("activated.log");
	int lfd = listening_unix_socket(path);
	struct stat before, after;

	cr_assert(stat(path, &before) == 0);
	/* a client connects and asks while no agent runs yet: the kernel
	 * queues it on the socket systemd (here: the test) holds */
	int early = hraw_connect(path);
	cr_assert(early >= 0);
	cr_assert(hraw_send_request(early, 7, "agent.ping", NULL, 0));

	pid_t pid = spawn_activated(lfd, hdb_conninfo(db), path, log);
	close(lfd);
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	enum hraw_result r = hraw_recv_msg(early, 10000, &u);
	char *text = hread_file(log);
	cr_assert_eq(r, HRAW_MSG, "no answer on the activated socket; log:\n%s", text);
	free(text);
	msgpack_unpacked_destroy(&u);
	close(early);
	/* wait for registration, then a normal call */
	int64_t deadline = hnow_ms() + 10000;
	for (;;) {
		text = hread_file(log);
		if (strstr(text, "msg=\"registered\" replica_id="))
			break;
		cr_assert(hnow_ms() < deadline, "not registered:\n%s", text);
		free(text);
		hsleep_ms(20);
	}
	cr_assert(strstr(text, "using the socket systemd passed on"), "%s", text);
	free(text);
	int fd = hraw_connect(path);
	session_open(fd, "activated-client");
	close(fd);

	kill(pid, SIGTERM);
	cr_assert_eq(wait_exit(pid, 10000), 0);
	/* the socket file is the .socket unit's: still there, same inode */
	cr_assert(stat(path, &after) == 0, "the agent removed systemd's socket");
	cr_assert_eq(before.st_ino, after.st_ino);

	/* a socket bound elsewhere than socket_path is refused with the fix */
	char *other = htmp_path("elsewhere.sock");
	lfd = listening_unix_socket(other);
	pid = spawn_activated(lfd, hdb_conninfo(db), path, log);
	close(lfd);
	cr_assert_eq(wait_exit(pid, 10000), 1);
	text = hread_file(log);
	cr_assert(strstr(text, "make ListenStream= and socket_path agree"), "%s", text);
	free(text);
	free(other);
	free(path);
	free(log);
	hdb_drop(db);
}

/* --- database settings and secrets ----------------------------------------- */

Test(ops, empty_database_url_uses_libpq_environment)
{
	struct harness_db *db = migrated_db();
	setenv("PGHOST", henv("PGCOORD_TEST_PGHOST"), 1);
	setenv("PGPORT", henv("PGCOORD_TEST_PGPORT"), 1);
	setenv("PGUSER", henv("PGCOORD_TEST_PGUSER"), 1);
	setenv("PGDATABASE", hdb_name(db), 1);
	unsetenv("PGCOORD_DATABASE_URL");
	struct hagent *a = hagent_start(NULL, "libpq-env-1", NULL);
	cr_assert(strstr(hagent_log(a), "database_url=\"\""), "%s", hagent_log(a));
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'libpq-env-1' AND stopped_at IS NULL"),
		     1);
	cr_assert_eq(hagent_stop(a), 0);
	hagent_destroy(a);
	hdb_drop(db);
}

Test(ops, database_passwords_never_reach_logs_or_check_config)
{
	struct harness_db *db = migrated_db();
	/* trust authentication ignores the password; the agent must still hide it */
	char *kv = xasprintf("%s password=Kv-S3cret-1", hdb_conninfo(db));
	char *uri = xasprintf("postgresql://%s:Uri-S3cret-2@/%s?host=%s&port=%s",
			      henv("PGCOORD_TEST_PGUSER"), hdb_name(db),
			      henv("PGCOORD_TEST_PGHOST"), henv("PGCOORD_TEST_PGPORT"));
	const char *debug[] = {"--log-level", "debug", NULL};
	struct hagent *a = hagent_start_url(kv, "secret-kv", debug);
	struct hagent *b = hagent_start_url(uri, "secret-uri", debug);
	int fd = hraw_connect(hagent_socket(a));
	session_open(fd, "s");
	close(fd);
	cr_assert_eq(hagent_stop(a), 0);
	cr_assert_eq(hagent_stop(b), 0);
	cr_assert(strstr(hagent_log(a), "password=****"), "%s", hagent_log(a));
	cr_assert(!strstr(hagent_log(a), "Kv-S3cret-1"), "%s", hagent_log(a));
	cr_assert(strstr(hagent_log(b), ":****@"), "%s", hagent_log(b));
	cr_assert(!strstr(hagent_log(b), "Uri-S3cret-2"), "%s", hagent_log(b));

	/* a database that refuses: the errors are logged, the password not */
	char *bad =
	    xasprintf("host=%s port=1 dbname=x password=Bad-S3cret-3", henv("PGCOORD_TEST_PGHOST"));
	const char *argv[] = {henv("PGCOORD_TEST_AGENT_BIN"), "--check-config", "--database-url",
			      bad, NULL};
	char *out = NULL;
	cr_assert_eq(hrun(argv, &out), 0, "%s", out);
	cr_assert(strstr(out, "database_url = \"host="), "%s", out);
	cr_assert(!strstr(out, "Bad-S3cret-3"), "%s", out);
	free(out);
	char *sock = htmp_path("bad.sock"), *logp = htmp_path("bad.log");
	const char *run[] = {henv("PGCOORD_TEST_AGENT_BIN"),
			     "--database-url",
			     bad,
			     "--socket-path",
			     sock,
			     "--replica-id",
			     "secret-bad",
			     "--log-level",
			     "debug",
			     NULL};
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int lfd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(lfd, 1);
		dup2(lfd, 2);
		execv(run[0], (char *const *)run);
		_exit(127);
	}
	hsleep_ms(1200);
	kill(pid, SIGTERM);
	wait_exit(pid, 10000);
	out = hread_file(logp);
	cr_assert(strstr(out, "cannot connect"), "%s", out);
	cr_assert(!strstr(out, "Bad-S3cret-3"), "%s", out);
	free(out);
	free(sock);
	free(logp);
	free(bad);
	hagent_destroy(a);
	hagent_destroy(b);
	free(kv);
	free(uri);
	hdb_drop(db);
}

/* --- pgcoordctl top ----------------------------------------------------- */

Test(ops, top_draws_the_agent_fleet_leases_fullest_quotas_and_uncertain_permits)
{
	struct harness_db *db = migrated_db();
	struct hagent *a = hagent_start(db, "top-1", NULL);
	const char *ctl = henv("PGCOORD_TEST_CTL_BIN");
	int fds[2];
	char *out = NULL;

	populate(a, fds);
	const char *text[] = {
	    ctl, "--socket", hagent_socket(a), "top", "--count", "2", "--interval", "200", NULL};
	int64_t t0 = hnow_ms();
	cr_assert_eq(hrun(text, &out), 0, "%s", out);
	cr_assert_geq(hnow_ms() - t0, 200, "two frames came faster than the interval");
	const char *first = strstr(out, "pgcoordctl top");
	cr_assert(first && strstr(first + 1, "pgcoordctl top"), "not two frames:\n%s", out);
	static const char *const want[] = {
	    "agent   top-1 serving, database up",
	    "connections, 3 sessions, 2 leases held, the fleet's janitor",
	    "fleet   1 agent (1 live), 3 live sessions",
	    "billing.leader",
	    "gpu-pool",
	    "50%",
	    "UNCERTAIN PERMITS (oldest first)",
	    "vm-<42>",
	    "connector lost \"mid-flight\"",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert(strstr(out, want[i]), "top lacks %s:\n%s", want[i], out);
	free(out);

	const char *json[] = {ctl, "--socket", hagent_socket(a), "--json", "top", "--count",
			      "1", NULL};
	cr_assert_eq(hrun(json, &out), 0, "%s", out);
	cr_assert(out[0] == '{' && strstr(out, "\"status\": {") && strstr(out, "\"leases\": {") &&
		      strstr(out, "\"permits\": {"),
		  "%s", out);
	free(out);

	close(fds[0]);
	close(fds[1]);
	cr_assert_eq(hagent_stop(a), 0);
	const char *gone[] = {ctl, "--socket", hagent_socket(a), "top", "--count", "1", NULL};
	cr_assert_eq(hrun(gone, &out), 3, "%s", out);
	cr_assert(strstr(out, "unreachable"), "%s", out);
	free(out);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The line of the log holding needle (a copy; fails the test if none). */
static char *log_line(struct hagent *a, const char *needle)
{
	const char *log = hagent_log(a), *at = strstr(log, needle);
	cr_assert(at, "no \"%s\" in the log:\n%s", needle, log);
	const char *start = at;
	while (start > log && start[-1] != '\n')
		start--;
	return strndup(start, strcspn(start, "\n"));
}

/* A lease released by its holder and a clean shutdown are normal: info, not warn. */
Test(ops, normal_releases_and_a_clean_shutdown_log_at_info)
{
	struct harness_db *db = migrated_db();
	struct hagent *a = hagent_start(db, "calm-1", NULL);
	int fd = hraw_connect(hagent_socket(a));
	struct params p;
	char *line;

	/* the janitor lease is the agent's own, held until the shutdown */
	wait_log(a, "this agent is now the fleet's janitor", 10000);
	session_open(fd, "calm");
	pgc_pack_kv_str(params_map(&p, 1), "name", "calm.leader");
	call_ok(fd, "lease.acquire", &p, NULL, NULL);
	pgc_pack_kv_str(params_map(&p, 1), "name", "calm.leader");
	call_ok(fd, "lease.release", &p, NULL, NULL);
	wait_log(a, "leadership belief ends: released by its holder", 5000);
	line = log_line(a, "leadership belief ends: released by its holder");
	cr_assert(strstr(line, "level=info ") && strstr(line, "lease=calm.leader"), "%s", line);
	free(line);
	cr_assert_eq(hagent_stop(a), 0);
	close(fd);

	line = log_line(a, "leadership belief ends: the agent is shutting down");
	cr_assert(strstr(line, "level=info ") && strstr(line, "lease=pgcoord.janitor"), "%s", line);
	free(line);
	line = log_line(a, "session lost: the agent exited");
	cr_assert(strstr(line, "level=info "), "%s", line);
	free(line);
	/* the database agrees the stop was clean */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'calm-1' AND stopped_at IS NOT NULL"),
		     1);
	hagent_destroy(a);
	hdb_drop(db);
}

/* The status page names libpq's reason for a database that is down, and
 * the log shows libpq's words on one line, without escaped tabs. */
Test(ops, a_database_that_refuses_the_agent_is_down_with_libpqs_reason)
{
	struct harness_db *db = migrated_db();
	const char *args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct hagent *a = hagent_start(db, "refused-1", args);
	int port = http_port(a);
	char *body = NULL;

	/* grants of CONNECT are PUBLIC's, and the test's own session stays */
	hdb_exec(db, "REVOKE CONNECT ON DATABASE \"%s\" FROM PUBLIC", hdb_name(db));
	hdb_exec(db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
		     "WHERE datname = current_database() AND pid <> pg_backend_pid()");
	int64_t deadline = hnow_ms() + 10000;
	for (;;) {
		body = http_get(port, "/status", 200);
		if (strstr(body, "DOWN"))
			break;
		free(body);
		cr_assert_lt(hnow_ms(), deadline, "the status page never said DOWN:\n%s",
			     hagent_log(a));
		hsleep_ms(50);
	}
	cr_assert(strstr(body, "DOWN (") && strstr(body, "permission denied for database &quot;"),
		  "%s", body);
	free(body);

	const char *log = hagent_log(a);
	cr_assert(strstr(log, "connection lost: "), "%s", log);
	cr_assert_not(strstr(log, "\\t") || strstr(log, "\\x09"), "escaped tabs:\n%s", log);

	hdb_exec(db, "GRANT CONNECT ON DATABASE \"%s\" TO PUBLIC", hdb_name(db));
	hagent_destroy(a);
	hdb_drop(db);
}
