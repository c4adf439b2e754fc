/*
 * test_authz.c — who may do what, tried as an attacker with a shell account
 * would: clients connect as unprivileged uids (a forked child setuid()s,
 * connects and hands the socket back, so SO_PEERCRED names that uid) to an
 * agent whose socket anyone may reach, and every refusal is checked to
 * change nothing in the database.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

TestSuite(authz, .timeout = 120);

/* Two unprivileged uids; neither needs a passwd entry for SO_PEERCRED. */
#define UID_A 65534u
#define UID_B 65533u

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

/* A connection to path made by uid (the kernel records the connecting
 * process's credentials). uid 0 connects directly. */
static int connect_as(const char *path, uid_t uid)
{
	int sv[2], fd, status;
	pid_t pid;

	if (uid == 0)
		return iconnect(path);
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

static void resume(int fd, int64_t id, struct ireply *r)
{
	struct iparams p;

	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", id);
	icall(fd, "session.open", &p, r);
	iparams_destroy(&p);
}

/*
 * Everything a refused call could have changed, leaving out what heartbeats
 * move: sessions (with owners), permits and their quotas and audit, records
 * and their audit, quotas, leases.
 */
static char *picture(struct harness_db *db)
{
	return hdb_query_value(
	    db,
	    "SELECT concat_ws(E'\\n', "
	    " (SELECT string_agg(concat_ws(',', id, name, replica_id, incarnation, owner_uid, "
	    "   closed_at, close_reason), '; ' ORDER BY id) FROM pgcoord.sessions), "
	    " (SELECT string_agg(concat_ws(',', id, token, owner_session, owner_replica, state, "
	    "   phase, md5(intent), uncertain_reason, state_at, released_at), '; ' ORDER BY id) "
	    "   FROM pgcoord.permits), "
	    " (SELECT string_agg(concat_ws(',', permit_id, key, weight), '; ' "
	    "   ORDER BY permit_id, key) FROM pgcoord.permit_quotas), "
	    " (SELECT count(*) || '/' || coalesce(max(id), 0) FROM pgcoord.permit_events), "
	    " (SELECT string_agg(concat_ws(',', key, \"limit\", in_flight, updated_at), '; ' "
	    "   ORDER BY key) FROM pgcoord.quotas), "
	    " (SELECT string_agg(concat_ws(',', kind, key, state, md5(data), owner_session, "
	    "   token, terminal, updated_at), '; ' ORDER BY kind, key) FROM pgcoord.records), "
	    " (SELECT count(*) || '/' || coalesce(max(id), 0) FROM pgcoord.record_events), "
	    " (SELECT string_agg(concat_ws(',', name, holder_session, epoch), '; ' "
	    "   ORDER BY name) FROM pgcoord.leases))");
}

static void assert_forbidden(const struct ireply *r, const char *mention)
{
	ierr(r, "forbidden", false, (const char *const[]){mention, NULL});
}

/* --- sessions ------------------------------------------------------------ */

Test(authz, a_session_records_its_uid_and_resumes_only_for_that_uid)
{
	const char *const args[] = {"--socket-mode", "0666", "--session-grace-ms", "30000", NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *ag = hagent_start(db, "authz-resume", args);
	iwait_janitor(ag);
	int fa = connect_as(hagent_socket(ag), UID_A);
	int64_t sa = isession_open(fa, "victim");
	struct ireply r;
	const msgpack_object *res;

	cr_assert_eq(hdb_query_long(db, "SELECT owner_uid FROM pgcoord.sessions WHERE id = %lld",
				    (long long)sa),
		     UID_A);
	/* the agent's own session is owned by the agent's user (root here) */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.sessions WHERE internal "
					"AND owner_uid = 0 AND replica_id = 'authz-resume'"),
		     1);
	/* fleet.sessions shows the owner, as the view does */
	res = icall_ok(fa, "fleet.sessions", NULL, &r);
	const msgpack_object *list = pgc_map_get(res, "sessions");
	bool seen = false;
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *s = &list->via.array.ptr[i];
		if (iint(s, "session") == sa) {
			cr_assert_eq(iint(s, "owner_uid"), UID_A);
			seen = true;
		}
	}
	cr_assert(seen, "fleet.sessions does not list session %lld", (long long)sa);
	ireply_destroy(&r);
	close(fa); /* detached: resumable within the grace */

	char *before = picture(db);
	int fb = connect_as(hagent_socket(ag), UID_B);
	resume(fb, sa, &r);
	assert_forbidden(&r, "belongs to uid 65534");
	ireply_destroy(&r);
	/* refused, it attached nothing: the intruder has no session */
	icall(fb, "session.keepalive", NULL, &r);
	ierr(&r, "no_session", false, NULL);
	ireply_destroy(&r);
	char *after = picture(db);
	cr_assert_str_eq(before, after);
	cr_assert(strstr(hagent_log(ag), "uid 65533 refused session.open"), "%s", hagent_log(ag));

	/* the owner still resumes it */
	fa = connect_as(hagent_socket(ag), UID_A);
	resume(fa, sa, &r);
	res = iok(&r, "the owner's resume");
	cr_assert_eq(iint(res, "session"), sa);
	cr_assert(ibool(res, "resumed"));
	ireply_destroy(&r);
	close(fa);

	/* and root, an admin, may resume anyone's */
	int fr = connect_as(hagent_socket(ag), 0);
	resume(fr, sa, &r);
	iok(&r, "an admin's resume");
	ireply_destroy(&r);

	free(before);
	free(after);
	close(fb);
	close(fr);
	hagent_destroy(ag);
	hdb_drop(db);
}

Test(authz, a_predecessors_session_resumes_only_for_its_uid)
{
	const char *const args[] = {"--socket-mode",
				    "0666",
				    "--heartbeat-interval-ms",
				    "200",
				    "--session-ttl-ms",
				    "20000",
				    "--session-grace-ms",
				    "10000",
				    NULL};
	struct harness_db *db = idb_migrated();
	struct hagent *first = hagent_start(db, "authz-crash", args);
	int fa = connect_as(hagent_socket(first), UID_A);
	int64_t sa = isession_open(fa, "crash-victim");
	struct ireply r;

	hagent_kill(first, SIGKILL);
	cr_assert_eq(hagent_wait(first, 5000), 128 + SIGKILL);
	close(fa);
	struct hagent *second = hagent_start(db, "authz-crash", args);

	/* the successor holds it without knowing its owner: the database does */
	char *before = picture(db);
	int fb = connect_as(hagent_socket(second), UID_B);
	resume(fb, sa, &r);
	assert_forbidden(&r, "belongs to uid 65534");
	ireply_destroy(&r);
	char *after = picture(db);
	cr_assert_str_eq(before, after);
	/* now the agent knows the owner, and refuses again without asking */
	resume(fb, sa, &r);
	assert_forbidden(&r, "belongs to uid 65534");
	ireply_destroy(&r);

	fa = connect_as(hagent_socket(second), UID_A);
	resume(fa, sa, &r);
	cr_assert_eq(iint(iok(&r, "the owner's resume"), "session"), sa);
	ireply_destroy(&r);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.sessions WHERE id = %lld AND "
				    "owner_uid = %u AND closed_at IS NULL",
				    (long long)sa, UID_A),
		     1);
	free(before);
	free(after);
	close(fa);
	close(fb);
	hagent_destroy(first);
	hagent_destroy(second);
	hdb_drop(db);
}
