/*
 * itest.c — helpers shared by the issue-2 integration tests; see itest.h.
 */
#include "itest.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- calls on a raw connection ----------------------------------------- */

int iconnect(const char *path)
{
	int fd = hraw_connect(path);

	cr_assert_geq(fd, 0, "cannot connect to %s: %s", path, strerror(errno));
	return fd;
}

static void send_fd(int sock, int fd)
{
	char byte = 0;
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = {.msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	(void)!sendmsg(sock, &msg, 0);
}

static int recv_fd(int sock)
{
	char byte;
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = {.msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *c;
	int fd = -1;

	if (recvmsg(sock, &msg, 0) != 1)
		return -1;
	c = CMSG_FIRSTHDR(&msg);
	if (c && c->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

int iconnect_as(const char *path, uid_t uid)
{
	int sv[2], fd, status;
	pid_t pid;

	if (uid == 0)
		return iconnect(path);
	/* (the harness cleans up what the test started) */
	if (geteuid() != 0)
		cr_skip_test("connecting as uid %u needs root", (unsigned)uid);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0)
			_exit(2);
		fd = hraw_connect(path);
		if (fd < 0)
			_exit(3);
		send_fd(sv[1], fd);
		_exit(0);
	}
	close(sv[1]);
	fd = recv_fd(sv[0]);
	close(sv[0]);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "uid %u could not connect to %s (child status %d)", (unsigned)uid, path, status);
	cr_assert_geq(fd, 0);
	return fd;
}

uint32_t inext_msgid(void)
{
	static uint32_t next = 1000;

	return ++next;
}

static const char *result_name(enum hraw_result r)
{
	switch (r) {
	case HRAW_MSG:
		return "a message";
	case HRAW_TIMEOUT:
		return "a timeout";
	case HRAW_EOF:
		return "a closed connection";
	case HRAW_ERROR:
		return "a read error or bytes that are not MessagePack";
	}
	return "?";
}

void icall(int fd, const char *method, const struct iparams *params, struct ireply *out)
{
	char err[256];
	enum hraw_result r;

	msgpack_unpacked_init(&out->u);
	r = hraw_call(fd, inext_msgid(), method, params ? params->sb.data : NULL,
		      params ? params->sb.size : 0, ICALL_MS, &out->u);
	cr_assert_eq(r, HRAW_MSG, "%s: expected a response, got %s", method, result_name(r));
	memset(&out->m, 0, sizeof(out->m));
	cr_assert(pgc_parse_message(&out->u.data, &out->m, err, sizeof(err)),
		  "%s: malformed response: %s", method, err);
	cr_assert_eq(out->m.type, PGC_RPC_RESPONSE);
}

void ireply_destroy(struct ireply *r)
{
	msgpack_unpacked_destroy(&r->u);
}

static void error_text(const struct ireply *r, char *buf, size_t len)
{
	const char *code = "?", *msg = "?";
	size_t code_len = 1, msg_len = 1;

	pgc_obj_str(pgc_map_get(r->m.error, "code"), &code, &code_len);
	pgc_obj_str(pgc_map_get(r->m.error, "message"), &msg, &msg_len);
	snprintf(buf, len, "%.*s: %.*s", (int)code_len, code, (int)msg_len, msg);
}

const msgpack_object *iok(const struct ireply *r, const char *what)
{
	char text[600];

	if (r->m.error) {
		error_text(r, text, sizeof(text));
		cr_assert_fail("%s failed: %s", what, text);
	}
	cr_assert_not_null(r->m.result, "%s: no result", what);
	cr_assert_eq(r->m.result->type, MSGPACK_OBJECT_MAP, "%s: the result is not a map", what);
	return r->m.result;
}

void ierr(const struct ireply *r, const char *code, bool retryable, const char *const *mentions)
{
	const msgpack_object *msg;
	const char *text = NULL;
	size_t len = 0;
	bool retry = !retryable;
	char got[600];
	char *copy;

	cr_assert_not_null(r->m.error, "expected the error %s, got a result", code);
	cr_assert(r->m.result == NULL || r->m.result->type == MSGPACK_OBJECT_NIL,
		  "an error response must carry a nil result");
	error_text(r, got, sizeof(got));
	cr_assert(pgc_obj_str_eq(pgc_map_get(r->m.error, "code"), code), "expected %s, got %s",
		  code, got);
	msg = pgc_map_get(r->m.error, "message");
	cr_assert(pgc_obj_str(msg, &text, &len), "error %s without a message", code);
	cr_assert(pgc_obj_bool(pgc_map_get(r->m.error, "retryable"), &retry),
		  "error %s without a retryable flag", code);
	cr_assert_eq(retry, retryable, "error %s: retryable is %d", code, retry);
	copy = strndup(text, len);
	for (size_t i = 0; mentions && mentions[i]; i++)
		cr_assert(strstr(copy, mentions[i]), "error %s: message \"%s\" does not mention %s",
			  code, copy, mentions[i]);
	free(copy);
}

const msgpack_object *icall_ok(int fd, const char *method, const struct iparams *params,
			       struct ireply *out)
{
	icall(fd, method, params, out);
	return iok(out, method);
}

static const msgpack_object *field(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = pgc_map_get(map, key);

	cr_assert_not_null(o, "the result has no \"%s\"", key);
	return o;
}

int64_t iint(const msgpack_object *map, const char *key)
{
	int64_t v = 0;

	cr_assert(pgc_obj_int64(field(map, key), &v), "\"%s\" is not an integer", key);
	return v;
}

bool ibool(const msgpack_object *map, const char *key)
{
	bool v = false;

	cr_assert(pgc_obj_bool(field(map, key), &v), "\"%s\" is not a boolean", key);
	return v;
}

char *istr(const msgpack_object *map, const char *key)
{
	char *v = pgc_obj_strdup(field(map, key));

	cr_assert_not_null(v, "\"%s\" is not a string", key);
	return v;
}

bool iis_nil(const msgpack_object *map, const char *key)
{
	return field(map, key)->type == MSGPACK_OBJECT_NIL;
}

msgpack_packer *iparams_begin(struct iparams *p, uint32_t nkeys)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&p->pk, nkeys);
	return &p->pk;
}

void iparams_destroy(struct iparams *p)
{
	msgpack_sbuffer_destroy(&p->sb);
}

int64_t isession_open(int fd, const char *name)
{
	struct iparams p;
	struct ireply r;
	int64_t id;

	pgc_pack_kv_str(iparams_begin(&p, 1), "name", name);
	id = iint(icall_ok(fd, "session.open", &p, &r), "session");
	ireply_destroy(&r);
	iparams_destroy(&p);
	cr_assert_gt(id, 0);
	return id;
}

int64_t istatus_int(struct hagent *a, const char *key)
{
	int fd = iconnect(hagent_socket(a));
	struct ireply r;
	int64_t v = iint(icall_ok(fd, "agent.status", NULL, &r), key);

	ireply_destroy(&r);
	close(fd);
	return v;
}

bool istatus_bool(struct hagent *a, const char *key)
{
	int fd = iconnect(hagent_socket(a));
	struct ireply r;
	bool v = ibool(icall_ok(fd, "agent.status", NULL, &r), key);

	ireply_destroy(&r);
	close(fd);
	return v;
}

char *istatus_str(struct hagent *a, const char *key)
{
	int fd = iconnect(hagent_socket(a));
	struct ireply r;
	char *v = istr(icall_ok(fd, "agent.status", NULL, &r), key);

	ireply_destroy(&r);
	close(fd);
	return v;
}

void iwait_janitor(struct hagent *a)
{
	int64_t deadline = hnow_ms() + 10000;

	while (!istatus_bool(a, "janitor")) {
		cr_assert_lt(hnow_ms(), deadline, "%s never became the janitor:\n%s",
			     hagent_replica_id(a), hagent_log(a));
		hsleep_ms(20);
	}
}

/* --- the database ------------------------------------------------------ */

struct harness_db *idb_migrated(void)
{
	struct harness_db *db = hdb_create();

	hdb_migrate(db);
	return db;
}

bool iwait_sql(struct harness_db *db, int timeout_ms, const char *sql, ...)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	va_list ap;
	char *q;
	bool ok = false;

	va_start(ap, sql);
	cr_assert_geq(vasprintf(&q, sql, ap), 0);
	va_end(ap);
	for (;;) {
		if (hdb_query_long(db, "%s", q) != 0) {
			ok = true;
			break;
		}
		if (hnow_ms() > deadline)
			break;
		hsleep_ms(25);
	}
	free(q);
	return ok;
}

char *idb_fingerprint(struct harness_db *db)
{
	return hdb_query_value(
	    db,
	    "SELECT concat_ws(E'\\n', "
	    " 'sessions: ' || (SELECT string_agg(concat_ws(',', id, name, replica_id, "
	    "   incarnation, opened_at, closed_at, close_reason), '; ' ORDER BY id) "
	    "   FROM pgcoord.sessions), "
	    " 'agents: ' || (SELECT string_agg(concat_ws(',', replica_id, incarnation, host, pid, "
	    "   version, started_at, stopped_at), '; ' ORDER BY replica_id) FROM pgcoord.agents), "
	    " 'leases: ' || (SELECT string_agg(concat_ws(',', name, holder_session, "
	    "   holder_replica, holder_incarnation, epoch, ttl_ms, acquired_at), '; ' "
	    "   ORDER BY name) FROM pgcoord.leases), "
	    " 'lease_events: ' || (SELECT count(*) || '/' || coalesce(max(id), 0) "
	    "   FROM pgcoord.lease_events), "
	    " 'quotas: ' || (SELECT string_agg(concat_ws(',', key, \"limit\", in_flight, "
	    "   updated_at), '; ' ORDER BY key) FROM pgcoord.quotas), "
	    " 'permits: ' || (SELECT count(*) FROM pgcoord.permits), "
	    " 'permit_quotas: ' || (SELECT count(*) FROM pgcoord.permit_quotas), "
	    " 'permit_events: ' || (SELECT count(*) FROM pgcoord.permit_events), "
	    " 'migrations: ' || (SELECT string_agg(version || ':' || applied_at, ',' "
	    "   ORDER BY version) FROM pgcoord.schema_migrations))");
}

/* --- processes --------------------------------------------------------- */

pid_t ispawn(const char *const *argv, const char *out_path)
{
	pid_t parent = getpid();
	int out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	pid_t pid;

	cr_assert_geq(out_fd, 0, "cannot create %s: %s", out_path, strerror(errno));
	fflush(NULL);
	pid = fork();
	cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int null_fd = open("/dev/null", O_RDONLY);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		if (null_fd >= 0) {
			dup2(null_fd, STDIN_FILENO);
			close(null_fd);
		}
		dup2(out_fd, STDOUT_FILENO);
		dup2(out_fd, STDERR_FILENO);
		close_range(STDERR_FILENO + 1, ~0u, 0);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(out_fd);
	return pid;
}

int iwait_pid(pid_t pid)
{
	int status;
	pid_t r;

	do
		r = waitpid(pid, &status, 0);
	while (r < 0 && errno == EINTR);
	cr_assert_eq(r, pid, "waitpid %d: %s", (int)pid, strerror(errno));
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

const char *iagent_bin(void)
{
	return henv("PGCOORD_TEST_AGENT_BIN");
}

const char *ictl_bin(void)
{
	return henv("PGCOORD_TEST_CTL_BIN");
}

int ischema_latest(void)
{
	const char *argv[] = {iagent_bin(), "--version", NULL};
	char *out = NULL;
	const char *p;
	int v = 0;

	cr_assert_eq(hrun(argv, &out), 0);
	p = strstr(out, "(schema ");
	cr_assert_not_null(p, "no schema version in `--version`: %s", out);
	v = atoi(p + strlen("(schema "));
	free(out);
	cr_assert_gt(v, 0);
	return v;
}

const char *ihostname(void)
{
	static char host[256];

	if (!host[0])
		cr_assert_eq(gethostname(host, sizeof(host) - 1), 0);
	return host;
}

long irss_kib(pid_t pid)
{
	char path[64];
	char *status, *p;
	long kib = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	status = hread_file(path);
	p = strstr(status, "VmRSS:");
	if (p)
		kib = strtol(p + 6, NULL, 10);
	free(status);
	return kib;
}

/* GET path from the HTTP listener of an agent started with --metrics-listen 127.0.0.1:0; the
 * whole response, malloc'd. */
char *ihttp_get(struct hagent *a, const char *path)
{
	const char key[] = "metrics_listen=127.0.0.1:";
	int64_t deadline = hnow_ms() + 5000;
	const char *at;
	while (!(at = strstr(hagent_log(a), key))) {
		cr_assert_lt(hnow_ms(), deadline, "no %s in the log:\n%s", key, hagent_log(a));
		hsleep_ms(20);
	}
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)atoi(at + strlen(key))),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct timeval tv = {10, 0};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	char req[256], buf[4096];
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	size_t len = 0;
	char *resp = calloc(1, 1);
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		resp = realloc(resp, len + (size_t)n + 1);
		cr_assert_not_null(resp);
		memcpy(resp + len, buf, (size_t)n);
		len += (size_t)n;
		resp[len] = '\0';
	}
	close(fd);
	return resp;
}

/* Reads fd until the notification `method` arrives (other messages are
 * dropped); fails after timeout_ms. out->m.params is its map. */
void ihear(int fd, const char *method, int timeout_ms, struct ireply *out)
{
	int64_t deadline = hnow_ms() + timeout_ms;
	char err[256];

	for (;;) {
		int left = (int)(deadline - hnow_ms());
		cr_assert_gt(left, 0, "no %s within %d ms", method, timeout_ms);
		msgpack_unpacked_init(&out->u);
		enum hraw_result got = hraw_recv_msg(fd, left, &out->u);
		cr_assert(got == HRAW_MSG || got == HRAW_TIMEOUT, "the connection broke (%d)", got);
		if (got == HRAW_MSG) {
			memset(&out->m, 0, sizeof(out->m));
			cr_assert(pgc_parse_message(&out->u.data, &out->m, err, sizeof(err)), "%s",
				  err);
			if (out->m.type == PGC_RPC_NOTIFY && out->m.method_len == strlen(method) &&
			    memcmp(out->m.method, method, out->m.method_len) == 0)
				return;
		}
		ireply_destroy(out);
	}
}

bool istr_is(const msgpack_object *map, const char *key, const char *want)
{
	char *v = istr(map, key);
	bool same = strcmp(v, want) == 0;
	free(v);
	return same;
}

void iquota_set(int fd, const char *key, int64_t limit)
{
	struct iparams p;
	struct ireply r;
	msgpack_packer *pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "key", key);
	pgc_pack_kv_int(pk, "limit", limit);
	icall_ok(fd, "quota.set", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
}

/* --- permits through libpgcoord ---------------------------------------- */

pgcoord_err iclaim_one(pgcoord *c, const char *id, const char *key, int timeout_ms,
		       pgcoord_claim **out)
{
	const char *keys[1] = {key};
	struct pgcoord_claim_opts opts = PGCOORD_CLAIM_OPTS_INIT;

	opts.keys = keys;
	opts.nquotas = 1;
	return pgcoord_permit_claim(c, id, &opts, timeout_ms, out);
}

void iclaim_call(int fd, const char *id, const char *key, int64_t weight, int64_t wait_ms,
		 struct ireply *r)
{
	struct iparams p;
	msgpack_packer *pk = iparams_begin(&p, wait_ms ? 3 : 2);
	pgc_pack_kv_str(pk, "id", id);
	pgc_pack_cstr(pk, "quotas");
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 2);
	pgc_pack_kv_str(pk, "key", key);
	pgc_pack_kv_int(pk, "weight", weight);
	if (wait_ms)
		pgc_pack_kv_int(pk, "wait_ms", wait_ms);
	icall(fd, "permit.claim", &p, r);
	iparams_destroy(&p);
}

int ictl_run(const char *socket, const char *const *args, char **out)
{
	const char *argv[16] = {ictl_bin(), "--socket", socket};
	size_t n = 3;

	for (size_t i = 0; args[i]; i++) {
		cr_assert_lt(n, sizeof(argv) / sizeof(argv[0]) - 1);
		argv[n++] = args[i];
	}
	argv[n] = NULL;
	return hrun(argv, out);
}
