/*
 * lease_client.h — a libpgcoord client for the lease tests: lease.* calls
 * made with pgcoord_call (params packed here with msgpack-c), and every
 * notification the agent pushes kept as a `struct lnote`, stamped with this
 * process's monotonic clock (and the wall clock, to compare with database
 * times) at the moment pgcoord_poll delivers it.
 *
 * The lc_* functions that return pgcoord_err never fail the test, so worker
 * threads may use them (one lclient per thread). The lc_*_ok variants and
 * lc_wait fail the test and are for the test's own thread.
 */
#ifndef PGCOORD_TESTS_LEASE_CLIENT_H
#define PGCOORD_TESTS_LEASE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "pgcoord/pgcoord.h"

#define LC_CALL_MS 10000

/* One notification as received. Fields the method does not carry are 0. */
struct lnote {
	char method[32];
	int64_t at_ms;	 /* hnow_ms() when delivered */
	int64_t wall_ms; /* CLOCK_REALTIME ms when delivered */
	char name[96];
	int64_t epoch;
	bool leader;
	int64_t valid_ms;
	int64_t session; /* lease.changed: the receiving session; session.*: its id */
	bool has_holder;
	int64_t holder_session;
	char holder_replica[64];
	int64_t safe_ms; /* session.suspended / session.restored */
	char reason[200];
};

struct lclient;
typedef void (*lc_note_fn)(struct lclient *lc, const struct lnote *n);

struct lclient {
	pgcoord *c;
	int64_t session; /* 0 while none */
	char label[48];
	struct lnote *notes; /* every notification, in order of delivery */
	size_t nnotes, cap;
	size_t cursor;	 /* lc_wait looks at notes from here on */
	lc_note_fn hook; /* called for each note as it is delivered; may be NULL */
	void *user;
};

/* A lease.acquire / lease.status result. */
struct lreply {
	int64_t epoch;
	bool leader;
	int64_t valid_ms;
	bool campaigning; /* acquire only */
	int64_t ttl_ms;
	bool has_holder;
	int64_t holder_session;
	char holder_replica[64];
	int64_t expires_in_ms;
};

/* Connects to the agent's socket and, when session_name is non-NULL, opens a
 * session. On failure lc holds no connection. */
pgcoord_err lc_open(struct lclient *lc, const char *socket_path, const char *session_name);

/* Closes the connection (the session stays resumable) and frees the notes.
 * lc can be opened again. Accepts a closed lc. */
void lc_close(struct lclient *lc);

/* session.open (new) or session.open {resume} on an open connection. */
pgcoord_err lc_session_open(struct lclient *lc, const char *name);
pgcoord_err lc_session_resume(struct lclient *lc, int64_t session);
pgcoord_err lc_session_close(struct lclient *lc);

/* lease.acquire {name, ttl_ms (0: the agent's default), wait}. out may be NULL. */
pgcoord_err lc_acquire(struct lclient *lc, const char *name, int ttl_ms, bool wait,
		       struct lreply *out);
pgcoord_err lc_release(struct lclient *lc, const char *name, bool *released);
pgcoord_err lc_status(struct lclient *lc, const char *name, bool watch, struct lreply *out);

/* pgcoord_poll: delivers what arrived within timeout_ms into lc->notes. */
pgcoord_err lc_poll(struct lclient *lc, int timeout_ms);

/* --- for the test's own thread (fail the test on error) --------------- */

void lc_open_ok(struct lclient *lc, struct hagent *a, const char *session_name);
void lc_acquire_ok(struct lclient *lc, const char *name, int ttl_ms, bool wait, struct lreply *out);
bool lc_release_ok(struct lclient *lc, const char *name);
void lc_status_ok(struct lclient *lc, const char *name, bool watch, struct lreply *out);

/*
 * Polls until a note with this method (and leader == leader unless leader <
 * 0) is found at or after lc->cursor; copies it to *out (may be NULL) and
 * moves the cursor past it. False after timeout_ms, or when the agent
 * closed the connection without sending one.
 */
bool lc_wait(struct lclient *lc, const char *method, int leader, int timeout_ms, struct lnote *out);

/* As lc_wait, failing the test (with what) on timeout. */
struct lnote lc_expect(struct lclient *lc, const char *method, int leader, int timeout_ms,
		       const char *what);

/* agent.status of a (on a connection of its own): an integer or boolean
 * field; fails the test when the agent does not answer. */
int64_t lc_agent_status_int(struct hagent *a, const char *key);
bool lc_agent_status_bool(struct hagent *a, const char *key);
/* As lc_agent_status_bool, but false (not a failure) when a does not answer
 * within timeout_ms, for an agent that may be dead or frozen. */
bool lc_agent_status_try(struct hagent *a, const char *key, int timeout_ms, bool *value);

/* CLOCK_REALTIME in ms, the clock the database's now() reads on this host. */
int64_t lc_wall_ms(void);

#endif
