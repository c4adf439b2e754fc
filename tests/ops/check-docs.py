#!/usr/bin/env python3
"""check-docs.py AGENT_BIN CTL_BIN SOURCE_ROOT — fails when something an
operator can use is undocumented:

- every agent option (from `pgcoord-agent --help`) must have a row in
  docs/CONFIGURATION.md's option table and an entry in pgcoord-agent.conf(5),
  both with the default `--check-config` reports;
- every pgcoordctl command and option (from `pgcoordctl --help`) must be in
  pgcoordctl(1);
- every function of <pgcoord/pgcoord.h> must be in libpgcoord(3);
- every relative link in README.md and docs/**/*.md must name a file that
  exists, and a link with #anchor into a Markdown file a heading that makes
  that anchor;
- no Markdown file of the project keeps a merge's conflict markers.
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
reference = read("docs/CONFIGURATION.md")
conf5 = read("man/pgcoord-agent.conf.5.scd")
for name in options:
    value = defaults.get(name)
    if value is None:
        problems.append("%s: not printed by --check-config" % name)
        continue
    value = value[1:-1] if value.startswith('"') else value
    row = re.search(r"^\| `%s` \|(.*)$" % re.escape(name), reference, re.M)
    if not row:
        problems.append("%s: no row in docs/CONFIGURATION.md's option table" % name)
    elif name not in ("replica_id", "database_url"):  # host-dependent / secret
        want = "`%s`" % value if value else "empty"
        if want not in row.group(1):
            problems.append("%s: docs/CONFIGURATION.md's row does not give the default %s" % (name, want))
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

# --- links --------------------------------------------------------------------
def anchors(markdown):
    """The anchors GitHub gives the headings of a Markdown text."""
    seen, out = {}, set()
    for title in re.findall(r"^#{1,6} +(.+?) *#*$", strip_code(markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def strip_code(markdown):
    return re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)


pages = ["README.md"] + sorted(
    os.path.relpath(os.path.join(d, f), root)
    for d, _, fs in os.walk(os.path.join(root, "docs")) for f in fs if f.endswith(".md"))
nlinks = 0
for page in pages:
    text = strip_code(read(page))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        nlinks += 1
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
        if not os.path.exists(os.path.join(root, dest)):
            problems.append("%s: link to %s: no such file" % (page, target))
        elif anchor and dest.endswith(".md") and anchor not in anchors(read(dest)):
            problems.append("%s: link to %s: no heading makes #%s" % (page, target, anchor))

# A merge resolved by hand can leave a marker line behind in prose, where
# no compiler sees it.
MARKER = re.compile(r"^(<<<<<<< |=======$|>>>>>>> )", re.M)
SKIP = {".git", "node_modules", "subprojects"}
nmarkdown = 0
for d, dirs, fs in os.walk(root):
    dirs[:] = [x for x in dirs if x not in SKIP and not x.startswith("build")]
    for f in fs:
        if f.endswith(".md"):
            rel = os.path.relpath(os.path.join(d, f), root)
            nmarkdown += 1
            for m in MARKER.finditer(read(rel)):
                line = read(rel).count("\n", 0, m.start()) + 1
                problems.append("%s:%d: a merge conflict marker" % (rel, line))

for p in problems:
    print("problem:", p)
print("checked %d agent options, %d pgcoordctl commands and %d flags, %d library functions, "
      "%d links in %d pages, conflict markers in %d Markdown files"
      % (len(options), len(commands), len(flags), len(functions), nlinks, len(pages), nmarkdown))
sys.exit(1 if problems else 0)
