"""The asyncio client: the same calls as Client, awaited. A reader task
answers calls, keeps the leader belief and hands notifications to
callbacks or queues, so nobody polls."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from typing import Callable, Optional

from . import types as T
from .api import ALL_PAGE_SIZE, Api, claim_params, resume_params, session_open_params
from .belief import Beliefs, deadline_of, mono_ms
from .errors import (CallTimeout, ClaimDenied, ClientClosed, Conflict,
                     ConnectionLost, GaveUp, MethodNotFound, NotFound, PgcoordError,
                     ProtocolError, SessionExpired, WaitExpired, error_from_wire)
from .client import RESUME_PATIENCE_MS, held_claim, wait_outcome
from .dialing import connect_unix_async
from .framing import NOTIFICATION, FrameReader, Message, pack_request

READ_CHUNK = 65536


class AsyncLead:
    """As client.Lead: valid / deadline / deadline_ms read the clock only."""

    def __init__(self, client, name: str, epoch: int):
        self._client, self.name, self.epoch = client, name, epoch

    @property
    def valid(self) -> bool:
        b = self._client.beliefs
        return b.is_leader(self.name) and b.epoch(self.name) == self.epoch

    @property
    def deadline_ms(self) -> int:
        return self._client.beliefs.deadline_ms(self.name) if self.valid else 0

    @property
    def deadline(self) -> float:
        return self.deadline_ms / 1000.0

    @property
    def valid_ms(self) -> int:
        return self._client.beliefs.valid_ms(self.name) if self.valid else 0

    def __bool__(self) -> bool:
        return self.valid


class AsyncClient(Api):
    """await AsyncClient.connect(path) — then every Api method is a
    coroutine. Same reconnect/resume and retry rules as Client."""

    def __init__(self, socket_path: str, *, timeout: float = 5.0, connect_timeout: float = 5.0,
                 reconnect: bool = True, retry_for: float = 10.0):
        self.socket_path = socket_path
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.reconnect, self.retry_for = reconnect, retry_for
        self.beliefs = Beliefs()
        self.session: Optional[T.Session] = None
        self.session_lost = False
        self._lost_at_ms = 0
        self._sock: Optional[socket.socket] = None
        self._reader_task: Optional[asyncio.Task] = None
        self._failure: Optional[PgcoordError] = None
        self._pending: dict[int, tuple[asyncio.Future, Optional[Callable]]] = {}
        self._ids = itertools.count(1)
        self._handlers: list[tuple[Optional[str], Callable]] = []
        self._queues: list[asyncio.Queue] = []
        self._leases: dict[str, bool] = {}
        self._lease_event = asyncio.Event()
        self._waiters: dict[str, list] = {}   # claim_wait's: [outcome future, socket]
        self._closed = False
        self._conn_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, socket_path: str, **kw) -> "AsyncClient":
        c = cls(socket_path, **kw)
        await c._open()
        return c

    async def _open(self) -> None:
        s = await connect_unix_async(self.socket_path, self.connect_timeout)
        self._sock, self._failure, self._pending = s, None, {}
        self._reader_task = asyncio.create_task(self._read_loop(s))

    async def close(self) -> None:
        self._closed = True
        self._fail(ClientClosed("the client was closed"))
        if self._reader_task:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _fail(self, failure: PgcoordError) -> None:
        if self._failure:
            return
        self._failure = failure
        if self._sock:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(failure)
        self.beliefs.end_all()
        if self.session and not self._lost_at_ms:
            self._lost_at_ms = mono_ms()
        self._lease_event.set()
        # What was pushed to the lost connection is not pushed again.
        self._fail_waiters(f"the connection broke: {failure.message}", self._sock)
        self._notify("connection.lost", {"reason": str(failure)})

    async def _read_loop(self, s: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        frames = FrameReader()
        frames.note_quiet(mono_ms())
        try:
            while True:
                before = mono_ms()
                try:
                    data = s.recv(READ_CHUNK)
                except BlockingIOError:
                    frames.note_quiet(before)
                    ready = loop.create_future()
                    loop.add_reader(s.fileno(), ready.set_result, None)
                    try:
                        await ready
                    finally:
                        loop.remove_reader(s.fileno())
                    continue
                if not data:
                    raise ConnectionLost("the agent closed the connection")
                for m in frames.feed(data, before, len(data) < READ_CHUNK):
                    self._deliver(m)
                frames.check()
        except asyncio.CancelledError:
            raise
        except PgcoordError as e:
            self._fail(e)
        except OSError as e:
            self._fail(ConnectionLost(f"reading from the agent: {e}"))

    def _deliver(self, m: Message) -> None:
        if m.kind == NOTIFICATION:
            sid = self.session.session if self.session else 0
            self.beliefs.note(m.method, m.params, m.stamp_ms, sid)
            if m.method == "session.lost" and m.params.get("session") == sid:
                self.session_lost = True
                self._fail_waiters("the session was lost", None)
            if m.method in ("permit.admitted", "permit.expired"):
                w = self._waiters.get(m.params.get("id"))
                if w is not None and not w[0].done():
                    w[0].set_result((m.method, m.params))
            self._lease_event.set()
            self._notify(m.method, m.params)
            return
        entry = self._pending.pop(m.msgid, None)
        if entry is None:
            if m.msgid == 0 and m.error is not None:
                raise error_from_wire(m.error)
            return
        fut, on_reply = entry
        if on_reply:
            on_reply(m)
        if not fut.done():
            fut.set_result(m)

    def _notify(self, method: str, params: dict) -> None:
        for q in self._queues:
            q.put_nowait((method, params))
        for want, fn in self._handlers:
            if want is None or want == method:
                with contextlib.suppress(Exception):
                    r = fn(method, params)
                    if asyncio.iscoroutine(r):
                        asyncio.ensure_future(r)

    def on(self, method: Optional[str], fn: Callable) -> None:
        """fn(method, params) per notification (a coroutine function is
        scheduled as a task)."""
        self._handlers.append((method, fn))

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self._queues.append(q)
        return q

    # --- calls -----------------------------------------------------------------

    async def _live(self) -> None:
        async with self._conn_lock:
            if self._closed:
                raise ClientClosed("the client was closed")
            if self._failure is None and self._sock is not None:
                return
            if not self.reconnect:
                raise self._failure or ConnectionLost("not connected")
            await self._open()
            if self.session and not self.session_lost:
                await self._resume()

    async def _resume(self) -> None:
        s = self.session
        if mono_ms() - (self._lost_at_ms or mono_ms()) >= s.grace_ms:
            self.session_lost = True
            raise SessionExpired(f"session {s.session} was disconnected longer than its grace")
        lost_at = self._lost_at_ms or mono_ms()
        while True:
            try:
                m = await self._send("session.open", resume_params(s), None)
                break
            except Conflict:
                # the agent has not yet seen the old connection close
                if mono_ms() - lost_at >= min(s.grace_ms, RESUME_PATIENCE_MS):
                    raise
                await asyncio.sleep(0.02)
            except (SessionExpired, NotFound) as e:
                self.session_lost = True
                raise SessionExpired(f"session {s.session} could not be resumed: {e.message}")
        r = T.from_map(T.Session, m)
        if r.session != s.session:
            raise ProtocolError(f"asked to resume session {s.session}, got {r.session}")
        self.session, self._lost_at_ms = r, 0
        self._notify("session.resumed", {"session": r.session})
        for name, wait in list(self._leases.items()):
            with contextlib.suppress(PgcoordError):
                await self._acquire(name, None, wait, None)

    async def _send(self, method, params, timeout, on_reply=None) -> dict:
        if self._failure:
            raise self._failure
        loop = asyncio.get_running_loop()
        msgid = next(self._ids) % 0xFFFFFFFF + 1
        fut = loop.create_future()
        self._pending[msgid] = (fut, on_reply)
        t = self.timeout if timeout is None else timeout
        deadline = loop.time() + t
        try:
            await asyncio.wait_for(loop.sock_sendall(self._sock, pack_request(msgid, method, params)), t)
        except asyncio.TimeoutError:
            # Part of the request may be on the wire: the stream is unusable.
            self._fail(CallTimeout(f"{method}: could not send within {t:g} s"))
            raise self._failure from None
        except OSError as e:
            self._fail(ConnectionLost(f"sending {method}: {e}"))
            raise self._failure from None
        try:
            m = await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            self._pending.pop(msgid, None)
            raise CallTimeout(f"{method}: no reply within {t:g} s; the outcome is unknown") from None
        if m.error is not None:
            raise error_from_wire(m.error)
        return m.result

    async def call(self, method: str, params: Optional[dict] = None, *, timeout=None) -> dict:
        if not isinstance(method, str):
            raise TypeError("method is a str")
        if params is not None and not isinstance(params, dict):
            raise TypeError("params is a dict or None")
        await self._live()
        return await self._send(method, params, timeout)

    async def _invoke(self, method, params, convert, timeout=None):
        return convert(await self.call(method, params, timeout=timeout))

    async def _invoke_all(self, method, params, page_size=None, timeout=None):
        rows, cursor = [], None
        while True:
            page = await self.list_page(method, params, limit=page_size or ALL_PAGE_SIZE,
                                        cursor=cursor, timeout=timeout)
            rows.extend(page.items)
            if page.next_cursor is None:
                return rows
            cursor = page.next_cursor

    # --- sessions, leases, permits ------------------------------------------------

    async def session_open(self, name: Optional[str] = None, *,
                           keepalive_ms: Optional[int] = None, timeout=None) -> T.Session:
        r = T.from_map(T.Session, await self.call("session.open",
                                                  session_open_params(name, keepalive_ms),
                                                  timeout=timeout))
        self.session, self.session_lost, self._lost_at_ms = r, False, 0
        return r

    async def session_close(self, *, timeout=None) -> bool:
        self.beliefs.end_all()
        self._leases.clear()
        r = await self.call("session.close", None, timeout=timeout)
        self.session = None
        return r.get("closed") is True

    async def _acquire(self, name, ttl_ms, wait, timeout) -> T.LeaseAcquired:
        def on_reply(m: Message):
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
            m = await self._send("lease.acquire", params, timeout, on_reply)
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

    async def lease_acquire(self, name: str, *, ttl_ms=None, wait=False, timeout=None):
        if not isinstance(name, str) or not name:
            raise TypeError("a lease name is a non-empty str")
        await self._live()
        return await self._acquire(name, ttl_ms, wait, timeout)

    async def lease_release(self, name: str, *, timeout=None) -> bool:
        self.beliefs.drop(name)
        self._leases.pop(name, None)
        r = await self.call("lease.release", {"name": name}, timeout=timeout)
        return r.get("released") is True

    def is_leader(self, name: str) -> bool:
        return self.beliefs.is_leader(name)

    async def wait_leader(self, name: str, timeout: Optional[float] = None) -> bool:
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not self.beliefs.is_leader(name):
            if self.session_lost:
                raise SessionExpired("the session was lost while campaigning")
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            self._lease_event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._lease_event.wait(),
                                       0.25 if left is None else min(left, 0.25))
        return True

    @contextlib.asynccontextmanager
    async def lease(self, name: str, *, ttl_ms=None, wait=True, timeout=None):
        r = await self.lease_acquire(name, ttl_ms=ttl_ms, wait=wait)
        try:
            if wait and not self.beliefs.is_leader(name):
                await self.wait_leader(name, timeout)
            yield AsyncLead(self, name, self.beliefs.epoch(name) or r.epoch)
        finally:
            with contextlib.suppress(PgcoordError):
                await self.lease_release(name)

    async def _retrying(self, fn, retry_for):
        loop = asyncio.get_running_loop()
        end = loop.time() + (self.retry_for if retry_for is None else retry_for)
        backoff, unknown, attempts = 0.05, False, 0
        while True:
            attempts += 1
            try:
                return await fn(), unknown, attempts
            except PgcoordError as e:
                unknown = unknown or e.outcome_unknown
                if not e.retryable or isinstance(e, ClientClosed) or loop.time() + backoff >= end:
                    e.outcome_unknown_seen = unknown
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def claim(self, id: str, quotas, *, intent=None, on_owner_loss=None, limit=None,
                    wait_ms=None, timeout=None, retry_for=None,
                    give_up: bool = True) -> T.Claim:
        """wait_ms: see Client.claim; the outcome of a "queued" claim comes
        as a permit.admitted or permit.expired notification."""
        params = claim_params(id, quotas, intent, on_owner_loss, limit, wait_ms)
        try:
            m, unknown, attempts = await self._retrying(
                lambda: self.call("permit.claim", params, timeout=timeout), retry_for)
        except PgcoordError as e:
            if not e.retryable or not getattr(e, "outcome_unknown_seen", False):
                raise
            released = None
            if give_up:
                try:
                    await self.give_up(id)
                    released = True
                except PgcoordError:
                    released = False
            raise GaveUp(f"claim {id}: gave up after {e}", last=e, released=released) from e
        c = T.from_map(T.Claim, m)
        c.earlier_outcome_unknown, c.attempts = unknown, attempts
        return c

    async def give_up(self, id: str, *, retry_for=None) -> bool:
        try:
            await self.release(id, reason="given up after an unknown outcome",
                               retry_for=retry_for)
        except NotFound:
            # A claim that queued is not a permit; cancel takes it out.
            if await self._cancel_wait(id):
                await self.release(id, reason="given up after an unknown outcome",
                                   retry_for=retry_for)
        return True

    async def _cancel_wait(self, id: str) -> bool:
        """permit.cancel; True when it was admitted meanwhile."""
        try:
            c = await self.permit_cancel(id)
        except (NotFound, MethodNotFound):
            return False
        return c.status in ("admitted", "held")

    async def claim_wait(self, id: str, quotas, wait_ms: int, **kw) -> T.Claim:
        """Client.claim_wait as a coroutine: cancelling the task that awaits
        it cancels the claim (releasing a permit admitted meanwhile)."""
        if not isinstance(wait_ms, int) or isinstance(wait_ms, bool) or wait_ms <= 0:
            raise TypeError("claim_wait's wait_ms is an int > 0")
        if id in self._waiters:
            raise RuntimeError(f"claim_wait of {id!r} is already running on this client")
        w = [asyncio.get_running_loop().create_future(), None]  # outcome, the socket it queued on
        self._waiters[id] = w
        try:
            c = await self.claim(id, quotas, wait_ms=wait_ms, **kw)
            if c.status == "denied":
                raise ClaimDenied(f"claim {id}: no room in {c.quota} "
                                  f"({c.waiting or 0} waiting)", c)
            if c.status != "queued":
                return c
            if c.mine is False:   # its outcome is pushed to the session that queued it
                raise Conflict(f"claim {id}: queued by another session")
            w[1] = self._sock
            if self._failure is not None and not w[0].done():
                w[0].set_exception(ConnectionLost("waiting for a queued claim: the connection broke"))
            # The outcome is pushed; the timeout covers one pushed and lost.
            left = ((c.deadline_at or 0) - (c.now_at or 0)) / 1000.0 + 5.0
            try:
                method, params = await asyncio.wait_for(asyncio.shield(w[0]), left)
            except asyncio.TimeoutError:
                return await self._settle_wait(id, w[0], gave_up=False)
            except asyncio.CancelledError:
                with contextlib.suppress(PgcoordError):
                    await self._settle_wait(id, w[0], gave_up=True)
                raise
            return wait_outcome(id, method, params)
        finally:
            if self._waiters.get(id) is w:
                del self._waiters[id]
            if w[0].done() and not w[0].cancelled():
                w[0].exception()  # seen: no "never retrieved" warning

    async def _settle_wait(self, id, fut, *, gave_up: bool):
        admitted = await self._cancel_wait(id)
        heard = fut.result() if fut.done() and fut.exception() is None else None
        admitted = admitted or (heard is not None and heard[0] == "permit.admitted")
        if gave_up:
            if admitted:
                await self.release(id, reason="waiting claim given up")
            return None
        if not admitted:
            if heard is not None:
                return wait_outcome(id, *heard)
            raise WaitExpired(f"claim {id}: no outcome heard; cancelled", "no outcome heard")
        return held_claim(id, await self.permit_get(id))

    def _fail_waiters(self, why: str, sock) -> None:
        """Ends the waits queued on sock (None: on any connection)."""
        for id, (fut, on) in self._waiters.items():
            if on is not None and (sock is None or on is sock) and not fut.done():
                fut.set_exception(ConnectionLost(f"waiting for {id}: {why}"))

    async def release(self, id: str, *, override=None, reason=None, timeout=None,
                      retry_for=None) -> T.PermitChange:
        params = {"id": id}
        if override is not None:
            params["override"] = override
        if reason is not None:
            params["reason"] = reason
        m, _, _ = await self._retrying(
            lambda: self.call("permit.release", params, timeout=timeout), retry_for)
        return T.from_map(T.PermitChange, m)

    @contextlib.asynccontextmanager
    async def permit(self, id: str, quotas, **kw):
        c = await self.claim(id, quotas, **kw)
        if not c.granted:
            if c.earlier_outcome_unknown:
                await self.give_up(id)
            raise ClaimDenied(f"claim {id}: no room in {c.quota}", c)
        try:
            yield c
        except BaseException:
            if c.mine is not False:
                with contextlib.suppress(PgcoordError):
                    await self.release(id)
            raise
        if c.mine is not False:
            with contextlib.suppress(Conflict):
                await self.release(id)
