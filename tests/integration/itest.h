/*
 * itest.h — small helpers shared by the integration tests of issue 2
 * (identity, sessions, heartbeat, bad input, socket, config, pgcoordctl,
 * database outages): typed raw-socket calls, reading result maps, polling
 * the database with a deadline, and running programs side by side.
 *
 * Like the harness, every helper fails the calling Criterion test with the
 * reason when something the test did not ask for goes wrong, and is meant
 * to be called from the test's own thread.
 */
#ifndef PGCOORD_TESTS_ITEST_H
#define PGCOORD_TESTS_ITEST_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

#define ICALL_MS 5000

/* --- calls on a raw connection ----------------------------------------- */

/* Request params: iparams_begin starts a map of nkeys entries and returns
 * the packer to add them with; iparams_destroy frees the bytes. */
struct iparams {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};
msgpack_packer *iparams_begin(struct iparams *p, uint32_t nkeys);
void iparams_destroy(struct iparams *p);

/* A decoded response: m borrows from u. */
struct ireply {
	msgpack_unpacked u;
	struct pgc_message m;
};

/* hraw_connect, or fails the test naming the path. */
int iconnect(const char *path);

/* A connection to path made by uid, so that its SO_PEERCRED names that uid
 * (a forked child setuid()s, connects and hands the socket back); uid 0
 * connects directly. Skips the test unless it runs as root. */
int iconnect_as(const char *path, uid_t uid);

/* A fresh msgid, unique in the test process. */
uint32_t inext_msgid(void);

/*
 * Calls method (params: a packed map, or NULL) and waits for its response,
 * failing the test on a timeout, a closed connection or a malformed
 * response. The caller ireply_destroy()s out.
 */
void icall(int fd, const char *method, const struct iparams *params, struct ireply *out);
void ireply_destroy(struct ireply *r);

/* Fails the test unless r succeeded; returns its result map (borrowed). */
const msgpack_object *iok(const struct ireply *r, const char *what);

/* Fails the test unless r is the error `code` with that retryable flag and a
 * message containing each of the NULL-terminated `mentions`. */
void ierr(const struct ireply *r, const char *code, bool retryable, const char *const *mentions);

/* Convenience: one call that must succeed; *out_map borrows from out. */
const msgpack_object *icall_ok(int fd, const char *method, const struct iparams *params,
			       struct ireply *out);

/* Reads from a result map, failing the test when the key is absent or of
 * another type. istr returns a malloc'd copy. */
int64_t iint(const msgpack_object *map, const char *key);
bool ibool(const msgpack_object *map, const char *key);
char *istr(const msgpack_object *map, const char *key);
bool iis_nil(const msgpack_object *map, const char *key);

/* session.open {name} on fd; returns the new session id. */
int64_t isession_open(int fd, const char *name);

/* agent.status on a fresh connection to a: an integer / boolean / string
 * field. */
int64_t istatus_int(struct hagent *a, const char *key);
bool istatus_bool(struct hagent *a, const char *key);
char *istatus_str(struct hagent *a, const char *key);

/* Waits (up to 10 s) until a reports janitor=true: its own janitor session
 * and lease rows exist, so the rows it writes by itself have settled. */
void iwait_janitor(struct hagent *a);

/* --- the database ------------------------------------------------------ */

/* A new database with every migration applied. */
struct harness_db *idb_migrated(void);

/* Polls the integer query sql until it is non-zero; false after timeout_ms. */
bool iwait_sql(struct harness_db *db, int timeout_ms, const char *sql, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * A text picture of everything in pgcoord.* that a client request could
 * change, leaving out what heartbeats and lease renewals move (expiry and
 * renewal times): equal pictures mean no request changed any data.
 * Caller frees.
 */
char *idb_fingerprint(struct harness_db *db);

/* --- processes --------------------------------------------------------- */

/* Starts argv (stdout+stderr to out_path, stdin /dev/null) and returns its
 * pid; it gets SIGKILL when the test process dies. */
pid_t ispawn(const char *const *argv, const char *out_path);

/* Waits for pid; returns its exit code (128+N for signal N). */
int iwait_pid(pid_t pid);

/* $PGCOORD_TEST_AGENT_BIN and $PGCOORD_TEST_CTL_BIN. */
const char *iagent_bin(void);
const char *ictl_bin(void);

/* The latest schema version this build knows, from `pgcoord-agent --version`. */
int ischema_latest(void);

/* The host name, as the agent reports it. */
const char *ihostname(void);

/* Resident memory of pid in KiB (VmRSS), or -1. */
long irss_kib(pid_t pid);

/* --- notifications, quotas and the HTTP listener ----------------------- */

/* Reads fd until the notification `method` arrives (other messages are
 * dropped); fails after timeout_ms. out->m.params is its map. */
void ihear(int fd, const char *method, int timeout_ms, struct ireply *out);

/* Whether map[key] is the string want. */
bool istr_is(const msgpack_object *map, const char *key, const char *want);

/* quota.set {key, limit}; fails the test unless it is ok. */
void iquota_set(int fd, const char *key, int64_t limit);

/* GET path from the HTTP listener of an agent started with
 * --metrics-listen 127.0.0.1:0 (its port read from its log); the whole
 * response, malloc'd. */
char *ihttp_get(struct hagent *a, const char *path);

/* --- permits through libpgcoord ---------------------------------------- */

/* pgcoord_permit_claim of id, weight 1 on the one quota key, answered at
 * once, setting no limit: the plain claim most tests make. */
pgcoord_err iclaim_one(pgcoord *c, const char *id, const char *key, int timeout_ms,
		       pgcoord_claim **out);

/* permit.claim {id, quotas: [{key, weight}], wait_ms?} on a raw
 * connection (wait_ms 0: not sent); the reply in r, whatever it is. */
void iclaim_call(int fd, const char *id, const char *key, int64_t weight, int64_t wait_ms,
		 struct ireply *r);

/* Runs `pgcoordctl --socket SOCKET ARGS...` (hrun: stdout and stderr in
 * *out); returns its exit code. */
int ictl_run(const char *socket, const char *const *args, char **out);

#endif
