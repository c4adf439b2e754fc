#!/usr/bin/env python3
"""check-alerts.py SOURCE_ROOT — the alert rules (ops/prometheus/pgcoord-alerts.yml)
pass `promtool check rules`, every rule has a summary and a description and
fires in tests/ops/pgcoord-alerts.test.yml, and `promtool test rules` passes
that file (each rule fires on its input series, with the labels and the
rendered annotations expected, and nothing else fires).

Skips (exit 77) when promtool is missing: scripts/install-deps installs
Debian's prometheus package, which has it, so CI always runs this.
"""
import os
import shutil
import subprocess
import sys

import yaml

root = sys.argv[1]
promtool = shutil.which("promtool")
if not promtool:
    print("promtool is not installed (scripts/install-deps installs the prometheus package)")
    sys.exit(77)
rules_path = os.path.join(root, "ops", "prometheus", "pgcoord-alerts.yml")
tests_path = os.path.join(root, "tests", "ops", "pgcoord-alerts.test.yml")
problems = []

with open(rules_path, encoding="utf-8") as f:
    rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
with open(tests_path, encoding="utf-8") as f:
    tests = yaml.safe_load(f)["tests"]
fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])
         if t.get("exp_alerts")}
for r in rules:
    name = r.get("alert")
    if not name:
        problems.append("a rule without `alert:` (recording rules belong elsewhere): %r" % r)
        continue
    for key in ("summary", "description"):
        if not r.get("annotations", {}).get(key):
            problems.append("%s: no %s" % (name, key))
    if not r.get("labels", {}).get("severity") in ("warning", "critical"):
        problems.append("%s: severity is not warning or critical" % name)
    if name not in fired:
        problems.append("%s: no test in %s where it fires" % (name, os.path.basename(tests_path)))

for argv in (["check", "rules", rules_path], ["test", "rules", tests_path]):
    r = subprocess.run([promtool] + argv, capture_output=True, text=True)
    if r.returncode != 0:
        problems.append("promtool %s failed:\n%s%s" % (" ".join(argv[:2]), r.stdout, r.stderr))

for p in problems:
    print("problem:", p)
if not problems:
    print("%d alert rules: promtool check and test pass, each fires in a test" % len(rules))
sys.exit(1 if problems else 0)
