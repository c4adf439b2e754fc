#!/usr/bin/env python3
"""Smoke test of client-lib/python/examples/scheduler.py against a real
agent: permit-cycle's JSON, two replicas sharing per-tenant quotas with a
connector that drops, and the recovery of a dead predecessor's records.
Run under tests/harness/with-postgres."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client-lib", "python", "src"))
sys.path.insert(0, HERE)

import pgcoord  # noqa: E402
from fleet import Agent, Database  # noqa: E402

EXAMPLE = os.path.join(ROOT, "client-lib", "python", "examples", "scheduler.py")


def scheduler(sock: str, *args: str) -> subprocess.Popen:
    # stderr to a file, read while it runs (see stderr_of)
    err = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen([sys.executable, EXAMPLE, "--socket", sock, *args],
                         stdout=subprocess.PIPE, stderr=err, text=True)
    p.err_file = err  # type: ignore[attr-defined]
    return p


def stderr_of(p: subprocess.Popen) -> str:
    p.err_file.seek(0)  # type: ignore[attr-defined]
    return p.err_file.read()  # type: ignore[attr-defined]


def finish(p: subprocess.Popen) -> dict:
    out, _ = p.communicate(timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"scheduler exited {p.returncode}: {stderr_of(p)}{out}")
    return json.loads(out)


def wait_until(cond, what: str, bound_s: float = 30) -> None:
    """Waits for cond() to hold, for at most bound_s: a bound on a hang,
    not a guess at how long anything takes."""
    end = time.monotonic() + bound_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: still not so after {bound_s:g} s")
        time.sleep(0.05)


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
            old = dead.session_open("scheduler old").session
            dead.claim("old-job", {"tenant-0": 1}, limit=2)
            dead.record_put("scheduler.job", "old-job", "dispatching", permit="old-job")

        # Another that dies only once the successors are at work.
        late_c = pgcoord.Client(agent.socket_path)
        late = late_c.session_open("scheduler late").session
        late_c.claim("late-job", {"tenant-1": 1}, limit=2)
        late_c.record_put("scheduler.job", "late-job", "dispatching", permit="late-job")

        # The successors start at once: the first dead session may still be
        # live when they boot (the agent ends it at its next heartbeat), so
        # they must take a record when its owner dies, not only at boot.
        a = scheduler(agent.socket_path, "run", "--replica", "r1", "--jobs", "20",
                      "--drop-every", "5", "--stay")
        b = scheduler(agent.socket_path, "run", "--replica", "r2", "--jobs", "20",
                      "--drop-every", "5", "--stay")
        # Each recovers at boot before its first job: once both have put
        # one, the late predecessor dies after every boot recovery.
        wait_until(lambda: db.psql("SELECT count(DISTINCT split_part(key, '-', 1)) FROM "
                                   "pgcoord.records WHERE key ~ '^r[12]-job-'") == [["2"]],
                   "both replicas at work")
        late_c.close()
        adopted = ("SELECT r.key, r.state, r.adopted_from, s.name FROM pgcoord.records r "
                   "JOIN pgcoord.sessions s ON s.id = r.owner_session "
                   "WHERE r.kind = 'scheduler.job' AND r.key IN ('old-job', 'late-job') "
                   "AND r.terminal ORDER BY r.key DESC")
        wait_until(lambda: len(db.psql(adopted)) == 2, "both dead records settled by successors")
        for p in (a, b):
            wait_until(lambda: "following the records" in stderr_of(p) or p.poll() is not None,
                       "the replicas dispatched their jobs", 60)
            p.send_signal(signal.SIGTERM)
        ra, rb = finish(a), finish(b)
        got = db.psql(adopted)
        successors = ("scheduler r1", "scheduler r2")
        check(len(got) == 2 and
              got[0][:3] == ["old-job", "abandoned", str(old)] and got[0][3] in successors and
              got[1][:3] == ["late-job", "abandoned", str(late)] and got[1][3] in successors,
              f"successors adopted both dead predecessors' records and settled them: {got}")
        recovered = ra["recovered"] + rb["recovered"]
        check(sorted(recovered) == ["late-job", "old-job"] and
              db.psql("SELECT key, count(*) FROM pgcoord.record_events WHERE event = 'adopt' "
                      "GROUP BY key ORDER BY key") == [["late-job", "1"], ["old-job", "1"]],
              "a replica recovered its dead predecessor's record: each exactly once, nothing "
              f"else adopted, also one whose owner died after the replicas booted (r1 {ra['recovered']}, "
              f"r2 {rb['recovered']})")
        check(db.psql(f"SELECT count(*) FROM pgcoord.sessions WHERE id IN ({old}, {late}) "
                      "AND closed_at IS NOT NULL") == [["2"]],
              "the dead predecessors' sessions are closed")
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
        waiting_claims(agent.socket_path, db)
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


def waiting_claims(sock: str, db: Database) -> None:
    """claim_wait against the real agent: queued then admitted, expired,
    cancelled by the caller; the database agrees."""
    with pgcoord.Client(sock) as holder, pgcoord.Client(sock) as waiter:
        holder.session_open("wait-holder")
        sid = waiter.session_open("wait-waiter").session
        holder.claim("pw-holder", {"py-wq": 1}, limit=1)
        queued = "SELECT count(*) FROM pgcoord.waiters WHERE id = '{}' AND state = 'queued'"
        got: list = []
        t = threading.Thread(target=lambda: got.append(waiter.claim_wait("pw-1", {"py-wq": 1}, 20000)))
        t.start()
        end = time.monotonic() + 10
        while db.psql(queued.format("pw-1")) != [["1"]] and time.monotonic() < end:
            time.sleep(0.02)
        c = holder.claim("pw-2", {"py-wq": 1}, wait_ms=20000)
        check(c.queued and c.position == 2 and c.deadline_at > c.queued_at,
              f"a second waiter queues behind the first: {c}")
        x = holder.permit_cancel("pw-2")
        check(x.cancelled is True and x.status == "cancelled", f"permit_cancel takes it out: {x}")
        holder.release("pw-holder")
        t.join(10)
        check(len(got) == 1 and got[0].granted and got[0].owner_session == sid and got[0].token,
              f"claim_wait returns the admission when the slot is freed: {got}")
        check(db.psql("SELECT state, owner_session FROM pgcoord.permits WHERE id = 'pw-1'") ==
              [["held", str(sid)]], "the database shows the waiter's session holding it")
        try:
            waiter.claim_wait("pw-3", {"py-wq": 1}, 200)
            check(False, "a wait past wait_ms returned")
        except pgcoord.WaitExpired:
            check(db.psql("SELECT count(*) FROM pgcoord.permits WHERE id = 'pw-3'") == [["0"]] and
                  db.psql(queued.format("pw-3")) == [["0"]],
                  "an expired wait raises WaitExpired and leaves nothing behind")
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        try:
            holder.claim_wait("pw-4", {"py-wq": 1}, 20000, cancel=stop)
            check(False, "a cancelled wait returned")
        except pgcoord.WaitExpired:
            pass
        check(db.psql(queued.format("pw-4")) == [["0"]], "a cancelled wait leaves the queue")
        waiter.release("pw-1")
        check(db.psql("SELECT in_flight FROM pgcoord.quotas WHERE key = 'py-wq'") == [["0"]] and
              db.psql("SELECT count(*) FROM pgcoord.permits WHERE id = 'pw-4'") == [["0"]],
              "the freed slot went to nobody after the cancel")
        check(holder.permit_check().ok is True, "permit.check finds conservation intact")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED {e}")
        sys.exit(1)
