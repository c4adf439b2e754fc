#!/usr/bin/env python3
"""Runs the conformance scenarios (scenarios.json, format in README.md)
with the Python client against real agents on a real database. Needs
tests/harness/with-postgres around it and PGCOORD_TEST_AGENT_BIN.

    run_python.py [--only NAME]... [scenarios.json]

Exit status 0 when every vector and scenario passed, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client-lib", "python", "src"))
sys.path.insert(0, HERE)

import pgcoord  # noqa: E402
from fleet import Agent, Database, Proxy  # noqa: E402


class Failed(AssertionError):
    pass


def substitute(value, saved: dict):
    """${name} in strings (whole string: the saved value itself)."""
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{(\w+)\}", value)
        if m:
            return saved[m.group(1)]
        return re.sub(r"\$\{(\w+)\}", lambda m: str(saved[m.group(1)]), value)
    if isinstance(value, list):
        return [substitute(v, saved) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, saved) for k, v in value.items()}
    return value


def match(want, got, where: str) -> None:
    """want is a subset of got; "$any", "$int", "$str", "$bool" match a type."""
    if want == "$any":
        return
    if want == "$int":
        if not isinstance(got, int) or isinstance(got, bool):
            raise Failed(f"{where}: expected an integer, got {got!r}")
        return
    if want == "$str":
        if not isinstance(got, str):
            raise Failed(f"{where}: expected a string, got {got!r}")
        return
    if want == "$bool":
        if not isinstance(got, bool):
            raise Failed(f"{where}: expected a bool, got {got!r}")
        return
    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise Failed(f"{where}: expected a map, got {got!r}")
        for k, v in want.items():
            if k.startswith("$"):
                continue
            if k not in got:
                raise Failed(f"{where}: no {k!r} in {got!r}")
            match(v, got[k], f"{where}.{k}")
        return
    if isinstance(want, list):
        if not isinstance(got, list) or len(want) != len(got):
            raise Failed(f"{where}: expected {want!r}, got {got!r}")
        for i, (w, g) in enumerate(zip(want, got)):
            match(w, g, f"{where}[{i}]")
        return
    if want != got or type(want) is bool and type(got) is not bool:
        raise Failed(f"{where}: expected {want!r}, got {got!r}")


def expect_error(step: dict, fn):
    """Runs fn; when the step names an error code, it must fail with it."""
    code = step.get("error")
    try:
        out = fn()
    except pgcoord.PgcoordError as e:
        if code is None:
            raise Failed(f"{step.get('op', 'call')}: unexpected error {e}") from None
        if e.code != code:
            raise Failed(f"{step.get('op', 'call')}: expected error {code}, got {e}") from None
        return e
    if code is not None:
        raise Failed(f"{step.get('op', 'call')}: expected error {code}, got {out!r}")
    return out


class Run:
    def __init__(self, db: Database, tmp: str, scenario: dict):
        self.db, self.tmp = db, tmp
        self.agents: dict[str, Agent] = {}
        self.proxies: dict[str, Proxy] = {}
        self.clients: dict[str, pgcoord.Client] = {}
        self.saved: dict = {}
        self.held = None
        self.background: dict[str, tuple[threading.Thread, dict]] = {}
        self.belief_ended: dict[tuple[str, str], int] = {}
        extra = ["--heartbeat-interval-ms", "200", "--session-ttl-ms", "1500",
                 "--lease-retry-ms", "100", "--janitor-interval-ms", "200"]
        for name in scenario.get("agents", []):
            self.agents[name] = Agent(db, f"{name}-{os.getpid()}-{len(os.listdir(tmp))}",
                                      tmp, extra)

    def close(self):
        for c in self.clients.values():
            c.close()
        for p in self.proxies.values():
            p.close()
        if self.held:
            self.held.release()
        for a in self.agents.values():
            a.stop()

    def step(self, s: dict) -> None:
        s = substitute(s, self.saved)
        op = s["op"]
        getattr(self, "op_" + op)(s)

    def client(self, s) -> pgcoord.Client:
        return self.clients[s["client"]]

    def save(self, s, obj) -> None:
        spec = s.get("save")
        if isinstance(spec, dict):
            for var, field in spec.items():
                self.saved[var] = obj[field] if isinstance(obj, dict) else getattr(obj, field)

    # --- ops ---------------------------------------------------------------------

    def op_connect(self, s):
        agent = self.agents[s["agent"]]
        path = agent.socket_path
        if s.get("proxy"):
            p = Proxy(path, os.path.join(self.tmp, f"proxy-{s['client']}.sock"))
            self.proxies[s["client"]] = p
            path = p.path
        self.clients[s["client"]] = pgcoord.Client(path, timeout=5.0, retry_for=10.0)

    def op_open_session(self, s):
        r = self.client(s).session_open(s.get("name"))
        if isinstance(s.get("save"), str):
            self.saved[s["save"]] = r.session

    def op_call(self, s):
        out = expect_error(s, lambda: self.client(s).call(s["method"], s.get("params")))
        if "result" in s:
            match(s["result"], out, s["method"])
        self.save(s, out)

    def _claim(self, s):
        c = self.client(s)
        kw = {}
        if "limit" in s:
            kw["limit"] = s["limit"]
        if "timeout_ms" in s:
            kw["timeout"] = s["timeout_ms"] / 1000
        if "retry_ms" in s:
            kw["retry_for"] = s["retry_ms"] / 1000
        return c.claim(s["id"], s["quotas"], **kw)

    def op_claim(self, s):
        if "background" in s:
            box: dict = {}

            def run():
                try:
                    box["out"] = self._claim(s)
                except BaseException as e:  # handed to the await step
                    box["err"] = e
            t = threading.Thread(target=run, daemon=True)
            t.start()
            self.background[s["background"]] = (t, box)
            return
        out = expect_error(s, lambda: self._claim(s))
        if "expect" in s:
            match(s["expect"], out.raw, "claim")
            least = s["expect"].get("$attempts_at_least")
            if least and out.attempts < least:
                raise Failed(f"claim: {out.attempts} attempt(s), expected at least {least}")
        if not isinstance(out, Exception):
            self.save(s, out.raw)

    def op_await(self, s):
        t, box = self.background[s["name"]]
        t.join(timeout=60)
        if t.is_alive():
            raise Failed(f"{s['name']} still running after 60 s")
        if "err" in box:
            e = box["err"]
            if s.get("error") != getattr(e, "code", None):
                raise Failed(f"await {s['name']}: expected error {s.get('error')}, got {e!r}")
            if "released" in s and s["released"] != "$any" and e.released != s["released"]:
                raise Failed(f"await {s['name']}: released is {e.released}")
        elif s.get("error"):
            raise Failed(f"await {s['name']}: expected error {s['error']}, got {box['out']!r}")

    def op_release(self, s):
        out = expect_error(s, lambda: self.client(s).release(s["id"]))
        if "expect" in s:
            match(s["expect"], out.raw, "release")

    def op_give_up(self, s):
        self.client(s).give_up(s["id"])

    def op_lease_acquire(self, s):
        out = expect_error(s, lambda: self.client(s).lease_acquire(
            s["name"], ttl_ms=s.get("ttl_ms"), wait=s.get("wait", False)))
        if "expect" in s:
            match(s["expect"], out.raw, "lease.acquire")
        self.save(s, out.raw)

    def op_lease_release(self, s):
        out = self.client(s).lease_release(s["name"])
        if "expect" in s:
            match(s["expect"], {"released": out}, "lease.release")

    def op_expect_leader(self, s):
        c, name, want = self.client(s), s["name"], s["leader"]
        end = time.monotonic() + s.get("within_ms", 0) / 1000
        while c.is_leader(name) != want:
            if time.monotonic() >= end:
                raise Failed(f"{s['client']}: is_leader({name}) is not {want} "
                             f"after {s.get('within_ms', 0)} ms")
            time.sleep(0.005)
        now = pgcoord.mono_ms()
        if not want:
            self.belief_ended.setdefault((s["client"], name), now)
        if want and "deadline_within_ms" in s:
            left = c.beliefs.deadline_ms(name) - now
            if not 0 < left <= s["deadline_within_ms"]:
                raise Failed(f"{s['client']}: belief deadline {left} ms ahead, expected "
                             f"within (0, {s['deadline_within_ms']}]")
        if want and "after_belief_of" in s:
            ended = self.belief_ended.get((s["after_belief_of"], name))
            if ended is None or ended > now:
                raise Failed(f"{s['client']} leads {name} while {s['after_belief_of']} "
                             "may still believe it does")

    def op_expect_session(self, s):
        c = self.client(s)
        if c.session is None or c.session.session != s["session"]:
            raise Failed(f"{s['client']}: session is {c.session}, expected {s['session']}")
        if "resumed" in s and c.session.resumed != s["resumed"]:
            raise Failed(f"{s['client']}: resumed is {c.session.resumed}")

    def op_sql(self, s):
        rows = self.db.psql(s["query"])
        # psql answers text: compare expected values (saved ints too) as text
        want = [[str(v) for v in row] for row in s.get("rows", [])]
        if "rows" in s and rows != want:
            raise Failed(f"sql {s['query']!r}: rows {rows}, expected {s['rows']}")

    def op_list_all(self, s):
        rows = self.client(s).list_all(s["method"], s.get("params"),
                                       page_size=s.get("page_size"))
        got = [str(r.raw.get(s["key"])) for r in rows]
        want = [row[0] for row in self.db.psql(s["query"])]
        if got != want:
            raise Failed(f"list_all {s['method']}: {len(got)} rows {got[:5]}..., "
                         f"the database has {len(want)}: {want[:5]}...")

    def op_sql_hold(self, s):
        self.held = self.db.hold(s["query"])

    def op_sql_release(self, s):
        self.held.release()
        self.held = None

    def op_signal(self, s):
        self.agents[s["agent"]].signal(getattr(signal, "SIG" + s["signal"]))

    def op_sleep(self, s):
        time.sleep(s["ms"] / 1000)

    def op_proxy_drop_reply(self, s):
        self.proxies[s["client"]].drop_reply(s["method"])

    def op_proxy_cut(self, s):
        self.proxies[s["client"]].cut()


def run_vectors(db, tmp, vectors) -> int:
    failures = 0
    run = Run(db, tmp, {"agents": ["v"]})
    try:
        c = pgcoord.Client(run.agents["v"].socket_path)
        run.clients["v"] = c
        for v in vectors:
            try:
                call = v["call"]
                out = expect_error(v, lambda: c.call(call["method"], call.get("params")))
                if "result" in v:
                    match(v["result"], out, call["method"])
                print(f"ok     vector: {v['name']}")
            except Failed as e:
                failures += 1
                print(f"FAILED vector: {v['name']}: {e}")
    finally:
        run.close()
    return failures


def run_scenario(db, tmp, sc) -> bool:
    started = time.monotonic()
    run = Run(db, tmp, sc)
    try:
        for i, s in enumerate(sc["steps"]):
            try:
                run.step(s)
            except Failed as e:
                raise Failed(f"step {i + 1} ({s['op']}): {e}") from None
        print(f"ok     scenario: {sc['name']} ({time.monotonic() - started:.1f} s)")
        return True
    except Exception as e:
        print(f"FAILED scenario: {sc['name']}: {e}")
        if not isinstance(e, Failed):
            traceback.print_exc()
        for a in run.agents.values():
            print(f"--- log of agent {a.replica_id} ---\n{a.log_tail()}")
        return False
    finally:
        run.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run only this scenario")
    ap.add_argument("file", nargs="?", default=os.path.join(HERE, "scenarios.json"))
    args = ap.parse_args(argv)
    with open(args.file) as f:
        spec = json.load(f)
    if spec.get("format") != 1:
        print(f"unknown scenario format {spec.get('format')!r}")
        return 1
    tmp = tempfile.mkdtemp(prefix="py-conf.", dir=os.environ.get("PGCOORD_TEST_TMP"))
    db = Database()
    failures = 0
    try:
        if not args.only:
            failures += run_vectors(db, tmp, spec["vectors"])
        for sc in spec["scenarios"]:
            if args.only and sc["name"] not in args.only:
                continue
            failures += not run_scenario(db, tmp, sc)
    finally:
        db.close()
    print(f"{'FAILED' if failures else 'passed'}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
