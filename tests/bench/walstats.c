/*
 * walstats.c — --wal-records: what a cell's WAL is made of, record type by
 * record type, per cycle (pg_waldump --stats=record over the measured
 * window, on the harness cluster's pg_wal). Everything the server wrote in
 * that window counts, the heartbeats' and autovacuum's too, as in the
 * table's WAL column.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* pg_waldump of the server the harness runs (tests/harness/pg-cluster's
 * lookup): PG_BINDIR, pg_config's, or the newest under /usr/lib/postgresql. */
static void find_waldump(char *out, size_t cap)
{
	const char *bindir = getenv("PG_BINDIR");
	FILE *p;

	if (bindir && *bindir) {
		snprintf(out, cap, "%s/pg_waldump", bindir);
		return;
	}
	out[0] = '\0';
	p = popen("ls -d /usr/lib/postgresql/*/bin/pg_waldump 2>/dev/null | sort -V | tail -n1",
		  "r");
	if (p) {
		if (fgets(out, (int)cap, p))
			out[strcspn(out, "\n")] = '\0';
		pclose(p);
	}
}

void bench_wal_records(const char *cell, int64_t from, int64_t to, long cycles)
{
	const char *pgdata = getenv("PGCOORD_TEST_PGDATA");
	char waldump[512], cmd[2048], line[512];
	double n_total = 0, rec_total = 0, fpi_total = 0;
	FILE *p;

	if (!pgdata || from < 0 || to <= from || cycles <= 0) {
		fprintf(stderr,
			"pgcoord-bench: %s: no WAL window to read (PGCOORD_TEST_PGDATA %s)\n", cell,
			pgdata ? "set" : "unset");
		return;
	}
	find_waldump(waldump, sizeof(waldump));
	if (!waldump[0]) {
		fprintf(stderr, "pgcoord-bench: %s: no pg_waldump found (set PG_BINDIR)\n", cell);
		return;
	}
	snprintf(cmd, sizeof(cmd), "'%s' -p '%s/pg_wal' -s %X/%X -e %X/%X --stats=record 2>&1",
		 waldump, pgdata, (unsigned)((uint64_t)from >> 32),
		 (unsigned)((uint64_t)from & 0xffffffffu), (unsigned)((uint64_t)to >> 32),
		 (unsigned)((uint64_t)to & 0xffffffffu));
	if (!(p = popen(cmd, "r"))) {
		fprintf(stderr, "pgcoord-bench: %s: cannot run %s\n", cell, waldump);
		return;
	}
	fprintf(stderr, "\npgcoord-bench: WAL of %s, per cycle (%ld cycles):\n\n", cell, cycles);
	fprintf(stderr, "| record | per cycle | B/cycle | of which full-page images |\n");
	fprintf(stderr, "| --- | ---: | ---: | ---: |\n");
	while (fgets(line, sizeof(line), p)) {
		char type[128];
		long n, rec, fpi;

		/* Type  N (%)  Record size (%)  FPI size (%)  Combined size (%) */
		if (sscanf(line, "%127s %ld (%*[^)]) %ld (%*[^)]) %ld", type, &n, &rec, &fpi) !=
			4 ||
		    n == 0)
			continue;
		fprintf(stderr, "| %s | %.2f | %.0f | %.0f |\n", type, (double)n / (double)cycles,
			(double)(rec + fpi) / (double)cycles, (double)fpi / (double)cycles);
		n_total += (double)n;
		rec_total += (double)rec;
		fpi_total += (double)fpi;
	}
	fprintf(stderr, "| all | %.2f | %.0f | %.0f |\n", n_total / (double)cycles,
		(rec_total + fpi_total) / (double)cycles, fpi_total / (double)cycles);
	if (pclose(p) != 0)
		fprintf(stderr, "pgcoord-bench: %s: pg_waldump failed (see above)\n", cell);
}
