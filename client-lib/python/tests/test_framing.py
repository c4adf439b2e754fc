"""Framing: the request bytes, splitting the stream, envelope checks and
dating messages by the last moment the receive queue was empty."""

import msgpack
import pytest

from pgcoord.errors import ProtocolError
from pgcoord.framing import NOTIFICATION, RESPONSE, FrameReader, pack_request, parse_envelope


def test_request_bytes():
    assert pack_request(1, "agent.ping", None) == b"\x94\x00\x01\xaaagent.ping\x90"
    assert msgpack.unpackb(pack_request(2, "lease.status", {"name": "x"})) == \
        [0, 2, "lease.status", [{"name": "x"}]]
    # bytes travel as MessagePack bin, strings as str
    assert msgpack.unpackb(pack_request(3, "m", {"intent": b"\xff"}), raw=True)[3][0][b"intent"] == b"\xff"


def resp(msgid, result=None, error=None):
    return msgpack.packb([1, msgid, error, result if error is None else None])


def test_messages_split_anywhere_are_reassembled():
    data = resp(1, {"a": 1}) + msgpack.packb([2, "agent.db_up", [{}]]) + resp(2, {"b": 2})
    r = FrameReader()
    got = []
    for i in range(len(data)):
        got += r.feed(data[i:i + 1], 0, True)
    assert [m.kind for m in got] == [RESPONSE, NOTIFICATION, RESPONSE]
    assert got[0].result == {"a": 1} and got[1].method == "agent.db_up" and got[2].msgid == 2


def test_a_chunk_into_an_empty_buffer_is_dated_by_the_last_quiet_moment():
    r = FrameReader()
    r.note_quiet(100)
    m = r.feed(resp(1, {}), 150, True)
    assert m[0].stamp_ms == 100          # sent after 100, not "read at 150"
    # that read emptied the queue at 150: the next message was sent after it
    m = r.feed(resp(2, {}), 400, False)
    assert m[0].stamp_ms == 150
    # the read did not empty the queue: quiet_ms stays, and a message that
    # straddles chunks keeps the date of its first byte
    two = resp(3, {"k": "v" * 10})
    assert r.feed(two[:5], 500, False) == []
    r.note_quiet(600)
    m = r.feed(two[5:], 700, True)
    assert m[0].stamp_ms == 150


def test_garbage_bytes_are_a_protocol_error_after_the_messages_before_them():
    r = FrameReader()
    got = r.feed(resp(1, {}) + b"\xc1", 0, True)  # 0xc1 starts no type
    assert [m.msgid for m in got] == [1]
    with pytest.raises(ProtocolError):
        r.check()
    with pytest.raises(ProtocolError):
        r.feed(resp(2, {}), 0, True)


@pytest.mark.parametrize("obj", [
    5, [], [3, 1, None, {}], [1, "x", None, {}], [1, -1, None, {}], [1, 2**32, None, {}],
    [1, 1, None, None], [1, 1, None, [1]], [2, 5, [{}]], [2, "m", {}], [2, "m", [1, 2]],
    [0, 1, "agent.ping", []],
])
def test_bad_envelopes_are_refused(obj):
    with pytest.raises(ProtocolError):
        parse_envelope(obj)


def test_notification_params():
    assert parse_envelope([2, "agent.db_down", []]).params == {}
    assert parse_envelope([2, "session.lost", [{"session": 1}]]).params == {"session": 1}
