"""Connecting to the agent's Unix socket within a timeout. A socket whose
accept queue (the agent's listen_backlog) is full refuses a connect with
EAGAIN at once, and cannot be polled for room: during a burst of connects
the agent has not caught up with, the connect is retried with a short
growing backoff until the timeout. A missing socket (ENOENT) or an agent
that is not listening (ECONNREFUSED) fails at once."""

from __future__ import annotations

import asyncio
import errno
import random
import socket
import time
from typing import Iterator, Optional

from .errors import ConnectError

BACKOFF_FIRST = 0.001
BACKOFF_MAX = 0.05


def backoff() -> Iterator[float]:
    """1 ms doubling to 50 ms, each pause drawn from its upper half so a
    fleet restarting together does not retry in step."""
    pause = BACKOFF_FIRST
    while True:
        yield random.uniform(pause / 2, pause)
        pause = min(pause * 2, BACKOFF_MAX)


def _refused(path: str, e: OSError) -> ConnectError:
    return ConnectError(f"cannot connect to the agent at {path}: {e}")


def _timed_out(path: str, timeout: float, e: Optional[OSError]) -> ConnectError:
    why = f" while its accept queue stayed full ({e})" if e else ""
    return ConnectError(f"cannot connect to the agent at {path}: timed out after "
                        f"{timeout:g} s{why}")


def _try_connect(sock: socket.socket, path: str) -> Optional[OSError]:
    """One non-blocking connect: None when connected, the EAGAIN to retry,
    or raises what cannot be retried."""
    while True:
        try:
            sock.connect(path)
            return None
        except InterruptedError:
            continue
        except BlockingIOError as e:
            if e.errno == errno.EAGAIN:
                return e
            raise
        except OSError as e:
            if e.errno == errno.EISCONN:  # an interrupted connect went through
                return None
            raise


def connect_unix(path: str, timeout: Optional[float]) -> socket.socket:
    """A connected, non-blocking socket, or ConnectError naming path and
    the cause. timeout None waits for as long as the queue stays full."""
    deadline = None if timeout is None else time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        for pause in backoff():
            try:
                busy = _try_connect(sock, path)
            except OSError as e:
                raise _refused(path, e) from None
            if busy is None:
                return sock
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise _timed_out(path, timeout, busy)
            time.sleep(pause if left is None else min(pause, left))
    except BaseException:
        sock.close()
        raise
    raise AssertionError("unreachable")


async def connect_unix_async(path: str, timeout: Optional[float]) -> socket.socket:
    """connect_unix for asyncio: the pauses are awaited. (loop.sock_connect
    would take an EAGAIN for a connect in progress and wait for a socket
    that never connects.)"""
    deadline = None if timeout is None else time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        for pause in backoff():
            try:
                busy = _try_connect(sock, path)
            except OSError as e:
                raise _refused(path, e) from None
            if busy is None:
                return sock
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise _timed_out(path, timeout, busy)
            await asyncio.sleep(pause if left is None else min(pause, left))
    except BaseException:
        sock.close()
        raise
    raise AssertionError("unreachable")
