#!/usr/bin/env python3
"""check-dashboards.py AGENT_BIN CTL_BIN SOURCE_ROOT — under with-postgres:
the Grafana dashboard (ops/grafana/pgcoord-dashboard.json) is valid JSON
whose PromQL parses, and every metric name that it and the alert rules
(ops/prometheus/pgcoord-alerts.yml) reference is one a real agent exports.

It starts an agent on the test cluster, makes it answer a few calls (a
quota set, an admitted and a denied claim) so that the series that appear
only once used are there, and reads its /metrics until every referenced
name shows or 20 s pass. `up` (Prometheus's own series of a scrape) is the
one name allowed that the agent does not export. The PromQL syntax check
needs promtool (Debian's prometheus package); without it only the names
are checked.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

agent, ctl, root = sys.argv[1:4]
problems = []
rules_path = os.path.join(root, "ops", "prometheus", "pgcoord-alerts.yml")
dash_path = os.path.join(root, "ops", "grafana", "pgcoord-dashboard.json")
FOREIGN = {"up"}  # Prometheus's own, per scrape target

# --- the PromQL the two files hold ---------------------------------------------
with open(rules_path, encoding="utf-8") as f:
    rules_text = f.read()
rules = yaml.safe_load(rules_text)
rule_exprs = [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]

with open(dash_path, encoding="utf-8") as f:
    dash_text = f.read()
try:
    dash = json.loads(dash_text)
except ValueError as e:
    sys.exit("%s is not valid JSON: %s" % (dash_path, e))
for key in ("title", "uid", "panels", "templating", "schemaVersion"):
    if key not in dash:
        problems.append("dashboard: no %r" % key)

dash_exprs = []
ids = set()


def walk_panels(panels):
    for p in panels:
        if p.get("id") in ids:
            problems.append("dashboard: panel id %s used twice" % p.get("id"))
        ids.add(p.get("id"))
        if p.get("type") != "row" and not p.get("targets"):
            problems.append("dashboard: panel %r has no query" % p.get("title"))
        for t in p.get("targets", []):
            dash_exprs.append(("panel %r" % p.get("title"), t["expr"]))
        walk_panels(p.get("panels", []))


walk_panels(dash.get("panels", []))
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    m = re.match(r"label_values\((\w+)\s*,\s*\w+\)$", q or "")
    if m:
        dash_exprs.append(("variable %r" % v["name"], m.group(1)))
    elif v.get("type") == "query":
        problems.append("dashboard: variable %r: query %r is not label_values(METRIC, LABEL)"
                        % (v["name"], q))


def grafana_to_promql(expr):
    """Grafana's variables, as Prometheus would see them once substituted."""
    return expr.replace("$__rate_interval", "5m").replace("$instance", ".*")


# The dashboard's expressions must parse: promtool checks them as recording rules.
promtool = shutil.which("promtool")
if promtool:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
            {"record": "dashboard:expr_%d" % i, "expr": grafana_to_promql(e)}
            for i, (_, e) in enumerate(dash_exprs)]}]}, f)
        tmp_rules = f.name
    r = subprocess.run([promtool, "check", "rules", tmp_rules], capture_output=True, text=True)
    os.unlink(tmp_rules)
    if r.returncode != 0:
        problems.append("dashboard: promtool rejects a PromQL expression:\n" + r.stdout + r.stderr)
else:
    print("promtool is not installed: the dashboard's PromQL syntax is not checked")

# Metric names in an expression: identifiers outside strings, label matchers,
# ranges and by/without/on/ignoring lists, that are not functions or keywords.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr):
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        if word.lower() in KEYWORDS or re.match(r"\s*\(", e[m.end():]):
            continue
        if re.match(r"\d", e[m.start() - 1:m.start()] if m.start() else ""):
            continue  # a duration or number suffix such as 5m
        names.add(word)
    return names


referenced = {}
for where, e in [("alert %s" % a, x) for a, x in rule_exprs] + dash_exprs:
    for name in metric_names(grafana_to_promql(e)):
        referenced.setdefault(name, where)
# Names mentioned anywhere else (descriptions, legends) must be real too.
for text, what in ((rules_text, "the alert rules"), (dash_text, "the dashboard")):
    for name in re.findall(r"\bpgcoord_[a-z0-9_]+\b", text):
        referenced.setdefault(name, what)
for name in sorted(n for n in referenced if not n.startswith("pgcoord_") and n not in FOREIGN):
    problems.append("%s references %r, which is not an agent metric" % (referenced[name], name))

# --- a real agent's /metrics -----------------------------------------------------
tmp = os.environ["PGCOORD_TEST_TMP"]
pg = "host=%s port=%s" % (os.environ["PGCOORD_TEST_PGHOST"], os.environ["PGCOORD_TEST_PGPORT"])
role = os.environ["PGCOORD_TEST_RUNTIME_ROLE"]
env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "%s user=postgres dbname=postgres" % pg,
                "-c", "CREATE DATABASE dashboards"], check=True, env=env)
subprocess.run([agent, "migrate", "--database-url", "%s user=postgres dbname=dashboards" % pg,
                "--runtime-role", role], check=True, env=env, stdout=subprocess.DEVNULL)
sock = os.path.join(tmp, "dashboards.sock")
log_path = os.path.join(tmp, "dashboards-agent.log")
log = open(log_path, "w")
proc = subprocess.Popen([agent, "--config", "/dev/null",
                         "--database-url", "%s user=%s dbname=dashboards" % (pg, role),
                         "--socket-path", sock, "--replica-id", "dashboards",
                         "--metrics-listen", "127.0.0.1:0"],
                        stdout=log, stderr=log, env=env)


def agent_log():
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def ctl_run(*args):
    return subprocess.run([ctl, "--socket", sock] + list(args), capture_output=True, text=True,
                          env=env)


exported = set()
try:
    deadline = time.monotonic() + 20
    port = None
    while port is None:
        m = re.search(r"metrics_listen=127\.0\.0\.1:(\d+)", agent_log())
        if m:
            port = int(m.group(1))
        elif proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("the agent did not start its metrics listener:\n" + agent_log())
        else:
            time.sleep(0.05)
    while ctl_run("status").returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("the agent did not start serving:\n" + agent_log())
        time.sleep(0.1)
    for args, want in ((["quota", "set", "dash-q", "1"], 0), (["claim", "job-1", "--quota", "dash-q"], 0),
                       (["claim", "job-2", "--quota", "dash-q"], 1)):
        r = ctl_run(*args)
        if r.returncode != want:
            sys.exit("pgcoordctl %s exited %d (want %d): %s%s"
                     % (" ".join(args), r.returncode, want, r.stdout, r.stderr))
    wanted = {n for n in referenced if n.startswith("pgcoord_")}
    while True:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as resp:
            body = resp.read().decode()
        exported = set(re.findall(r"^# TYPE (\S+) ", body, re.M))
        exported |= set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", body, re.M))
        if wanted <= exported or time.monotonic() > deadline:
            break
        time.sleep(0.25)
finally:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()

for name in sorted(n for n in referenced if n.startswith("pgcoord_") and n not in exported):
    problems.append("%s references %s, which the agent's /metrics does not have"
                    % (referenced[name], name))
for p in problems:
    print("problem:", p)
families = set(re.findall(r"^# TYPE (\S+) ", body, re.M))
unused = sorted(f for f in families if not any(n == f or n.startswith(f + "_") for n in referenced))
print("checked %d alert rules and %d dashboard queries: %d metric names referenced, all among "
      "the %d families a running agent exports" % (len(rule_exprs), len(dash_exprs),
                                                   len(referenced), len(families))
      if not problems else "%d problem(s)" % len(problems))
if unused:
    print("exported but on neither the dashboard nor an alert: " + ", ".join(unused))
sys.exit(1 if problems else 0)
