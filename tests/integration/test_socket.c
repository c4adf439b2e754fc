/*
 * test_socket.c — the agent's Unix socket: its mode, what the agent does
 * about a file already at its path, and a graceful SIGTERM (exit 0, socket
 * removed, sessions and the agent row closed in the database).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

TestSuite(socket_path, .timeout = 60);

/* An agent the harness cannot start: one on a socket path of the test's
 * choosing (the harness picks its own). */
struct path_agent {
	pid_t pid;
	char *log_path;
};

static struct path_agent path_agent_start(struct harness_db *db, const char *replica,
					  const char *socket_path)
{
	struct path_agent pa = {.log_path = htmp_path("path-agent.log")};
	const char *argv[] = {iagent_bin(),
			      "--database-url",
			      hdb_agent_conninfo(db),
			      "--replica-id",
			      replica,
			      "--socket-path",
			      socket_path,
			      NULL};
	int64_t deadline = hnow_ms() + 10000;

	pa.pid = ispawn(argv, pa.log_path);
	for (;;) {
		int fd = hraw_connect(socket_path);
		if (fd >= 0) {
			msgpack_unpacked u;
			struct pgc_message m;
			char err[128];
			int64_t pid = 0;
			bool registered = false;

			msgpack_unpacked_init(&u);
			if (hraw_call(fd, 1, "agent.status", NULL, 0, 2000, &u) == HRAW_MSG &&
			    pgc_parse_message(&u.data, &m, err, sizeof(err)) && m.result) {
				pgc_obj_int64(pgc_map_get(m.result, "pid"), &pid);
				pgc_obj_bool(pgc_map_get(m.result, "registered"), &registered);
			}
			msgpack_unpacked_destroy(&u);
			close(fd);
			if (pid == pa.pid && registered)
				return pa;
		}
		char *log = hread_file(pa.log_path);
		cr_assert_lt(hnow_ms(), deadline, "the agent on %s never served; log:\n%s",
			     socket_path, log);
		cr_assert_eq(waitpid(pa.pid, NULL, WNOHANG), 0, "the agent on %s exited; log:\n%s",
			     socket_path, log);
		free(log);
		hsleep_ms(20);
	}
}

static int path_agent_stop(struct path_agent *pa)
{
	kill(pa->pid, SIGTERM);
	int rc = iwait_pid(pa->pid);
	free(pa->log_path);
	return rc;
}

Test(socket_path, socket_is_created_with_mode_0660)
{
	struct harness_db *db = idb_migrated();
	struct hagent *a = hagent_start(db, "sock-mode", NULL);
	struct stat st;

	cr_assert_eq(lstat(hagent_socket(a), &st), 0, "%s", strerror(errno));
	cr_assert(S_ISSOCK(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0660, "mode %04o", (unsigned)(st.st_mode & 07777));
	hagent_destroy(a);
	hdb_drop(db);
}

Test(socket_path, stale_socket_of_a_killed_agent_is_replaced_by_the_next_agent)
{
	struct harness_db *db = idb_migrated();
	struct hagent *dead = hagent_start(db, "sock-dead", NULL);
	const char *path = hagent_socket(dead);
	struct stat st;

	hagent_kill(dead, SIGKILL);
	cr_assert_eq(hagent_wait(dead, 5000), 128 + SIGKILL);
	/* what a crash leaves: a socket file nobody listens on */
	cr_assert_eq(lstat(path, &st), 0, "kill -9 removed the socket file?");
	cr_assert(S_ISSOCK(st.st_mode));
	cr_assert_eq(hraw_connect(path), -1);
	cr_assert_eq(errno, ECONNREFUSED, "%s", strerror(errno));

	struct path_agent next = path_agent_start(db, "sock-next", path);
	cr_assert_eq(lstat(path, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0660);
	char *rid = NULL;
	{
		int fd = iconnect(path);
		struct ireply r;
		rid = istr(icall_ok(fd, "agent.status", NULL, &r), "replica_id");
		ireply_destroy(&r);
		close(fd);
	}
	cr_assert_str_eq(rid, "sock-next");
	free(rid);
	cr_assert_eq(path_agent_stop(&next), 0);
	hagent_destroy(dead);
	hdb_drop(db);
}

Test(socket_path, second_agent_on_a_live_agents_path_exits_1_and_leaves_it_serving)
{
	struct harness_db *db = idb_migrated();
	struct hagent *live = hagent_start(db, "sock-live", NULL);
	const char *const args[] = {"--socket-path", hagent_socket(live), NULL};
	char *log = NULL;
	struct stat before, after;

	cr_assert_eq(lstat(hagent_socket(live), &before), 0);
	int rc = hagent_start_expect_exit(db, "sock-intruder", args, &log);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "another agent is serving on"), "%s", log);
	cr_assert(strstr(log, hagent_socket(live)), "the message does not name the path:\n%s", log);
	free(log);

	/* the live agent's socket is the same file, still served */
	cr_assert_eq(lstat(hagent_socket(live), &after), 0);
	cr_assert_eq(after.st_ino, before.st_ino);
	cr_assert_eq(istatus_int(live, "pid"), hagent_pid(live));
	/* the intruder never registered */
	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
					"'sock-intruder'"),
		     0);
	hagent_destroy(live);
	hdb_drop(db);
}

Test(socket_path, regular_file_at_the_socket_path_makes_the_agent_refuse)
{
	struct harness_db *db = idb_migrated();
	char *path = htmp_path("not-a-socket");
	const char *const args[] = {"--socket-path", path, NULL};
	char *log = NULL, *content;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "precious\n", 9), 9);
	close(fd);
	int rc = hagent_start_expect_exit(db, "sock-file", args, &log);
	cr_assert_eq(rc, 1, "exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "is not a socket"), "%s", log);
	free(log);
	content = hread_file(path);
	cr_assert_str_eq(content, "precious\n", "the agent touched the file");
	free(content);
	free(path);
	hdb_drop(db);
}

Test(socket_path, sigterm_exits_0_removes_the_socket_and_closes_every_session)
{
	struct harness_db *db = idb_migrated();
	const char *const args[] = {"--session-grace-ms", "60000", NULL};
	struct hagent *a = hagent_start(db, "sock-term", args);
	int64_t inc = istatus_int(a, "incarnation");
	int attached = iconnect(hagent_socket(a)), leaver = iconnect(hagent_socket(a));
	int64_t s1 = isession_open(attached, "attached");
	int64_t s2 = isession_open(leaver, "in-grace");
	struct stat st;

	close(leaver); /* its session waits in its grace */
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE incarnation = %lld "
			   "AND closed_at IS NULL",
			   (long long)inc),
	    3, "two client sessions and the janitor's");

	cr_assert_eq(hagent_stop(a), 0, "%s", hagent_log(a));
	cr_assert_neq(lstat(hagent_socket(a), &st), 0, "the socket file is still there");
	cr_assert_eq(errno, ENOENT);
	cr_assert(hraw_expect_closed(attached, 1000), "the attached client was not hung up on");
	close(attached);

	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE incarnation = %lld "
			   "AND closed_at IS NULL",
			   (long long)inc),
	    0, "sessions left open after SIGTERM");
	cr_assert_eq(
	    hdb_query_long(db,
			   "SELECT count(*) FROM pgcoord.sessions WHERE id IN (%lld, %lld) "
			   "AND closed_at IS NOT NULL AND close_reason = 'agent stopped'",
			   (long long)s1, (long long)s2),
	    2);
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.agents WHERE replica_id = "
				    "'sock-term' AND incarnation = %lld AND stopped_at IS NOT NULL",
				    (long long)inc),
		     1);
	hagent_destroy(a);
	hdb_drop(db);
}
