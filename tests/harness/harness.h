/*
 * harness.h — what an integration test needs around the code under test: a
 * fresh database, real pgcoord-agent processes, raw socket access and control
 * over the Postgres server.
 *
 * Integration tests run under tests/harness/with-postgres, which starts a
 * private cluster (and, with --pgbouncer, a PgBouncer in transaction pooling
 * mode in front of it) and passes it in PGCOORD_TEST_* environment variables;
 * tests/integration/meson.build adds PGCOORD_TEST_AGENT_BIN (and
 * PGCOORD_TEST_CTL_BIN). Every function here fails the calling Criterion test
 * (cr_fatal, with the reason and, for agents, the agent's log) when something
 * the test did not ask to go wrong goes wrong, so a test reads as a list of
 * steps. Functions that may legitimately fail return a status instead, as
 * their comment says.
 *
 * Nothing outlives the test: agents get SIGKILL when the test process dies
 * (PR_SET_PDEATHSIG — strictly, when the thread that started them ends, so
 * start agents from the test's main thread), and with-postgres removes the
 * databases, sockets and logs with the cluster. Cleaning up explicitly (hagent_destroy, hdb_drop)
 * still matters when a test starts many of them.
 *
 * Not thread-safe; call from the test's thread.
 */
#ifndef PGCOORD_TESTS_HARNESS_H
#define PGCOORD_TESTS_HARNESS_H

#include <libpq-fe.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HARNESS_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* --- environment ------------------------------------------------------- */

/* $name, or fails the test naming the variable (and with-postgres). */
const char *henv(const char *name);

/* A new path "$PGCOORD_TEST_TMP/<pid>-<n>-<suffix>", unique in this run.
 * Owned by the caller (free()). */
char *htmp_path(const char *suffix);

/*
 * Runs argv (argv[0] is a path or a name looked up in PATH) to completion,
 * stdin from /dev/null. When output is non-NULL, *output receives its stdout
 * and stderr, malloc'd and NUL-terminated (caller frees); otherwise they go
 * to this process's stderr. Returns the exit code, or 128+N when signal N
 * ended it. Fails the test only if the command cannot be started at all.
 */
int hrun(const char *const *argv, char **output);

/* Reads a whole file into a malloc'd NUL-terminated string; "" if missing. */
char *hread_file(const char *path);

/* Monotonic milliseconds, for deadlines in tests. */
int64_t hnow_ms(void);

/* Sleeps ms milliseconds (restarts on EINTR). */
void hsleep_ms(int ms);

/* --- databases --------------------------------------------------------- */

struct harness_db;

/*
 * Creates a database with a name nobody used before in this cluster
 * (t_<pid>_<n>_<random>) and returns a handle that holds its conninfo
 * ("host=<socket dir> port=<port> user=postgres dbname=<name>"). The database
 * is empty: migrations are not applied (hdb_migrate does that).
 *
 * Agents run as the runtime role and migrations as the owner (postgres), so
 * the suite runs with the least privilege production is documented with.
 * Under `with-postgres --pgbouncer` both go through PgBouncer: hagent_start
 * and hdb_migrate use that path, so the whole agent runs behind a
 * transaction-mode pooler, while the query helpers (the test's view of the
 * truth) go to the server directly, as the owner.
 */
struct harness_db *hdb_create(void);

/* Drops the database (WITH (FORCE): agents still connected are cut off) and
 * frees db. Accepts NULL. Never fails the test: teardown may run while the
 * server is stopped, and with-postgres removes the cluster anyway. */
void hdb_drop(struct harness_db *db);

/* The conninfo string (straight to the server) and the database name; owned
 * by db. */
const char *hdb_conninfo(const struct harness_db *db);
const char *hdb_name(const struct harness_db *db);

/* The conninfo agents get: through PgBouncer when hbouncer_enabled(), else
 * straight to the server, as the runtime role ($PGCOORD_TEST_RUNTIME_ROLE,
 * which with-postgres creates: it may only execute the pgcoord functions and
 * read what the agent reads, once hdb_migrate granted it). Owned by db. */
const char *hdb_agent_conninfo(const struct harness_db *db);

/* The same way, as the owner ($PGCOORD_TEST_PGUSER): for migrations. */
const char *hdb_owner_conninfo(const struct harness_db *db);

/* A new connection to db. The caller PQfinish()es it. */
PGconn *hdb_connect(const struct harness_db *db);

/*
 * The query helpers format sql with printf, run it on a connection cached in
 * db (reopened once if the server restarted since), and fail the test on any
 * error.
 */

/* Runs one or more statements, discarding rows. */
void hdb_exec(struct harness_db *db, const char *sql, ...) HARNESS_PRINTF(2, 3);

/* The first column of the first row, malloc'd (caller frees); NULL when the
 * query returns no row or SQL NULL. */
char *hdb_query_value(struct harness_db *db, const char *sql, ...) HARNESS_PRINTF(2, 3);

/* As hdb_query_value, for an integer; fails the test on no row, NULL or a
 * value that is not an integer. */
long hdb_query_long(struct harness_db *db, const char *sql, ...) HARNESS_PRINTF(2, 3);

/* Runs `pgcoord-agent migrate --database-url <owner conninfo> --runtime-role
 * <runtime role>` and fails the test unless it exits 0 (its output is in the
 * failure message). */
void hdb_migrate(struct harness_db *db);

/* --- agents ------------------------------------------------------------ */

struct hagent;

/*
 * Starts $PGCOORD_TEST_AGENT_BIN with
 *   --database-url <hdb_agent_conninfo(db)> --replica-id <replica_id>
 *   --socket-path $PGCOORD_TEST_TMP/<pid>-<n>-agent.sock
 * followed by extra_args (NULL-terminated array, or NULL), stdout and stderr
 * to a log file in $PGCOORD_TEST_TMP. Returns once the socket accepts
 * connections and agent.status answers registered=true. Fails the test,
 * printing the agent's log, if the agent exits first or 10 s pass.
 * When db is NULL no --database-url is passed (give one in extra_args, or in
 * a --config file). hagent_destroy() frees the result.
 */
struct hagent *hagent_start(struct harness_db *db, const char *replica_id,
			    const char *const *extra_args);

/* As hagent_start, connecting to conninfo instead of a harness database (a
 * PgBouncer in front of it, a multi-host string, a bad address, …). */
struct hagent *hagent_start_url(const char *conninfo, const char *replica_id,
				const char *const *extra_args);

/*
 * As hagent_start, but for an agent that must refuse to start: waits up to
 * 10 s for it to exit and returns its exit code (128+N for signal N); when
 * log is non-NULL, *log receives what it wrote to stdout/stderr (caller
 * frees). Fails the test if the agent is still running after 10 s (it is
 * killed first).
 */
int hagent_start_expect_exit(struct harness_db *db, const char *replica_id,
			     const char *const *extra_args, char **log);

/* SIGTERM, then waits up to 15 s for the exit. Returns the exit code (128+N
 * for signal N; 0 is a graceful shutdown). Fails the test, after SIGKILL, if
 * the agent does not exit in time. The handle stays valid (hagent_log). */
int hagent_stop(struct hagent *a);

/* Sends sig (SIGKILL to crash it, SIGSTOP/SIGCONT to freeze it, …). Does not
 * wait; follow with hagent_wait to reap a killed agent. */
void hagent_kill(struct hagent *a, int sig);

/* Waits up to timeout_ms (-1: forever) for the agent to exit. Returns its
 * exit code (128+N for signal N), or -1 if it is still running. */
int hagent_wait(struct hagent *a, int timeout_ms);

/* True while the agent process has not exited. */
bool hagent_running(struct hagent *a);

/* Kills (SIGKILL) and reaps the agent if it still runs, then frees a. Its log
 * file stays until with-postgres removes the temp dir. Accepts NULL. */
void hagent_destroy(struct hagent *a);

pid_t hagent_pid(const struct hagent *a);
const char *hagent_socket(const struct hagent *a);
const char *hagent_replica_id(const struct hagent *a);
const char *hagent_log_path(const struct hagent *a);

/* The agent's output so far. Owned by a, valid until the next hagent_log call
 * on a or hagent_destroy — made to be passed straight to a cr_assert message. */
const char *hagent_log(struct hagent *a);

/* --- raw socket -------------------------------------------------------- */

/* Connects a stream socket to the Unix socket at path. Returns the fd, or -1
 * with errno set (a test may expect refusal). Close it with close(). */
int hraw_connect(const char *path);

/* Writes all n bytes (MSG_NOSIGNAL: a peer that closed gives false with
 * errno EPIPE, not a signal). Returns false on error. */
bool hraw_send(int fd, const void *bytes, size_t n);

enum hraw_result {
	HRAW_MSG,     /* *out holds one object */
	HRAW_TIMEOUT, /* no complete object in time; a partial one is kept for the next call */
	HRAW_EOF,     /* the peer closed (or reset) the connection */
	HRAW_ERROR,   /* a read error, or bytes that are not MessagePack */
};

/*
 * Reads exactly one MessagePack object (frames found with pgc_frame_scan,
 * up to 64 MiB) within timeout_ms, never consuming bytes of the next one, so
 * calls can be mixed with plain reads on fd. out must have been
 * msgpack_unpacked_init()ed; on HRAW_MSG what it held is freed and out->data
 * is the object, which owns its bytes (the caller msgpack_unpacked_destroy()s
 * out as usual).
 */
enum hraw_result hraw_recv_msg(int fd, int timeout_ms, msgpack_unpacked *out);

/* True if the peer closes the connection within timeout_ms; whatever it
 * sends before closing (an error reply, say) is read and discarded. */
bool hraw_expect_closed(int fd, int timeout_ms);

/* Sends the request [0, msgid, method, [params]] where params is a
 * MessagePack-encoded map (NULL/0: []). Returns false on a write error. */
bool hraw_send_request(int fd, uint32_t msgid, const char *method, const void *params,
		       size_t params_len);

/*
 * Sends a request and reads until its response arrives (notifications and
 * other responses in between are dropped). On HRAW_MSG, out holds the whole
 * response [1, msgid, error, result].
 */
enum hraw_result hraw_call(int fd, uint32_t msgid, const char *method, const void *params,
			   size_t params_len, int timeout_ms, msgpack_unpacked *out);

/* --- the Postgres server ----------------------------------------------- */

/* Restarts the test cluster; mode "fast" (clean shutdown) or "immediate"
 * (a crash: no checkpoint, crash recovery at start). Returns when the server
 * accepts connections again. Every existing connection is broken. */
void hpg_restart(const char *mode);

/* Stops the server (mode as for hpg_restart; NULL = "immediate") and keeps
 * its data; hpg_start brings it back. Agents then see the database down. */
void hpg_stop(const char *mode);
void hpg_start(void);

/* --- a streaming standby (failover tests) ------------------------------ */

/*
 * Makes $PGCOORD_TEST_TMP/standby a streaming standby of the test cluster
 * (`pg-cluster standby`: pg_basebackup -R, application_name "standby") and
 * starts it; sync also makes it the primary's synchronous standby
 * (synchronous_standby_names, reloaded), else it is made asynchronous.
 * Returns once it streams (as a synchronous standby when sync).
 * with-postgres stops and removes it with the cluster.
 */
void hpg_standby_start(bool sync);

/* pg_ctl promote; returns once the standby accepts writes. */
void hpg_standby_promote(void);

/* The standby's socket directory (its port is the primary's). */
const char *hpg_standby_host(void);

/* The pid of the standby's WAL receiver, 0 when none runs: SIGSTOP it to
 * stall replication (SIGCONT before the test ends). */
pid_t hpg_standby_walreceiver_pid(void);

/* db on the standby, as the superuser (the test's view of the truth after a
 * failover). Caller frees. */
char *hpg_standby_conninfo(const struct harness_db *db);

/* db on both servers, primary first, with target_session_attrs=read-write,
 * as user: how agents reach a database that fails over. Caller frees. */
char *hpg_failover_conninfo(const struct harness_db *db, const char *user);

/* --- PgBouncer (with-postgres --pgbouncer) ----------------------------- */

/* True when the test runs with a PgBouncer in front of the server. */
bool hbouncer_enabled(void);

/* Stops PgBouncer: crash true is SIGKILL (clients and servers see their
 * connections drop with no goodbye), false a SIGTERM (it closes them
 * itself). Returns once the process is gone. Fails the test when
 * !hbouncer_enabled(). */
void hbouncer_stop(bool crash);

/* Starts it again (same socket, same settings); returns once it answers. */
void hbouncer_start(void);

#endif
