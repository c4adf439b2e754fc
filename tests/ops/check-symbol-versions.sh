#!/usr/bin/env bash
# tests/ops/check-symbol-versions.sh LIBPGCOORD_SO SOURCE_ROOT — every
# symbol libpgcoord exports is a pgcoord_* function with a version: the
# first release's (listed in libpgcoord-0.symbols, which never changes)
# carry PGCOORD_0, and every later one the node libpgcoord.sym names it in.
# A new function left out of libpgcoord.sym would fall into PGCOORD_0 by
# its wildcard: the frozen list catches that.
set -euo pipefail

so=$1
root=$2

# objdump -T: a defined dynamic symbol's version is the next-to-last
# column, its name the last; version nodes define themselves as absolute
# symbols (version == name) and are skipped. One awk pass: the machine
# running the suite may be busy.
objdump -T "$so" | awk -v frozen="$root/tests/ops/libpgcoord-0.symbols" \
	-v symfile="$root/client-lib/libpgcoord.sym" '
BEGIN {
	while ((getline l < frozen) > 0)
		if (l != "")
			old[l] = 1
	while ((getline l < symfile) > 0) {
		if (l ~ /^PGCOORD_[0-9]+ *\{/) {
			node = l
			sub(/ *\{.*/, "", node)
			continue
		}
		t = l
		gsub(/[ \t;]/, "", t)
		if (t ~ /^pgcoord_[a-z0-9_]+$/)
			want[t] = node
	}
}
NF >= 2 && $0 !~ /\*UND\*/ && / D[FO] / {
	ver = $(NF - 1)
	name = $NF
	if (ver == name)
		next
	if (name !~ /^pgcoord_/) {
		printf "check-symbol-versions: %s is exported (only pgcoord_* may be)\n", name
		fail = 1
	} else if (name in old) {
		seen[name] = 1
		if (ver != "PGCOORD_0") {
			printf "check-symbol-versions: %s carries %s, not PGCOORD_0\n", name, ver
			fail = 1
		}
		n0++
	} else if (!(name in want) || want[name] == "PGCOORD_0") {
		printf "check-symbol-versions: %s is new since PGCOORD_0 but libpgcoord.sym does not list it in a later node\n", name
		fail = 1
	} else if (ver != want[name]) {
		printf "check-symbol-versions: %s carries %s, libpgcoord.sym says %s\n", name, ver, want[name]
		fail = 1
	} else {
		nlater++
	}
}
END {
	# The old ABI stays whole: each first-release symbol still exported.
	for (name in old)
		if (!(name in seen)) {
			printf "check-symbol-versions: %s (PGCOORD_0) is no longer exported\n", name
			fail = 1
		}
	if (fail)
		exit 1
	printf "check-symbol-versions: %d symbols at PGCOORD_0, %d in later nodes\n", n0, nlater
}' >&2
