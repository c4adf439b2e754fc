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
frozen="$root/tests/ops/libpgcoord-0.symbols"
fail=0

# "VERSION NAME" for each defined dynamic symbol (objdump -T: the version
# is the next-to-last column, the name the last).
defined=$(objdump -T "$so" | awk 'NF >= 2 && $0 !~ /\*UND\*/ && / D[FO] / {print $(NF-1), $NF}')

# Version nodes define themselves as absolute symbols: skip those.
while read -r ver name; do
	[[ $ver == "$name" ]] && continue
	if [[ $name != pgcoord_* ]]; then
		echo "check-symbol-versions: $name is exported (only pgcoord_* may be)" >&2
		fail=1
	elif grep -qx "$name" "$frozen"; then
		if [[ $ver != PGCOORD_0 ]]; then
			echo "check-symbol-versions: $name carries $ver, not PGCOORD_0" >&2
			fail=1
		fi
	else
		# The node whose block in libpgcoord.sym names it.
		want=$(awk -v n="$name;" '/^PGCOORD_[0-9]+ *\{/ {node = $1}
			$1 == n {print node}' "$root/client-lib/libpgcoord.sym")
		if [[ -z $want || $want == PGCOORD_0 ]]; then
			echo "check-symbol-versions: $name is new since PGCOORD_0 but libpgcoord.sym" \
				"does not list it in a later node" >&2
			fail=1
		elif [[ $ver != "$want" ]]; then
			echo "check-symbol-versions: $name carries $ver, libpgcoord.sym says $want" >&2
			fail=1
		fi
	fi
done <<<"$defined"

# The old ABI stays whole: each first-release symbol still exported.
while read -r name; do
	if ! grep -qE "^PGCOORD_0 $name\$" <<<"$defined"; then
		echo "check-symbol-versions: $name (PGCOORD_0) is no longer exported" >&2
		fail=1
	fi
done <"$frozen"

if ((fail)); then
	exit 1
fi
echo "check-symbol-versions: $(grep -c '^PGCOORD_0 pgcoord_' <<<"$defined") symbols at PGCOORD_0," \
	"$(grep -c '^PGCOORD_[1-9][0-9]* pgcoord_' <<<"$defined") in later nodes"
