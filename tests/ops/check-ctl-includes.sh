#!/usr/bin/env bash
# tests/ops/check-ctl-includes.sh SOURCE_ROOT — pgcoordctl is a client of
# libpgcoord's public API, like any other: its sources may include the
# public header, msgpack-c and system headers, and of the project's own
# only the migration runner's (agent/migrate.h, a library of its own that
# `pgcoordctl migrate` needs without an agent). Never the wire codec or
# another agent header: what the CLI needs, the library must offer.
set -euo pipefail

root=$1
dir="$root/client-lib/pgcoordctl"
if [[ ! -d $dir ]]; then
	echo "check-ctl-includes: $dir is missing" >&2
	exit 1
fi
bad=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](proto|agent|\.\.)/' \
	"$dir"/*.[ch] | grep -v '"agent/migrate.h"' || true)
if [[ -n $bad ]]; then
	echo "check-ctl-includes: pgcoordctl includes internal headers:" >&2
	echo "$bad" >&2
	exit 1
fi
echo "check-ctl-includes: $(ls "$dir"/*.[ch] | wc -l) files use only the public API"
