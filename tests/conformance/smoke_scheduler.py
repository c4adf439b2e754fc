#!/usr/bin/env python3
"""Smoke test of client-lib/python/examples/scheduler.py against a real
agent: permit-cycle's JSON, two replicas sharing per-tenant quotas with a
connector that drops, and the recovery of a dead predecessor's records.
Run under tests/harness/with-postgres."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client-lib", "python", "src"))
sys.path.insert(0, HERE)

import pgcoord  # noqa: E402
from fleet import Agent, Database  # noqa: E402

EXAMPLE = os.path.join(ROOT, "client-lib", "python", "examples", "scheduler.py")


def scheduler(sock: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, EXAMPLE, "--socket", sock, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"scheduler exited {p.returncode}: {err}{out}")
    return json.loads(out)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)
    print(f"ok     {what}")


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="py-sched.", dir=os.environ.get("PGCOORD_TEST_TMP"))
    db = Database()
    # No grace: a client that goes away leaves a dead session at once.
    agent = Agent(db, f"sched-{os.getpid()}", tmp,
                  ["--session-grace-ms", "0", "--heartbeat-interval-ms", "200",
                   "--lease-retry-ms", "100"])
    try:
        out = finish(scheduler(agent.socket_path, "permit-cycle", "--id", "pc-1"))
        check(out["claim"]["status"] == "admitted" and out["claim"]["id"] == "pc-1" and
              out["release"] == {"released": True, "state": "released"} and
              out["quota"] == {"key": "permit-cycle", "limit": 1, "in_flight": 0},
              f"permit-cycle prints the claim and the release: {out}")
        check(db.psql("SELECT state FROM pgcoord.permits WHERE id = 'pc-1'") == [["released"]],
              "permit-cycle's permit is released in the database")

        # A predecessor that died mid-job: a record and its held permit.
        with pgcoord.Client(agent.socket_path) as dead:
            dead.session_open("scheduler old")
            dead.claim("old-job", {"tenant-0": 1}, limit=2)
            dead.record_put("scheduler.job", "old-job", "dispatching", permit="old-job")

        a = scheduler(agent.socket_path, "run", "--replica", "r1", "--jobs", "20",
                      "--drop-every", "5")
        b = scheduler(agent.socket_path, "run", "--replica", "r2", "--jobs", "20",
                      "--drop-every", "5")
        ra, rb = finish(a), finish(b)
        check("old-job" in ra["recovered"] + rb["recovered"],
              "a replica recovered its dead predecessor's record")
        check(len(ra["completed"]) + len(rb["completed"]) > 0 and
              len(ra["uncertain"]) + len(rb["uncertain"]) > 0,
              f"jobs completed ({len(ra['completed'])}+{len(rb['completed'])}) and "
              f"dropped dispatches were marked uncertain "
              f"({len(ra['uncertain'])}+{len(rb['uncertain'])})")
        uncertain = set(ra["uncertain"] + rb["uncertain"])
        reconciled = set(ra["reconciled"] + rb["reconciled"])
        check(uncertain <= reconciled,
              f"the leader reconciled every uncertain permit ({len(reconciled)})")
        check(db.psql("SELECT count(*) FROM pgcoord.permits WHERE state <> 'released'") ==
              [["0"]] and
              db.psql("SELECT coalesce(sum(in_flight), 0) FROM pgcoord.quotas") == [["0"]],
              "every permit ended released and nothing stays in flight")
        check(db.psql("SELECT count(*) FROM pgcoord.records WHERE settled_at IS NULL") ==
              [["0"]], "every record is settled")
        with pgcoord.Client(agent.socket_path) as c:
            check(c.permit_check().ok is True, "permit.check finds conservation intact")
            check(any(a.live and a.replica_id == agent.replica_id for a in c.fleet_agents()),
                  "fleet_agents lists the agent, live")
            events = [e.event for e in c.permit_history("pc-1")]
            check(events == ["admitted", "released"],
                  f"permit_history of permit-cycle's id: {events}")
        # The quota held at every admission: the audit never shows more
        # admitted than the limit at once for any tenant.
        over = db.psql("""
            SELECT key FROM (
              SELECT key, sum(delta) OVER (PARTITION BY key ORDER BY id) AS running
              FROM pgcoord.permit_events WHERE key LIKE 'tenant-%') s
            WHERE running > 2 LIMIT 1""")
        check(over == [], "no tenant ever had more than its limit in flight")
        asyncio.run(asyncio.wait_for(async_client(agent.socket_path, db), 30))
    finally:
        agent.stop()
        db.close()
    return 0


async def async_client(sock: str, db: Database) -> None:
    """The asyncio client does the same work against the real agent."""
    async with await pgcoord.AsyncClient.connect(sock) as c:
        s = await c.session_open("async")
        async with c.lease("async-lease", ttl_ms=3000) as lead:
            check(lead.valid and 0 < lead.deadline_ms - pgcoord.mono_ms() <= 3000,
                  "the asyncio client leads with a deadline within the ttl")
            check(db.psql("SELECT holder_session FROM pgcoord.leases "
                          "WHERE name = 'async-lease'") == [[str(s.session)]],
                  "the database shows the asyncio client's session as the holder")
        check(not c.is_leader("async-lease"), "leaving the lease context ends the belief")
        async with c.permit("async-job", {"async-q": 1}, limit=1) as p:
            check(p.status == "admitted", "the asyncio client's permit is admitted")
            try:
                async with c.permit("async-job-2", {"async-q": 1}):
                    check(False, "a second permit over the limit")
            except pgcoord.ClaimDenied as e:
                check(e.claim.in_flight == 1, "the asyncio client's second claim is denied")
        check(db.psql("SELECT state FROM pgcoord.permits WHERE id = 'async-job'") ==
              [["released"]], "leaving the permit context released it")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED {e}")
        sys.exit(1)
