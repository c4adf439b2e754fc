/*
 * ctl_migrate.c — `pgcoordctl migrate` runs `pgcoord-agent migrate` and
 * reports what it did. The migrations and their runner belong to the agent
 * (one copy of the schema, one runner); the CLI only finds the binary,
 * hands it the database URL through the environment and reads back its one
 * summary line, "applied N migration(s); schema at version V".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_migrate.h"

static const char *agent_path(void)
{
	const char *p = getenv("PGCOORD_AGENT_BIN");
	return p && *p ? p : PGCOORD_AGENT_PATH;
}

/* The child: stdout to the pipe, the URL in the environment, then exec. */
static void run_child(int out_fd, const char *bin, const char *database_url,
		      const char *runtime_role)
{
	if (dup2(out_fd, STDOUT_FILENO) < 0)
		_exit(127);
	if (database_url && setenv("PGCOORD_DATABASE_URL", database_url, 1) != 0)
		_exit(127);
	const char *argv[] = {bin, "migrate", runtime_role ? "--runtime-role" : NULL, runtime_role,
			      NULL};
	execvp(bin, (char *const *)argv);
	fprintf(stderr, "pgcoordctl: migrate: cannot run %s: %s (set PGCOORD_AGENT_BIN)\n", bin,
		strerror(errno));
	_exit(127);
}

int ctl_migrate(const char *database_url, const char *runtime_role, bool json)
{
	const char *bin = agent_path();
	char out[4096];
	size_t len = 0;
	int fds[2], status = 0;

	fflush(stdout);
	if (pipe(fds) != 0) {
		fprintf(stderr, "pgcoordctl: migrate: pipe: %s\n", strerror(errno));
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "pgcoordctl: migrate: fork: %s\n", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return 1;
	}
	if (pid == 0) {
		close(fds[0]);
		run_child(fds[1], bin, database_url, runtime_role);
	}
	close(fds[1]);
	for (;;) {
		ssize_t n = read(fds[0], out + len, sizeof(out) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == sizeof(out) - 1)
			break; /* the summary is in the first line; drop the rest */
	}
	out[len] = '\0';
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		/* The agent said why on stderr, which is ours. */
		fputs(out, stdout);
		if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
			return 1;
		fprintf(stderr, "pgcoordctl: migrate: %s migrate failed (%s %d)\n", bin,
			WIFEXITED(status) ? "exit status" : "signal",
			WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		return 1;
	}

	int applied = 0, version = 0;
	const char *line = strstr(out, "applied ");
	if (!line || sscanf(line, "applied %d migration(s); schema at version %d", &applied,
			    &version) != 2) {
		/* Another agent version's wording: show it as it came. */
		fputs(out, stdout);
		return 0;
	}
	if (json)
		printf("{\n  \"applied\": %d,\n  \"version\": %d\n}\n", applied, version);
	else if (applied == 0)
		printf("schema is up to date (version %d)\n", version);
	else
		printf("applied %d migration%s; schema version %d\n", applied,
		       applied == 1 ? "" : "s", version);
	return 0;
}
