"""MessagePack-RPC framing (PROTOCOL.md "Transport and framing",
"Envelopes"): requests out, and a reader that splits the byte stream into
messages, checks their envelopes and dates each one for the leader belief."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import ProtocolError

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2
MAX_MSGID = 0xFFFFFFFF


def pack_request(msgid: int, method: str, params: dict | None) -> bytes:
    """[0, msgid, method, [params]]; no params is an empty params array."""
    return msgpack.packb([REQUEST, msgid, method, [params] if params else []],
                         use_bin_type=True)


@dataclass
class Message:
    kind: int
    msgid: int = 0           # responses
    error: Any = None        # responses
    result: Any = None       # responses
    method: str = ""         # notifications
    params: dict | None = None  # notifications
    stamp_ms: int = 0        # a moment before the agent sent it (monotonic ms)


def parse_envelope(obj: Any, stamp_ms: int = 0) -> Message:
    """A decoded object as a response or a notification; ProtocolError for
    anything else (a client never receives requests)."""
    if not isinstance(obj, (list, tuple)) or not obj:
        raise ProtocolError(f"the agent sent a message that is not an array: {obj!r:.200}")
    kind = obj[0]
    if kind == RESPONSE and len(obj) == 4:
        _, msgid, error, result = obj
        if not isinstance(msgid, int) or isinstance(msgid, bool) or not 0 <= msgid <= MAX_MSGID:
            raise ProtocolError(f"a response has a bad msgid: {msgid!r:.50}")
        if error is None and not isinstance(result, dict):
            raise ProtocolError(f"a successful response has no result map: {result!r:.200}")
        return Message(RESPONSE, msgid=msgid, error=error, result=result, stamp_ms=stamp_ms)
    if kind == NOTIFICATION and len(obj) == 3:
        _, method, params = obj
        if not isinstance(method, str) or not isinstance(params, (list, tuple)):
            raise ProtocolError(f"a notification has a bad method or params: {obj!r:.200}")
        if len(params) == 0:
            p = {}
        elif len(params) == 1 and isinstance(params[0], dict):
            p = params[0]
        else:
            raise ProtocolError(f"notification {method} params are not one map")
        return Message(NOTIFICATION, method=method, params=p, stamp_ms=stamp_ms)
    raise ProtocolError(f"the agent sent a message of unknown shape: {obj!r:.200}")


class FrameReader:
    """Feeds received chunks to a streaming unpacker and hands back the
    complete messages, each dated with the stamp of the chunk its first
    byte came in.

    The stamp rule is libpgcoord's (client-lib/inbound.c): a chunk read
    into an empty buffer is dated by the last moment the socket's receive
    queue was seen empty, because the agent sent those bytes after it. The
    caller says when it saw the queue empty (note_quiet) and whether a read
    emptied it."""

    def __init__(self, max_buffer: int = 64 * 1024 * 1024):
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                          max_buffer_size=max_buffer)
        self._fed = 0        # bytes given to the unpacker
        self._done = 0       # where the last complete message ended
        self.quiet_ms = 0    # last moment the receive queue was seen empty
        self._stamp_ms = 0   # the date of the message being assembled
        # Set when the stream broke; the messages before the break are
        # still handed back, so a notification sent just before garbage
        # is not lost.
        self.broken: ProtocolError | None = None

    def note_quiet(self, at_ms: int) -> None:
        self.quiet_ms = at_ms

    def buffered(self) -> int:
        """Bytes of a message begun but not complete."""
        return self._fed - self._done

    def feed(self, data: bytes, read_started_ms: int, emptied: bool) -> list[Message]:
        """data was read by a read that began at read_started_ms; emptied
        says the read took everything queued (it returned less than asked)."""
        if self.buffered() == 0:
            self._stamp_ms = self.quiet_ms
        if emptied:
            self.quiet_ms = read_started_ms
        out: list[Message] = []
        if self.broken:
            raise self.broken
        try:
            self._unpacker.feed(data)
            self._fed += len(data)
            while True:
                try:
                    obj = self._unpacker.unpack()
                except msgpack.OutOfData:
                    break
                self._done = self._unpacker.tell()
                # Every message that begins in this chunk shares its date.
                out.append(parse_envelope(obj, self._stamp_ms))
        except ProtocolError as e:
            self.broken = e
        except (ValueError, msgpack.ExtraData, msgpack.FormatError,
                msgpack.StackError, msgpack.BufferFull) as e:
            self.broken = ProtocolError(f"the agent sent bytes that are not MessagePack: {e}")
        return out

    def check(self) -> None:
        """Raises the ProtocolError that broke the stream, if one did."""
        if self.broken:
            raise self.broken
