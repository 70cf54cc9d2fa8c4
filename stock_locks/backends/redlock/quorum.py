"""RedLock's rules, as pure functions of the masters' replies (no I/O; tested alone).

A reply per master is the script's reply, or :class:`Failed` (unreachable, timed
out, or an error reply). ``quorum`` is ``N // 2 + 1``. Each rule says what a
round means, or raises :class:`Unknown` when too few masters answered to tell;
the backend turns that into ``RedisUnavailable``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..base import ExtendOutcome, ReleaseOutcome
from ..redis.protocol import AcquireReply, token_of


class Failed:
    """A master's missing reply: unreachable, timed out, or an error reply."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<failed: {self.error}>"


class Unknown(Exception):
    """Too few masters answered to tell the outcome."""


def answered(replies: Sequence[Any]) -> int:
    return sum(not isinstance(r, Failed) for r in replies)


def validity_ms(ttl_ms: int, elapsed_ms: float, clock_drift: float) -> float:
    """What is left of a lease granted ``elapsed_ms`` ago, less the clocks' drift
    (``ttl * clock_drift + 2 ms``); a grant counts only while this is positive."""
    return ttl_ms - elapsed_ms - (ttl_ms * clock_drift + 2)


def granted(replies: Sequence[Any]) -> list[Any]:
    """The grant replies (``{1, fence, count}``) among ``replies``."""
    return [r for r in replies if not isinstance(r, Failed) and r[0] == AcquireReply.GRANTED]


def grant_fence(grants: Sequence[Any], quorum: int) -> tuple[int, bool]:
    """(the fence of a grant by ``grants``: the highest proposal, whether a majority
    proposed that very value, so that it need not be stored again)."""
    fence = max(int(r[1]) for r in grants)
    return fence, sum(int(r[1]) == fence for r in grants) >= quorum


def release_outcome(replies: Sequence[Any], quorum: int) -> ReleaseOutcome:
    """A release's outcome by majority. RELEASED once no majority can still hold the
    token (what a silent master may keep is a minority, freed by its lease) while
    one could have at the release; NOT_OWNED when a majority said the token held
    nothing (the lock was lost before); :class:`Unknown` when a majority may still
    hold it (the caller repeats the release)."""
    votes = Counter(r for r in replies if not isinstance(r, Failed))
    unanswered = len(replies) - sum(votes.values())
    if votes[ReleaseOutcome.STILL_HELD] >= quorum:
        return ReleaseOutcome.STILL_HELD
    if votes[ReleaseOutcome.STILL_HELD] + unanswered >= quorum:
        raise Unknown
    if votes[ReleaseOutcome.RELEASED] + votes[ReleaseOutcome.STILL_HELD] + unanswered >= quorum:
        return ReleaseOutcome.RELEASED
    return ReleaseOutcome.NOT_OWNED


def extend_outcome(replies: Sequence[Any], quorum: int, still_valid: bool) -> ExtendOutcome:
    """EXTENDED when a majority extended the lease in time (``still_valid``), CAPPED
    when max_hold cut it on a majority, LOST when no majority can still hold it for
    this token; :class:`Unknown` when that cannot be told (the caller repeats it)."""
    votes = Counter(r for r in replies if not isinstance(r, Failed))
    unanswered = len(replies) - sum(votes.values())
    held = votes[ExtendOutcome.EXTENDED] + votes[ExtendOutcome.CAPPED]
    if held + unanswered < quorum:
        return ExtendOutcome.LOST
    if held < quorum or not still_valid:
        raise Unknown
    return (
        ExtendOutcome.EXTENDED if votes[ExtendOutcome.EXTENDED] >= quorum else ExtendOutcome.CAPPED
    )


def wait_after(
    replies: Sequence[Any], grants: int, quorum: int, retry_delay: float
) -> float | None:
    """How long a refused caller may sleep, seconds: until enough held leases end for
    a majority to be free; a short random delay when the votes split (``grants`` > 0)
    or a majority is free already; None when no lease bounds it."""
    if grants:
        return random.uniform(0, retry_delay)
    leases = sorted(
        int(r[1]) if int(r[1]) >= 0 else float("inf")
        for r in replies
        if not isinstance(r, Failed) and r[0] == AcquireReply.REFUSED
    )
    free = len(replies) - len(leases) - sum(isinstance(r, Failed) for r in replies)
    needed = quorum - free
    if needed <= 0:
        return random.uniform(0, retry_delay)
    if needed > len(leases) or leases[needed - 1] == float("inf"):
        return None
    return (leases[needed - 1] + 1) / 1000


def majority_holder(replies: Sequence[Any], quorum: int) -> list[Any] | None:
    """The ``lock_inspect.lua`` replies of the token a majority shows, or None (nobody
    holds it on a majority); :class:`Unknown` when too few answered to tell."""
    held = [r for r in replies if not isinstance(r, Failed) and r]
    tokens = Counter(token_of(r[0]) for r in held)
    for token, votes in tokens.items():
        if votes >= quorum:
            return [r for r in held if token_of(r[0]) == token]
    if answered(replies) < quorum:
        raise Unknown
    return None


def majority_token(replies: Sequence[Any], quorum: int) -> str | None:
    """The token a majority's ``GET`` of the lock key shows, or None; :class:`Unknown`
    when too few answered to tell."""
    tokens = Counter(token_of(r) for r in replies if not isinstance(r, Failed) and r is not None)
    for token, votes in tokens.items():
        if votes >= quorum:
            return token
    if answered(replies) < quorum:
        raise Unknown
    return None
