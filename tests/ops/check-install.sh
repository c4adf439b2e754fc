#!/usr/bin/env bash
# check-install.sh BUILD_DIR MAN_BUILT — `meson install --destdir` into a
# temporary root, then checks what landed where: the binaries (and that they
# run from there), the library with its soname links, the header, the
# pkg-config file (a program compiles and links against the installed
# copy), the unit files, the sysusers file, the example configuration (which
# must pass --check-config), the Python client and, when scdoc built them,
# the man pages.
set -euo pipefail

build=$1
man_built=$2
dest=$(mktemp -d "${TMPDIR:-/tmp}/pgcoord-install.XXXXXX")
trap 'rm -rf "$dest"' EXIT
fail=0
bad() {
	echo "check-install: $*" >&2
	fail=1
}

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >/dev/null

# The directories this build was configured with, absolute.
eval "$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
opts = {o["name"]: o["value"] for o in json.load(sys.stdin)}
prefix = opts["prefix"]
for key in ("bindir", "sbindir", "libdir", "includedir", "datadir", "mandir"):
    v = opts[key]
    print("%s=%s" % (key, v if v.startswith("/") else prefix.rstrip("/") + "/" + v))
print("prefix=%s" % prefix)
san = opts.get("b_sanitize", "none")
print("sanitize=%s" % ("" if san in ("none", "", []) else "-fsanitize=" + (",".join(san) if isinstance(san, list) else san)))
')"

need() { # need TEST PATH...
	local t=$1
	shift
	for p in "$@"; do
		test "$t" "$dest$p" || bad "missing $p (test $t) under DESTDIR"
	done
}

need -x "$bindir/pgcoordctl" "$sbindir/pgcoord-agent"
need -f "$libdir/libpgcoord.so.0.1.0" "$includedir/pgcoord/pgcoord.h" \
	"$libdir/pkgconfig/pgcoord.pc" "$datadir/doc/pgcoord/agent.conf.example"
need -L "$libdir/libpgcoord.so.0" "$libdir/libpgcoord.so"
need -f "$prefix/lib/systemd/system/pgcoord-agent.service" \
	"$prefix/lib/systemd/system/pgcoord-agent.socket" "$prefix/lib/sysusers.d/pgcoord.conf"
if [[ $man_built == yes ]]; then
	need -f "$mandir/man8/pgcoord-agent.8" "$mandir/man5/pgcoord-agent.conf.5" \
		"$mandir/man1/pgcoordctl.1" "$mandir/man3/libpgcoord.3"
	for page in "$dest$mandir"/man?/*; do
		head -c 200 "$page" | grep -q '^\.TH' || bad "$page is not a roff man page"
	done
fi
[[ $(readlink "$dest$libdir/libpgcoord.so.0") == libpgcoord.so.0.1.0 ]] ||
	bad "libpgcoord.so.0 does not point at libpgcoord.so.0.1.0"
grep -q "^ExecStart=$sbindir/pgcoord-agent " "$dest$prefix/lib/systemd/system/pgcoord-agent.service" ||
	bad "the unit's ExecStart is not $sbindir/pgcoord-agent"

# The installed programs run from there (no build-tree rpath needed beyond the
# installed library).
"$dest$sbindir/pgcoord-agent" --version >/dev/null || bad "the installed agent does not run"
LD_LIBRARY_PATH=$dest$libdir "$dest$bindir/pgcoordctl" --version >/dev/null ||
	bad "the installed pgcoordctl does not run against the installed library"
# The example configuration is valid as shipped.
env -i PATH="$PATH" "$dest$sbindir/pgcoord-agent" --check-config \
	--config "$dest$datadir/doc/pgcoord/agent.conf.example" >/dev/null ||
	bad "agent.conf.example does not pass --check-config"

# A client builds against the installed header and library via pkg-config.
if command -v cc >/dev/null && command -v pkg-config >/dev/null; then
	cat >"$dest/client.c" <<'C'
#include <pgcoord/pgcoord.h>
#include <stdio.h>
int main(void)
{
	puts(pgcoord_strerror(PGCOORD_E_CONNECT));
	return pgcoord_err_retryable(PGCOORD_E_UNAVAILABLE) ? 0 : 1;
}
C
	export PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_LIBDIR=$dest$libdir/pkgconfig
	if ! flags=$(pkg-config --cflags --libs pgcoord); then
		bad "pkg-config does not find pgcoord.pc"
	# a sanitized library needs a sanitized program (the runtime comes first)
	elif ! cc $sanitize -o "$dest/client" "$dest/client.c" $flags 2>"$dest/cc.log"; then
		bad "a client does not build with \`pkg-config --cflags --libs pgcoord\`: $(cat "$dest/cc.log")"
	elif ! LD_LIBRARY_PATH=$dest$libdir "$dest/client" >/dev/null; then
		bad "a client linked against the installed library does not run"
	fi
fi

# The Python client, where the system's python3 finds pure modules.
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import msgpack' 2>/dev/null; then
	pydir=$(find "$dest" -path '*/pgcoord/client.py' -printf '%h\n' | head -n 1)
	if [[ -z $pydir ]]; then
		bad "the Python package pgcoord is not installed"
	elif ! PYTHONPATH=$(dirname "$pydir") /usr/bin/python3 -B -c \
		'import pgcoord, sys; sys.exit(not hasattr(pgcoord, "Client"))'; then
		bad "the installed Python package pgcoord does not import"
	fi
fi

if [[ $fail -eq 0 ]]; then
	echo "check-install: layout under $prefix as expected ($(find "$dest" -type f | wc -l) files)"
fi
exit $fail
