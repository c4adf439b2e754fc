/*
 * conformance.h — the C runner of the clients' conformance suite
 * (tests/conformance/README.md): scenario values, the fleet it runs them on
 * (a database, agents, a relaying proxy) and the failure reporting.
 *
 * The scenario file reaches this runner as MessagePack (json2msgpack.py
 * converts scenarios.json at build time), so values are msgpack_objects and
 * the runner needs no JSON library.
 */
#ifndef PGCOORD_CONFORMANCE_H
#define PGCOORD_CONFORMANCE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CONF_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* --- failure reporting ------------------------------------------------- */

/* Why the current step failed; "" while nothing has. Steps return false
 * after calling conf_fail. */
extern char conf_why[1024];
bool conf_fail(const char *fmt, ...) CONF_PRINTF(1, 2);

/* --- values (value.c) -------------------------------------------------- */

/* m[key], or NULL when m is not a map or has no such key. */
const msgpack_object *conf_get(const msgpack_object *m, const char *key);
/* m[key] as a NUL-terminated string in zone, or NULL when it is not a string. */
char *conf_get_str(msgpack_zone *z, const msgpack_object *m, const char *key);
/* m[key] as an integer, or def when absent or not an integer. */
int64_t conf_get_int(const msgpack_object *m, const char *key, int64_t def);
/* m[key] as a boolean, or def when absent or not a boolean. */
bool conf_get_bool(const msgpack_object *m, const char *key, bool def);
/* The string o as a NUL-terminated copy in zone (NULL if not a string). */
char *conf_str(msgpack_zone *z, const msgpack_object *o);
bool conf_is_str(const msgpack_object *o, const char *s);
bool conf_is_int(const msgpack_object *o);
/* An integer's value (positive or negative encodings alike). */
int64_t conf_int(const msgpack_object *o);
/* o as text, as a scenario's sql rows compare it (strings bare). In zone. */
char *conf_text(msgpack_zone *z, const msgpack_object *o);

/* Values saved by earlier steps: ${name} in strings. */
struct conf_vars {
	size_t n;
	char *names[64];
	msgpack_object values[64];
};
void conf_vars_set(struct conf_vars *v, msgpack_zone *z, const char *name, msgpack_object value);

/* A copy of o (in zone) with ${name} replaced; false (conf_why set) when a
 * name was never saved. */
bool conf_substitute(msgpack_zone *z, const struct conf_vars *v, const msgpack_object *o,
		     msgpack_object *out);

/* want is a subset of got (README "Matching"); where names the place. */
bool conf_match(const msgpack_object *want, const msgpack_object *got, const char *where);

/* Builders for maps the runner makes up itself (in zone). */
msgpack_object conf_make_str(msgpack_zone *z, const char *s);
msgpack_object conf_make_int(int64_t i);
msgpack_object conf_make_bool(bool b);
msgpack_object conf_make_map(msgpack_zone *z, size_t n, const char *const *keys,
			     const msgpack_object *values);

/* o packed as MessagePack (malloc'd; caller frees). */
char *conf_pack(const msgpack_object *o, size_t *len);

/* --- the fleet (fleet.c) ------------------------------------------------ */

/* $name, or exits 2 naming the variable (and with-postgres). */
const char *conf_env(const char *name);
int64_t conf_now_ms(void);
void conf_sleep_ms(int64_t ms);

struct conf_db {
	char name[64];
};
bool conf_db_create(struct conf_db *db);
void conf_db_drop(struct conf_db *db);
/* Runs sql as the owner, straight to the server; *rows (may be NULL)
 * receives the rows' cells as text (row-major; a malloc'd array of
 * malloc'd strings, free with conf_rows_free). */
bool conf_sql(const struct conf_db *db, const char *sql, char ***rows, int *nrows, int *ncols);
void conf_rows_free(char **rows, int nrows, int ncols);

/* A transaction left open (holding its row locks) until released. */
struct conf_held;
struct conf_held *conf_hold(const struct conf_db *db, const char *sql);
void conf_held_release(struct conf_held *h);

struct conf_agent {
	char replica_id[96];
	char socket_path[256];
	char log_path[256];
	pid_t pid;
};
/* Starts an agent with the scenarios' timings and waits for it to register. */
bool conf_agent_start(struct conf_agent *a, const struct conf_db *db, const char *dir,
		      const char *replica_id);
void conf_agent_stop(struct conf_agent *a);
void conf_agent_print_log(const struct conf_agent *a);

/* --- the relay (proxy.c) ------------------------------------------------ */

struct conf_proxy;
struct conf_proxy *conf_proxy_start(const char *agent_path, const char *path);
/* Swallows the reply to the next request of method and cuts that connection. */
void conf_proxy_drop_reply(struct conf_proxy *p, const char *method);
/* Closes every connection it carries, both sides. */
void conf_proxy_cut(struct conf_proxy *p);
void conf_proxy_stop(struct conf_proxy *p);
const char *conf_proxy_path(const struct conf_proxy *p);

#endif
