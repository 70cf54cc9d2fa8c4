"""The lease algorithm without I/O (stock_locks.lease): driven by hand, step by step.

The loop is a generator of backend calls, so its decisions are checked here with
scripted replies and a scripted clock; every backend runs the same loop (the
contract suite, tests/contract, checks it against real servers).
"""

from __future__ import annotations

import math

import pytest

from stock_locks import lease
from stock_locks.exceptions import LockError, RedisUnavailable
from stock_locks.lease import Attempt, Call


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(clock: Clock, timeout: float | None = 1.0, give_back: Call | None = None):
    return lease.acquire(
        lambda patience, waited: Call("try", (patience, waited)),
        lambda seconds: Call("wait", (seconds,)),
        blocking=True,
        timeout=timeout,
        default_wait=30.0,
        give_back=give_back,
        what="test",
        clock=clock,
    )


def test_a_refusal_at_the_deadline_is_followed_by_a_last_try_without_patience():
    clock = Clock()
    steps = _steps(clock)
    assert next(steps) == Call("try", (1.0, False))
    clock.now += 1.5  # the try's round trip outlasted the deadline
    # No wait, and no giving up yet: one last try that says it will not wait (a fair
    # semaphore's waiter leaves its queue with it).
    assert steps.send(Attempt(False, wait=5.0)) == Call("try", (0.0, False))
    with pytest.raises(StopIteration) as done:
        steps.send(Attempt(False, wait=5.0))
    assert done.value.value is None


def test_each_wait_is_bounded_by_the_holders_lease_and_the_deadline():
    clock = Clock()
    steps = _steps(clock, timeout=10.0)
    next(steps)
    assert steps.send(Attempt(False, wait=2.0)) == Call("wait", (2.0,))  # the lease ends first
    clock.now += 2.0
    assert steps.send(True) == Call("try", (8.0, True))
    clock.now += 1.0
    assert steps.send(Attempt(False, wait=None)) == Call("wait", (7.0,))  # unknown lease: deadline
    grant = Attempt(True, fence=7, count=1)
    assert steps.send(False) == Call("try", (7.0, True))
    with pytest.raises(StopIteration) as done:
        steps.send(grant)
    assert done.value.value is grant


def test_without_timeout_a_try_has_unbounded_patience_and_waits_for_the_lease():
    steps = _steps(Clock(), timeout=None)
    assert next(steps) == Call("try", (math.inf, False))
    assert steps.send(Attempt(False, wait=None)) == Call("wait", (30.0,))


def test_an_interrupted_try_is_given_back_bounded_and_the_error_propagates():
    give_back = Call("release", ("token", "abandon"))
    steps = _steps(Clock(), give_back=give_back)
    next(steps)
    assert steps.throw(RedisUnavailable("lost reply")) == lease.bounded(give_back)
    with pytest.raises(RedisUnavailable):
        steps.send(1)


def test_a_try_made_at_the_wake_up_counts_as_the_next_try():
    clock = Clock()
    steps = _steps(clock, timeout=10.0)
    next(steps)
    assert steps.send(Attempt(False, wait=2.0)) == Call("wait", (2.0,))
    clock.now += 1.0
    # Refused again at the wake-up: no try of its own, it waits again.
    assert steps.send(Attempt(False, wait=3.0)) == Call("wait", (3.0,))
    grant = Attempt(True, fence=9, count=1)
    with pytest.raises(StopIteration) as done:
        steps.send(grant)
    assert done.value.value is grant


def test_a_timeout_after_a_wake_up_try_with_a_lost_reply_gives_the_token_back():
    give_back = Call("release", ("token", "abandon"))
    clock = Clock()
    steps = _steps(clock, timeout=1.0, give_back=give_back)
    next(steps)
    assert steps.send(Attempt(False, wait=5.0)) == Call("wait", (1.0,))
    clock.now += 1.0
    # The wait ran out with the try it carried perhaps still to run (None): the last
    # try is refused, and the token is given back, so that a late grant is refused too.
    assert steps.send(None) == Call("try", (0.0, True))
    assert steps.send(Attempt(False, wait=5.0)) == lease.bounded(give_back)
    with pytest.raises(StopIteration) as done:
        steps.send(1)
    assert done.value.value is None


def test_a_timeout_after_plain_waits_gives_nothing_back():
    clock = Clock()
    steps = _steps(clock, timeout=1.0, give_back=Call("release", ("token", "abandon")))
    next(steps)
    assert steps.send(Attempt(False, wait=5.0)) == Call("wait", (1.0,))
    clock.now += 1.0
    assert steps.send(False) == Call("try", (0.0, True))
    with pytest.raises(StopIteration) as done:
        steps.send(Attempt(False, wait=5.0))
    assert done.value.value is None


def test_a_refusal_the_backend_explains_gives_nothing_back():
    steps = _steps(Clock(), give_back=Call("release", ("token", "abandon")))
    next(steps)
    with pytest.raises(LockError):
        steps.throw(LockError("token already given back"))


def test_a_lost_reply_is_repeated_once_bounded_then_the_first_error_wins():
    call = Call("release", ("token",))
    steps = lease.repeatable(call)
    assert next(steps) == call
    assert steps.throw(RedisUnavailable("first")) == lease.bounded(call)
    with pytest.raises(RedisUnavailable, match="first"):
        steps.throw(RedisUnavailable("second"))
