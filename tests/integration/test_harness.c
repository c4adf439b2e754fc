/*
 * test_harness.c — the harness itself works: fresh databases, the query
 * helpers, the raw socket reader, and agent processes that start, stop,
 * refuse and die with their test.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "pgcoord/pgcoord.h"
#include "proto/codec.h"

TestSuite(harness, .timeout = 120);

static const char user_tables[] =
    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema', "
    "'pg_toast')";

Test(harness, fresh_databases_are_distinct_and_empty)
{
	struct harness_db *a = hdb_create();
	struct harness_db *b = hdb_create();

	cr_assert_str_neq(hdb_name(a), hdb_name(b));
	cr_assert_str_neq(hdb_conninfo(a), hdb_conninfo(b));
	cr_assert_eq(hdb_query_long(a, "%s", user_tables), 0);
	cr_assert_eq(hdb_query_long(b, "%s", user_tables), 0);

	hdb_exec(a, "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2)");
	cr_assert_eq(hdb_query_long(a, "SELECT sum(x) FROM t"), 3);
	cr_assert_eq(hdb_query_long(b, "%s", user_tables), 0, "a table leaked into another db");

	char *name = hdb_query_value(a, "SELECT current_database()");
	cr_assert_str_eq(name, hdb_name(a));
	free(name);

	char *dropped = strdup(hdb_name(a));
	hdb_drop(a);
	cr_assert_eq(
	    hdb_query_long(b, "SELECT count(*) FROM pg_database WHERE datname = '%s'", dropped), 0);
	free(dropped);
	hdb_drop(b);
}

Test(harness, query_value_is_null_for_no_row_and_sql_null)
{
	struct harness_db *db = hdb_create();

	cr_assert_null(hdb_query_value(db, "SELECT 1 WHERE false"));
	cr_assert_null(hdb_query_value(db, "SELECT NULL"));
	char *v = hdb_query_value(db, "SELECT 'x' || %d", 42);
	cr_assert_str_eq(v, "x42");
	free(v);

	PGconn *conn = hdb_connect(db);
	cr_assert_eq(PQstatus(conn), CONNECTION_OK);
	cr_assert_str_eq(PQdb(conn), hdb_name(db));
	PQfinish(conn);
	hdb_drop(db);
}

static size_t pack_ping(char *buf, size_t cap, uint32_t msgid)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t n;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	pgc_pack_request_begin(&pk, msgid, "agent.ping");
	msgpack_pack_map(&pk, 0);
	cr_assert_leq(sb.size, cap);
	memcpy(buf, sb.data, sb.size);
	n = sb.size;
	msgpack_sbuffer_destroy(&sb);
	return n;
}

static uint32_t msgid_of(const msgpack_unpacked *u)
{
	struct pgc_message m;
	char err[128];

	cr_assert(pgc_parse_message(&u->data, &m, err, sizeof(err)), "%s", err);
	return m.msgid;
}

Test(harness, raw_recv_reads_one_object_at_a_time)
{
	int sv[2];
	char two[256];
	size_t n1, n2;
	msgpack_unpacked u;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	n1 = pack_ping(two, sizeof(two), 7);
	n2 = pack_ping(two + n1, sizeof(two) - n1, 8);
	cr_assert(hraw_send(sv[1], two, n1 + n2));

	msgpack_unpacked_init(&u);
	cr_assert_eq(hraw_recv_msg(sv[0], 1000, &u), HRAW_MSG);
	cr_assert_eq(msgid_of(&u), 7);
	cr_assert_eq(hraw_recv_msg(sv[0], 1000, &u), HRAW_MSG);
	cr_assert_eq(msgid_of(&u), 8);
	cr_assert_eq(hraw_recv_msg(sv[0], 50, &u), HRAW_TIMEOUT);

	/* An object split across writes is assembled, the next one left alone. */
	cr_assert(hraw_send(sv[1], two, 3));
	cr_assert_eq(hraw_recv_msg(sv[0], 50, &u), HRAW_TIMEOUT);
	cr_assert(hraw_send(sv[1], two + 3, n1 - 3 + n2));
	cr_assert_eq(hraw_recv_msg(sv[0], 1000, &u), HRAW_MSG);
	cr_assert_eq(msgid_of(&u), 7, "the prefix read before the timeout was lost");
	cr_assert_eq(hraw_recv_msg(sv[0], 1000, &u), HRAW_MSG);
	cr_assert_eq(msgid_of(&u), 8);
	cr_assert_eq(hraw_recv_msg(sv[0], 50, &u), HRAW_TIMEOUT);

	cr_assert(hraw_send(sv[1], two, n1 - 1));
	cr_assert(hraw_send(sv[1], two + n1 - 1, 1));
	cr_assert_eq(hraw_recv_msg(sv[0], 1000, &u), HRAW_MSG);
	cr_assert_eq(msgid_of(&u), 7);

	/* 0xc1 starts no MessagePack type. */
	cr_assert(hraw_send(sv[1], "\xc1", 1));
	cr_assert_eq(hraw_recv_msg(sv[0], 1000, &u), HRAW_ERROR);
	msgpack_unpacked_destroy(&u);

	close(sv[1]);
	cr_assert(hraw_expect_closed(sv[0], 1000));
	close(sv[0]);
}

Test(harness, raw_expect_closed_times_out_on_an_open_peer)
{
	int sv[2];

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	cr_assert(hraw_send(sv[1], "junk", 4));
	cr_assert_not(hraw_expect_closed(sv[0], 100));
	close(sv[0]);
	cr_assert_not(hraw_send(sv[1], "more", 4), "sending to a closed peer must fail, not "
						   "raise SIGPIPE");
	close(sv[1]);
}

Test(harness, agent_starts_registers_and_stops_gracefully)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	struct hagent *a = hagent_start(db, "harness-a", NULL);

	cr_assert(hagent_running(a));
	cr_assert_gt(hagent_pid(a), 0);

	pgcoord *c = NULL;
	cr_assert_eq(pgcoord_connect(hagent_socket(a), 5000, &c), PGCOORD_OK, "log:\n%s",
		     hagent_log(a));
	cr_assert_eq(pgcoord_ping(c, 5000), PGCOORD_OK, "%s", pgcoord_last_message(c));
	pgcoord_close(c);

	int fd = hraw_connect(hagent_socket(a));
	cr_assert_geq(fd, 0);
	msgpack_unpacked u;
	struct pgc_message m;
	char err[128];
	msgpack_unpacked_init(&u);
	cr_assert_eq(hraw_call(fd, 99, "agent.status", NULL, 0, 5000, &u), HRAW_MSG);
	cr_assert(pgc_parse_message(&u.data, &m, err, sizeof(err)), "%s", err);
	cr_assert_eq(m.msgid, 99);
	cr_assert(pgc_obj_str_eq(pgc_map_get(m.result, "replica_id"), "harness-a"));
	msgpack_unpacked_destroy(&u);
	close(fd);

	cr_assert_eq(hdb_query_long(db, "SELECT count(*) FROM pgcoord.agents WHERE "
					"replica_id = 'harness-a'"),
		     1);

	cr_assert_eq(hagent_stop(a), 0, "log:\n%s", hagent_log(a));
	cr_assert_not(hagent_running(a));
	cr_assert_eq(hraw_connect(hagent_socket(a)), -1, "the socket still accepts");
	hagent_destroy(a);
	hdb_drop(db);
}

Test(harness, agent_that_refuses_to_start_reports_status_and_log)
{
	const char *const bad[] = {"--no-such-option", "1", NULL};
	char *log = NULL;

	int rc = hagent_start_expect_exit(NULL, "harness-bad", bad, &log);
	cr_assert_neq(rc, 0);
	cr_assert(strstr(log, "no-such-option"), "the reason is not in the log:\n%s", log);
	free(log);
}

Test(harness, agents_die_with_the_test_process)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);

	/* A stand-in for a test that crashes while its agent runs. */
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct hagent *a = hagent_start(db, "harness-orphan", NULL);
		pid_t pid = hagent_pid(a);

		if (write(pfd[1], &pid, sizeof(pid)) != sizeof(pid))
			_exit(2);
		_exit(0); /* no hagent_destroy: the agent is left behind */
	}
	close(pfd[1]);
	pid_t agent = 0;
	cr_assert_eq(read(pfd[0], &agent, sizeof(agent)), (ssize_t)sizeof(agent));
	close(pfd[0]);
	int status;
	cr_assert_eq(waitpid(child, &status, 0), child);

	/* Gone, or a zombie waiting for init to reap it. */
	bool gone = false;
	for (int i = 0; i < 200 && !gone; i++) {
		char path[64], state = '?';
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)agent);
		FILE *f = fopen(path, "re");
		if (!f) {
			gone = true;
			break;
		}
		if (fscanf(f, "%*d %*s %c", &state) == 1 && (state == 'Z' || state == 'X'))
			gone = true;
		fclose(f);
		if (!gone)
			hsleep_ms(10);
	}
	cr_assert(gone, "agent %d outlived the process that started it", (int)agent);
	hdb_drop(db);
}
