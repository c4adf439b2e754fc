"""Error mapping: every PROTOCOL.md code to its class, retryable as the
table says unless the agent says otherwise."""

import pytest

import pgcoord
from pgcoord.errors import CODES, PgcoordError, ProtocolError, error_from_wire

RETRYABLE = {"unavailable", "timeout", "busy", "shutting_down"}


def test_codes_follow_the_protocol_table():
    assert CODES == ("invalid_request", "method_not_found", "invalid_params", "unavailable",
                     "timeout", "busy", "not_found", "forbidden", "no_session",
                     "session_expired", "conflict", "fenced", "superseded", "shutting_down",
                     "internal", "too_large")


@pytest.mark.parametrize("code", CODES)
def test_each_code_has_its_class(code):
    e = error_from_wire({"code": code, "message": "m", "retryable": code in RETRYABLE})
    assert type(e) is not PgcoordError and isinstance(e, PgcoordError)
    assert e.code == code and e.message == "m" and e.retryable == (code in RETRYABLE)
    assert str(e) == f"{code}: m"
    name = "".join(p.capitalize() for p in code.split("_"))
    assert type(e).__name__ == name and getattr(pgcoord, name) is type(e)


def test_the_agents_retryable_wins():
    assert error_from_wire({"code": "busy", "message": "", "retryable": False}).retryable is False


def test_unknown_code_keeps_what_the_agent_said():
    e = error_from_wire({"code": "brand_new", "message": "x", "retryable": True})
    assert type(e) is PgcoordError and e.code == "brand_new" and e.retryable


@pytest.mark.parametrize("bad", [None, "oops", {"message": "no code"}, {"code": 3}])
def test_a_malformed_error_map_is_a_protocol_error(bad):
    assert isinstance(error_from_wire(bad), ProtocolError)


def test_client_side_failures_say_the_outcome_is_unknown():
    assert pgcoord.ConnectionLost("x").outcome_unknown and pgcoord.ConnectionLost.retryable
    assert pgcoord.CallTimeout("x").outcome_unknown and pgcoord.CallTimeout.retryable
    assert not pgcoord.ConnectError.outcome_unknown
    assert not pgcoord.ProtocolError.retryable
