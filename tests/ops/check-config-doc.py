#!/usr/bin/env python3
"""check-config-doc.py AGENT_BIN SOURCE_ROOT [--write] — docs/CONFIGURATION.md's
option table is generated from agent/config.c's config_options[] (by
`pgcoord-agent --help-config-markdown`). Without --write it fails when the
committed table differs from what the binary prints; with --write it puts
the printed table in place (`meson compile -C build config-doc`).
"""
import difflib
import os
import subprocess
import sys

REGENERATE = "meson compile -C build config-doc"
BEGIN = "<!-- BEGIN generated option table:"
END = "<!-- END generated option table -->"

agent, root = sys.argv[1:3]
write = sys.argv[3:] == ["--write"]
path = os.path.join(root, "docs", "CONFIGURATION.md")

table = subprocess.run([agent, "--help-config-markdown"], capture_output=True, text=True,
                       check=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout
with open(path, encoding="utf-8") as f:
    text = f.read()
start = text.find(BEGIN)
end = text.find(END)
if start < 0 or end < start:
    sys.exit("docs/CONFIGURATION.md: no %r ... %r markers around the option table" % (BEGIN, END))
start = text.index("\n", start) + 1  # the table begins after the marker's line
committed = text[start:end]

if write:
    if committed != table:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:start] + table + text[end:])
        print("docs/CONFIGURATION.md: option table regenerated")
    else:
        print("docs/CONFIGURATION.md: option table already up to date")
    sys.exit(0)

if committed != table:
    sys.stdout.writelines(difflib.unified_diff(
        committed.splitlines(True), table.splitlines(True),
        "docs/CONFIGURATION.md (committed)", "pgcoord-agent --help-config-markdown"))
    print("\ndocs/CONFIGURATION.md's option table differs from agent/config.c's "
          "config_options[]; regenerate it with:\n    %s" % REGENERATE)
    sys.exit(1)
print("docs/CONFIGURATION.md's option table matches config_options[] (%d lines)"
      % table.count("\n"))
