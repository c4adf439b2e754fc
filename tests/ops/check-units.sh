#!/usr/bin/env bash
# check-units.sh BUILD_DIR MAN_BUILT — the installed unit files pass
# `systemd-analyze verify`, and `systemd-analyze security --offline=true`
# rates the service at most 2.0 (lower is better).
#
# verify checks that ExecStart's binary exists and that the Documentation=
# man pages resolve, so the units are installed into a temporary root and
# checked with ExecStart pointing at the binary there and MANPATH at the man
# pages there; nothing else is changed, and nothing is started.
set -euo pipefail

build=$1
man_built=$2
max_exposure=2.0
if ! command -v systemd-analyze >/dev/null; then
	echo "systemd-analyze is not installed (scripts/install-deps installs it)"
	exit 77
fi
dest=$(mktemp -d "${TMPDIR:-/tmp}/pgcoord-units.XXXXXX")
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >/dev/null
eval "$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
opts = {o["name"]: o["value"] for o in json.load(sys.stdin)}
prefix = opts["prefix"]
for key in ("sbindir", "mandir"):
    v = opts[key]
    print("%s=%s" % (key, v if v.startswith("/") else prefix.rstrip("/") + "/" + v))
print("prefix=%s" % prefix)
')"
units=$dest/verify
mkdir "$units"
sed "s|^ExecStart=$sbindir/|ExecStart=$dest$sbindir/|" \
	"$dest$prefix/lib/systemd/system/pgcoord-agent.service" >"$units/pgcoord-agent.service"
cp "$dest$prefix/lib/systemd/system/pgcoord-agent.socket" "$units/"

man_flag=--man=no
if [[ $man_built == yes ]] && command -v man >/dev/null; then
	man_flag=--man=yes
	export MANPATH=$dest$mandir
fi
if ! out=$(systemd-analyze verify "$man_flag" "$units/pgcoord-agent.service" \
	"$units/pgcoord-agent.socket" 2>&1) || [[ -n $out ]]; then
	echo "systemd-analyze verify complains:" >&2
	echo "$out" >&2
	exit 1
fi
report=$(systemd-analyze security --offline=true "$units/pgcoord-agent.service" 2>&1) || true
score=$(sed -n 's/.*Overall exposure level for pgcoord-agent.service: \([0-9.]*\).*/\1/p' <<<"$report")
if [[ -z $score ]]; then
	echo "no exposure level in systemd-analyze security's report:" >&2
	echo "$report" >&2
	exit 1
fi
echo "systemd-analyze verify: clean; security exposure $score (at most $max_exposure)"
if ! awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }'; then
	grep '✗' <<<"$report" >&2 || true
	exit 1
fi
