#!/usr/bin/env python3
"""check-docs.py AGENT_BIN CTL_BIN SOURCE_ROOT — fails when something an
operator can use is undocumented:

- every agent option (from `pgcoord-agent --help`) must have a row in
  README.md's option table and an entry in pgcoord-agent.conf(5), both with
  the default `--check-config` reports;
- every pgcoordctl command and option (from `pgcoordctl --help`) must be in
  pgcoordctl(1);
- every function of <pgcoord/pgcoord.h> must be in libpgcoord(3).
"""
import os
import re
import subprocess
import sys

agent, ctl, root = sys.argv[1:4]
problems = []


def run(*argv):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout


def read(rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


# --- agent options -----------------------------------------------------------
options = [m.replace("-", "_") for m in re.findall(r"^  --([a-z0-9-]+) ", run(agent, "--help"), re.M)]
if len(options) < 10:
    problems.append("found only %d options in `pgcoord-agent --help`" % len(options))
defaults = dict(re.findall(r"^([a-z0-9_]+) = (.*)$",
                           run(agent, "--check-config", "--config", "/dev/null"), re.M))
readme = read("README.md")
conf5 = read("man/pgcoord-agent.conf.5.scd")
for name in options:
    value = defaults.get(name)
    if value is None:
        problems.append("%s: not printed by --check-config" % name)
        continue
    value = value[1:-1] if value.startswith('"') else value
    row = re.search(r"^\| `%s` \|(.*)$" % re.escape(name), readme, re.M)
    if not row:
        problems.append("%s: no row in README.md's option table" % name)
    elif name not in ("replica_id", "database_url"):  # host-dependent / secret
        want = "`%s`" % value if value else "empty"
        if want not in row.group(1):
            problems.append("%s: README.md's row does not give the default %s" % (name, want))
    entry = re.search(r"^\*%s\* = .*\n\tDefault: ([^.]*(?:\.[0-9a-z/][^.]*)*)\." % re.escape(name),
                      conf5, re.M)
    if not entry:
        problems.append("%s: no entry in man/pgcoord-agent.conf.5.scd" % name)
    elif name not in ("replica_id", "database_url"):
        want = '"%s"' % value if value else "empty"
        if entry.group(1) != want:
            problems.append("%s: pgcoord-agent.conf(5) says the default is %s, the agent %s"
                            % (name, entry.group(1), want))

# --- pgcoordctl --------------------------------------------------------------
ctl_help = run(ctl, "--help")
ctl1 = read("man/pgcoordctl.1.scd")
commands_part = ctl_help.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
commands = re.findall(r"^  ([a-z][a-z-]*)", commands_part, re.M)
flags = re.findall(r"^ {2,4}(?:-h, )?--([a-z][a-z-]*)", ctl_help, re.M)
if len(commands) < 5:
    problems.append("found only %d commands in `pgcoordctl --help`" % len(commands))
for c in commands:
    if not re.search(r"^\*%s\*" % re.escape(c), ctl1, re.M):
        problems.append("pgcoordctl %s: not documented in man/pgcoordctl.1.scd" % c)
for f in flags:
    if "*--%s*" % f not in ctl1:
        problems.append("pgcoordctl --%s: not documented in man/pgcoordctl.1.scd" % f)

# --- libpgcoord --------------------------------------------------------------
header = read("client-lib/include/pgcoord/pgcoord.h")
lib3 = read("man/libpgcoord.3.scd")
functions = sorted(set(re.findall(r"\b(pgcoord_[a-z0-9_]+)\s*\(", header)))
for fn in functions:
    if not re.search(r"\b%s\b" % re.escape(fn), lib3):
        problems.append("%s(): not documented in man/libpgcoord.3.scd" % fn)

for p in problems:
    print("undocumented:", p)
print("checked %d agent options, %d pgcoordctl commands and %d flags, %d library functions"
      % (len(options), len(commands), len(flags), len(functions)))
sys.exit(1 if problems else 0)
