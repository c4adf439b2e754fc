#!/usr/bin/env python3
"""A connect refused because the agent's accept queue is full (EAGAIN: a
burst of connects, or an agent not accepting for a moment) is retried by
pgcoord.Client and pgcoord.AsyncClient within connect_timeout, then fails
with ConnectError naming the socket and the cause. A real agent with
listen_backlog 1, stopped while its queue is filled. Run under
tests/harness/with-postgres."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
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


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)
    print(f"ok     {what}")


def fill_queue(path: str) -> list[socket.socket]:
    """Non-blocking connects until the stopped agent's queue says EAGAIN."""
    held = []
    for _ in range(64):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError as e:
            s.close()
            check(e.errno == errno.EAGAIN and held, f"the queue is full after {len(held)}")
            return held
        held.append(s)
    raise AssertionError("the accept queue took 64 connects and was not full")


def resumed_later(agent: Agent, seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, agent.signal, (signal.SIGCONT,))
    t.start()
    return t


def running_again(agent: Agent) -> None:
    """Resumes the agent and waits until its queue is empty: the agent
    accepts in arrival order, so once a new connection's ping is answered
    every connect queued before it has been taken off the queue."""
    agent.signal(signal.SIGCONT)
    with pgcoord.Client(agent.socket_path, connect_timeout=5.0) as c:
        c.ping()


def stopped_full(agent: Agent) -> list[socket.socket]:
    agent.signal(signal.SIGSTOP)
    return fill_queue(agent.socket_path)


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="py-burst.", dir=os.environ.get("PGCOORD_TEST_TMP"))
    db = Database()
    agent = Agent(db, f"burst-{os.getpid()}", tmp, ["--listen-backlog", "1"])
    held: list[socket.socket] = []
    try:
        # sync: waits out the full queue, then works
        held += stopped_full(agent)
        resumed_later(agent, 0.3)
        t0 = time.monotonic()
        with pgcoord.Client(agent.socket_path, connect_timeout=5.0) as c:
            took = time.monotonic() - t0
            check(took >= 0.25, f"Client connected after {took:.3f} s, once the agent ran")
            check(c.ping() is True, "Client's ping answered through the retried connect")

        # sync: left stopped past connect_timeout
        held += stopped_full(agent)
        t0 = time.monotonic()
        try:
            pgcoord.Client(agent.socket_path, connect_timeout=0.4).ping()
            raise AssertionError("Client connected to a stopped agent with a full queue")
        except pgcoord.ConnectError as e:
            took, msg = time.monotonic() - t0, str(e)
            check(agent.socket_path in msg and "timed out after 0.4 s" in msg and
                  "accept queue stayed full" in msg, f"Client's error says why: {msg}")
            check(0.4 <= took < 1.5, f"Client gave up after {took:.3f} s of 0.4")
        running_again(agent)

        async def aio() -> None:
            held.extend(stopped_full(agent))
            resumed_later(agent, 0.3)
            t0 = time.monotonic()
            c = await pgcoord.AsyncClient.connect(agent.socket_path, connect_timeout=5.0)
            took = time.monotonic() - t0
            try:
                check(took >= 0.25, f"AsyncClient connected after {took:.3f} s")
                check(await c.ping() is True, "AsyncClient's ping answered")
            finally:
                await c.close()
            held.extend(stopped_full(agent))
            t0 = time.monotonic()
            try:
                await pgcoord.AsyncClient.connect(agent.socket_path, connect_timeout=0.4)
                raise AssertionError("AsyncClient connected to a stopped agent")
            except pgcoord.ConnectError as e:
                took, msg = time.monotonic() - t0, str(e)
                check(agent.socket_path in msg and "accept queue stayed full" in msg,
                      f"AsyncClient's error says why: {msg}")
                check(0.4 <= took < 1.5, f"AsyncClient gave up after {took:.3f} s of 0.4")
            running_again(agent)

        asyncio.run(aio())

        # no socket: at once, not after the timeout
        t0 = time.monotonic()
        try:
            pgcoord.Client(agent.socket_path + ".missing", connect_timeout=5.0).ping()
            raise AssertionError("connected to a missing socket")
        except pgcoord.ConnectError as e:
            check("No such file" in str(e) and time.monotonic() - t0 < 0.5,
                  f"a missing socket fails at once: {e}")
        check(agent.proc.poll() is None, "the agent still runs")
        return 0
    finally:
        for s in held:
            s.close()
        agent.stop()
        db.close()


if __name__ == "__main__":
    sys.exit(main())
