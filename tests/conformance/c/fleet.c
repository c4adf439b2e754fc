/*
 * fleet.c — what the C runner stands on (as fleet.py for Python): a fresh
 * database migrated by the owner, agents run as the runtime role, SQL as
 * the owner for asserting on database state and for holding row locks.
 */
#include "conformance.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pgcoord/pgcoord.h>

const char *conf_env(const char *name)
{
	const char *v = getenv(name);

	if (v == NULL || *v == '\0') {
		fprintf(stderr,
			"%s is not set: run under tests/harness/with-postgres with "
			"PGCOORD_TEST_AGENT_BIN pointing at pgcoord-agent\n",
			name);
		exit(2);
	}
	return v;
}

int64_t conf_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void conf_sleep_ms(int64_t ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* The owner's connection straight to the server (never through PgBouncer:
 * a held transaction must stay on its server connection). */
static PGconn *owner_connect(const char *dbname)
{
	const char *keys[] = {"host", "port", "user", "dbname", NULL};
	const char *vals[] = {conf_env("PGCOORD_TEST_PGHOST"), conf_env("PGCOORD_TEST_PGPORT"),
			      conf_env("PGCOORD_TEST_PGUSER"), dbname, NULL};
	PGconn *pg = PQconnectdbParams(keys, vals, 0);

	if (PQstatus(pg) != CONNECTION_OK) {
		conf_fail("connecting to %s: %s", dbname, PQerrorMessage(pg));
		PQfinish(pg);
		return NULL;
	}
	return pg;
}

static bool exec_on(const char *dbname, const char *sql)
{
	PGconn *pg = owner_connect(dbname);
	PGresult *res;
	bool ok;

	if (pg == NULL)
		return false;
	res = PQexec(pg, sql);
	ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok)
		conf_fail("%s: %s", sql, PQerrorMessage(pg));
	PQclear(res);
	PQfinish(pg);
	return ok;
}

/* Agents go through PgBouncer when the harness runs one. */
static void agent_conninfo(char *buf, size_t size, const char *dbname, const char *user)
{
	const char *host = getenv("PGCOORD_TEST_PGBOUNCER_HOST");
	const char *port = getenv("PGCOORD_TEST_PGBOUNCER_PORT");

	if (host == NULL || *host == '\0') {
		host = conf_env("PGCOORD_TEST_PGHOST");
		port = conf_env("PGCOORD_TEST_PGPORT");
	}
	snprintf(buf, size, "host='%s' port='%s' user='%s' dbname='%s'", host, port, user, dbname);
}

/* Runs argv with stdout and stderr to log_fd (-1: this process's stderr);
 * its pid, dying with this process. */
static pid_t spawn(char *const *argv, int log_fd)
{
	pid_t parent = getpid();
	pid_t pid = fork();

	if (pid != 0)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
	if (log_fd >= 0) {
		dup2(log_fd, STDOUT_FILENO);
		dup2(log_fd, STDERR_FILENO);
	}
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0)
		dup2(devnull, STDIN_FILENO);
	execv(argv[0], argv);
	_exit(127);
}

bool conf_db_create(struct conf_db *db)
{
	char sql[128], owner[512];
	int status;
	pid_t pid;

	snprintf(db->name, sizeof(db->name), "cconf_%d_%lld", (int)getpid(),
		 (long long)(conf_now_ms() % 1000000000));
	snprintf(sql, sizeof(sql), "CREATE DATABASE \"%s\"", db->name);
	if (!exec_on("postgres", sql))
		return false;
	snprintf(owner, sizeof(owner), "host='%s' port='%s' user='%s' dbname='%s'",
		 conf_env("PGCOORD_TEST_PGHOST"), conf_env("PGCOORD_TEST_PGPORT"),
		 conf_env("PGCOORD_TEST_PGUSER"), db->name);
	char *argv[] = {(char *)conf_env("PGCOORD_TEST_AGENT_BIN"),
			"migrate",
			"--database-url",
			owner,
			"--runtime-role",
			(char *)conf_env("PGCOORD_TEST_RUNTIME_ROLE"),
			NULL};
	pid = spawn(argv, -1);
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0) {
		conf_db_drop(db);
		return conf_fail("pgcoord-agent migrate failed (status %d)", status);
	}
	return true;
}

void conf_db_drop(struct conf_db *db)
{
	char sql[128];

	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", db->name);
	exec_on("postgres", sql);
}

bool conf_sql(const struct conf_db *db, const char *sql, char ***rows, int *nrows, int *ncols)
{
	PGconn *pg = owner_connect(db->name);
	PGresult *res;
	bool ok;

	if (pg == NULL)
		return false;
	res = PQexec(pg, sql);
	ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok) {
		conf_fail("sql %s: %s", sql, PQerrorMessage(pg));
	} else if (rows != NULL) {
		int n = PQntuples(res), m = PQnfields(res);

		*nrows = n;
		*ncols = m;
		*rows = calloc((size_t)(n * m) + 1, sizeof(char *));
		if (*rows == NULL)
			abort();
		/* psql -At's text: NULL prints as "" */
		for (int i = 0; i < n; i++)
			for (int j = 0; j < m; j++)
				(*rows)[i * m + j] = strdup(PQgetvalue(res, i, j));
	}
	PQclear(res);
	PQfinish(pg);
	return ok;
}

void conf_rows_free(char **rows, int nrows, int ncols)
{
	if (rows == NULL)
		return;
	for (int i = 0; i < nrows * ncols; i++)
		free(rows[i]);
	free(rows);
}

struct conf_held {
	PGconn *pg;
};

struct conf_held *conf_hold(const struct conf_db *db, const char *sql)
{
	struct conf_held *h = calloc(1, sizeof(*h));
	PGresult *res;

	if (h == NULL)
		abort();
	h->pg = owner_connect(db->name);
	if (h->pg == NULL) {
		free(h);
		return NULL;
	}
	res = PQexec(h->pg, "BEGIN");
	PQclear(res);
	res = PQexec(h->pg, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
		conf_fail("could not hold %s: %s", sql, PQerrorMessage(h->pg));
		PQclear(res);
		PQfinish(h->pg);
		free(h);
		return NULL;
	}
	PQclear(res);
	return h;
}

void conf_held_release(struct conf_held *h)
{
	if (h == NULL)
		return;
	PQclear(PQexec(h->pg, "ROLLBACK"));
	PQfinish(h->pg);
	free(h);
}

/* Ready when agent.status on a fresh connection answers registered: true. */
static bool agent_registered(const struct conf_agent *a)
{
	pgcoord *c = NULL;
	void *res = NULL;
	size_t len = 0;
	bool ok = false;

	if (pgcoord_connect(a->socket_path, 1000, &c) != PGCOORD_OK)
		return false;
	if (pgcoord_call(c, "agent.status", NULL, 0, 2000, &res, &len) == PGCOORD_OK) {
		msgpack_unpacked u;

		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, res, len, NULL) == MSGPACK_UNPACK_SUCCESS)
			ok = conf_get_bool(&u.data, "registered", false);
		msgpack_unpacked_destroy(&u);
	}
	pgcoord_free(res);
	pgcoord_close(c);
	return ok;
}

bool conf_agent_start(struct conf_agent *a, const struct conf_db *db, const char *dir,
		      const char *replica_id)
{
	char conninfo[512];
	int log_fd, status;

	snprintf(a->replica_id, sizeof(a->replica_id), "%s", replica_id);
	snprintf(a->socket_path, sizeof(a->socket_path), "%s/%s.sock", dir, replica_id);
	snprintf(a->log_path, sizeof(a->log_path), "%s/%s.log", dir, replica_id);
	agent_conninfo(conninfo, sizeof(conninfo), db->name, conf_env("PGCOORD_TEST_RUNTIME_ROLE"));
	log_fd = open(a->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (log_fd < 0)
		return conf_fail("%s: %s", a->log_path, strerror(errno));
	char *argv[] = {(char *)conf_env("PGCOORD_TEST_AGENT_BIN"),
			"--database-url",
			conninfo,
			"--replica-id",
			a->replica_id,
			"--socket-path",
			a->socket_path,
			"--heartbeat-interval-ms",
			"200",
			"--session-ttl-ms",
			"1500",
			"--lease-retry-ms",
			"100",
			"--janitor-interval-ms",
			"200",
			NULL};
	a->pid = spawn(argv, log_fd);
	close(log_fd);
	if (a->pid < 0)
		return conf_fail("fork: %s", strerror(errno));
	for (int64_t end = conf_now_ms() + 20000; conf_now_ms() < end; conf_sleep_ms(50)) {
		if (waitpid(a->pid, &status, WNOHANG) == a->pid) {
			a->pid = 0;
			conf_agent_print_log(a);
			return conf_fail("agent %s exited (status %d)", a->replica_id, status);
		}
		if (agent_registered(a))
			return true;
	}
	conf_agent_stop(a);
	conf_agent_print_log(a);
	return conf_fail("agent %s not registered in 20 s", a->replica_id);
}

void conf_agent_stop(struct conf_agent *a)
{
	int status;

	if (a->pid <= 0)
		return;
	kill(a->pid, SIGCONT);
	kill(a->pid, SIGTERM);
	for (int64_t end = conf_now_ms() + 10000; conf_now_ms() < end; conf_sleep_ms(20))
		if (waitpid(a->pid, &status, WNOHANG) == a->pid) {
			a->pid = 0;
			return;
		}
	kill(a->pid, SIGKILL);
	waitpid(a->pid, &status, 0);
	a->pid = 0;
}

void conf_agent_print_log(const struct conf_agent *a)
{
	FILE *f = fopen(a->log_path, "r");
	char *lines[30] = {0};
	char buf[2048];
	size_t n = 0;

	printf("--- log of agent %s ---\n", a->replica_id);
	if (f == NULL)
		return;
	while (fgets(buf, sizeof(buf), f) != NULL) {
		free(lines[n % 30]);
		lines[n % 30] = strdup(buf);
		n++;
	}
	fclose(f);
	for (size_t i = n > 30 ? n - 30 : 0; i < n; i++) {
		fputs(lines[i % 30], stdout);
		free(lines[i % 30]);
		lines[i % 30] = NULL;
	}
}
