/*
 * test_bad_input.c — hostile or broken socket clients (DESIGN.md "Bad input
 * from a socket client", PROTOCOL.md "Limits"). Every attack runs while a
 * second, well-behaved client on the same agent keeps working: it gets
 * correct replies before and after. Afterwards the agent still runs and no
 * pgcoord.* row changed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "itest.h"

TestSuite(bad_input, .timeout = 60);

/* --- the well-behaved client ------------------------------------------- */

struct good {
	int fd;
	int64_t session;
};

static struct good good_open(struct hagent *a)
{
	struct good g = {.fd = iconnect(hagent_socket(a))};

	g.session = isession_open(g.fd, "well-behaved");
	return g;
}

/* A call that never touches the database, one on its session, and one that
 * reads the database: all answered, and correctly. */
static void good_works(struct good *g, const char *when)
{
	struct ireply r;
	const msgpack_object *res, *list;
	bool found = false;

	icall(g->fd, "agent.ping", NULL, &r);
	cr_assert(ibool(iok(&r, when), "pong"), "ping %s", when);
	ireply_destroy(&r);

	icall(g->fd, "session.keepalive", NULL, &r);
	res = iok(&r, when);
	cr_assert_eq(iint(res, "session"), g->session, "keepalive %s", when);
	cr_assert(ibool(res, "live"), "keepalive %s", when);
	ireply_destroy(&r);

	icall(g->fd, "fleet.sessions", NULL, &r);
	list = pgc_map_get(iok(&r, when), "sessions");
	cr_assert(list && list->type == MSGPACK_OBJECT_ARRAY);
	for (uint32_t i = 0; i < list->via.array.size; i++)
		found |= iint(&list->via.array.ptr[i], "session") == g->session;
	cr_assert(found, "fleet.sessions %s does not list the good client's session", when);
	ireply_destroy(&r);
}

/* --- reading what the agent answers an attacker ------------------------ */

/* Reads one response from fd and checks it is the error `code` for msgid. */
static void expect_error(int fd, uint32_t msgid, const char *code)
{
	struct ireply r;
	char err[256];
	enum hraw_result got;

	msgpack_unpacked_init(&r.u);
	got = hraw_recv_msg(fd, ICALL_MS, &r.u);
	cr_assert_eq(got, HRAW_MSG, "expected a %s error, got no message (%d)", code, got);
	memset(&r.m, 0, sizeof(r.m));
	cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
	cr_assert_eq(r.m.type, PGC_RPC_RESPONSE);
	cr_assert_eq(r.m.msgid, msgid, "the %s error has msgid %u, not %u", code, r.m.msgid, msgid);
	ierr(&r, code, false, NULL);
	ireply_destroy(&r);
}

/* The framing answer: an error with msgid 0, then the agent hangs up. */
static void expect_error_then_close(int fd, const char *code)
{
	expect_error(fd, 0, code);
	cr_assert(hraw_expect_closed(fd, ICALL_MS), "the agent kept the connection open after %s",
		  code);
}

/* The connection still serves after a refused message. */
static void expect_still_open(int fd)
{
	struct ireply r;

	icall(fd, "agent.ping", NULL, &r);
	cr_assert(ibool(iok(&r, "ping after a refused message"), "pong"));
	ireply_destroy(&r);
}

static void send_bytes(int fd, const void *bytes, size_t n)
{
	cr_assert(hraw_send(fd, bytes, n), "send: %s", strerror(errno));
}

/* A send that may fail because the agent hung up part-way. */
static void set_send_timeout(int fd, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
}

/* The start of a request envelope [0, 7, "agent.hello", [ — its params
 * follow. */
static size_t envelope_head(unsigned char *buf)
{
	static const unsigned char head[] = {0x94, 0x00, 0x07, 0xab, 'a', 'g', 'e', 'n',
					     't',  '.',	 'h',  'e',  'l', 'l', 'o', 0x91};
	memcpy(buf, head, sizeof(head));
	return sizeof(head);
}

/* --- the attacks --------------------------------------------------------- */

/* A str32 header declaring 2 GiB and three bytes of it: refused from the
 * header, before the agent could buffer (or allocate) the rest. */
static void attack_declared_2gib_string(struct hagent *a)
{
	unsigned char buf[64];
	size_t n = envelope_head(buf);
	long rss_before = irss_kib(hagent_pid(a));
	int fd = iconnect(hagent_socket(a));

	buf[n++] = 0x81; /* {client: */
	buf[n++] = 0xa6;
	memcpy(buf + n, "client", 6);
	n += 6;
	buf[n++] = 0xdb; /* str32, 0x80000000 bytes */
	buf[n++] = 0x80;
	buf[n++] = 0x00;
	buf[n++] = 0x00;
	buf[n++] = 0x00;
	memcpy(buf + n, "abc", 3);
	n += 3;
	send_bytes(fd, buf, n);
	expect_error_then_close(fd, "too_large");
	close(fd);
	long rss_after = irss_kib(hagent_pid(a));
	cr_assert_lt(rss_after - rss_before, 64 * 1024,
		     "the agent's memory grew from %ld to %ld KiB", rss_before, rss_after);
}

/* A real 2 MiB request of 2048 small strings, each header honest: it is
 * refused once what arrived passes max_message_bytes (1 MiB). */
static void attack_real_2mib_message(struct hagent *a)
{
	size_t cap = 3 * 1024 * 1024, n;
	unsigned char *buf = malloc(cap);
	int fd = iconnect(hagent_socket(a));

	cr_assert_not_null(buf);
	n = envelope_head(buf);
	buf[n++] = 0x81; /* {pad: [2048 × 1 KiB str]} */
	buf[n++] = 0xa3;
	memcpy(buf + n, "pad", 3);
	n += 3;
	buf[n++] = 0xdc; /* array16, 2048 */
	buf[n++] = 0x08;
	buf[n++] = 0x00;
	for (int i = 0; i < 2048; i++) {
		buf[n++] = 0xda; /* str16, 1024 */
		buf[n++] = 0x04;
		buf[n++] = 0x00;
		memset(buf + n, 'x', 1024);
		n += 1024;
	}
	cr_assert_gt(n, 2u * 1024 * 1024);
	set_send_timeout(fd, ICALL_MS);
	/* the agent may hang up before all of it is written: that is the point */
	(void)hraw_send(fd, buf, n);
	free(buf);
	expect_error_then_close(fd, "too_large");
	close(fd);
}

/* 40 nested arrays (max_depth is 32). */
static void attack_too_deep(struct hagent *a)
{
	unsigned char buf[128];
	size_t n = envelope_head(buf);
	int fd = iconnect(hagent_socket(a));

	buf[n++] = 0x81;
	buf[n++] = 0xa1;
	buf[n++] = 'k';
	for (int i = 0; i < 40; i++)
		buf[n++] = 0x91;
	buf[n++] = 0xc0;
	send_bytes(fd, buf, n);
	expect_error_then_close(fd, "too_large");
	close(fd);
}

/* An array32 header declaring 4 billion elements. */
static void attack_huge_array_count(struct hagent *a)
{
	unsigned char buf[64];
	size_t n = envelope_head(buf);
	int fd = iconnect(hagent_socket(a));

	buf[n++] = 0x81;
	buf[n++] = 0xa1;
	buf[n++] = 'k';
	buf[n++] = 0xdd;
	memset(buf + n, 0xff, 4);
	n += 4;
	send_bytes(fd, buf, n);
	expect_error_then_close(fd, "too_large");
	close(fd);

	/* and a map32 as the whole message */
	fd = iconnect(hagent_socket(a));
	send_bytes(fd, "\xdf\xff\xff\xff\xff", 5);
	expect_error_then_close(fd, "too_large");
	close(fd);
}

/* 0xc1 starts no MessagePack type: the stream cannot be trusted after it. */
static void attack_broken_framing(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));

	send_bytes(fd, "\xc1", 1);
	expect_error_then_close(fd, "invalid_request");
	close(fd);

	/* the same byte in the middle of a request */
	fd = iconnect(hagent_socket(a));
	send_bytes(fd, "\x94\x00\x01\xc1", 4);
	expect_error_then_close(fd, "invalid_request");
	close(fd);
}

static void attack_unknown_method(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));
	struct ireply r;

	icall(fd, "no.such_method", NULL, &r);
	ierr(&r, "method_not_found", false, (const char *const[]){"no.such_method", NULL});
	ireply_destroy(&r);
	expect_still_open(fd);
	close(fd);
}

static void attack_wrong_param_types(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));
	struct iparams p;
	struct ireply r;
	msgpack_packer *pk;

	pk = iparams_begin(&p, 1);
	pgc_pack_cstr(pk, "name");
	msgpack_pack_int(pk, 42);
	icall(fd, "session.open", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'name'", "string", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	pgc_pack_kv_str(iparams_begin(&p, 1), "resume", "twelve");
	icall(fd, "session.open", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'resume'", "integer", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* an admin call (the test runs as the agent's user): still refused */
	pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "key", "bad-input-quota");
	pgc_pack_kv_str(pk, "limit", "ten");
	icall(fd, "quota.set", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'limit'", "integer", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	pk = iparams_begin(&p, 1);
	pgc_pack_cstr(pk, "name");
	msgpack_pack_array(pk, 0);
	icall(fd, "lease.status", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'name'", "string", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* strings Postgres would choke on, and one over its length limit */
	static const struct {
		const char *bytes;
		size_t len;
		const char *says;
	} bad_names[] = {
	    {"a\0b", 3, "NUL"},
	    {"\xff\xfe", 2, "UTF-8"},
	    {"\xed\xa0\x80", 3, "UTF-8"}, /* a surrogate */
	};
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		pk = iparams_begin(&p, 1);
		pgc_pack_cstr(pk, "name");
		pgc_pack_strn(pk, bad_names[i].bytes, bad_names[i].len);
		icall(fd, "session.open", &p, &r);
		ierr(&r, "invalid_params", false,
		     (const char *const[]){"'name'", bad_names[i].says, NULL});
		ireply_destroy(&r);
		iparams_destroy(&p);
	}
	char long_name[202];
	memset(long_name, 'n', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	pgc_pack_kv_str(iparams_begin(&p, 1), "name", long_name);
	icall(fd, "session.open", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'name'", "200", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* a resume id out of range, and a method name far longer than any */
	pgc_pack_kv_int(iparams_begin(&p, 1), "resume", -5);
	icall(fd, "session.open", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'resume'", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	char *method = malloc(100000);
	memset(method, 'm', 99999);
	method[99999] = '\0';
	icall(fd, method, NULL, &r);
	ierr(&r, "method_not_found", false, NULL);
	ireply_destroy(&r);
	free(method);

	/* a key that is not a string is refused as such */
	pk = iparams_begin(&p, 2);
	msgpack_pack_int(pk, 1);
	msgpack_pack_int(pk, 2);
	pgc_pack_kv_str(pk, "name", "first");
	icall(fd, "session.open", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"keys must be strings", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	/* the same key twice: no crash, and the first "name" (an integer) is
	 * the one judged */
	pk = iparams_begin(&p, 2);
	pgc_pack_cstr(pk, "name");
	msgpack_pack_int(pk, 3);
	pgc_pack_kv_str(pk, "name", "second");
	icall(fd, "session.open", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"'name'", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	expect_still_open(fd);
	close(fd);
}

static void attack_missing_required_fields(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));
	struct iparams p;
	struct ireply r;

	icall(fd, "lease.status", NULL, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"missing", "'name'", NULL});
	ireply_destroy(&r);
	icall(fd, "quota.get", NULL, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"missing", "'key'", NULL});
	ireply_destroy(&r);
	pgc_pack_kv_str(iparams_begin(&p, 1), "key", "bad-input-quota");
	icall(fd, "quota.set", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"missing", "'limit'", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	expect_still_open(fd);
	close(fd);
}

/* A key the method does not accept is refused before it runs, naming the
 * key, the method and what it accepts (the fingerprint proves nothing was
 * written); keys starting with "x-" are ignored; keys must be strings. */
static void attack_unknown_param_keys(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));
	struct iparams p;
	struct ireply r;
	msgpack_packer *pk;

	pk = iparams_begin(&p, 3);
	pgc_pack_kv_str(pk, "key", "bad-input-quota");
	pgc_pack_kv_int(pk, "limit", 3);
	pgc_pack_kv_int(pk, "lapse_after", 5);
	icall(fd, "quota.set", &p, &r);
	ierr(&r, "invalid_params", false,
	     (const char *const[]){"unknown parameter \"lapse_after\" for quota.set",
				   "accepted: key, limit, lapse_after_s", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	pk = iparams_begin(&p, 1);
	pgc_pack_kv_bool(pk, "dryrun", true);
	icall(fd, "agent.ping", &p, &r);
	ierr(&r, "invalid_params", false,
	     (const char *const[]){"\"dryrun\" for agent.ping", "accepted: none", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	pk = iparams_begin(&p, 1);
	msgpack_pack_int(pk, 7);
	msgpack_pack_int(pk, 1);
	icall(fd, "agent.ping", &p, &r);
	ierr(&r, "invalid_params", false, (const char *const[]){"keys must be strings", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);

	/* forward compatibility: an x- key is for a newer agent, not an error */
	pk = iparams_begin(&p, 2);
	pgc_pack_kv_str(pk, "key", "bad-input-quota");
	pgc_pack_kv_int(pk, "x-future-option", 1);
	icall(fd, "quota.get", &p, &r);
	ierr(&r, "not_found", false, (const char *const[]){"bad-input-quota", NULL});
	ireply_destroy(&r);
	iparams_destroy(&p);
	pk = iparams_begin(&p, 1);
	pgc_pack_kv_str(pk, "x-trace", "abc");
	icall_ok(fd, "agent.ping", &p, &r);
	ireply_destroy(&r);
	iparams_destroy(&p);
	expect_still_open(fd);
	close(fd);
}

/* Well-formed MessagePack that is no request: answered, and the
 * connection stays usable. */
static void attack_not_an_envelope(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));

	send_bytes(fd, "\x81\xa5hello\x01", 8); /* {hello: 1} */
	expect_error(fd, 0, "invalid_request");
	send_bytes(fd, "\x05", 1); /* 5 */
	expect_error(fd, 0, "invalid_request");
	send_bytes(fd, "\x92\x00\x01", 3); /* [0, 1] */
	expect_error(fd, 0, "invalid_request");
	send_bytes(fd, "\x94\x00\x09\x07\x90", 5); /* [0, 9, 7, []]: method not a string */
	expect_error(fd, 9, "invalid_request");
	send_bytes(fd, "\x94\x00\xff\xa3x.y\x90", 8); /* msgid -1 */
	expect_error(fd, 0, "invalid_request");
	/* params that are not [map]: the envelope's shape, so its msgid is known */
	send_bytes(fd, "\x94\x00\x0a\xacsession.open\x91\x05", 18);
	expect_error(fd, 10, "invalid_request");
	/* five elements, and two params maps */
	send_bytes(fd,
		   "\x95\x00\x0b\xaa"
		   "agent.ping\x90\xc0",
		   16);
	expect_error(fd, 0, "invalid_request");
	send_bytes(fd,
		   "\x94\x00\x0c\xaa"
		   "agent.ping\x92\x80\x80",
		   17);
	expect_error(fd, 12, "invalid_request");
	expect_still_open(fd);
	close(fd);
}

/* A response and a notification sent to the agent. */
static void attack_response_from_client(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));

	send_bytes(fd, "\x94\x01\x05\xc0\x80", 5); /* [1, 5, nil, {}] */
	expect_error(fd, 0, "invalid_request");
	send_bytes(fd, "\x93\x02\xa1x\x91\x80", 6); /* [2, "x", [{}]] */
	expect_error(fd, 0, "invalid_request");
	expect_still_open(fd);
	close(fd);
}

/* Half a request, then the client goes away: the agent forgets it. */
static void attack_truncated_then_close(struct hagent *a)
{
	unsigned char buf[64];
	size_t n = envelope_head(buf);
	int fd = iconnect(hagent_socket(a));

	buf[n++] = 0x81;
	buf[n++] = 0xa6;
	memcpy(buf + n, "cli", 3); /* of "client" */
	n += 3;
	send_bytes(fd, buf, n);
	close(fd);
}

/* Requests still running against the database when their client goes:
 * the agent finishes them and drops the replies. */
static void attack_close_with_requests_in_flight(struct hagent *a)
{
	int fd = iconnect(hagent_socket(a));
	msgpack_sbuffer sb;
	msgpack_packer pk;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	for (uint32_t i = 0; i < 40; i++) {
		pgc_pack_request_begin(&pk, i, i % 2 ? "fleet.sessions" : "fleet.agents");
		msgpack_pack_map(&pk, 0);
	}
	send_bytes(fd, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	close(fd);
}

struct attack {
	const char *name;
	void (*run)(struct hagent *a);
};

static const struct attack attacks[] = {
    {"declared 2 GiB string", attack_declared_2gib_string},
    {"real 2 MiB message", attack_real_2mib_message},
    {"nesting deeper than max_depth", attack_too_deep},
    {"huge array count", attack_huge_array_count},
    {"broken framing", attack_broken_framing},
    {"unknown method", attack_unknown_method},
    {"wrong parameter types", attack_wrong_param_types},
    {"missing required fields", attack_missing_required_fields},
    {"unknown parameter keys", attack_unknown_param_keys},
    {"not a request envelope", attack_not_an_envelope},
    {"response from the client", attack_response_from_client},
    {"truncated then closed", attack_truncated_then_close},
    {"closed with requests in flight", attack_close_with_requests_in_flight},
};

/* --- running an attack ---------------------------------------------------- */

struct target {
	struct harness_db *db;
	struct hagent *agent;
	struct good good;
	char *fingerprint;
};

static struct target target_start(const char *replica, const char *const *args)
{
	struct target t = {.db = idb_migrated()};

	t.agent = hagent_start(t.db, replica, args);
	/* the picture is taken once the agent's own rows settled */
	iwait_janitor(t.agent);
	t.good = good_open(t.agent);
	t.fingerprint = idb_fingerprint(t.db);
	return t;
}

static void target_attack(struct target *t, const struct attack *at)
{
	char when[128];

	snprintf(when, sizeof(when), "before the attack \"%s\"", at->name);
	good_works(&t->good, when);
	at->run(t->agent);
	snprintf(when, sizeof(when), "after the attack \"%s\"", at->name);
	cr_assert(hagent_running(t->agent), "the agent died %s:\n%s", when, hagent_log(t->agent));
	good_works(&t->good, when);
}

/* The agent survived, dropped every attacker, and no row changed. */
static void target_finish(struct target *t)
{
	cr_assert(hagent_running(t->agent), "%s", hagent_log(t->agent));
	/* only the good client is left connected (connections counts the
	 * status call's own) */
	int64_t deadline = hnow_ms() + 5000;
	while (istatus_int(t->agent, "connections") != 2) {
		cr_assert_lt(hnow_ms(), deadline, "attackers' connections were never closed");
		hsleep_ms(20);
	}
	char *now = idb_fingerprint(t->db);
	cr_assert_str_eq(now, t->fingerprint, "bad requests changed pgcoord.* rows");
	free(now);
	close(t->good.fd);
	free(t->fingerprint);
	hagent_destroy(t->agent);
	hdb_drop(t->db);
}

static void run_one(const char *name)
{
	for (size_t i = 0; i < sizeof(attacks) / sizeof(attacks[0]); i++) {
		if (strcmp(attacks[i].name, name) == 0) {
			struct target t = target_start("bad-one", NULL);
			target_attack(&t, &attacks[i]);
			target_finish(&t);
			return;
		}
	}
	cr_assert_fail("no attack named %s", name);
}

/* --- tests ---------------------------------------------------------------- */

Test(bad_input, declared_2gib_string_gets_too_large_and_close_before_buffering)
{
	run_one("declared 2 GiB string");
}

Test(bad_input, real_2mib_message_gets_too_large_and_close)
{
	run_one("real 2 MiB message");
}

Test(bad_input, nesting_deeper_than_max_depth_gets_an_error_and_close)
{
	run_one("nesting deeper than max_depth");
}

Test(bad_input, huge_array_count_header_gets_too_large_and_close)
{
	run_one("huge array count");
}

Test(bad_input, byte_that_starts_no_type_closes_only_that_connection)
{
	run_one("broken framing");
}

Test(bad_input, unknown_method_answers_method_not_found_naming_it)
{
	run_one("unknown method");
}

Test(bad_input, wrong_parameter_types_answer_invalid_params_naming_key_and_type)
{
	run_one("wrong parameter types");
}

Test(bad_input, missing_required_fields_answer_invalid_params_naming_them)
{
	run_one("missing required fields");
}

Test(bad_input, unknown_parameter_keys_answer_invalid_params_naming_key_and_method)
{
	run_one("unknown parameter keys");
}

Test(bad_input, valid_msgpack_that_is_no_request_answers_invalid_request_and_stays_open)
{
	run_one("not a request envelope");
}

Test(bad_input, response_or_notification_from_the_client_answers_invalid_request)
{
	run_one("response from the client");
}

Test(bad_input, truncated_message_then_close_is_forgotten)
{
	run_one("truncated then closed");
}

Test(bad_input, client_gone_with_requests_in_flight_is_forgotten)
{
	run_one("closed with requests in flight");
}

Test(bad_input, every_attack_in_a_row_leaves_the_agent_serving_and_the_tables_unchanged)
{
	struct target t = target_start("bad-all", NULL);

	for (size_t i = 0; i < sizeof(attacks) / sizeof(attacks[0]); i++)
		target_attack(&t, &attacks[i]);
	target_finish(&t);
}

/* Ten db-backed requests in one write with max_inflight_per_conn 2: the
 * first two go to the database, the other eight are refused busy. */
Test(bad_input, requests_pipelined_beyond_max_inflight_answer_busy)
{
	const char *const args[] = {"--max-inflight-per-conn", "2", NULL};
	struct target t = target_start("bad-inflight", args);
	int fd = iconnect(hagent_socket(t.agent));
	msgpack_sbuffer sb;
	msgpack_packer pk;
	uint32_t first = inext_msgid();
	int ok = 0, busy = 0;

	good_works(&t.good, "before pipelining");
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	for (uint32_t i = 0; i < 10; i++) {
		pgc_pack_request_begin(&pk, first + i, "fleet.agents");
		msgpack_pack_map(&pk, 0);
		inext_msgid();
	}
	send_bytes(fd, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	for (int i = 0; i < 10; i++) {
		struct ireply r;
		char err[256];

		msgpack_unpacked_init(&r.u);
		cr_assert_eq(hraw_recv_msg(fd, ICALL_MS, &r.u), HRAW_MSG, "reply %d missing", i);
		cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
		cr_assert(r.m.msgid >= first && r.m.msgid < first + 10);
		if (r.m.error) {
			ierr(&r, "busy", true,
			     (const char *const[]){"max_inflight_per_conn", NULL});
			busy++;
		} else {
			ok++;
		}
		ireply_destroy(&r);
	}
	cr_assert_eq(ok, 2, "%d of 10 ran (busy %d)", ok, busy);
	cr_assert_eq(busy, 8);

	/* requests that finish at once never pile up: 20 pipelined pings all pass */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	first = inext_msgid();
	for (uint32_t i = 0; i < 20; i++) {
		pgc_pack_request_begin(&pk, first + i, "agent.ping");
		msgpack_pack_map(&pk, 0);
		inext_msgid();
	}
	send_bytes(fd, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	for (int i = 0; i < 20; i++) {
		struct ireply r;
		char err[256];

		msgpack_unpacked_init(&r.u);
		cr_assert_eq(hraw_recv_msg(fd, ICALL_MS, &r.u), HRAW_MSG);
		cr_assert(pgc_parse_message(&r.u.data, &r.m, err, sizeof(err)), "%s", err);
		cr_assert_eq(r.m.msgid, first + (uint32_t)i);
		iok(&r, "pipelined ping");
		ireply_destroy(&r);
	}
	expect_still_open(fd);
	close(fd);
	good_works(&t.good, "after pipelining");
	target_finish(&t);
}

/* A client that sends and never reads: once its unread replies pass
 * max_output_bytes the agent drops it, and only it. */
Test(bad_input, client_that_never_reads_is_dropped_past_max_output_bytes)
{
	const char *const args[] = {"--max-output-bytes", "65536", NULL};
	struct target t = target_start("bad-output", args);
	int fd = iconnect(hagent_socket(t.agent));
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int batches = 0;

	good_works(&t.good, "before the flood");
	set_send_timeout(fd, 2000);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	for (int i = 0; i < 100; i++) {
		pgc_pack_request_begin(&pk, (uint32_t)i, "agent.status");
		msgpack_pack_map(&pk, 0);
	}
	/* at ~400 bytes a reply, 200 batches are 8 MB of replies: far past
	 * what the socket buffers and 64 KiB of queue hold */
	while (batches < 200 && hraw_send(fd, sb.data, sb.size))
		batches++;
	msgpack_sbuffer_destroy(&sb);
	cr_assert_lt(batches, 200, "the agent never dropped a client that does not read");
	cr_assert(hraw_expect_closed(fd, ICALL_MS));
	close(fd);
	cr_assert(strstr(hagent_log(t.agent), "max_output_bytes"), "%s", hagent_log(t.agent));
	good_works(&t.good, "after the flood");
	target_finish(&t);
}

/* max_connections 3: the good client and two more are served, a fourth is
 * accepted and closed at once; a freed slot can be used again. */
Test(bad_input, connection_past_max_connections_is_closed_at_once)
{
	const char *const args[] = {"--max-connections", "3", NULL};
	struct target t = target_start("bad-conns", args);
	struct ireply r;
	int64_t deadline = hnow_ms() + 5000;

	/* wait until the start-up probes are gone: only the good client */
	for (;;) {
		icall(t.good.fd, "agent.status", NULL, &r);
		int64_t n = iint(iok(&r, "status"), "connections");
		ireply_destroy(&r);
		if (n == 1)
			break;
		cr_assert_lt(hnow_ms(), deadline, "%lld connections linger", (long long)n);
		hsleep_ms(20);
	}
	int c2 = iconnect(hagent_socket(t.agent)), c3 = iconnect(hagent_socket(t.agent));
	expect_still_open(c2);
	expect_still_open(c3);

	int c4 = iconnect(hagent_socket(t.agent));
	cr_assert(hraw_expect_closed(c4, ICALL_MS), "the fourth connection was served");
	close(c4);
	good_works(&t.good, "after a refused connection");
	expect_still_open(c2);
	cr_assert(strstr(hagent_log(t.agent), "max_connections"), "%s", hagent_log(t.agent));

	/* a slot freed is a slot again, once the agent saw the close */
	close(c3);
	deadline = hnow_ms() + 5000;
	for (;;) {
		int c = iconnect(hagent_socket(t.agent));
		msgpack_unpacked u;

		msgpack_unpacked_init(&u);
		enum hraw_result got = hraw_call(c, inext_msgid(), "agent.ping", NULL, 0, 1000, &u);
		msgpack_unpacked_destroy(&u);
		close(c);
		if (got == HRAW_MSG)
			break;
		cr_assert_lt(hnow_ms(), deadline, "the freed slot never came back");
		hsleep_ms(20);
	}
	close(c2);
	/* target_finish's own status call needs a slot: wait for c2's close */
	deadline = hnow_ms() + 5000;
	for (;;) {
		icall(t.good.fd, "agent.status", NULL, &r);
		int64_t n = iint(iok(&r, "status"), "connections");
		ireply_destroy(&r);
		if (n == 1)
			break;
		cr_assert_lt(hnow_ms(), deadline);
		hsleep_ms(20);
	}
	target_finish(&t);
}
