"""The synchronous client: one Unix-socket connection to the agent, a
reader thread that answers calls, keeps the leader belief and queues
notifications, and a dispatcher thread that hands notifications to
callbacks (so a callback may itself call the agent)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import queue
import select
import socket
import threading
import time
from typing import Callable, Optional

from . import types as T
from .api import ALL_PAGE_SIZE, Api, claim_params, resume_params, session_open_params
from .belief import Beliefs, deadline_of, mono_ms
from .dialing import connect_unix
from .errors import (ClaimDenied, MethodNotFound, ClientClosed, ConnectionLost, CallTimeout,
                     GaveUp, NotFound, PgcoordError, ProtocolError, SessionExpired, Conflict,
                     WaitExpired, error_from_wire)
from .framing import NOTIFICATION, FrameReader, Message, pack_request

DEFAULT_SOCKET = "/run/pgcoord/agent.sock"
READ_CHUNK = 65536
# How long a resume waits for the agent to notice the old connection closed.
RESUME_PATIENCE_MS = 2000


def _wait_for(sock: socket.socket, events: int, timeout: Optional[float]) -> None:
    """poll(2), not select(2): descriptors above 1023 work too."""
    p = select.poll()
    p.register(sock, events)
    p.poll(None if timeout is None else max(0, int(timeout * 1000)))


class _Pending:
    __slots__ = ("event", "msg", "failure", "on_reply")

    def __init__(self, on_reply=None):
        self.event = threading.Event()
        self.msg: Optional[Message] = None
        self.failure: Optional[PgcoordError] = None
        self.on_reply = on_reply


class _Connection:
    """One socket and its reader thread. Once it fails it stays failed;
    the client makes a new one to reconnect."""

    def __init__(self, path: str, connect_timeout: float, on_message, on_failure):
        self.sock = connect_unix(path, connect_timeout)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self.pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self.failure: Optional[PgcoordError] = None
        self._on_message = on_message
        self._on_failure = on_failure
        self.frames = FrameReader()
        self.frames.note_quiet(mono_ms())
        self.thread = threading.Thread(target=self._read_loop, name="pgcoord-reader", daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.failure is None

    def send(self, method: str, params, deadline: float, on_reply=None) -> tuple[int, _Pending]:
        p = _Pending(on_reply)
        with self._lock:
            if self.failure:
                raise self.failure
            # 1..2^32-1: msgid 0 is the agent's for errors about the stream itself
            msgid = next(self._ids) % 0xFFFFFFFF + 1
            self.pending[msgid] = p
        data = pack_request(msgid, method, params)
        with self._send_lock:
            view = memoryview(data)
            while view:
                left = deadline - time.monotonic()
                if left <= 0:
                    # Part of a request may be on the wire: the stream is
                    # unusable from here on.
                    self.fail(CallTimeout(f"{method}: could not send within the timeout"))
                    raise CallTimeout(f"{method}: could not send within the timeout")
                try:
                    n = self.sock.send(view)
                    view = view[n:]
                except BlockingIOError:
                    _wait_for(self.sock, select.POLLOUT, left)
                except OSError as e:
                    self.fail(ConnectionLost(f"sending {method}: {e}"))
                    raise self.failure from None
        return msgid, p

    def forget(self, msgid: int) -> None:
        with self._lock:
            self.pending.pop(msgid, None)

    def fail(self, failure: PgcoordError) -> None:
        with self._lock:
            if self.failure:
                return
            self.failure = failure
            pending, self.pending = self.pending, {}
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        for p in pending.values():
            p.failure = failure
            p.event.set()
        self._on_failure(self, failure)

    def close(self) -> None:
        self.fail(ClientClosed("the client was closed"))
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=2)
        self.sock.close()

    def _read_loop(self) -> None:
        try:
            while self.failure is None:
                before = mono_ms()
                try:
                    data = self.sock.recv(READ_CHUNK)
                except BlockingIOError:
                    # Nothing queued at `before`: what comes next was sent after it.
                    self.frames.note_quiet(before)
                    _wait_for(self.sock, select.POLLIN, None)
                    continue
                except InterruptedError:
                    continue
                if not data:
                    raise ConnectionLost("the agent closed the connection" +
                                         (" in the middle of a message"
                                          if self.frames.buffered() else ""))
                for m in self.frames.feed(data, before, len(data) < READ_CHUNK):
                    self._deliver(m)
                self.frames.check()
        except PgcoordError as e:
            self.fail(e)
        except OSError as e:
            self.fail(ConnectionLost(f"reading from the agent: {e}"))
        except Exception as e:  # a bug here must not leave callers hanging
            self.fail(ProtocolError(f"reader failed: {e!r}"))

    def _deliver(self, m: Message) -> None:
        if m.kind == NOTIFICATION:
            self._on_message(m)
            return
        with self._lock:
            p = self.pending.pop(m.msgid, None)
        if p is None:
            if m.msgid == 0 and m.error is not None:
                # The agent refused the stream itself (framing, limits).
                raise error_from_wire(m.error)
            return  # the answer to a call that timed out
        p.msg = m
        if p.on_reply:
            # In stream order with the notifications (the lease belief).
            p.on_reply(m)
        p.event.set()


def wait_outcome(id: str, method: str, params: dict) -> T.Claim:
    """claim_wait's admission from its permit.admitted, or WaitExpired."""
    if method == "permit.expired":
        reason = params.get("reason")
        raise WaitExpired(f"claim {id}: left the queue: {reason}", reason)
    c = T.from_map(T.Claim, dict(params, status="admitted", mine=True))
    c.earlier_outcome_unknown, c.attempts = False, 1
    return c


def held_claim(id: str, p: T.Permit) -> T.Claim:
    """The answer for a claim admitted from the queue unheard: the permit."""
    c = T.from_map(T.Claim, {"status": "held", "id": id, "token": p.token, "state": p.state,
                             "phase": p.phase, "owner_session": p.owner_session,
                             "owner_replica": p.owner_replica, "mine": True,
                             "created_at": p.created_at})
    c.earlier_outcome_unknown, c.attempts = False, 1
    return c


class _Waiter:
    """claim_wait's ear for its id: the permit.admitted/permit.expired
    params, or the failure that ended the connection or session."""

    __slots__ = ("event", "method", "params", "failure", "conn")

    def __init__(self):
        # The connection the claim queued on (a failure of an earlier
        # one was claim's to retry): its failure ends the wait.
        self.conn: Optional[_Connection] = None
        self.event = threading.Event()
        self.method: Optional[str] = None
        self.params: dict = {}
        self.failure: Optional[PgcoordError] = None


class Lead:
    """The belief in one lease, as the context manager hands it out. Every
    property reads the local clock only; none does I/O."""

    def __init__(self, client, name: str, epoch: int):
        self._client = client
        self.name = name
        self.epoch = epoch

    @property
    def valid(self) -> bool:
        """Still leader: the agent's last word said so and the deadline on
        CLOCK_MONOTONIC lies ahead."""
        return self._client.beliefs.is_leader(self.name) and \
            self._client.beliefs.epoch(self.name) == self.epoch

    @property
    def deadline_ms(self) -> int:
        """CLOCK_MONOTONIC ms at which belief ends (0 when not leading)."""
        return self._client.beliefs.deadline_ms(self.name) if self.valid else 0

    @property
    def deadline(self) -> float:
        """The same deadline in seconds on time.monotonic()'s clock
        (CLOCK_MONOTONIC on Linux); 0.0 when not leading."""
        return self.deadline_ms / 1000.0

    @property
    def valid_ms(self) -> int:
        return self._client.beliefs.valid_ms(self.name) if self.valid else 0

    def __bool__(self) -> bool:
        return self.valid

    def __repr__(self) -> str:
        return f"Lead(name={self.name!r}, epoch={self.epoch}, valid={self.valid})"


class Client(Api):
    """A connection to the local pgcoord-agent.

    timeout: seconds to wait for each call's reply (CallTimeout after it).
    reconnect: on a lost connection, the next call connects again and
    resumes the session when it is still within the grace.
    retry_for: seconds claims and releases keep retrying retryable errors
    with the same id."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 5.0,
                 connect_timeout: float = 5.0, reconnect: bool = True,
                 retry_for: float = 10.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.retry_for = retry_for
        self.beliefs = Beliefs()
        self.session: Optional[T.Session] = None
        self.session_lost = False
        self._lost_at_ms = 0
        self._lock = threading.RLock()
        self._closed = False
        self._leases: dict[str, bool] = {}   # name -> wait (to re-ask after a resume)
        self._lease_cv = threading.Condition()
        self._waiters: dict[str, _Waiter] = {}   # claim_wait's, by permit id
        # Its own lock: the reader takes it, while _lock is held across
        # calls (a resume) that wait for the reader.
        self._waiters_lock = threading.Lock()
        self._handlers: list[tuple[Optional[str], Callable]] = []
        self._queues: list[queue.Queue] = []
        self._dispatch_q: queue.Queue = queue.Queue()
        self._dispatcher = threading.Thread(target=self._dispatch_loop,
                                            name="pgcoord-dispatch", daemon=True)
        self._dispatcher.start()
        self._conn: Optional[_Connection] = None
        try:
            self._conn = self._connect()
        except BaseException:
            self._dispatch_q.put(None)
            raise

    # --- connection ----------------------------------------------------------

    def _connect(self) -> _Connection:
        return _Connection(self.socket_path, self.connect_timeout, self._on_notification,
                           self._on_failure)

    def _on_failure(self, conn: _Connection, failure: PgcoordError) -> None:
        # A broken connection ends every belief: nobody tells us anymore.
        self.beliefs.end_all()
        with self._lock:
            if conn is self._conn and self.session and not self._lost_at_ms:
                self._lost_at_ms = mono_ms()
        with self._lease_cv:
            self._lease_cv.notify_all()
        # What was pushed to the lost connection is not pushed again.
        self._fail_waiters(ConnectionLost(f"waiting for a queued claim: {failure.message}"), conn)
        self._dispatch_q.put(("connection.lost", {"reason": str(failure)}))

    def _live_conn(self) -> _Connection:
        with self._lock:
            if self._closed:
                raise ClientClosed("the client was closed")
            if self._conn and self._conn.alive:
                return self._conn
            if not self.reconnect:
                raise self._conn.failure if self._conn else ConnectionLost("not connected")
            self._conn = self._connect()
            if self.session and not self.session_lost:
                self._resume()
            return self._conn

    def _resume(self) -> None:
        """Re-attaches the session on the new connection, if the agent may
        still hold it (within the grace); otherwise the session is lost."""
        s = self.session
        lost_at = self._lost_at_ms or mono_ms()
        if mono_ms() - lost_at >= s.grace_ms:
            self._session_gone(f"session {s.session} was disconnected longer than its "
                               f"grace ({s.grace_ms} ms)")
        while True:
            try:
                m = self._call_on(self._conn, "session.open", resume_params(s), None)
                break
            except Conflict:
                # Still attached to the old connection: the agent has not
                # seen it close yet. Within the grace, ask again shortly.
                if mono_ms() - lost_at >= min(s.grace_ms, RESUME_PATIENCE_MS):
                    raise
                time.sleep(0.02)
            except (SessionExpired, NotFound) as e:
                self._session_gone(f"session {s.session} could not be resumed: {e.message}")
        r = T.from_map(T.Session, m)
        if r.session != s.session:
            raise ProtocolError(f"asked to resume session {s.session}, "
                                f"the agent attached {r.session}")
        self.session, self._lost_at_ms = r, 0
        self._dispatch_q.put(("session.resumed", {"session": r.session}))
        # The agent kept the leases; ask again for the belief it holds.
        for name, wait in list(self._leases.items()):
            with contextlib.suppress(PgcoordError):
                self._acquire_on(self._conn, name, None, wait, None)

    def _session_gone(self, why: str):
        self.session_lost = True
        self.beliefs.end_all()
        raise SessionExpired(why)

    def close(self) -> None:
        """Closes the connection (the agent keeps the session for its
        grace); see session_close to end the session at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn = self._conn
        if conn:
            conn.close()
        self._dispatch_q.put(None)
        if self._dispatcher is not threading.current_thread():
            self._dispatcher.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- calls ---------------------------------------------------------------

    def call(self, method: str, params: Optional[dict] = None, *, timeout=None) -> dict:
        """One request; the result map, or the error as an exception."""
        if not isinstance(method, str):
            raise TypeError("method is a str")
        if params is not None and not isinstance(params, dict):
            raise TypeError("params is a dict or None")
        return self._call_on(self._live_conn(), method, params, timeout)

    def _call_on(self, conn: _Connection, method, params, timeout, on_reply=None) -> dict:
        t = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        msgid, p = conn.send(method, params, deadline, on_reply)
        if not p.event.wait(max(0.0, deadline - time.monotonic())):
            conn.forget(msgid)
            raise CallTimeout(f"{method}: no reply within {t:g} s; the outcome is unknown")
        if p.failure:
            # One failure ends every call in flight: each gets its own copy.
            e = copy.copy(p.failure)
            e.message = f"{method}: {p.failure.message}"
            e.args = (e.message,)
            raise e
        if p.msg.error is not None:
            raise error_from_wire(p.msg.error)
        return p.msg.result

    def _invoke(self, method, params, convert, timeout=None):
        return convert(self.call(method, params, timeout=timeout))

    def _invoke_all(self, method, params, page_size=None, timeout=None):
        rows, cursor = [], None
        while True:
            page = self.list_page(method, params, limit=page_size or ALL_PAGE_SIZE,
                                  cursor=cursor, timeout=timeout)
            rows.extend(page.items)
            if page.next_cursor is None:
                return rows
            cursor = page.next_cursor

    # --- sessions ------------------------------------------------------------

    def session_open(self, name: Optional[str] = None, *, keepalive_ms: Optional[int] = None,
                     timeout=None) -> T.Session:
        """keepalive_ms: the application must then call keepalive() at least
        that often, or the agent declares the session lost ("keepalive
        missed"), lets its leases lapse and applies on_owner_loss."""
        params = session_open_params(name, keepalive_ms)
        r = T.from_map(T.Session, self.call("session.open", params, timeout=timeout))
        with self._lock:
            self.session, self.session_lost, self._lost_at_ms = r, False, 0
        return r

    def session_close(self, *, timeout=None) -> bool:
        self.beliefs.end_all()
        self._leases.clear()
        try:
            r = self.call("session.close", None, timeout=timeout)
        except PgcoordError as e:
            if e.code in ("no_session", "session_expired"):
                self.session = None
            raise
        self.session = None
        return r.get("closed") is True

    # --- notifications ---------------------------------------------------------

    def on(self, method: Optional[str], fn: Callable[[str, dict], None]) -> None:
        """Calls fn(method, params) for each notification of that method
        (None: every one), on the dispatcher thread. Also delivered:
        "connection.lost" and "session.resumed", made by the client."""
        self._handlers.append((method, fn))

    def subscribe(self) -> "queue.Queue[tuple[str, dict]]":
        """A queue that receives every notification as (method, params)."""
        q: queue.Queue = queue.Queue()
        self._queues.append(q)
        return q

    def _on_notification(self, m: Message) -> None:
        # The belief moves here, on the reader, before anyone is told.
        sid = self.session.session if self.session else 0
        self.beliefs.note(m.method, m.params, m.stamp_ms, sid)
        if m.method == "session.lost" and m.params.get("session") == sid:
            self.session_lost = True
            self._fail_waiters(ConnectionLost("waiting for a queued claim: the session was lost"))
        if m.method in ("permit.admitted", "permit.expired"):
            with self._waiters_lock:
                w = self._waiters.get(m.params.get("id"))
            if w is not None and not w.event.is_set():
                w.method, w.params = m.method, m.params
                w.event.set()
        if m.method in ("lease.changed", "session.lost"):
            with self._lease_cv:
                self._lease_cv.notify_all()
        self._dispatch_q.put((m.method, m.params))

    def _dispatch_loop(self) -> None:
        while True:
            item = self._dispatch_q.get()
            if item is None:
                return
            method, params = item
            for q in list(self._queues):
                q.put(item)
            for want, fn in list(self._handlers):
                if want is None or want == method:
                    try:
                        fn(method, params)
                    except Exception:  # a callback's bug must not stop delivery
                        pass

    # --- leases --------------------------------------------------------------

    def _acquire_on(self, conn, name, ttl_ms, wait, timeout) -> T.LeaseAcquired:
        def on_reply(m: Message):
            # The result is the agent's belief when it answered, in stream
            # order with its notifications: apply it on the reader.
            r = m.result
            if m.error is not None or not isinstance(r, dict):
                return
            leader = r.get("leader") is True and isinstance(r.get("valid_ms"), int) \
                and r["valid_ms"] >= 0 and isinstance(r.get("epoch"), int)
            until = deadline_of(r, m.stamp_ms, r["valid_ms"]) if leader else 0
            self.beliefs.set(name, leader, r.get("epoch", 0), until, r.get("ttl_ms") or 0)

        self.beliefs.track(name)
        params = {"name": name, "wait": bool(wait)}
        if ttl_ms:
            params["ttl_ms"] = ttl_ms
        try:
            m = self._call_on(conn, "lease.acquire", params, timeout, on_reply)
        except PgcoordError as e:
            if not e.retryable and not self.beliefs.is_leader(name):
                self.beliefs.drop(name)
            raise
        r = T.from_map(T.LeaseAcquired, m)
        if not r.leader and not wait:
            self.beliefs.drop(name)
        else:
            self._leases[name] = bool(wait)
        return r

    def lease_acquire(self, name: str, *, ttl_ms: Optional[int] = None, wait: bool = False,
                      timeout=None) -> T.LeaseAcquired:
        if not isinstance(name, str) or not name:
            raise TypeError("a lease name is a non-empty str")
        return self._acquire_on(self._live_conn(), name, ttl_ms, wait, timeout)

    def lease_release(self, name: str, *, timeout=None) -> bool:
        # Belief ends before the hand-back is even asked for.
        self.beliefs.drop(name)
        self._leases.pop(name, None)
        return self.call("lease.release", {"name": name}, timeout=timeout).get("released") is True

    def is_leader(self, name: str) -> bool:
        """The local belief; never does I/O."""
        return self.beliefs.is_leader(name)

    def wait_leader(self, name: str, timeout: Optional[float] = None) -> bool:
        """Blocks until the belief in name starts (True) or timeout passes."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lease_cv:
            while not self.beliefs.is_leader(name):
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self.session_lost:
                    raise SessionExpired("the session was lost while campaigning")
                self._lease_cv.wait(0.25 if left is None else min(left, 0.25))
            return True

    @contextlib.contextmanager
    def lease(self, name: str, *, ttl_ms: Optional[int] = None, wait: bool = True,
              timeout: Optional[float] = None):
        """with client.lease("x") as lead: ... — campaigns (waiting up to
        timeout seconds, None: as long as it takes) and hands the lease
        back on exit. Check lead.valid before each step that needs it."""
        r = self.lease_acquire(name, ttl_ms=ttl_ms, wait=wait)
        try:
            if wait and not self.beliefs.is_leader(name):
                self.wait_leader(name, timeout)
            yield Lead(self, name, self.beliefs.epoch(name) or r.epoch)
        finally:
            with contextlib.suppress(PgcoordError):
                self.lease_release(name)

    # --- permits -------------------------------------------------------------

    def _retrying(self, what: str, fn, retry_for: Optional[float]):
        """fn() until it answers or fails for good; retryable errors are
        retried (reconnecting and resuming as needed) for retry_for s.
        Returns (result, saw_unknown, attempts) or raises (error, unknown)."""
        budget = self.retry_for if retry_for is None else retry_for
        end = time.monotonic() + budget
        backoff, unknown, attempts = 0.05, False, 0
        while True:
            attempts += 1
            try:
                return fn(), unknown, attempts
            except PgcoordError as e:
                unknown = unknown or e.outcome_unknown
                if not e.retryable or isinstance(e, ClientClosed) or \
                        time.monotonic() + backoff >= end:
                    e.outcome_unknown_seen = unknown
                    raise
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def claim(self, id: str, quotas, *, intent=None, on_owner_loss: Optional[str] = None,
              limit: Optional[int] = None, wait_ms: Optional[int] = None, timeout=None,
              retry_for: Optional[float] = None, give_up: bool = True) -> T.Claim:
        """permit.claim, retried with the same id on retryable errors (a
        lost reply included) for retry_for seconds. When it runs out after
        an attempt whose outcome was unknown, the id is released (give_up)
        and GaveUp is raised. wait_ms (0..3600000): a claim that cannot be
        admitted now queues that long and answers "queued"; its outcome
        comes as permit.admitted or permit.expired (claim_wait waits)."""
        params = claim_params(id, quotas, intent, on_owner_loss, limit, wait_ms)
        try:
            m, unknown, attempts = self._retrying(
                "permit.claim", lambda: self.call("permit.claim", params, timeout=timeout),
                retry_for)
        except PgcoordError as e:
            if not e.retryable or not getattr(e, "outcome_unknown_seen", False):
                raise
            released = self._give_up_after(id, give_up)
            raise GaveUp(f"claim {id}: gave up after {e}; "
                         f"{'id released' if released else 'release failed' if released is False else 'not released'}",
                         last=e, released=released) from e
        c = T.from_map(T.Claim, m)
        c.earlier_outcome_unknown, c.attempts = unknown, attempts
        return c

    def _give_up_after(self, id: str, give_up: bool) -> Optional[bool]:
        if not give_up:
            return None
        try:
            self.give_up(id)
            return True
        except PgcoordError:
            return False

    def give_up(self, id: str, *, retry_for: Optional[float] = None) -> bool:
        """Releases an id whose claim's outcome was never seen, as
        PROTOCOL.md requires: frees what a late attempt admitted, or
        retires the id so an attempt still on its way is refused. True when
        the id is settled either way."""
        try:
            self.release(id, reason="given up after an unknown outcome", retry_for=retry_for)
        except NotFound:
            # Nothing admitted; a claim that queued is not a permit yet,
            # and a release does not take it out of the queue.
            if self._cancel_wait(id):
                self.release(id, reason="given up after an unknown outcome",
                             retry_for=retry_for)
        return True

    def _cancel_wait(self, id: str) -> bool:
        """permit.cancel; True when the claim was admitted meanwhile (the
        caller now owns a permit to release)."""
        try:
            c = T.from_map(T.Cancel, self.call("permit.cancel", {"id": id}))
        except (NotFound, MethodNotFound):
            return False
        return c.status in ("admitted", "held")

    def claim_wait(self, id: str, quotas, wait_ms: int, *, cancel: Optional[threading.Event] = None,
                   **kw) -> T.Claim:
        """Claims id with wait_ms and blocks until the outcome: the
        admission (at once or from the queue), WaitExpired when it left the
        queue without one, ClaimDenied when it could not even queue. When
        cancel is set, or the wait is interrupted (KeyboardInterrupt,
        anything raised in it), the claim is cancelled, and a permit it was
        admitted to meanwhile released, so nothing leaks; cancel raises
        WaitExpired(reason="cancelled by the caller"). A connection or
        session lost while waiting raises ConnectionLost (retryable): a
        retry with the same id answers the current state (still queued: it
        waits on; admitted: "held")."""
        if not isinstance(wait_ms, int) or isinstance(wait_ms, bool) or wait_ms <= 0:
            raise TypeError("claim_wait's wait_ms is an int > 0")
        w = _Waiter()
        with self._waiters_lock:
            if id in self._waiters:
                raise RuntimeError(f"claim_wait of {id!r} is already running on this client")
            self._waiters[id] = w
        try:
            c = self.claim(id, quotas, wait_ms=wait_ms, **kw)
            if c.status == "denied":
                raise ClaimDenied(f"claim {id}: no room in {c.quota} "
                                  f"({c.in_flight}/{c.limit} in flight, "
                                  f"{c.waiting or 0} waiting)", c)
            if c.status != "queued":
                return c
            if c.mine is False:   # its outcome is pushed to the session that queued it
                raise Conflict(f"claim {id}: queued by another session")
            with self._waiters_lock:
                w.conn = self._conn
                if not w.conn.alive:
                    w.failure = ConnectionLost("waiting for a queued claim: the connection broke")
                    w.event.set()
            return self._await_outcome(id, w, c, cancel)
        finally:
            with self._waiters_lock:
                if self._waiters.get(id) is w:
                    del self._waiters[id]

    def _await_outcome(self, id, w: _Waiter, c: T.Claim, cancel) -> T.Claim:
        # The outcome is pushed; the end only covers one pushed and lost
        # (on a connection that broke and was resumed in between).
        end = time.monotonic() + ((c.deadline_at or 0) - (c.now_at or 0)) / 1000.0 + 5.0
        try:
            while not w.event.wait(0.05):
                if cancel is not None and cancel.is_set():
                    self._settle_wait(id, w, gave_up=True)
                    raise WaitExpired(f"claim {id}: cancelled by the caller",
                                      "cancelled by the caller")
                if time.monotonic() >= end:
                    return self._settle_wait(id, w, gave_up=False)
        except PgcoordError:
            raise
        except BaseException:
            with contextlib.suppress(PgcoordError):
                self._settle_wait(id, w, gave_up=True)
            raise
        if w.failure is not None:
            raise w.failure
        return self._outcome(id, w)

    @staticmethod
    def _outcome(id, w: _Waiter) -> T.Claim:
        return wait_outcome(id, w.method, w.params)

    def _settle_wait(self, id, w: _Waiter, *, gave_up: bool) -> Optional[T.Claim]:
        """Cancels a wait the caller gave up, or whose outcome was never
        heard. A permit admitted meanwhile is released when the caller gave
        up, and answered ("held") when it was not heard."""
        admitted = self._cancel_wait(id)
        if not admitted and w.event.is_set() and w.method == "permit.admitted":
            admitted = True   # admitted while we asked
        if gave_up:
            if admitted:
                self.release(id, reason="waiting claim given up")
            return None
        if not admitted:
            if w.event.is_set() and w.failure is None:
                return self._outcome(id, w)
            raise WaitExpired(f"claim {id}: no outcome heard; cancelled", "no outcome heard")
        return held_claim(id, self.permit_get(id))

    def _fail_waiters(self, failure: PgcoordError, conn: Optional[_Connection] = None) -> None:
        """Ends the waits queued on conn (None: on any connection)."""
        with self._waiters_lock:
            waiters = [w for w in self._waiters.values()
                       if w.conn is not None and (conn is None or w.conn is conn)]
        for w in waiters:
            if not w.event.is_set():
                w.failure = failure
                w.event.set()

    def release(self, id: str, *, override: Optional[bool] = None,
                reason: Optional[str] = None, timeout=None,
                retry_for: Optional[float] = None) -> T.PermitChange:
        """permit.release, retried with the same id on retryable errors
        (releasing is idempotent)."""
        params = {"id": id}
        if override is not None:
            params["override"] = override
        if reason is not None:
            params["reason"] = reason
        m, _, _ = self._retrying("permit.release",
                                 lambda: self.call("permit.release", params, timeout=timeout),
                                 retry_for)
        return T.from_map(T.PermitChange, m)

    @contextlib.contextmanager
    def permit(self, id: str, quotas, **kw):
        """with client.permit(id, {"tenant-1": 1}) as p: ... — claims
        (ClaimDenied when there is no room) and releases on exit. A permit
        the body marked uncertain stays so (its release is a conflict)."""
        c = self.claim(id, quotas, **kw)
        if not c.granted:
            if c.earlier_outcome_unknown:
                self.give_up(id)
            raise ClaimDenied(f"claim {id}: no room in {c.quota} "
                              f"({c.in_flight}/{c.limit} in flight)", c)
        try:
            yield c
        except BaseException:
            # The body's failure is the news; a release that fails too (the
            # session gone, say) must not hide it.
            if c.mine is not False:
                with contextlib.suppress(PgcoordError):
                    self.release(id)
            raise
        if c.mine is not False:
            with contextlib.suppress(Conflict):
                self.release(id)
