"""Typed errors: one class per PROTOCOL.md error code, and the client's own
failures (connection lost, no reply in time, garbage from the agent)."""

from __future__ import annotations


class PgcoordError(Exception):
    """An error the agent answered, or one of the client's own failures.

    code is the PROTOCOL.md code (or a client-side one such as
    "connection_lost"); retryable says whether the same call with the same
    ids may be sent again; outcome_unknown says the call may have taken
    effect although no answer was seen."""

    code = "error"
    retryable = False
    outcome_unknown = False

    def __init__(self, message: str = "", *, code: str | None = None,
                 retryable: bool | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class InvalidRequest(PgcoordError):
    code = "invalid_request"


class MethodNotFound(PgcoordError):
    code = "method_not_found"


class InvalidParams(PgcoordError):
    code = "invalid_params"


class Unavailable(PgcoordError):
    code = "unavailable"
    retryable = True


class Timeout(PgcoordError):
    """The agent's statement timed out: retry with the same ids. When the
    database did not answer at all the outcome is unknown."""

    code = "timeout"
    retryable = True
    outcome_unknown = True


class Busy(PgcoordError):
    code = "busy"
    retryable = True


class NotFound(PgcoordError):
    code = "not_found"


class Forbidden(PgcoordError):
    code = "forbidden"


class NoSession(PgcoordError):
    code = "no_session"


class SessionExpired(PgcoordError):
    code = "session_expired"


class Conflict(PgcoordError):
    code = "conflict"


class Fenced(PgcoordError):
    code = "fenced"


class Superseded(PgcoordError):
    code = "superseded"


class ShuttingDown(PgcoordError):
    code = "shutting_down"
    retryable = True


class Internal(PgcoordError):
    code = "internal"


class TooLarge(PgcoordError):
    code = "too_large"


# Client-side failures: not codes the agent sends.

class ConnectError(PgcoordError):
    """The agent's socket could not be reached; nothing was sent."""

    code = "connect"
    retryable = True


class ConnectionLost(PgcoordError):
    """The connection failed or was closed while a call was in flight: the
    call may or may not have taken effect."""

    code = "connection_lost"
    retryable = True
    outcome_unknown = True


class CallTimeout(PgcoordError):
    """No reply within the call's timeout; the outcome is unknown."""

    code = "call_timeout"
    retryable = True
    outcome_unknown = True


class ProtocolError(PgcoordError):
    """The agent sent something that is not MessagePack-RPC as PROTOCOL.md
    describes; the connection is closed."""

    code = "protocol"


class ClientClosed(PgcoordError):
    code = "closed"


class ClaimDenied(PgcoordError):
    """Raised by the permit() context manager when the claim found no room;
    .claim holds the denied result."""

    code = "denied"

    def __init__(self, message: str, claim):
        super().__init__(message)
        self.claim = claim


class WaitExpired(PgcoordError):
    """claim_wait's claim left the queue without admission (permit.expired:
    its wait_ms elapsed, or an admin cancelled it); reason says which.
    Nothing of it remains: the id is free again."""

    code = "expired"

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class GaveUp(PgcoordError):
    """A claim kept failing with retryable errors until its retry budget ran
    out. When an attempt's outcome was unknown the id was released (retired)
    as PROTOCOL.md requires; released says whether that release succeeded."""

    code = "gave_up"

    def __init__(self, message: str, *, last: PgcoordError, released: bool | None):
        super().__init__(message)
        self.last = last
        self.released = released


_BY_CODE = {cls.code: cls for cls in (
    InvalidRequest, MethodNotFound, InvalidParams, Unavailable, Timeout, Busy,
    NotFound, Forbidden, NoSession, SessionExpired, Conflict, Fenced,
    Superseded, ShuttingDown, Internal, TooLarge)}

# PROTOCOL.md's table order, which libpgcoord's numbers follow from 1.
CODES = tuple(_BY_CODE)


def error_from_wire(err) -> PgcoordError:
    """The exception for the error map of a response. A map that is not
    {code, message, retryable} is a protocol error."""
    if not isinstance(err, dict):
        return ProtocolError(f"the error of a response is not a map: {err!r:.200}")
    code, message = err.get("code"), err.get("message", "")
    if not isinstance(code, str) or not isinstance(message, str):
        return ProtocolError(f"the error of a response has no code/message: {err!r:.200}")
    retryable = err.get("retryable")
    cls = _BY_CODE.get(code)
    if cls is None:
        # A code this client does not know yet: keep what the agent said.
        return PgcoordError(message, code=code,
                            retryable=retryable if isinstance(retryable, bool) else False)
    e = cls(message)
    # The agent's word on retryability wins over the table.
    if isinstance(retryable, bool):
        e.retryable = retryable
    return e
