/*
 * harness.c — databases, agent processes, raw sockets and server control for
 * the integration tests. The contracts are in harness.h.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/codec.h"

#define AGENT_START_TIMEOUT_MS 10000
#define AGENT_STOP_TIMEOUT_MS 15000
#define FAIL_LOG_TAIL 6000 /* bytes of an agent's log quoted in a failure */
#define RAW_MAX_MESSAGE (64u * 1024 * 1024)
#define RAW_MAX_DEPTH 256

/* --- failing the test -------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) static void hfail(const char *fmt, ...)
{
	char msg[8192];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cr_assert_fail("%s", msg);
	abort(); /* not reached: cr_assert_fail ends the test */
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		hfail("harness: out of memory (%zu bytes)", n);
	return p;
}

static char *xstrdup(const char *s)
{
	char *p = strdup(s);

	if (!p)
		hfail("harness: out of memory");
	return p;
}

__attribute__((format(printf, 1, 0))) static char *xvasprintf(const char *fmt, va_list ap)
{
	char *s;

	if (vasprintf(&s, fmt, ap) < 0)
		hfail("harness: out of memory");
	return s;
}

__attribute__((format(printf, 1, 2))) static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	s = xvasprintf(fmt, ap);
	va_end(ap);
	return s;
}

/* The last max bytes of s, for failure messages that must stay readable. */
static const char *tail_of(const char *s, size_t max)
{
	size_t n = strlen(s);

	return n > max ? s + n - max : s;
}

/* --- environment ------------------------------------------------------- */

const char *henv(const char *name)
{
	const char *v = getenv(name);

	if (!v || !*v)
		hfail("harness: %s is not set; run integration tests with `meson test` (they need "
		      "tests/harness/with-postgres and the variables of "
		      "tests/integration/meson.build)",
		      name);
	return v;
}

static unsigned next_serial(void)
{
	static unsigned serial;

	return ++serial;
}

char *htmp_path(const char *suffix)
{
	return xasprintf("%s/%ld-%u-%s", henv("PGCOORD_TEST_TMP"), (long)getpid(), next_serial(),
			 suffix);
}

int64_t hnow_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void hsleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

char *hread_file(const char *path)
{
	FILE *f = fopen(path, "re");
	size_t cap = 4096, len = 0, n;
	char *buf;

	if (!f)
		return xstrdup("");
	buf = xmalloc(cap);
	while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (cap - len - 1 == 0) {
			char *bigger = realloc(buf, cap * 2);

			if (!bigger) {
				free(buf);
				fclose(f);
				hfail("harness: out of memory reading %s", path);
			}
			buf = bigger;
			cap *= 2;
		}
	}
	buf[len] = '\0';
	fclose(f);
	return buf;
}

/* A wait status as a shell would report it: the exit code, or 128+signal. */
static int exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return -1;
}

static pid_t waitpid_retry(pid_t pid, int *status, int flags)
{
	pid_t r;

	do
		r = waitpid(pid, status, flags);
	while (r < 0 && errno == EINTR);
	return r;
}

/*
 * In a freshly forked child: stdin from /dev/null, stdout and stderr to
 * out_fd (or left alone when out_fd < 0), and no other descriptor of the
 * test (Criterion's pipes, other agents' sockets) leaks into the program.
 */
static void child_setup_fds(int out_fd)
{
	int null_fd = open("/dev/null", O_RDONLY);

	if (null_fd >= 0 && null_fd != STDIN_FILENO) {
		dup2(null_fd, STDIN_FILENO);
		close(null_fd);
	}
	if (out_fd >= 0) {
		dup2(out_fd, STDOUT_FILENO);
		dup2(out_fd, STDERR_FILENO);
		if (out_fd > STDERR_FILENO)
			close(out_fd);
	}
	close_range(STDERR_FILENO + 1, ~0u, 0);
}

int hrun(const char *const *argv, char **output)
{
	char *out_path = NULL;
	int out_fd = -1, status;
	pid_t pid;

	if (output) {
		out_path = htmp_path("run.out");
		out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (out_fd < 0)
			hfail("harness: cannot create %s: %s", out_path, strerror(errno));
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		hfail("harness: fork: %s", strerror(errno));
	if (pid == 0) {
		child_setup_fds(out_fd);
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "harness: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (out_fd >= 0)
		close(out_fd);
	if (waitpid_retry(pid, &status, 0) < 0)
		hfail("harness: waitpid: %s", strerror(errno));
	if (output) {
		*output = hread_file(out_path);
		unlink(out_path);
		free(out_path);
	}
	return exit_code(status);
}

/* --- databases --------------------------------------------------------- */

struct harness_db {
	char *name;
	char *conninfo;
	char *agent_conninfo; /* the runtime role, through PgBouncer when enabled */
	char *owner_conninfo; /* the owner (migrations), the same way */
	PGconn *conn;	      /* for the query helpers; opened on first use */
};

/* Appends key='value' to a conninfo string, quoted as libpq wants. */
static void conninfo_add(char *buf, size_t size, const char *key, const char *value)
{
	size_t len = strlen(buf);

	len +=
	    (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s%s='", len ? " " : "", key);
	for (const char *p = value; *p && len + 3 < size; p++) {
		if (*p == '\'' || *p == '\\')
			buf[len++] = '\\';
		buf[len++] = *p;
	}
	if (len + 2 > size)
		hfail("harness: conninfo too long");
	buf[len++] = '\'';
	buf[len] = '\0';
}

/*
 * The harness's own connection to the server, for its checks. Without JIT:
 * on a fresh database's default statistics a check query (a count over a
 * correlated subquery) can be estimated above jit_above_cost and spend a
 * second compiling what runs in a millisecond. Agents keep the server's
 * settings.
 */
static char *server_conninfo(const char *dbname)
{
	char buf[2048] = "";

	conninfo_add(buf, sizeof(buf), "host", henv("PGCOORD_TEST_PGHOST"));
	conninfo_add(buf, sizeof(buf), "port", henv("PGCOORD_TEST_PGPORT"));
	conninfo_add(buf, sizeof(buf), "user", henv("PGCOORD_TEST_PGUSER"));
	conninfo_add(buf, sizeof(buf), "dbname", dbname);
	conninfo_add(buf, sizeof(buf), "options", "-c jit=off");
	return xstrdup(buf);
}

bool hbouncer_enabled(void)
{
	const char *host = getenv("PGCOORD_TEST_PGBOUNCER_HOST");

	return host && *host;
}

/*
 * How agents and migrations reach the database: through PgBouncer when
 * enabled (it logs in to the server as the client's user), else straight to
 * the server; as user, the owner ($PGCOORD_TEST_PGUSER, which migrates) or
 * the runtime role ($PGCOORD_TEST_RUNTIME_ROLE, which agents run as).
 */
static char *client_conninfo(const char *dbname, const char *user)
{
	char buf[2048] = "";
	bool bouncer = hbouncer_enabled();

	conninfo_add(buf, sizeof(buf), "host",
		     henv(bouncer ? "PGCOORD_TEST_PGBOUNCER_HOST" : "PGCOORD_TEST_PGHOST"));
	conninfo_add(buf, sizeof(buf), "port",
		     henv(bouncer ? "PGCOORD_TEST_PGBOUNCER_PORT" : "PGCOORD_TEST_PGPORT"));
	conninfo_add(buf, sizeof(buf), "user", user);
	conninfo_add(buf, sizeof(buf), "dbname", dbname);
	return xstrdup(buf);
}

static PGconn *connect_or_fail(const char *conninfo)
{
	PGconn *conn = PQconnectdb(conninfo);

	if (PQstatus(conn) != CONNECTION_OK) {
		char *msg = xstrdup(PQerrorMessage(conn));

		PQfinish(conn);
		hfail("harness: cannot connect to %s: %s", conninfo, msg);
	}
	return conn;
}

/* Runs sql on conn; fails the test unless it succeeds. The caller PQclear()s. */
static PGresult *exec_or_fail(PGconn *conn, const char *sql)
{
	PGresult *res = PQexec(conn, sql);
	ExecStatusType st = PQresultStatus(res);

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		char *msg = xstrdup(PQresultErrorMessage(res));

		PQclear(res);
		hfail("harness: query failed: %s\n  query: %s", msg, sql);
	}
	return res;
}

struct harness_db *hdb_create(void)
{
	char *admin_info = server_conninfo("postgres");
	PGconn *admin = connect_or_fail(admin_info);
	struct harness_db *db = xmalloc(sizeof(*db));
	uint32_t rnd = 0;
	char *sql;

	free(admin_info);
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint32_t)hnow_ms();
	/* pid + serial is unique among live test processes, the random part
	 * across time (a pid reused by a later test). */
	db->name = xasprintf("t_%ld_%u_%06x", (long)getpid(), next_serial(), rnd & 0xffffff);
	db->conninfo = server_conninfo(db->name);
	db->agent_conninfo = client_conninfo(db->name, henv("PGCOORD_TEST_RUNTIME_ROLE"));
	db->owner_conninfo = client_conninfo(db->name, henv("PGCOORD_TEST_PGUSER"));
	db->conn = NULL;
	sql = xasprintf("CREATE DATABASE \"%s\"", db->name);
	PQclear(exec_or_fail(admin, sql));
	free(sql);
	PQfinish(admin);
	return db;
}

void hdb_drop(struct harness_db *db)
{
	char *admin_info;
	PGconn *admin;

	if (!db)
		return;
	PQfinish(db->conn);
	admin_info = server_conninfo("postgres");
	admin = PQconnectdb(admin_info);
	if (PQstatus(admin) == CONNECTION_OK) {
		char *sql = xasprintf("DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", db->name);
		PGresult *res = PQexec(admin, sql);

		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			fprintf(stderr, "harness: dropping %s: %s", db->name,
				PQresultErrorMessage(res));
		PQclear(res);
		free(sql);
	}
	PQfinish(admin);
	free(admin_info);
	free(db->conninfo);
	free(db->agent_conninfo);
	free(db->owner_conninfo);
	free(db->name);
	free(db);
}

const char *hdb_conninfo(const struct harness_db *db)
{
	return db->conninfo;
}

const char *hdb_name(const struct harness_db *db)
{
	return db->name;
}

const char *hdb_agent_conninfo(const struct harness_db *db)
{
	return db->agent_conninfo;
}

const char *hdb_owner_conninfo(const struct harness_db *db)
{
	return db->owner_conninfo;
}

PGconn *hdb_connect(const struct harness_db *db)
{
	return connect_or_fail(db->conninfo);
}

/* True when res failed because the connection broke, not because of the SQL:
 * libpq reports a server that went away with no SQLSTATE (or class 08), and
 * a server shutting down sends 57P01..57P03 first. */
static bool connection_lost(PGconn *conn, const PGresult *res)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	return PQstatus(conn) != CONNECTION_OK || !state || strncmp(state, "08", 2) == 0 ||
	       strncmp(state, "57P", 3) == 0;
}

/*
 * Runs sql on db's cached connection. A connection broken by a server
 * restart is replaced and the query sent once more; any other failure, or a
 * second one, fails the test.
 */
static PGresult *db_run(struct harness_db *db, const char *sql)
{
	if (db->conn && PQstatus(db->conn) == CONNECTION_OK) {
		PGresult *res = PQexec(db->conn, sql);
		ExecStatusType st = PQresultStatus(res);

		if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
			return res;
		if (!connection_lost(db->conn, res)) {
			char *msg = xstrdup(PQresultErrorMessage(res));

			PQclear(res);
			hfail("harness: query failed on %s: %s\n  query: %s", db->name, msg, sql);
		}
		PQclear(res);
	}
	PQfinish(db->conn);
	db->conn = connect_or_fail(db->conninfo);
	return exec_or_fail(db->conn, sql);
}

void hdb_exec(struct harness_db *db, const char *sql, ...)
{
	va_list ap;
	char *q;

	va_start(ap, sql);
	q = xvasprintf(sql, ap);
	va_end(ap);
	PQclear(db_run(db, q));
	free(q);
}

__attribute__((format(printf, 2, 0))) static char *
query_value_v(struct harness_db *db, const char *sql, va_list ap, char **query_out)
{
	char *q = xvasprintf(sql, ap);
	PGresult *res = db_run(db, q);
	char *value = NULL;

	if (PQntuples(res) > 0 && PQnfields(res) > 0 && !PQgetisnull(res, 0, 0))
		value = xstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	if (query_out)
		*query_out = q;
	else
		free(q);
	return value;
}

char *hdb_query_value(struct harness_db *db, const char *sql, ...)
{
	va_list ap;
	char *v;

	va_start(ap, sql);
	v = query_value_v(db, sql, ap, NULL);
	va_end(ap);
	return v;
}

long hdb_query_long(struct harness_db *db, const char *sql, ...)
{
	va_list ap;
	char *q, *v, *end;
	long n;

	va_start(ap, sql);
	v = query_value_v(db, sql, ap, &q);
	va_end(ap);
	if (!v) {
		char *msg = xasprintf("harness: query returned no row or NULL: %s", q);

		free(q);
		hfail("%s", msg);
	}
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno || end == v || *end) {
		char *msg = xasprintf("harness: query returned '%s', not an integer: %s", v, q);

		free(v);
		free(q);
		hfail("%s", msg);
	}
	free(v);
	free(q);
	return n;
}

void hdb_migrate(struct harness_db *db)
{
	const char *argv[] = {henv("PGCOORD_TEST_AGENT_BIN"),
			      "migrate",
			      "--database-url",
			      db->owner_conninfo,
			      "--runtime-role",
			      henv("PGCOORD_TEST_RUNTIME_ROLE"),
			      NULL};
	char *out;
	int rc = hrun(argv, &out);

	if (rc != 0) {
		char *msg = xasprintf("harness: `pgcoord-agent migrate` exited %d:\n%s", rc,
				      tail_of(out, FAIL_LOG_TAIL));

		free(out);
		hfail("%s", msg);
	}
	free(out);
}

/* --- agents ------------------------------------------------------------ */

struct hagent {
	pid_t pid;
	bool exited;
	int exit_code;
	char *replica_id;
	char *socket_path;
	char *log_path;
	char *log; /* the last hagent_log() answer */
};

static int start_timeout_ms(void)
{
	const char *v = getenv("PGCOORD_TEST_AGENT_START_MS");
	int ms = v ? atoi(v) : 0;

	return ms > 0 ? ms : AGENT_START_TIMEOUT_MS;
}

static struct hagent *agent_spawn(const char *conninfo, const char *replica_id,
				  const char *const *extra_args)
{
	const char *bin = henv("PGCOORD_TEST_AGENT_BIN");
	struct hagent *a = xmalloc(sizeof(*a));
	struct sockaddr_un sun;
	size_t nextra = 0, argc = 0;
	const char **argv;
	pid_t parent = getpid();
	int log_fd;

	memset(a, 0, sizeof(*a));
	a->replica_id = xstrdup(replica_id);
	a->socket_path = htmp_path("agent.sock");
	a->log_path = htmp_path("agent.log");
	if (strlen(a->socket_path) >= sizeof(sun.sun_path))
		hfail("harness: socket path %s is longer than a Unix socket allows; use a "
		      "shorter TMPDIR",
		      a->socket_path);

	while (extra_args && extra_args[nextra])
		nextra++;
	argv = xmalloc((nextra + 10) * sizeof(*argv));
	argv[argc++] = bin;
	if (conninfo) {
		argv[argc++] = "--database-url";
		argv[argc++] = conninfo;
	}
	argv[argc++] = "--replica-id";
	argv[argc++] = replica_id;
	argv[argc++] = "--socket-path";
	argv[argc++] = a->socket_path;
	for (size_t i = 0; i < nextra; i++)
		argv[argc++] = extra_args[i];
	argv[argc] = NULL;

	log_fd = open(a->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (log_fd < 0)
		hfail("harness: cannot create %s: %s", a->log_path, strerror(errno));
	fflush(NULL);
	a->pid = fork();
	if (a->pid < 0)
		hfail("harness: fork: %s", strerror(errno));
	if (a->pid == 0) {
		/* Dies with the test, even one that crashes or is killed. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		child_setup_fds(log_fd);
		execv(bin, (char *const *)argv);
		fprintf(stderr, "harness: cannot run %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	close(log_fd);
	free(argv);
	return a;
}

static bool agent_reaped(struct hagent *a, int flags)
{
	int status;

	if (a->exited)
		return true;
	if (waitpid_retry(a->pid, &status, flags) == a->pid) {
		a->exited = true;
		a->exit_code = exit_code(status);
	}
	return a->exited;
}

/* True when agent.status on a fresh connection answers registered=true. */
static bool agent_registered(struct hagent *a)
{
	msgpack_unpacked msg;
	struct pgc_message m;
	char err[256];
	bool registered = false;
	int fd = hraw_connect(a->socket_path);

	if (fd < 0)
		return false;
	msgpack_unpacked_init(&msg);
	if (hraw_call(fd, 1, "agent.status", NULL, 0, 2000, &msg) == HRAW_MSG &&
	    pgc_parse_message(&msg.data, &m, err, sizeof(err)) && !m.error && m.result)
		pgc_obj_bool(pgc_map_get(m.result, "registered"), &registered);
	msgpack_unpacked_destroy(&msg);
	close(fd);
	return registered;
}

static struct hagent *agent_start_ready(const char *conninfo, const char *replica_id,
					const char *const *extra_args)
{
	struct hagent *a = agent_spawn(conninfo, replica_id, extra_args);
	int timeout = start_timeout_ms();
	int64_t deadline = hnow_ms() + timeout;

	for (;;) {
		if (agent_reaped(a, WNOHANG)) {
			char *msg = xasprintf("harness: agent %s exited %d while starting; its "
					      "log (%s):\n%s",
					      replica_id, a->exit_code, a->log_path,
					      tail_of(hagent_log(a), FAIL_LOG_TAIL));

			hagent_destroy(a);
			hfail("%s", msg);
		}
		if (agent_registered(a))
			return a;
		if (hnow_ms() > deadline) {
			char *msg = xasprintf("harness: agent %s not registered after %d ms; its "
					      "log (%s):\n%s",
					      replica_id, timeout, a->log_path,
					      tail_of(hagent_log(a), FAIL_LOG_TAIL));

			hagent_destroy(a);
			hfail("%s", msg);
		}
		hsleep_ms(20);
	}
}

struct hagent *hagent_start(struct harness_db *db, const char *replica_id,
			    const char *const *extra_args)
{
	return agent_start_ready(db ? db->agent_conninfo : NULL, replica_id, extra_args);
}

struct hagent *hagent_start_url(const char *conninfo, const char *replica_id,
				const char *const *extra_args)
{
	return agent_start_ready(conninfo, replica_id, extra_args);
}

int hagent_start_expect_exit(struct harness_db *db, const char *replica_id,
			     const char *const *extra_args, char **log)
{
	struct hagent *a = agent_spawn(db ? db->agent_conninfo : NULL, replica_id, extra_args);
	int rc = hagent_wait(a, start_timeout_ms());

	if (rc < 0) {
		char *msg;

		hagent_kill(a, SIGKILL);
		hagent_wait(a, -1);
		msg = xasprintf("harness: agent %s was expected to exit but still ran after %d "
				"ms; its log (%s):\n%s",
				replica_id, start_timeout_ms(), a->log_path,
				tail_of(hagent_log(a), FAIL_LOG_TAIL));
		hagent_destroy(a);
		hfail("%s", msg);
	}
	if (log)
		*log = hread_file(a->log_path);
	hagent_destroy(a);
	return rc;
}

int hagent_wait(struct hagent *a, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;

	if (timeout_ms < 0)
		return agent_reaped(a, 0) ? a->exit_code : -1;
	while (!agent_reaped(a, WNOHANG)) {
		if (hnow_ms() >= deadline)
			return -1;
		hsleep_ms(10);
	}
	return a->exit_code;
}

int hagent_stop(struct hagent *a)
{
	int rc;

	if (a->exited)
		return a->exit_code;
	kill(a->pid, SIGTERM);
	rc = hagent_wait(a, AGENT_STOP_TIMEOUT_MS);
	if (rc < 0) {
		hagent_kill(a, SIGKILL);
		hagent_wait(a, -1);
		hfail("harness: agent %s did not exit within %d ms of SIGTERM; its log (%s):\n%s",
		      a->replica_id, AGENT_STOP_TIMEOUT_MS, a->log_path,
		      tail_of(hagent_log(a), FAIL_LOG_TAIL));
	}
	return rc;
}

void hagent_kill(struct hagent *a, int sig)
{
	if (!a->exited)
		kill(a->pid, sig);
}

bool hagent_running(struct hagent *a)
{
	return !agent_reaped(a, WNOHANG);
}

void hagent_destroy(struct hagent *a)
{
	if (!a)
		return;
	if (!agent_reaped(a, WNOHANG)) {
		kill(a->pid, SIGCONT); /* a stopped agent cannot die of SIGKILL until resumed */
		kill(a->pid, SIGKILL);
		agent_reaped(a, 0);
	}
	free(a->replica_id);
	free(a->socket_path);
	free(a->log_path);
	free(a->log);
	free(a);
}

pid_t hagent_pid(const struct hagent *a)
{
	return a->pid;
}

const char *hagent_socket(const struct hagent *a)
{
	return a->socket_path;
}

const char *hagent_replica_id(const struct hagent *a)
{
	return a->replica_id;
}

const char *hagent_log_path(const struct hagent *a)
{
	return a->log_path;
}

const char *hagent_log(struct hagent *a)
{
	free(a->log);
	a->log = hread_file(a->log_path);
	return a->log;
}

/* --- raw socket -------------------------------------------------------- */

int hraw_connect(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd, saved;

	if (strlen(path) >= sizeof(sun.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sun.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

bool hraw_send(int fd, const void *bytes, size_t n)
{
	const char *p = bytes;

	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* Waits until fd is readable or the deadline (-1: none) passes. */
static bool wait_readable(int fd, int64_t deadline)
{
	for (;;) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int timeout = -1, r;

		if (deadline >= 0) {
			int64_t left = deadline - hnow_ms();

			if (left <= 0)
				return false;
			timeout = (int)left;
		}
		r = poll(&pfd, 1, timeout);
		if (r > 0)
			return true;
		if (r < 0 && errno != EINTR)
			return true; /* let the read report it */
		if (r == 0)
			return false;
	}
}

/* Decodes one complete frame into out; out's zone keeps its own copy. */
static bool unpack_frame(const char *frame, size_t len, msgpack_unpacked *out)
{
	msgpack_unpacker unp;
	bool ok;

	if (!msgpack_unpacker_init(&unp, MSGPACK_UNPACKER_INIT_BUFFER_SIZE))
		return false;
	if (!msgpack_unpacker_reserve_buffer(&unp, len)) {
		msgpack_unpacker_destroy(&unp);
		return false;
	}
	memcpy(msgpack_unpacker_buffer(&unp), frame, len);
	msgpack_unpacker_buffer_consumed(&unp, len);
	ok = msgpack_unpacker_next(&unp, out) == MSGPACK_UNPACK_SUCCESS;
	msgpack_unpacker_destroy(&unp);
	return ok;
}

/*
 * The prefix of an object that a timeout cut short, kept for the next call
 * on the same socket so the stream stays in step. The inode tells a socket
 * from a later one that got the same descriptor number.
 */
struct pending {
	int fd;
	ino_t ino;
	char *buf;
	size_t have, cap;
};

static struct pending pendings[32];

static ino_t fd_inode(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* Takes fd's pending prefix (if any) out of the table. */
static struct pending pending_take(int fd)
{
	struct pending none = {.fd = -1};
	ino_t ino = fd_inode(fd);

	for (size_t i = 0; i < sizeof(pendings) / sizeof(pendings[0]); i++) {
		struct pending *p = &pendings[i];

		if (!p->buf || p->fd != fd)
			continue;
		none = *p;
		memset(p, 0, sizeof(*p));
		if (none.ino != ino) {
			free(none.buf);
			none = (struct pending){.fd = -1};
		}
		break;
	}
	return none;
}

static void pending_keep(int fd, char *buf, size_t have, size_t cap)
{
	for (size_t i = 0; i < sizeof(pendings) / sizeof(pendings[0]); i++) {
		struct pending *p = &pendings[i];

		if (p->buf)
			continue;
		*p = (struct pending){
		    .fd = fd, .ino = fd_inode(fd), .buf = buf, .have = have, .cap = cap};
		return;
	}
	free(buf);
	hfail("harness: more than %zu sockets hold a partly received object",
	      sizeof(pendings) / sizeof(pendings[0]));
}

/*
 * Peeks at what the socket holds, and consumes bytes only once they are known
 * to belong to the current object: the object's prefix when it is still
 * incomplete (kept in a pending buffer across a timeout), exactly its rest
 * when it is complete.
 */
enum hraw_result hraw_recv_msg(int fd, int timeout_ms, msgpack_unpacked *out)
{
	int64_t deadline = timeout_ms < 0 ? -1 : hnow_ms() + timeout_ms;
	struct pending p = pending_take(fd);
	size_t cap = p.buf ? p.cap : 64 * 1024, have = p.buf ? p.have : 0, frame_len = 0;
	char *buf = p.buf ? p.buf : xmalloc(cap);
	enum hraw_result result;

	for (;;) {
		ssize_t n;

		if (cap - have < 16 * 1024) {
			char *bigger = realloc(buf, cap * 2);

			if (!bigger) {
				result = HRAW_ERROR;
				break;
			}
			buf = bigger;
			cap *= 2;
		}
		n = recv(fd, buf + have, cap - have, MSG_PEEK | MSG_DONTWAIT);
		if (n == 0) {
			result = HRAW_EOF;
			break;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				if (wait_readable(fd, deadline))
					continue;
				if (have > 0) {
					pending_keep(fd, buf, have, cap);
					return HRAW_TIMEOUT;
				}
				result = HRAW_TIMEOUT;
				break;
			}
			result = (errno == ECONNRESET || errno == EPIPE) ? HRAW_EOF : HRAW_ERROR;
			break;
		}
		switch (pgc_frame_scan(buf, have + (size_t)n, RAW_MAX_MESSAGE, RAW_MAX_DEPTH,
				       &frame_len)) {
		case PGC_SCAN_COMPLETE:
			/* The bytes are already in buf; this only takes them off the socket. */
			if (recv(fd, buf + have, frame_len - have, MSG_WAITALL) !=
			    (ssize_t)(frame_len - have)) {
				result = HRAW_ERROR;
				goto out;
			}
			result = unpack_frame(buf, frame_len, out) ? HRAW_MSG : HRAW_ERROR;
			goto out;
		case PGC_SCAN_NEED_MORE:
			if (recv(fd, buf + have, (size_t)n, MSG_WAITALL) != n) {
				result = HRAW_ERROR;
				goto out;
			}
			have += (size_t)n;
			continue;
		default:
			result = HRAW_ERROR;
			goto out;
		}
	}
out:
	free(buf);
	return result;
}

bool hraw_expect_closed(int fd, int timeout_ms)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	struct pending p = pending_take(fd);
	char buf[4096];

	free(p.buf);

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n == 0)
			return true;
		if (n < 0) {
			if (errno == ECONNRESET)
				return true;
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				return false;
			if (!wait_readable(fd, deadline))
				return false;
		}
	}
}

bool hraw_send_request(int fd, uint32_t msgid, const char *method, const void *params,
		       size_t params_len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	bool ok;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 4);
	msgpack_pack_uint8(&pk, PGC_RPC_REQUEST);
	msgpack_pack_uint32(&pk, msgid);
	pgc_pack_cstr(&pk, method);
	if (params && params_len > 0) {
		msgpack_pack_array(&pk, 1);
		msgpack_sbuffer_write(&sb, params, params_len);
	} else {
		msgpack_pack_array(&pk, 0);
	}
	ok = hraw_send(fd, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	return ok;
}

enum hraw_result hraw_call(int fd, uint32_t msgid, const char *method, const void *params,
			   size_t params_len, int timeout_ms, msgpack_unpacked *out)
{
	int64_t deadline = timeout_ms < 0 ? -1 : hnow_ms() + timeout_ms;

	if (!hraw_send_request(fd, msgid, method, params, params_len))
		return errno == EPIPE || errno == ECONNRESET ? HRAW_EOF : HRAW_ERROR;
	for (;;) {
		int left = -1;
		enum hraw_result r;
		const msgpack_object *o;

		if (deadline >= 0) {
			left = (int)(deadline - hnow_ms());
			if (left < 0)
				left = 0;
		}
		r = hraw_recv_msg(fd, left, out);
		if (r != HRAW_MSG)
			return r;
		o = &out->data;
		if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4 &&
		    o->via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
		    o->via.array.ptr[0].via.u64 == PGC_RPC_RESPONSE &&
		    o->via.array.ptr[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
		    o->via.array.ptr[1].via.u64 == msgid)
			return HRAW_MSG;
	}
}

/* --- the Postgres server ----------------------------------------------- */

static void cluster_run(const char *verb, const char *mode)
{
	const char *argv[] = {henv("PGCOORD_TEST_CLUSTER"), verb, henv("PGCOORD_TEST_PGDATA"), mode,
			      NULL};
	char *out;
	int rc = hrun(argv, &out);

	if (rc != 0) {
		char *msg = xasprintf("harness: `pg-cluster %s` exited %d:\n%s", verb, rc,
				      tail_of(out, FAIL_LOG_TAIL));

		free(out);
		hfail("%s", msg);
	}
	free(out);
}

void hpg_restart(const char *mode)
{
	cluster_run("restart", mode ? mode : "fast");
}

void hpg_stop(const char *mode)
{
	cluster_run("shutdown", mode ? mode : "immediate");
}

void hpg_start(void)
{
	cluster_run("start", NULL);
}

/* --- PgBouncer --------------------------------------------------------- */

static void bouncer_run(const char *verb)
{
	if (!hbouncer_enabled())
		hfail("harness: no PgBouncer in this run (use with-postgres --pgbouncer)");
	const char *argv[] = {henv("PGCOORD_TEST_PGBOUNCER"), verb,
			      henv("PGCOORD_TEST_PGBOUNCER_HOST"), NULL};
	char *out;
	int rc = hrun(argv, &out);

	if (rc != 0) {
		char *msg = xasprintf("harness: `pg-bouncer %s` exited %d:\n%s", verb, rc,
				      tail_of(out, FAIL_LOG_TAIL));

		free(out);
		hfail("%s", msg);
	}
	free(out);
}

void hbouncer_stop(bool crash)
{
	bouncer_run(crash ? "kill" : "stop");
}

void hbouncer_start(void)
{
	bouncer_run("start");
}

/* --- a standby --------------------------------------------------------- */

static char *standby_dir(void)
{
	return xasprintf("%s/standby", henv("PGCOORD_TEST_TMP"));
}

static void standby_run(const char *verb, const char *arg)
{
	char *dir = standby_dir();
	const char *argv[] = {henv("PGCOORD_TEST_CLUSTER"), verb, dir, arg, NULL};
	char *out;
	int rc = hrun(argv, &out);

	free(dir);
	if (rc != 0) {
		char *msg = xasprintf("harness: `pg-cluster %s` of the standby exited %d:\n%s",
				      verb, rc, tail_of(out, FAIL_LOG_TAIL));

		free(out);
		hfail("%s", msg);
	}
	free(out);
}

/* Runs sql as the superuser in the postgres database of the server whose
 * socket directory is host; fails the test on error. */
static char *server_value(const char *host, const char *sql)
{
	char buf[2048] = "";

	conninfo_add(buf, sizeof(buf), "host", host);
	conninfo_add(buf, sizeof(buf), "port", henv("PGCOORD_TEST_PGPORT"));
	conninfo_add(buf, sizeof(buf), "user", henv("PGCOORD_TEST_PGUSER"));
	conninfo_add(buf, sizeof(buf), "dbname", "postgres");
	PGconn *conn = connect_or_fail(buf);
	PGresult *res = exec_or_fail(conn, sql);
	char *v =
	    PQntuples(res) > 0 && !PQgetisnull(res, 0, 0) ? xstrdup(PQgetvalue(res, 0, 0)) : NULL;

	PQclear(res);
	PQfinish(conn);
	return v;
}

const char *hpg_standby_host(void)
{
	static char *host;

	if (!host)
		host = xasprintf("%s/standby/socket", henv("PGCOORD_TEST_TMP"));
	return host;
}

void hpg_standby_start(bool sync)
{
	standby_run("standby", henv("PGCOORD_TEST_PGDATA"));
	free(server_value(henv("PGCOORD_TEST_PGHOST"),
			  sync ? "ALTER SYSTEM SET synchronous_standby_names = 'standby'"
			       : "ALTER SYSTEM RESET synchronous_standby_names"));
	free(server_value(henv("PGCOORD_TEST_PGHOST"), "SELECT pg_reload_conf()"));
	int64_t deadline = hnow_ms() + 30000;
	for (;;) {
		char *n =
		    server_value(henv("PGCOORD_TEST_PGHOST"),
				 sync ? "SELECT count(*) FROM pg_stat_replication WHERE "
					"application_name = 'standby' AND sync_state = 'sync'"
				      : "SELECT count(*) FROM pg_stat_replication WHERE "
					"application_name = 'standby' AND state = 'streaming'");
		bool attached = n && strcmp(n, "1") == 0;

		free(n);
		if (attached)
			return;
		if (hnow_ms() > deadline)
			hfail("harness: the standby did not attach %s within 30 s",
			      sync ? "as synchronous" : "");
		hsleep_ms(50);
	}
}

void hpg_standby_promote(void)
{
	standby_run("promote", NULL);
}

pid_t hpg_standby_walreceiver_pid(void)
{
	char *v = server_value(hpg_standby_host(), "SELECT pid FROM pg_stat_wal_receiver");
	pid_t pid = v ? (pid_t)atol(v) : 0;

	free(v);
	return pid;
}

char *hpg_standby_conninfo(const struct harness_db *db)
{
	char buf[2048] = "";

	conninfo_add(buf, sizeof(buf), "host", hpg_standby_host());
	conninfo_add(buf, sizeof(buf), "port", henv("PGCOORD_TEST_PGPORT"));
	conninfo_add(buf, sizeof(buf), "user", henv("PGCOORD_TEST_PGUSER"));
	conninfo_add(buf, sizeof(buf), "dbname", hdb_name(db));
	return xstrdup(buf);
}

char *hpg_failover_conninfo(const struct harness_db *db, const char *user)
{
	char hosts[1024], ports[64], buf[2048] = "";

	snprintf(hosts, sizeof(hosts), "%s,%s", henv("PGCOORD_TEST_PGHOST"), hpg_standby_host());
	snprintf(ports, sizeof(ports), "%s,%s", henv("PGCOORD_TEST_PGPORT"),
		 henv("PGCOORD_TEST_PGPORT"));
	conninfo_add(buf, sizeof(buf), "host", hosts);
	conninfo_add(buf, sizeof(buf), "port", ports);
	conninfo_add(buf, sizeof(buf), "user", user);
	conninfo_add(buf, sizeof(buf), "dbname", hdb_name(db));
	conninfo_add(buf, sizeof(buf), "target_session_attrs", "read-write");
	conninfo_add(buf, sizeof(buf), "connect_timeout", "2");
	return xstrdup(buf);
}
