"""Typed results: one dataclass per result shape of PROTOCOL.md. Each keeps
the whole result map in .raw, so fields a newer agent adds are not lost."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional


def from_map(cls, m: Any):
    """An instance of cls from a result map: known keys become fields (a
    missing one is None), nested shapes are converted, the map is kept."""
    if not isinstance(m, dict):
        from .errors import ProtocolError
        raise ProtocolError(f"expected a map for {cls.__name__}, got {m!r:.200}")
    kw = {}
    for f in fields(cls):
        if f.name == "raw":
            continue
        v = m.get(f.name)
        conv = _NESTED.get((cls.__name__, f.name))
        if conv is not None and v is not None:
            v = conv(v)
        kw[f.name] = v
    obj = cls(**kw)
    obj.raw = m
    return obj


@dataclass
class Hello:
    agent: str
    version: str
    protocol: int
    replica_id: str
    incarnation: int
    max_message_bytes: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class AgentStatus:
    replica_id: str
    incarnation: int
    host: str
    pid: int
    version: str
    state: str
    db: str
    registered: bool
    schema_version: int
    schema_required: int
    sessions: int
    connections: int
    leases_held: int
    janitor: bool
    uptime_ms: int
    last_heartbeat_ms_ago: int
    db_reconnects: int
    db_queries: int
    db_failures: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Session:
    session: int
    resumed: bool
    ttl_ms: int
    grace_ms: int
    keepalive_ms: Optional[int] = None   # enforced keepalive (0: none)
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Keepalive:
    session: int
    live: bool
    last_heartbeat_ms_ago: int
    keepalive_ms: Optional[int] = None   # the session's keepalive_ms (0: none)
    next_due_ms: Optional[int] = None    # the next keepalive is due within this
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Holder:
    session: int
    replica_id: str
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class LeaseAcquired:
    name: str
    leader: bool
    epoch: int
    valid_ms: int
    valid_until_mono_ms: int
    campaigning: bool
    ttl_ms: int
    holder: Optional[Holder]
    expires_in_ms: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class LeaseStatus:
    name: str
    epoch: int
    holder: Optional[Holder]
    expires_in_ms: int
    ttl_ms: int
    acquired_at: Optional[int]
    renewed_at: Optional[int]
    leader: bool
    valid_ms: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class QuotaSet:
    key: str
    limit: int
    in_flight: int
    lapse_after_s: Optional[int]
    previous_limit: Optional[int]
    created: bool
    now_at: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Quota:
    key: str
    limit: int
    in_flight: int
    held: int
    uncertain: int
    available: int
    permits: int
    lapse_after_s: Optional[int]
    created_at: int
    updated_at: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class QuotaHolder:
    """One open permit holding a quota's room, in a denied or queued
    claim's answer: age_ms since its claim, reason an uncertain one's."""

    id: str
    weight: int
    state: str
    owner_replica: Optional[str] = None
    owner_session: Optional[int] = None
    age_ms: Optional[int] = None
    reason: Optional[str] = None
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Claim:
    """A permit.claim result: status is "admitted", "held", "denied" or
    "queued" (with wait_ms: position, 1 is next; queued_at and deadline_at
    in ms of the database clock; mine False when another session queued
    it). claim_wait's admission from the queue has queued_ms.
    earlier_outcome_unknown: an earlier attempt of this id had no answer, so
    a "denied" speaks only for the retry (PROTOCOL.md, "After an outcome you
    did not see"): give the id up with Client.give_up."""

    status: str
    id: str
    token: Optional[int] = None
    state: Optional[str] = None
    phase: Optional[str] = None
    owner_session: Optional[int] = None
    owner_replica: Optional[str] = None
    mine: Optional[bool] = None
    created_at: Optional[int] = None
    quota: Optional[str] = None
    limit: Optional[int] = None
    in_flight: Optional[int] = None
    weight: Optional[int] = None
    waiting: Optional[int] = None
    position: Optional[int] = None
    queued_at: Optional[int] = None
    deadline_at: Optional[int] = None
    queued_ms: Optional[int] = None
    now_at: Optional[int] = None
    # denied or queued: who holds the room (PROTOCOL.md, "Who holds the
    # room"): the largest open permits the caller may see, at most 5, and
    # how many it may not; None when the agent did not say
    hidden: Optional[int] = None
    holders: Optional[list[QuotaHolder]] = None
    earlier_outcome_unknown: bool = False
    attempts: int = 1
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def granted(self) -> bool:
        return self.status in ("admitted", "held")

    @property
    def queued(self) -> bool:
        return self.status == "queued"


@dataclass
class Cancel:
    """permit.cancel's result: status "cancelled" (cancelled: it left the
    queue), "admitted" or "held" (the caller owns a permit and must
    release it) or "released"."""

    id: str
    cancelled: Optional[bool] = None
    status: Optional[str] = None
    now_at: Optional[int] = None
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class PermitChange:
    """permit.update, mark_uncertain, resolve and release results."""

    id: str
    state: Optional[str] = None
    phase: Optional[str] = None
    changed: Optional[bool] = None
    released: Optional[bool] = None
    owner_session: Optional[int] = None
    detail: Optional[str] = None
    phase_at: Optional[int] = None
    state_at: Optional[int] = None
    released_at: Optional[int] = None
    now_at: Optional[int] = None
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Permit:
    id: str
    token: int
    state: str
    phase: str
    owner_session: Optional[int]
    owner_replica: Optional[str]
    owner_live: bool
    on_owner_loss: str
    uncertain_reason: Optional[str]
    quotas: list
    intent_bytes: Optional[int]
    intent: Optional[bytes]
    redacted: Optional[bool]
    created_at: int
    phase_at: int
    state_at: int
    released_at: Optional[int]
    age_ms: int
    phase_age_ms: int
    state_age_ms: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Record:
    kind: str
    key: str
    state: str
    terminal: bool
    data: Optional[bytes]
    permit: Optional[str]
    owner_session: Optional[int]
    owner_replica: Optional[str]
    owner_live: bool
    token: int
    created_at: int
    updated_at: int
    settled_at: Optional[int]
    adopted_from: Optional[int]
    adopted_at: Optional[int]
    redacted: Optional[bool] = None
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class RecordPut:
    created: bool
    record: Record
    now_at: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Recovery:
    liveness_read: bool
    dry_run: bool
    adopted: list
    permits: list
    left_alone: Optional[int]
    remaining: Optional[int]
    reason: Optional[str]
    now_at: Optional[int]
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class FleetAgent:
    replica_id: str
    incarnation: int
    host: str
    pid: int
    version: str
    started_at: int
    heartbeat_at: int
    expires_at: int
    stopped_at: Optional[int]
    live: bool
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class FleetSession:
    session: int
    name: str
    replica_id: str
    incarnation: int
    opened_at: int
    expires_at: int
    owner_uid: Optional[int]
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class PermitEvent:
    seq: int
    event: str
    quota: Optional[str]
    delta: Optional[int]
    actor: str
    reason: Optional[str]
    state: Optional[str]
    phase: Optional[str]
    at: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Violation:
    key: str
    limit: int
    in_flight: int
    permit_weights: int
    audit_sum: int
    problem: str
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Check:
    """permit.check: ok is False when conservation is broken somewhere."""

    ok: bool
    quotas: int
    violations: list
    now_at: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Watch:
    """quota.watch, permit.watch, record.watch: the id every notification
    of the watch carries, and how often the agent reads it."""

    watch: int
    poll_ms: int
    raw: dict = field(default_factory=dict, repr=False)


@dataclass
class Page:
    """One page of a paged list (Client.list_page): its typed rows, the
    cursor of the next page (None after the last) and now_at (None for
    lists without one)."""

    items: list
    next_cursor: Optional[str]
    now_at: Optional[int] = None


def _list_of(cls):
    return lambda v: [from_map(cls, x) for x in v] if isinstance(v, list) else v


_NESTED = {
    ("LeaseAcquired", "holder"): lambda v: from_map(Holder, v),
    ("LeaseStatus", "holder"): lambda v: from_map(Holder, v),
    ("RecordPut", "record"): lambda v: from_map(Record, v),
    ("Recovery", "adopted"): _list_of(Record),
    ("Check", "violations"): _list_of(Violation),
    ("Claim", "holders"): _list_of(QuotaHolder),
}
