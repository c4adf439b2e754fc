"""The client's own leader belief, computed as libpgcoord does
(client-lib/leases.c): a deadline on CLOCK_MONOTONIC, moved only by what
the agent says, and checked against the clock at every question, so a
silent or frozen agent still ends the belief in time. Nothing here does
I/O."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


def mono_ms() -> int:
    """CLOCK_MONOTONIC in milliseconds: the clock valid_until_mono_ms is a
    reading of, shared with an agent on the same host."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000_000


def deadline_of(params: dict, stamp_ms: int, valid_ms: int) -> int:
    """stamp + valid_ms, capped by the agent's own monotonic deadline when
    it sent one (0 means none)."""
    until = stamp_ms + valid_ms
    mono = params.get("valid_until_mono_ms")
    if _is_int(mono) and 0 < mono < until:
        until = mono
    return until


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class _Belief:
    leader: bool = False
    epoch: int = 0
    until_ms: int = 0
    ttl_ms: int = 0


class Beliefs:
    """Every lease this client's session may lead, by name. Thread-safe:
    the reader updates it, the application asks it."""

    def __init__(self, clock=mono_ms):
        self._clock = clock
        self._lock = threading.Lock()
        self._by_name: dict[str, _Belief] = {}

    # --- what the agent says ---------------------------------------------

    def track(self, name: str) -> None:
        with self._lock:
            self._by_name.setdefault(name, _Belief())

    def drop(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)

    def end_all(self) -> None:
        with self._lock:
            self._by_name.clear()

    def tracking(self, name: str) -> bool:
        with self._lock:
            return name in self._by_name

    def set(self, name: str, leader: bool, epoch: int, until_ms: int, ttl_ms: int = 0) -> None:
        """Belief starts or ends, as a lease.changed or an acquire result says."""
        with self._lock:
            if not leader:
                b = self._by_name.get(name)
                if b:
                    b.leader, b.until_ms = False, 0
                return
            b = self._by_name.setdefault(name, _Belief())
            b.leader, b.epoch, b.until_ms = True, epoch, until_ms
            if ttl_ms > 0:
                b.ttl_ms = ttl_ms

    def note(self, method: str, params: dict, stamp_ms: int, session_id: int) -> None:
        """Takes in a notification (dated stamp_ms) for the session session_id."""
        if method == "lease.changed":
            r = _read(params)
            if r is None:
                return
            name, leader, epoch, valid_ms = r
            # Only this client's session can lead for us.
            if leader:
                s = params.get("session")
                if session_id == 0 or (_is_int(s) and s != session_id):
                    return
            self.set(name, leader, epoch, deadline_of(params, stamp_ms, valid_ms))
        elif method == "lease.renewed":
            r = _read(params)
            if r is None or not r[1]:
                return
            name, _, epoch, valid_ms = r
            # A renewal extends only a belief lease.changed (or the acquire
            # result) started, under the same epoch.
            with self._lock:
                b = self._by_name.get(name)
                if b and b.leader and b.epoch == epoch:
                    b.until_ms = deadline_of(params, stamp_ms, valid_ms)
        elif method == "session.lost":
            if params.get("session") == session_id:
                self.end_all()
        elif method == "session.suspended":
            # The session may be gone in safe_ms; no belief outlives it
            # unless a renewal comes first.
            safe = params.get("safe_ms")
            if params.get("session") != session_id or not _is_int(safe):
                return
            with self._lock:
                for b in self._by_name.values():
                    if b.until_ms > stamp_ms + safe:
                        b.until_ms = stamp_ms + max(safe, 0)

    # --- questions (no I/O) -----------------------------------------------

    def deadline_ms(self, name: str) -> int:
        """The monotonic ms at which belief ends; 0 when not leading."""
        with self._lock:
            b = self._by_name.get(name)
            return b.until_ms if b and b.leader else 0

    def is_leader(self, name: str) -> bool:
        with self._lock:
            b = self._by_name.get(name)
            return bool(b and b.leader and self._clock() < b.until_ms)

    def epoch(self, name: str) -> int:
        with self._lock:
            b = self._by_name.get(name)
            return b.epoch if b and b.leader and self._clock() < b.until_ms else 0

    def valid_ms(self, name: str) -> int:
        with self._lock:
            b = self._by_name.get(name)
            now = self._clock()
            return b.until_ms - now if b and b.leader and now < b.until_ms else 0


def _read(params: dict):
    """(name, leader, epoch, valid_ms), leader true only for a well-formed
    leading message; None without a name."""
    name = params.get("name")
    if not isinstance(name, str) or not name:
        return None
    epoch, valid = params.get("epoch"), params.get("valid_ms")
    if params.get("leader") is True and _is_int(epoch) and _is_int(valid) and valid >= 0:
        return name, True, epoch, valid
    return name, False, 0, 0
