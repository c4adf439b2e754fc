/* migrations.h — the schema migrations compiled into the binary. */
#ifndef PGCOORD_AGENT_MIGRATIONS_H
#define PGCOORD_AGENT_MIGRATIONS_H

struct migration {
	int version;
	const char *name;
	/* sha256 of the file's bytes, lowercase hex, computed by embed.py */
	const char *checksum;
	const char *sql;
};

/* Sorted by version, consecutive from 1 (embed.py checks this at build time). */
extern const struct migration migrations[];
extern const int migrations_count;

#endif
