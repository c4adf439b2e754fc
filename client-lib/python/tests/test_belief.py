"""The leader belief: libpgcoord's rule (client-lib/leases.c), on a fake clock."""

from pgcoord.belief import Beliefs, deadline_of, mono_ms


class Clock:
    def __init__(self, now=1000):
        self.now = now

    def __call__(self):
        return self.now


def changed(name="x", leader=True, epoch=7, valid_ms=500, mono=0, session=1):
    return {"name": name, "leader": leader, "epoch": epoch, "valid_ms": valid_ms,
            "valid_until_mono_ms": mono, "session": session}


def test_deadline_is_stamp_plus_valid_without_mono():
    assert deadline_of({"valid_until_mono_ms": 0}, 1000, 500) == 1500
    assert deadline_of({}, 1000, 500) == 1500


def test_deadline_takes_the_earlier_of_the_two():
    assert deadline_of({"valid_until_mono_ms": 1200}, 1000, 500) == 1200
    # a later agent deadline never lengthens the belief
    assert deadline_of({"valid_until_mono_ms": 9000}, 1000, 500) == 1500
    # nor does a value of the wrong type
    assert deadline_of({"valid_until_mono_ms": True}, 1000, 500) == 1500


def test_belief_is_dated_by_the_stamp_not_by_the_reading():
    clock = Clock(5000)
    b = Beliefs(clock)
    # the message was sent after 1000 (its stamp) but read at 5000
    b.note("lease.changed", changed(valid_ms=3000), 1000, 1)
    assert b.deadline_ms("x") == 4000
    assert not b.is_leader("x")


def test_belief_ends_at_the_deadline_without_any_message():
    clock = Clock(1000)
    b = Beliefs(clock)
    b.note("lease.changed", changed(valid_ms=500), 1000, 1)
    assert b.is_leader("x") and b.epoch("x") == 7 and b.valid_ms("x") == 500
    clock.now = 1499
    assert b.is_leader("x")
    clock.now = 1500
    assert not b.is_leader("x") and b.epoch("x") == 0 and b.valid_ms("x") == 0


def test_only_our_session_leads_for_us():
    b = Beliefs(Clock(1000))
    b.note("lease.changed", changed(session=2), 1000, 1)
    assert not b.is_leader("x")
    b.note("lease.changed", changed(session=1), 1000, 0)  # no session yet
    assert not b.is_leader("x")


def test_anything_but_a_well_formed_leader_true_ends_belief():
    b = Beliefs(Clock(1000))
    b.note("lease.changed", changed(), 1000, 1)
    b.note("lease.changed", {"name": "x", "leader": True, "epoch": 7, "valid_ms": -1}, 1000, 1)
    assert not b.is_leader("x")
    b.note("lease.changed", changed(), 1000, 1)
    b.note("lease.changed", {"name": "x", "leader": "yes", "epoch": 7, "valid_ms": 5}, 1000, 1)
    assert not b.is_leader("x")


def test_renewal_extends_only_the_same_epoch():
    clock = Clock(1000)
    b = Beliefs(clock)
    b.note("lease.changed", changed(epoch=7, valid_ms=500), 1000, 1)
    b.note("lease.renewed", {"name": "x", "leader": True, "epoch": 8, "valid_ms": 900,
                             "valid_until_mono_ms": 0}, 1100, 1)
    assert b.deadline_ms("x") == 1500
    b.note("lease.renewed", {"name": "x", "leader": True, "epoch": 7, "valid_ms": 900,
                             "valid_until_mono_ms": 1800}, 1100, 1)
    assert b.deadline_ms("x") == 1800
    # a renewal never starts a belief
    b.note("lease.renewed", {"name": "y", "leader": True, "epoch": 1, "valid_ms": 900}, 1100, 1)
    assert not b.is_leader("y")


def test_suspension_caps_the_belief_at_safe_ms():
    b = Beliefs(Clock(1000))
    b.note("lease.changed", changed(valid_ms=5000), 1000, 1)
    b.note("session.suspended", {"session": 2, "safe_ms": 100}, 1000, 1)  # not ours
    assert b.deadline_ms("x") == 6000
    b.note("session.suspended", {"session": 1, "safe_ms": 100}, 1200, 1)
    assert b.deadline_ms("x") == 1300


def test_session_lost_ends_every_belief():
    b = Beliefs(Clock(1000))
    b.note("lease.changed", changed(name="a"), 1000, 1)
    b.note("lease.changed", changed(name="b"), 1000, 1)
    b.note("session.lost", {"session": 1, "reason": "x"}, 1000, 1)
    assert not b.is_leader("a") and not b.is_leader("b")


def test_mono_ms_is_clock_monotonic():
    import time
    a = mono_ms()
    t = time.clock_gettime(time.CLOCK_MONOTONIC) * 1000
    assert abs(t - a) < 50
