/*
 * test_log_injection.c — a client-chosen lease name, quota key or permit id
 * that holds a newline and a forged `level=error …` line is written escaped:
 * each event is exactly one log line, every line is the agent's own (starts
 * with ts=), and no raw control character reaches the log.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "pgcoord/pgcoord.h"

TestSuite(log_injection, .timeout = 120);

#define CALL_MS 10000

/* What an attacker would append to a name: a line of its own. */
#define FORGED                                                                                     \
	"\nts=2026-01-01T00:00:00.000Z level=error component=permits msg=\"operator uid 0 "        \
	"released permit p-root\""
/* The same, as the log must show it inside one quoted value (up to the
 * value's own closing quote). */
#define FORGED_ESCAPED                                                                             \
	"\\nts=2026-01-01T00:00:00.000Z level=error component=permits msg=\\\"operator uid 0 "     \
	"released permit p-root\\\""

static pgcoord *client(struct hagent *a, const char *session_name)
{
	pgcoord *c = NULL;
	pgcoord_err err = pgcoord_connect(hagent_socket(a), CALL_MS, &c);
	cr_assert_eq(err, PGCOORD_OK, "connect: %s", pgcoord_strerror(err));
	err = pgcoord_session_open(c, session_name, CALL_MS, NULL);
	cr_assert_eq(err, PGCOORD_OK, "session.open: %s (%s)", pgcoord_strerror(err),
		     pgcoord_last_message(c));
	return c;
}

/* Lines of log containing needle. */
static int lines_with(const char *log, const char *needle)
{
	int n = 0;
	for (const char *line = log; *line;) {
		const char *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);
		char *copy = strndup(line, len);
		n += strstr(copy, needle) != NULL;
		free(copy);
		line += len + (end != NULL);
	}
	return n;
}

/* Every line is one of the agent's (ts= first), none of them an error (the
 * test provokes none), with no raw control bytes. */
static void assert_lines_are_the_agents(const char *log)
{
	for (const char *line = log; *line;) {
		cr_assert(strncmp(line, "ts=", 3) == 0, "a line that is not the agent's:\n%s",
			  line);
		const char *end = strchr(line, '\n');
		cr_assert(end, "the log ends mid-line:\n%s", line);
		const char *level = strchr(line, ' ');
		cr_assert(level && level < end && strncmp(level, " level=error", 12) != 0,
			  "an error line:\n%.*s", (int)(end - line), line);
		for (const char *p = line; p < end; p++)
			cr_assert((unsigned char)*p >= 0x20 && *p != 0x7f,
				  "raw control byte 0x%02x in:\n%.*s", (unsigned char)*p,
				  (int)(end - line), line);
		line = end + 1;
	}
}

Test(log_injection, client_values_are_escaped_one_line_per_event)
{
	struct harness_db *db = hdb_create();
	hdb_migrate(db);
	struct hagent *a = hagent_start(db, "r1", NULL);
	pgcoord *owner = client(a, "owner");
	pgcoord *operator= client(a, "operator");
	const char *lease = "lease" FORGED;
	const char *quota = "quota" FORGED;
	const char *permit = "permit" FORGED;
	bool leader = false, released = false;

	/* a lease won and given back: "belief starts" and "belief ends" */
	cr_assert_eq(pgcoord_lease_acquire(owner, lease, 3000, false, CALL_MS, &leader, NULL),
		     PGCOORD_OK, "%s", pgcoord_last_message(owner));
	cr_assert(leader);
	cr_assert_eq(pgcoord_lease_release(owner, lease, CALL_MS, &released), PGCOORD_OK, "%s",
		     pgcoord_last_message(owner));
	cr_assert(released);

	/* a quota set (by uid 0, an admin: logged), a permit released by override */
	cr_assert_eq(pgcoord_quota_set(operator, quota, 5, 0, CALL_MS), PGCOORD_OK, "%s",
		     pgcoord_last_message(operator));
	pgcoord_claim *cl = NULL;
	const char *keys[1] = {quota};
	cr_assert_eq(pgcoord_permit_claim(
			 owner, permit,
			 &(struct pgcoord_claim_opts){.size = sizeof(struct pgcoord_claim_opts),
						      .keys = keys,
						      .nquotas = 1,
						      .limit = PGCOORD_NO_LIMIT},
			 CALL_MS, &cl),
		     PGCOORD_OK, "%s", pgcoord_last_message(owner));
	pgcoord_claim_free(cl);
	cr_assert_eq(
	    pgcoord_permit_release(operator, permit, PGCOORD_OVERRIDE, "test", CALL_MS, &released),
	    PGCOORD_OK, "%s", pgcoord_last_message(operator));
	cr_assert(released);
	/* the database holds the names as given: escaping is the log's alone */
	cr_assert_eq(hdb_query_long(db,
				    "SELECT count(*) FROM pgcoord.permits WHERE id = 'permit' || "
				    "chr(10) || 'ts=2026-01-01T00:00:00.000Z level=error "
				    "component=permits msg=\"operator uid 0 released permit "
				    "p-root\"' AND state = 'released'"),
		     1);

	pgcoord_close(owner);
	pgcoord_close(operator);
	cr_assert_eq(hagent_stop(a), 0);
	char *log = hread_file(hagent_log_path(a));

	assert_lines_are_the_agents(log);
	/* the janitor's lease has its lines too: count those of ours */
	cr_assert_eq(lines_with(log, "leadership belief starts\" lease=\"lease" FORGED_ESCAPED
				     "\" session="),
		     1, "%s", log);
	cr_assert_eq(lines_with(log, "leadership belief ends: released by its holder\" "
				     "lease=\"lease" FORGED_ESCAPED "\" session="),
		     1, "%s", log);
	cr_assert_eq(lines_with(log, "msg=\"quota limit set\" uid=0 quota=\"quota" FORGED_ESCAPED
				     "\" limit=5 was=null"),
		     1, "%s", log);
	/* the real line, once; the forged ones show only as escaped text */
	cr_assert_eq(lines_with(log, "component=permits msg=\"released by operator override\" "
				     "uid=0 permit=\"permit" FORGED_ESCAPED "\""),
		     1, "%s", log);
	cr_assert_eq(lines_with(log, "component=permits msg=\"operator uid 0"), 0, "%s", log);
	free(log);
	hagent_destroy(a);
	hdb_drop(db);
}
