#!/usr/bin/env bash
# tests/ops/check-ctl-includes.sh SOURCE_ROOT — pgcoordctl is a client of
# libpgcoord's public API, like any other: its sources may include the
# public header, msgpack-c and system headers, and never a header of the
# agent (`pgcoordctl migrate` runs the agent binary) or the wire codec:
# what the CLI needs, the library must offer. Its build must not link
# agent code either.
set -euo pipefail

root=$1
dir="$root/client-lib/pgcoordctl"
if [[ ! -d $dir ]]; then
	echo "check-ctl-includes: $dir is missing" >&2
	exit 1
fi
bad=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](proto|agent|\.\.)/' \
	"$dir"/*.[ch] || true)
if [[ -n $bad ]]; then
	echo "check-ctl-includes: pgcoordctl includes internal headers:" >&2
	echo "$bad" >&2
	exit 1
fi
deps=$(sed -n "/^executable('pgcoordctl'/,/^)/p" "$root/client-lib/meson.build" |
	grep -E 'dependencies:' || true)
if grep -qE 'migrate_dep|proto_dep|agent' <<<"$deps"; then
	echo "check-ctl-includes: pgcoordctl links internal code: $deps" >&2
	exit 1
fi
echo "check-ctl-includes: $(ls "$dir"/*.[ch] | wc -l) files use only the public API"
