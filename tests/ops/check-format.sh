#!/usr/bin/env bash
# tests/ops/check-format.sh SOURCE_ROOT — every C file of the project is as
# .clang-format says: `clang-format --dry-run --Werror` over the tracked
# sources, so a reviewer never has to comment on layout.
#
# Skips (exit 77) when clang-format is missing; scripts/install-deps installs
# it, so CI always runs it. clang-format 14 (Debian 12's) is the reference:
# other versions may format a few constructs differently.
set -euo pipefail

root=$1
if ! command -v clang-format >/dev/null; then
	echo "check-format: clang-format is not installed (scripts/install-deps installs it)"
	exit 77
fi

cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -t files < <(git ls-files -- '*.c' '*.h')
else
	# An unpacked tarball: every C file outside build trees.
	mapfile -t files < <(find agent proto client-lib tests -name '*.[ch]' -not -path '*/node_modules/*')
fi
if [[ ${#files[@]} -eq 0 ]]; then
	echo "check-format: no C sources found under $root" >&2
	exit 1
fi

out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1) || {
	echo "$out" | grep -E '^[^ ].*(warning|error):' | cut -d: -f1 | sort -u |
		sed 's/^/check-format: not formatted: /' >&2
	echo "check-format: run: clang-format -i FILE (version $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1))" >&2
	exit 1
}
echo "check-format: ${#files[@]} files formatted"
