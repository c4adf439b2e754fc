/*
 * test_replication.c — what the agent concludes from a server's replication
 * settings (agent/replication.c), and the warning it must recognise.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "agent/replication.h"

static struct replication_view view(const char *names, const char *commit, int attached)
{
	struct replication_view v = {.checked = true, .sync_standbys = attached};
	snprintf(v.server, sizeof(v.server), "db1:5432");
	snprintf(v.standby_names, sizeof(v.standby_names), "%s", names);
	snprintf(v.synchronous_commit, sizeof(v.synchronous_commit), "%s", commit);
	return v;
}

Test(replication, safe_only_when_commits_wait_for_a_synchronous_standby)
{
	struct replication_view unchecked = {0};
	cr_assert_str_eq(replication_failover_word(&unchecked), "unknown");
	cr_assert_not(replication_failover_safe(&unchecked));

	const char *waiting[] = {"on", "remote_write", "remote_apply"};
	for (size_t i = 0; i < 3; i++) {
		struct replication_view v = view("ANY 1 (a, b)", waiting[i], 1);
		cr_assert(replication_failover_safe(&v), "%s", waiting[i]);
		cr_assert_str_eq(replication_failover_word(&v), "safe");
	}
	const char *local[] = {"local", "off"};
	for (size_t i = 0; i < 2; i++) {
		struct replication_view v = view("ANY 1 (a, b)", local[i], 1);
		cr_assert_not(replication_failover_safe(&v), "%s", local[i]);
		cr_assert_str_eq(replication_failover_word(&v), "at_risk");
	}
	struct replication_view none = view("", "on", 0);
	cr_assert_not(replication_failover_safe(&none));
	struct replication_view standby = view("a", "on", 1);
	standby.in_recovery = true;
	cr_assert_not(replication_failover_safe(&standby));
}

Test(replication, describe_says_why)
{
	char line[512];
	struct replication_view v = view("", "on", 0);
	replication_describe(&v, line, sizeof(line));
	cr_assert(strstr(line, "db1:5432") && strstr(line, "synchronous_standby_names is empty") &&
		      strstr(line, "can be lost"),
		  "%s", line);
	v = view("s1", "local", 1);
	replication_describe(&v, line, sizeof(line));
	cr_assert(strstr(line, "synchronous_commit is local") && strstr(line, "can be lost"), "%s",
		  line);
	v = view("s1", "on", 0);
	replication_describe(&v, line, sizeof(line));
	cr_assert(strstr(line, "none is attached") && strstr(line, "stall"), "%s", line);
	v = view("s1", "on", -1);
	replication_describe(&v, line, sizeof(line));
	cr_assert(strstr(line, "attached synchronous standbys unknown"), "%s", line);
	v = view("s1", "on", 2);
	replication_describe(&v, line, sizeof(line));
	cr_assert(strstr(line, "2 synchronous standbys attached"), "%s", line);
}

Test(replication, changed_compares_what_is_shown)
{
	struct replication_view a = view("s1", "on", 1), b = a;
	cr_assert_not(replication_changed(&a, &b));
	snprintf(b.server, sizeof(b.server), "db2:5432");
	cr_assert(replication_changed(&a, &b));
	b = a;
	b.sync_standbys = 0;
	cr_assert(replication_changed(&a, &b));
}

Test(replication, the_cancelled_wait_warnings)
{
	cr_assert(replication_notice_is_cancelled_wait(
	    "canceling wait for synchronous replication due to user request"));
	cr_assert(replication_notice_is_cancelled_wait(
	    "canceling the wait for synchronous replication and terminating connection due to "
	    "administrator command"));
	cr_assert_not(replication_notice_is_cancelled_wait(NULL));
	cr_assert_not(replication_notice_is_cancelled_wait("there is no transaction in progress"));
}
