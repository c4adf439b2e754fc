"""Every method of PROTOCOL.md once, as (method, params, result type). The
sync and asyncio clients share these through _invoke, which either calls
now or returns an awaitable."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

from . import types as T

QuotaSpec = Union[str, Mapping[str, int], Iterable[Any]]


def quota_params(quotas: QuotaSpec) -> list:
    """[{key, weight}] from "key", {"key": weight}, ["a", "b"] or
    [{"key": "a", "weight": 2}]. Refuses anything else with TypeError."""
    if isinstance(quotas, str):
        return [{"key": quotas, "weight": 1}]
    if isinstance(quotas, Mapping):
        return [{"key": k, "weight": w} for k, w in quotas.items()]
    out = []
    for q in quotas:
        if isinstance(q, str):
            out.append({"key": q, "weight": 1})
        elif isinstance(q, Mapping) and "key" in q:
            out.append({"key": q["key"], "weight": q.get("weight", 1)})
        else:
            raise TypeError(f"a quota is a key or {{key, weight}}, not {q!r:.80}")
    return out


def _opt(d: dict, **kw) -> dict:
    """d with the keyword arguments that are not None."""
    d.update({k: v for k, v in kw.items() if v is not None})
    return d


# The paged lists (PROTOCOL.md, "Paging"): the array each answers its rows
# in, and the type of a row.
PAGED_LISTS = {
    "lease.list": ("leases", T.LeaseStatus),
    "quota.list": ("quotas", T.Quota),
    "fleet.agents": ("agents", T.FleetAgent),
    "fleet.sessions": ("sessions", T.FleetSession),
    "permit.list": ("permits", T.Permit),
    "record.list": ("records", T.Record),
}

# The page a walk of every page asks for: the cap of the lists that page
# by 100 (lease.list, quota.list, fleet.*).
ALL_PAGE_SIZE = 1000


def page_params(method: str, params: Optional[dict], limit, cursor) -> dict:
    if method not in PAGED_LISTS:
        raise ValueError(f"{method} is not a paged list")
    p = dict(params or {})
    p.pop("limit", None)
    p.pop("cursor", None)
    return _opt(p, limit=limit, cursor=cursor)


def page_of(method: str, m: dict) -> "T.Page":
    items, row = PAGED_LISTS[method]
    return T.Page(items=[T.from_map(row, x) for x in m.get(items, [])],
                  next_cursor=m.get("next_cursor"), now_at=m.get("now_at"))


class Api:
    """Typed wrappers; subclasses provide _invoke(method, params, convert,
    timeout), _invoke_all(method, params, page_size, timeout) (every page
    of a paged list, as one list of rows) and the calls with client-side
    logic (claim, release, leases)."""

    def _invoke(self, method: str, params: Optional[dict], convert, timeout=None):
        raise NotImplementedError

    def _invoke_all(self, method: str, params: Optional[dict], page_size=None, timeout=None):
        raise NotImplementedError

    # paged lists
    def list_page(self, method: str, params: Optional[dict] = None, *, limit=None,
                  cursor=None, timeout=None):
        """One page of a paged list (lease.list, quota.list, fleet.agents,
        fleet.sessions, permit.list, record.list): a Page of typed rows and
        the next_cursor to pass as cursor for the next page (None after the
        last). params are the list's filters; limit the page size (None:
        the agent's default)."""
        return self._invoke(method, page_params(method, params, limit, cursor),
                            lambda m: page_of(method, m), timeout)

    def list_all(self, method: str, params: Optional[dict] = None, *, page_size=None,
                 timeout=None):
        """Every page of a paged list, followed by its cursors, as one list
        of typed rows (pages of page_size, default 1000; timeout is per
        page). The list may change between pages: a row whose key does not
        change comes at most once."""
        return self._invoke_all(method, params, page_size, timeout)

    # agent.* and fleet.*
    def hello(self, client: Optional[str] = None, *, timeout=None):
        return self._invoke("agent.hello", _opt({}, client=client),
                            lambda m: T.from_map(T.Hello, m), timeout)

    def ping(self, *, timeout=None):
        return self._invoke("agent.ping", None, lambda m: m.get("pong") is True, timeout)

    def status(self, *, timeout=None):
        return self._invoke("agent.status", None, lambda m: T.from_map(T.AgentStatus, m), timeout)

    # every page (list_page reads one)
    def fleet_agents(self, *, timeout=None):
        return self._invoke_all("fleet.agents", None, None, timeout)

    def fleet_sessions(self, *, timeout=None):
        return self._invoke_all("fleet.sessions", None, None, timeout)

    # session.keepalive (open/close live in the clients: they keep state).
    # With session_open(keepalive_ms=...) it proves the application alive:
    # call it from the thread or loop doing the work it vouches for. The
    # client never calls it by itself (no hidden timer thread): a timer
    # would keep a hung application's session and leadership alive.
    def keepalive(self, *, timeout=None):
        return self._invoke("session.keepalive", None, lambda m: T.from_map(T.Keepalive, m),
                            timeout)

    # leases (acquire/release live in the clients: they move the belief)
    def lease_status(self, name: str, *, watch: Optional[bool] = None, timeout=None):
        return self._invoke("lease.status", _opt({"name": name}, watch=watch),
                            lambda m: T.from_map(T.LeaseStatus, m), timeout)

    def lease_list(self, *, timeout=None):
        """Every lease, by name, over every page (list_page reads one)."""
        return self._invoke_all("lease.list", None, None, timeout)

    # quotas
    def quota_set(self, key: str, limit: int, *, lapse_after_s: Optional[int] = None,
                  timeout=None):
        return self._invoke("quota.set", _opt({"key": key, "limit": limit},
                                              lapse_after_s=lapse_after_s),
                            lambda m: T.from_map(T.QuotaSet, m), timeout)

    def quota_get(self, key: str, *, timeout=None):
        return self._invoke("quota.get", {"key": key},
                            lambda m: T.from_map(T.Quota, m.get("quota")), timeout)

    def quota_list(self, *, timeout=None):
        """Every quota, by key, over every page (list_page reads one)."""
        return self._invoke_all("quota.list", None, None, timeout)

    # permits (claim/release live in the clients: they retry)
    def permit_update(self, id: str, phase: str, *, timeout=None):
        return self._invoke("permit.update", {"id": id, "phase": phase},
                            lambda m: T.from_map(T.PermitChange, m), timeout)

    def mark_uncertain(self, id: str, reason: str, *, timeout=None):
        return self._invoke("permit.mark_uncertain", {"id": id, "reason": reason},
                            lambda m: T.from_map(T.PermitChange, m), timeout)

    def permit_resolve(self, id: str, outcome: str, evidence: str, *,
                       override: Optional[bool] = None, timeout=None):
        return self._invoke("permit.resolve",
                            _opt({"id": id, "outcome": outcome, "evidence": evidence},
                                 override=override),
                            lambda m: T.from_map(T.PermitChange, m), timeout)

    def permit_cancel(self, id: str, *, timeout=None):
        """Takes the session's waiting claim out of the queue (NotFound
        when it is neither queued nor a permit)."""
        return self._invoke("permit.cancel", {"id": id},
                            lambda m: T.from_map(T.Cancel, m), timeout)

    def permit_get(self, id: str, *, timeout=None):
        return self._invoke("permit.get", {"id": id},
                            lambda m: T.from_map(T.Permit, m.get("permit")), timeout)

    def permit_list(self, *, quota=None, state=None, phase=None, owner=None, limit=None,
                    timeout=None):
        """The first page (up to limit, default 1000) by id; list_all and
        list_page read every page or one from a cursor."""
        return self._invoke("permit.list",
                            _opt({}, quota=quota, state=state, phase=phase, owner=owner,
                                 limit=limit),
                            lambda m: [T.from_map(T.Permit, x) for x in m.get("permits", [])],
                            timeout)

    def permit_history(self, id: str, *, timeout=None):
        return self._invoke("permit.history", {"id": id},
                            lambda m: [T.from_map(T.PermitEvent, x) for x in m.get("events", [])],
                            timeout)

    def permit_check(self, *, timeout=None):
        return self._invoke("permit.check", None, lambda m: T.from_map(T.Check, m), timeout)

    # records
    def record_put(self, kind: str, key: str, state: str, *, data=None, permit=None,
                   timeout=None):
        return self._invoke("record.put",
                            _opt({"kind": kind, "key": key, "state": state}, data=data,
                                 permit=permit),
                            lambda m: T.from_map(T.RecordPut, m), timeout)

    def record_update(self, kind: str, key: str, *, state=None, data=None, token=None,
                      timeout=None):
        return self._invoke("record.update",
                            _opt({"kind": kind, "key": key}, state=state, data=data,
                                 token=token),
                            lambda m: T.from_map(T.Record, m.get("record")), timeout)

    def record_settle(self, kind: str, key: str, state: str, *, token=None, timeout=None):
        return self._invoke("record.settle",
                            _opt({"kind": kind, "key": key, "state": state}, token=token),
                            lambda m: T.from_map(T.Record, m.get("record")), timeout)

    def record_get(self, kind: str, key: str, *, timeout=None):
        return self._invoke("record.get", {"kind": kind, "key": key},
                            lambda m: T.from_map(T.Record, m.get("record")), timeout)

    def record_list(self, *, kind=None, owner=None, live_owner=None, terminal=None,
                    limit=None, timeout=None):
        """The first page (up to limit, default 1000) by kind and key;
        list_all and list_page read every page or one from a cursor."""
        return self._invoke("record.list",
                            _opt({}, kind=kind, owner=owner, live_owner=live_owner,
                                 terminal=terminal, limit=limit),
                            lambda m: [T.from_map(T.Record, x) for x in m.get("records", [])],
                            timeout)

    def record_recover(self, *, kinds=None, limit=None, dry_run=None, timeout=None):
        return self._invoke("record.recover",
                            _opt({}, kinds=list(kinds) if kinds is not None else None,
                                 limit=limit, dry_run=dry_run),
                            lambda m: T.from_map(T.Recovery, m), timeout)

    # watches: what they push (quota.changed, permit.changed,
    # record.orphaned, each with the watch id) arrives as notifications
    def quota_watch(self, key: str, *, timeout=None):
        return self._invoke("quota.watch", {"key": key},
                            lambda m: T.from_map(T.Watch, m), timeout)

    def permit_watch(self, id: str, *, timeout=None):
        return self._invoke("permit.watch", {"id": id},
                            lambda m: T.from_map(T.Watch, m), timeout)

    def record_watch(self, kind: str, *, timeout=None):
        return self._invoke("record.watch", {"kind": kind},
                            lambda m: T.from_map(T.Watch, m), timeout)

    def watch_cancel(self, watch: int, *, timeout=None):
        return self._invoke("watch.cancel", {"watch": watch},
                            lambda m: bool(m.get("cancelled")), timeout)


def claim_params(id: str, quotas: QuotaSpec, intent, on_owner_loss, limit,
                 wait_ms=None) -> dict:
    if not isinstance(id, str) or not id:
        raise TypeError("a permit id is a non-empty str")
    if wait_ms is not None and (not isinstance(wait_ms, int) or isinstance(wait_ms, bool)):
        raise TypeError("wait_ms is an int of milliseconds")
    return _opt({"id": id, "quotas": quota_params(quotas)}, intent=intent,
                on_owner_loss=on_owner_loss, limit=limit, wait_ms=wait_ms or None)


def session_open_params(name, keepalive_ms):
    """session.open's params; TypeError for a keepalive_ms that is not an
    int (the agent judges its range: 0, or 100..600000)."""
    if keepalive_ms is not None and (not isinstance(keepalive_ms, int)
                                     or isinstance(keepalive_ms, bool)):
        raise TypeError("keepalive_ms is an int of milliseconds")
    params = {}
    if name is not None:
        params["name"] = name
    if keepalive_ms:
        params["keepalive_ms"] = keepalive_ms
    return params or None


def resume_params(session):
    """session.open {resume}, naming the session's keepalive_ms again: it
    counts only when the agent took the session over from a crashed
    predecessor, which could not pass it on."""
    params = {"resume": session.session}
    if session.keepalive_ms:
        params["keepalive_ms"] = session.keepalive_ms
    return params
