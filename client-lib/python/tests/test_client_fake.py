"""The clients against a fake agent on a Unix socket: replies, garbage, a
closed socket, silence, notifications, the lease result's belief and
resume on reconnect. Every failure must be an ordinary exception, fast."""

import asyncio
import os
import socket
import threading
import time

import msgpack
import pytest

import pgcoord
from pgcoord import AsyncClient, Client


class FakeAgent:
    """Answers each request with handler(conn_index, method, params), which
    returns a result map, ("error", code), ("error_map", obj), ("raw", bytes), ("close",),
    ("silent",) or a list of such actions (notifications as
    ("notify", method, params))."""

    def __init__(self, path, handler):
        self.path, self.handler = path, handler
        self.conns = []
        self.requests = []
        self.ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ls.bind(path)
        self.ls.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c, len(self.conns) - 1),
                             daemon=True).start()

    def _serve(self, c, index):
        u = msgpack.Unpacker(raw=False)
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    return
                u.feed(data)
                for _, msgid, method, params in u:
                    p = params[0] if params else {}
                    self.requests.append((index, method, p))
                    actions = self.handler(index, method, p)
                    if not isinstance(actions, list):
                        actions = [actions]
                    for a in actions:
                        if isinstance(a, dict):
                            c.sendall(msgpack.packb([1, msgid, None, a]))
                        elif a[0] == "error":
                            c.sendall(msgpack.packb([1, msgid, {"code": a[1], "message": "fake",
                                                                "retryable": a[1] in ("busy", "unavailable")}, None]))
                        elif a[0] == "notify":
                            c.sendall(msgpack.packb([2, a[1], [a[2]]]))
                        elif a[0] == "error_map":  # any error object, the msgid right
                            c.sendall(msgpack.packb([1, msgid, a[1], None]))
                        elif a[0] == "raw":
                            c.sendall(a[1])
                        elif a[0] == "close":
                            c.close()
                            return
        except OSError:
            pass

    def close(self):
        self.ls.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture
def fake(tmp_path):
    made = []

    def make(handler):
        f = FakeAgent(str(tmp_path / f"agent{len(made)}.sock"), handler)
        made.append(f)
        return f
    yield make
    for f in made:
        f.close()


def basic(index, method, p):
    if method == "agent.ping":
        return {"pong": True}
    if method == "session.open":
        return {"session": 41, "resumed": "resume" in p, "ttl_ms": 10000, "grace_ms": 10000}
    return ("error", "method_not_found")


def test_calls_and_typed_errors(fake):
    f = fake(basic)
    with Client(f.path, timeout=2) as c:
        assert c.ping() is True
        s = c.session_open("x")
        assert s.session == 41 and s.resumed is False and s.raw["ttl_ms"] == 10000
        with pytest.raises(pgcoord.MethodNotFound) as e:
            c.call("agent.nope")
        assert e.value.code == "method_not_found" and not e.value.retryable


def test_bad_input_is_a_type_error_before_anything_is_sent(fake):
    f = fake(basic)
    with Client(f.path, timeout=2) as c:
        with pytest.raises(TypeError):
            c.call(5)
        with pytest.raises(TypeError):
            c.call("agent.ping", ["not", "a", "map"])
        with pytest.raises(TypeError):
            c.claim("", "q")
        with pytest.raises(TypeError):
            c.claim("id", [3])
        with pytest.raises(TypeError):
            c.lease_acquire("")
        assert f.requests == []


def test_no_agent_is_a_connect_error(tmp_path):
    with pytest.raises(pgcoord.ConnectError):
        Client(str(tmp_path / "nobody.sock"))


@pytest.mark.parametrize("garbage", [b"\xc1", msgpack.packb({"not": "an envelope"}),
                                     msgpack.packb([1, 1, None, "not a map"]),
                                     msgpack.packb([7, 1, None, None])])
def test_garbage_from_the_agent_is_a_protocol_error_not_a_hang(fake, garbage):
    f = fake(lambda i, m, p: ("raw", garbage))
    with Client(f.path, timeout=5, reconnect=False) as c:
        started = time.monotonic()
        with pytest.raises(pgcoord.ProtocolError):
            c.call("agent.ping")
        assert time.monotonic() - started < 2


def test_a_closed_socket_is_connection_lost(fake):
    f = fake(lambda i, m, p: ("close",))
    with Client(f.path, timeout=5, reconnect=False) as c:
        with pytest.raises(pgcoord.ConnectionLost) as e:
            c.call("agent.ping")
        assert e.value.outcome_unknown
        with pytest.raises(pgcoord.ConnectionLost):
            c.call("agent.ping")


def test_a_silent_agent_is_a_call_timeout(fake):
    f = fake(lambda i, m, p: ("silent",))
    with Client(f.path, timeout=0.2) as c:
        started = time.monotonic()
        with pytest.raises(pgcoord.CallTimeout):
            c.call("agent.ping")
        assert 0.15 < time.monotonic() - started < 1.5


@pytest.mark.parametrize("bad", [{"no": "code"}, {"code": 7, "message": "x"}, "busy", [1]])
def test_a_malformed_error_answer_is_a_protocol_error_not_a_hang(fake, bad):
    f = fake(lambda i, m, p: ("error_map", bad))
    with Client(f.path, timeout=5, reconnect=False) as c:
        started = time.monotonic()
        with pytest.raises(pgcoord.ProtocolError):
            c.call("agent.ping")
        assert time.monotonic() - started < 2


def test_a_frame_cut_short_then_closed_is_connection_lost_not_a_hang(fake):
    whole = msgpack.packb([1, 1, None, {"pong": True}])
    f = fake(lambda i, m, p: [("raw", whole[:-3]), ("close",)])
    with Client(f.path, timeout=5, reconnect=False) as c:
        started = time.monotonic()
        with pytest.raises(pgcoord.ConnectionLost) as e:
            c.call("agent.ping")
        assert e.value.outcome_unknown
        assert time.monotonic() - started < 2


def test_async_garbage_and_a_cut_frame_are_ordinary_errors(fake):
    whole = msgpack.packb([1, 1, None, {"pong": True}])

    def handler(i, m, p):
        return [("raw", b"\xc1")] if i == 0 else [("raw", whole[:-3]), ("close",)]
    f = fake(handler)

    async def main():
        c = await AsyncClient.connect(f.path, timeout=5)
        with pytest.raises(pgcoord.ProtocolError):
            await c.ping()
        with pytest.raises(pgcoord.ConnectionLost):
            await c.ping()
        await c.close()
    asyncio.run(asyncio.wait_for(main(), 5))


def test_notifications_reach_callbacks_and_queues_without_polling(fake):
    def handler(i, m, p):
        if m == "agent.ping":
            return [("notify", "agent.db_down", {}), {"pong": True}]
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        got = threading.Event()
        c.on("agent.db_down", lambda m, p: got.set())
        q = c.subscribe()
        c.ping()
        assert got.wait(2)
        assert q.get(timeout=2) == ("agent.db_down", {})


def test_a_callback_may_call_the_agent(fake):
    def handler(i, m, p):
        if m == "session.open":
            return [("notify", "agent.db_up", {}), basic(i, m, p)]
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        answered = threading.Event()
        c.on("agent.db_up", lambda m, p: c.ping() and answered.set())
        c.session_open()
        assert answered.wait(2)


def test_lease_result_starts_a_belief_with_the_earlier_deadline(fake):
    def handler(i, m, p):
        if m == "lease.acquire":
            return {"name": p["name"], "leader": True, "epoch": 9, "valid_ms": 60000,
                    "valid_until_mono_ms": pgcoord.mono_ms() + 300, "campaigning": False,
                    "ttl_ms": 90000, "holder": {"session": 41, "replica_id": "r"},
                    "expires_in_ms": 90000}
        if m == "lease.release":
            return {"released": True}
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open()
        with c.lease("x") as lead:
            assert lead.valid and lead.epoch == 9
            assert 0 < lead.deadline_ms - pgcoord.mono_ms() <= 300
            assert abs(lead.deadline - time.monotonic()) < 0.5
            time.sleep(0.35)
            assert not lead.valid and lead.deadline == 0.0
        assert f.requests[-1][1] == "lease.release"


def test_lease_changed_to_false_ends_belief_at_once(fake):
    def handler(i, m, p):
        if m == "lease.acquire":
            return [{"name": "x", "leader": True, "epoch": 3, "valid_ms": 60000,
                     "valid_until_mono_ms": 0, "campaigning": False, "ttl_ms": 90000,
                     "holder": None, "expires_in_ms": 0},
                    ("notify", "lease.changed", {"name": "x", "epoch": 3, "leader": False,
                                                 "valid_ms": 0, "valid_until_mono_ms": 0,
                                                 "session": 41, "holder": None,
                                                 "reason": "lost"})]
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open()
        c.lease_acquire("x")
        end = time.monotonic() + 2
        while c.is_leader("x") and time.monotonic() < end:
            time.sleep(0.01)
        assert not c.is_leader("x")


def test_reconnect_resumes_the_session_and_a_claim_retries_the_same_id(fake):
    def handler(i, m, p):
        if m == "permit.claim":
            if i == 0:
                return ("close",)  # the reply is lost with the connection
            return {"status": "held", "id": p["id"], "token": 5, "state": "held",
                    "phase": "reserved", "owner_session": 41, "owner_replica": "r",
                    "mine": True, "created_at": 1, "now_at": 2}
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open()
        cl = c.claim("job-1", {"t": 2})
        assert cl.status == "held" and cl.attempts == 2 and cl.earlier_outcome_unknown
        assert c.session.resumed is True
        calls = [(i, m, p) for i, m, p in f.requests]
        assert (1, "session.open", {"resume": 41}) in calls
        claims = [p for i, m, p in calls if m == "permit.claim"]
        assert claims == [{"id": "job-1", "quotas": [{"key": "t", "weight": 2}]}] * 2


def test_giving_up_after_an_unknown_outcome_releases_the_id(fake):
    def handler(i, m, p):
        if m == "permit.claim":
            return ("silent",)
        if m == "permit.release":
            return ("error", "not_found")  # nothing admitted: the id is retired
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=0.1) as c:
        c.session_open()
        with pytest.raises(pgcoord.GaveUp) as e:
            c.claim("job-2", "t", retry_for=0.3)
        assert e.value.released is True and isinstance(e.value.last, pgcoord.CallTimeout)
        assert [m for _, m, _ in f.requests].count("permit.release") == 1


def test_a_denied_claim_in_the_permit_context_raises(fake):
    def handler(i, m, p):
        if m == "permit.claim":
            return {"status": "denied", "id": p["id"], "quota": "t", "limit": 1,
                    "in_flight": 1, "weight": 1, "now_at": 1}
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open()
        with pytest.raises(pgcoord.ClaimDenied) as e:
            with c.permit("job-3", "t"):
                pytest.fail("the body must not run")
        assert e.value.claim.limit == 1
        assert "permit.release" not in [m for _, m, _ in f.requests]


def test_async_client(fake):
    def handler(i, m, p):
        if m == "agent.ping" and i == 0:
            return [("notify", "agent.db_down", {}), ("raw", b"\xc1")]
        return basic(i, m, p)
    f = fake(handler)

    async def main():
        c = await AsyncClient.connect(f.path, timeout=2)
        q = c.subscribe()
        s = await c.session_open("a")
        assert s.session == 41
        with pytest.raises(pgcoord.ProtocolError):
            await c.ping()
        assert (await q.get()) == ("agent.db_down", {})
        # the next call reconnects and resumes
        assert await c.ping() is True
        assert c.session.resumed is True
        with pytest.raises(pgcoord.MethodNotFound):
            await c.call("agent.nope")
        await c.close()
    asyncio.run(asyncio.wait_for(main(), 10))


def test_async_silent_agent_times_out(fake):
    f = fake(lambda i, m, p: ("silent",))

    async def main():
        c = await AsyncClient.connect(f.path, timeout=0.2)
        with pytest.raises(pgcoord.CallTimeout):
            await c.ping()
        await c.close()
    asyncio.run(asyncio.wait_for(main(), 5))


def test_the_bodys_exception_wins_over_a_failing_release(fake):
    def handler(i, m, p):
        if m == "permit.claim":
            return {"status": "admitted", "id": p["id"], "token": 1, "state": "held",
                    "phase": "reserved", "owner_session": 41, "owner_replica": "r",
                    "mine": True, "created_at": 1, "now_at": 1}
        if m == "permit.release":
            return ("error", "session_expired")
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open()
        with pytest.raises(ValueError):
            with c.permit("job-4", "t"):
                raise ValueError("the work failed")
        # without a failing body, the release's error is the caller's to see
        with pytest.raises(pgcoord.SessionExpired):
            with c.permit("job-5", "t"):
                pass


def test_resume_waits_while_the_agent_still_sees_the_old_connection(fake):
    answers = {"conflicts": 0}

    def handler(i, m, p):
        if m == "agent.ping" and i == 0:
            return ("close",)
        if m == "session.open" and "resume" in p and answers["conflicts"] < 3:
            answers["conflicts"] += 1
            return ("error", "conflict")
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open()
        with pytest.raises(pgcoord.ConnectionLost):
            c.ping()
        assert c.ping() is True
        assert c.session.resumed is True and answers["conflicts"] == 3


def test_watch_calls_send_their_target_and_return_the_watch_id(fake):
    def agent(index, method, p):
        if method in ("quota.watch", "permit.watch", "record.watch"):
            return {"watch": 7, "poll_ms": 500}
        if method == "watch.cancel":
            return {"cancelled": p.get("watch") == 7}
        return basic(index, method, p)

    f = fake(agent)
    with Client(f.path, timeout=2) as c:
        w = c.quota_watch("gpu")
        assert w.watch == 7 and w.poll_ms == 500
        assert c.permit_watch("job-1").watch == 7
        assert c.record_watch("ingest").watch == 7
        assert c.watch_cancel(7) is True and c.watch_cancel(8) is False
    assert [r[1:] for r in f.requests] == [
        ("quota.watch", {"key": "gpu"}), ("permit.watch", {"id": "job-1"}),
        ("record.watch", {"kind": "ingest"}), ("watch.cancel", {"watch": 7}),
        ("watch.cancel", {"watch": 8})]


def test_keepalive_ms_is_sent_on_open_and_again_on_resume(fake):
    def handler(i, m, p):
        if m == "session.open":
            return {"session": 41, "resumed": "resume" in p, "ttl_ms": 10000,
                    "grace_ms": 10000, "keepalive_ms": p.get("keepalive_ms", 0)}
        if m == "session.keepalive":
            if i == 0:
                return ("close",)
            return {"session": 41, "live": True, "last_heartbeat_ms_ago": 3,
                    "keepalive_ms": 2000, "next_due_ms": 2000}
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        with pytest.raises(TypeError):
            c.session_open("x", keepalive_ms="2000")
        assert f.requests == []
        s = c.session_open("x", keepalive_ms=2000)
        assert s.keepalive_ms == 2000
        with pytest.raises(pgcoord.ConnectionLost):
            c.keepalive()
        k = c.keepalive()   # the application's next keepalive resumes first
        assert k.keepalive_ms == 2000 and k.next_due_ms == 2000
        calls = [(i, m, p) for i, m, p in f.requests if m == "session.open"]
        assert calls == [(0, "session.open", {"name": "x", "keepalive_ms": 2000}),
                         (1, "session.open", {"resume": 41, "keepalive_ms": 2000})]


def test_a_session_lost_to_a_missed_keepalive_raises_session_expired(fake):
    def handler(i, m, p):
        if m == "session.keepalive":
            return [("notify", "session.lost", {"session": 41, "reason": "keepalive missed"}),
                    ("error", "session_expired")]
        return basic(i, m, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        c.session_open(keepalive_ms=500)
        notes = c.subscribe()
        with pytest.raises(pgcoord.SessionExpired):
            c.keepalive()
        assert notes.get(timeout=2) == ("session.lost",
                                        {"session": 41, "reason": "keepalive missed"})
        assert c.session_lost


QUEUED = {"status": "queued", "id": "w", "position": 2, "queued_at": 1000,
          "deadline_at": 61000, "mine": True, "now_at": 1000}


@pytest.mark.parametrize("outcome", ["permit.admitted", "permit.expired"])
def test_claim_wait_hears_the_admission_or_the_expiry(fake, outcome):
    def handler(index, method, p):
        if method == "permit.claim":
            return [QUEUED, ("notify", outcome, {"id": "w", "token": 7, "state": "held",
                                                 "phase": "claimed", "owner_session": 3,
                                                 "queued_ms": 40, "reason": "wait_ms elapsed",
                                                 "now_at": 1040})]
        return basic(index, method, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        q = c.subscribe()
        if outcome == "permit.expired":
            with pytest.raises(pgcoord.WaitExpired) as e:
                c.claim_wait("w", "q", 60000)
            assert e.value.reason == "wait_ms elapsed"
        else:
            r = c.claim_wait("w", "q", 60000)
            assert r.granted and r.token == 7 and r.queued_ms == 40 and r.owner_session == 3
        assert q.get(timeout=2)[0] == outcome   # the notification is delivered too
        assert f.requests[0][2]["wait_ms"] == 60000


def test_claim_wait_cancelled_releases_a_late_admission(fake):
    def handler(index, method, p):
        if method == "permit.claim":
            return QUEUED
        if method == "permit.cancel":
            return {"id": "w", "cancelled": False, "status": "held", "now_at": 2000}
        if method == "permit.release":
            return {"id": "w", "released": True, "state": "released", "now_at": 2001}
        return basic(index, method, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        with pytest.raises(pgcoord.WaitExpired) as e:
            c.claim_wait("w", "q", 60000, cancel=stop)
        assert e.value.reason == "cancelled by the caller"
    assert [m for _, m, _ in f.requests] == ["permit.claim", "permit.cancel", "permit.release"]


def test_claim_wait_on_a_lost_connection_is_retryable(fake):
    def handler(index, method, p):
        if method == "permit.claim":
            return [QUEUED, ("close",)]
        return basic(index, method, p)
    f = fake(handler)
    with Client(f.path, timeout=2) as c:
        t0 = time.monotonic()
        with pytest.raises(pgcoord.ConnectionLost) as e:
            c.claim_wait("w", "q", 60000)
        assert e.value.retryable and time.monotonic() - t0 < 2


def test_async_claim_wait_admitted_then_cancelled_releases(fake):
    def handler(index, method, p):
        if method == "permit.claim" and p["id"] == "w":
            return [QUEUED, ("notify", "permit.admitted", {"id": "w", "token": 9, "state": "held",
                                                           "queued_ms": 5, "now_at": 1005})]
        if method == "permit.claim":
            return dict(QUEUED, id=p["id"])
        if method == "permit.cancel":
            return {"id": p["id"], "cancelled": False, "status": "held", "now_at": 2000}
        if method == "permit.release":
            return {"id": p["id"], "released": True, "state": "released", "now_at": 2001}
        return basic(index, method, p)
    f = fake(handler)

    async def main():
        async with await AsyncClient.connect(f.path, timeout=2) as c:
            r = await c.claim_wait("w", "q", 60000)
            assert r.granted and r.token == 9 and r.queued_ms == 5
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.claim_wait("w2", "q", 60000), 0.2)
    asyncio.run(main())
    assert [m for _, m, p in f.requests if p.get("id") == "w2"] == \
        ["permit.claim", "permit.cancel", "permit.release"]
