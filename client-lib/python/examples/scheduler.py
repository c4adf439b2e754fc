#!/usr/bin/env python3
"""A tiny job scheduler on pgcoord: replicas share one fleet-wide quota per
tenant, claim before dispatch with the job's intent committed alongside,
release when the job completes, mark the permit uncertain when the fake
connector drops, reconcile only while leader, and recover what dead
replicas left: at boot, and each time the agent says a record's owner died.

    scheduler.py --socket PATH run [--replica NAME] [--jobs N] [--tenants N] [--limit N]
                                   [--drop-every N] [--seconds S] [--stay]
    scheduler.py --socket PATH permit-cycle [--id ID] [--quota KEY] [--limit N]

run dispatches its jobs, then (with --stay) keeps following the records of
replicas that die until SIGTERM or SIGINT, and prints what it did as JSON.
permit-cycle claims and releases one id and prints the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import pgcoord  # noqa: E402

KIND = "scheduler.job"


class Connector:
    """Stands in for whatever runs the jobs (a cluster API, a queue). Every
    drop_every-th dispatch the connection drops before it confirms, so the
    scheduler cannot know whether the job started."""

    def __init__(self, drop_every: int):
        self.drop_every, self.n = drop_every, 0
        self.running: set[str] = set()

    def dispatch(self, job: str) -> None:
        self.n += 1
        if self.drop_every and self.n % self.drop_every == 0:
            raise ConnectionError(f"connector dropped while dispatching {job}")
        self.running.add(job)

    def finish(self, job: str) -> None:
        self.running.discard(job)

    def is_running(self, job: str) -> bool:
        return job in self.running


def recover(c: pgcoord.Client, out: dict) -> bool:
    """Takes back the open records of dead sessions (a predecessor of this
    replica, or any other of this uid) and settles their permits on
    evidence. False when liveness could not be read: nothing was taken,
    try again later."""
    while True:
        r = c.record_recover(kinds=[KIND])
        if not r.liveness_read:
            out["recovery"] = f"liveness unreadable: {r.reason}; trying again"
            return False
        for rec in r.adopted:
            # This fake connector knows no jobs of a dead process: gone.
            if rec.permit:
                try:
                    c.permit_resolve(rec.permit, "gone", f"no job {rec.key} in the connector")
                except (pgcoord.Conflict, pgcoord.NotFound):
                    pass  # the reconciler settled it meanwhile
            c.record_settle(KIND, rec.key, "abandoned", token=rec.token)
            out["recovered"].append(rec.key)
        if not r.remaining:
            return True


class DeadFollower:
    """Recovers at boot and again whenever a record of KIND loses its owner.

    Recovering only at boot is not enough: a predecessor that died just
    before this replica started may still be live in the database (its
    agent ends a session at its next heartbeat after the resume grace), so
    its records are left alone, and nobody would ask again. The watch
    pushes record.orphaned once the owner is dead (and, on its first read,
    for what is orphaned already); each push is a reason to recover."""

    def __init__(self, c: pgcoord.Client, out: dict):
        self.c, self.out = c, out
        self.wake, self.stopping = threading.Event(), False
        c.on(None, self._on_note)
        c.record_watch(KIND)  # before the first recovery: nothing dies unseen
        self._recover()  # at boot, before taking new work
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _on_note(self, method: str, params: dict) -> None:
        # session.resumed: the watch reads afresh; recovering again is safe
        if (method == "record.orphaned" and params.get("kind") == KIND) or \
                method == "session.resumed":
            self.wake.set()

    def _loop(self) -> None:
        while True:
            self.wake.wait()
            if self.stopping:
                return
            self.wake.clear()
            self._recover()

    def _recover(self) -> None:
        try:
            done = recover(self.c, self.out)
        except pgcoord.PgcoordError as e:
            self.out["errors"].append(f"recovery: {e}")
            done = False
        if not done:
            # the database was unreachable: try again in a while
            retry = threading.Timer(1.0, self.wake.set)
            retry.daemon = True
            retry.start()

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(5)


def reconcile_loop(c: pgcoord.Client, connector: Connector, stop: threading.Event,
                   out: dict) -> None:
    """Only while leader: settle the permits marked uncertain, on evidence."""
    while not stop.is_set():
        try:
            with c.lease("scheduler.reconciler", ttl_ms=3000, timeout=0.5) as lead:
                while lead.valid and not stop.is_set():
                    for p in c.permit_list(state="uncertain"):
                        if not lead.valid:
                            break  # lost the lease mid-pass: stop at once
                        job = p.id
                        outcome = "running" if connector.is_running(job) else "gone"
                        try:
                            c.permit_resolve(job, outcome, f"connector says {outcome}")
                            out["reconciled"].append(job)
                            if outcome == "running":
                                connector.finish(job)
                                c.release(job)
                        except (pgcoord.Forbidden, pgcoord.Conflict, pgcoord.NotFound):
                            pass  # another uid's, or settled meanwhile
                    stop.wait(0.2)
        except pgcoord.PgcoordError as e:
            out["errors"].append(str(e))
            stop.wait(0.2)


def run(args) -> int:
    out = {"replica": args.replica, "completed": [], "denied": 0, "uncertain": [],
           "reconciled": [], "recovered": [], "errors": []}
    connector = Connector(args.drop_every)
    quit_ = threading.Event()  # SIGTERM or SIGINT: stop dispatching, finish cleanly
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: quit_.set())
    with pgcoord.Client(args.socket) as c:
        c.session_open(f"scheduler {args.replica}")
        stop = threading.Event()
        follower = DeadFollower(c, out)
        leader = threading.Thread(target=reconcile_loop, args=(c, connector, stop, out),
                                  daemon=True)
        leader.start()
        end = time.monotonic() + args.seconds
        for n in range(args.jobs):
            if time.monotonic() > end or quit_.is_set():
                break
            tenant = f"tenant-{n % args.tenants}"
            job = f"{args.replica}-job-{n}"
            intent = json.dumps({"job": job, "image": "worker:1", "tenant": tenant}).encode()
            try:
                # Claim before dispatch: the intent is committed with the permit.
                p = c.claim(job, {tenant: 1}, intent=intent, limit=args.limit)
            except pgcoord.GaveUp as e:
                out["errors"].append(str(e))
                continue
            if not p.granted:
                out["denied"] += 1
                time.sleep(0.02)
                continue
            c.record_put(KIND, job, "dispatching", permit=job)
            try:
                connector.dispatch(job)
            except ConnectionError as e:
                # We cannot know whether it runs: keep counting it, say why.
                c.mark_uncertain(job, str(e))
                c.record_settle(KIND, job, "handed-to-reconciler")
                out["uncertain"].append(job)
                continue
            c.permit_update(job, "running")
            c.record_update(KIND, job, state="running")
            time.sleep(random.uniform(0.001, 0.01))  # the job's work
            connector.finish(job)
            c.release(job)
            c.record_settle(KIND, job, "done")
            out["completed"].append(job)
        # give the reconciler a moment for the last uncertain permits
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and \
                set(out["uncertain"]) - set(out["reconciled"]) and args.jobs:
            time.sleep(0.1)
        if args.stay:
            print(f"scheduler {args.replica}: jobs dispatched; following the records of "
                  "dead replicas until SIGTERM", file=sys.stderr, flush=True)
            quit_.wait()
        stop.set()
        leader.join(5)
        follower.stop()
        c.session_close()
    print(json.dumps(out, sort_keys=True))
    return 0


def permit_cycle(args) -> int:
    with pgcoord.Client(args.socket) as c:
        s = c.session_open("scheduler permit-cycle")
        claim = c.claim(args.id, {args.quota: 1}, intent=b"permit-cycle", limit=args.limit)
        released = c.release(args.id) if claim.granted else None
        quota = c.quota_get(args.quota)
        c.session_close()
    print(json.dumps({
        "session": s.session,
        "claim": {"status": claim.status, "id": claim.id, "token": claim.token,
                  "mine": claim.mine, "attempts": claim.attempts},
        "release": None if released is None else {"released": released.released,
                                                   "state": released.state},
        "quota": {"key": quota.key, "limit": quota.limit, "in_flight": quota.in_flight},
    }, sort_keys=True))
    return 0 if claim.granted and released and released.released else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=pgcoord.DEFAULT_SOCKET)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("--replica", default=f"replica-{os.getpid()}")
    r.add_argument("--jobs", type=int, default=50)
    r.add_argument("--tenants", type=int, default=3)
    r.add_argument("--limit", type=int, default=2)
    r.add_argument("--drop-every", type=int, default=7)
    r.add_argument("--seconds", type=float, default=30)
    r.add_argument("--stay", action="store_true",
                   help="after the jobs, keep recovering what dying replicas leave, "
                        "until SIGTERM or SIGINT")
    pc = sub.add_parser("permit-cycle")
    pc.add_argument("--id", default=f"permit-cycle-{os.getpid()}-{int(time.time())}")
    pc.add_argument("--quota", default="permit-cycle")
    pc.add_argument("--limit", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        return run(args) if args.mode == "run" else permit_cycle(args)
    except pgcoord.PgcoordError as e:
        print(f"scheduler: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
