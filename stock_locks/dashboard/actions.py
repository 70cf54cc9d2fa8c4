"""Operator actions taken from the dashboard. Each is audited, whatever its outcome.

Every action names exactly what it displaces: a lock is force-released only
if the token the operator confirmed still holds it (compare-and-delete, as
any release, through the public ``stock_locks.operations.force_release``), so a
lock that changed hands meanwhile is left alone. A force-released holder that
wakes up later is refused by fenced writes: the next grant's fence is newer
than its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ..backends.redis.errors import translated
from ..delayqueue import DelayQueue
from ..exceptions import BackendUnavailable
from ..holder import LockInfo
from ..models import AuditEntry
from ..operations import evict_holder, force_release, semaphore_state
from ..stock.reconcile import fix_drift, stock_report
from ..waitingroom.operator import clear_room
from .snapshot import TOKEN_SHOWN


@dataclass
class Outcome:
    done: bool
    message: str
    displaced: Any = None


def force_release_lock(name: str, token: str) -> Outcome:
    displaced = force_release(name, token=token)
    if displaced is None:
        return Outcome(False, f"lock {name!r} is no longer held by that holder; nothing released")
    return Outcome(
        True, f"lock {name!r} force-released (fence {displaced.fence})", audit_record(displaced)
    )


def audit_record(info: LockInfo) -> dict[str, Any]:
    """A displaced lock holder as audit rows keep it: ``LockInfo.as_dict()`` with
    the fence as text and the lease left as ``lease_remaining`` (as audit rows
    always had them), the token shortened by :func:`shown`."""
    record = info.as_dict()
    record["fence"] = None if info.fence is None else str(info.fence)
    record["lease_remaining"] = record.pop("remaining")
    return cast(dict[str, Any], shown(record))


def shown(holder: dict[str, Any] | None) -> dict[str, Any] | None:
    """A holder as the audit log keeps it: a token is a release credential, so only its prefix."""
    if holder is None:
        return None
    return {**holder, "token": holder["token"][:TOKEN_SHOWN]}


def semaphore_holder(name: str, holder_id: str) -> dict[str, Any] | None:
    """One live holder of a semaphore, as ``semaphore_state`` describes it, or None."""
    state = semaphore_state(name)
    return next((h for h in state["holders"] if h["identifier"] == holder_id), None)


def evict_semaphore_holder(name: str, holder_id: str) -> Outcome:
    state = semaphore_state(name)
    holder = next((h for h in state["holders"] if h["identifier"] == holder_id), None)
    if holder is None or not evict_holder(name, holder_id, limit=state["limit"]):
        return Outcome(False, f"semaphore {name!r} has no live holder {holder_id!r}", holder)
    return Outcome(True, f"semaphore {name!r}: holder {holder_id[:8]} evicted", holder)


def requeue_dead_letter(queue: str, item_id: str) -> Outcome:
    letter = dead_letter(queue, item_id)
    if not DelayQueue(queue).requeue(item_id):
        return Outcome(False, f"{item_id!r} is not a dead letter of {queue!r}", letter)
    return Outcome(True, f"{item_id!r} requeued in {queue!r}, due now", letter)


def discard_dead_letter(queue: str, item_id: str) -> Outcome:
    letter = dead_letter(queue, item_id)
    if letter is None:
        return Outcome(False, f"{item_id!r} is not a dead letter of {queue!r}")
    DelayQueue(queue).cancel(item_id)
    return Outcome(True, f"dead letter {item_id!r} of {queue!r} discarded", letter)


def reconcile_stock() -> Outcome:
    before = [row.as_dict() for row in stock_report() if row.drift]
    settled, fixed = fix_drift()
    return Outcome(
        True,
        f"reconciled: {len(fixed)} counter(s) corrected from the database, "
        f"{len(settled)} Redis reservation record(s) settled",
        {"drifting": before, "settled": settled},
    )


def clear_waiting_room(slug: str) -> Outcome:
    cleared = clear_room(slug)
    if cleared is None:
        return Outcome(False, f"no waiting-room event {slug!r}; nothing cleared")
    return Outcome(
        True,
        f"waiting room {slug!r} cleared: {cleared['waiting']} waiting, "
        f"{cleared['prequeued']} pre-queued and {cleared['admitted']} admitted forgotten",
        cleared,
    )


def dead_letter(queue: str, item_id: str) -> dict[str, Any] | None:
    """One dead letter of ``queue`` (JSON-ready), or None."""
    for letter in DelayQueue(queue).dead_letters(limit=10_000):
        if letter["id"] == item_id:
            return {**letter, "died_at": letter["died_at"].isoformat()}
    return None


# action name -> (function, the request parameters it takes)
ACTIONS: dict[str, tuple[Callable[..., Outcome], tuple[str, ...]]] = {
    "release_lock": (force_release_lock, ("name", "token")),
    "evict_holder": (evict_semaphore_holder, ("name", "holder")),
    "requeue": (requeue_dead_letter, ("queue", "id")),
    "discard": (discard_dead_letter, ("queue", "id")),
    "reconcile": (reconcile_stock, ()),
    "clear_room": (clear_waiting_room, ("event",)),
}


def perform(action: str, params: dict[str, str], user: Any) -> Outcome:
    """Run ``action`` with ``params`` for ``user`` and write its audit row. Raises
    :class:`~stock_locks.exceptions.BackendUnavailable` when the backend did not
    answer, audited too: whether the action ran is then not known."""
    func, names = ACTIONS[action]
    try:
        with translated():  # (some read Redis with redis-py's client directly)
            outcome = func(*(params[name] for name in names))
    except BackendUnavailable as exc:
        _audit(action, params, names, user, Outcome(False, f"outcome not known: {exc}"))
        raise
    _audit(action, params, names, user, outcome)
    return outcome


def _audit(
    action: str, params: dict[str, str], names: tuple[str, ...], user: Any, outcome: Outcome
) -> None:
    AuditEntry.objects.create(
        user=user if getattr(user, "pk", None) else None,
        username=getattr(user, "get_username", lambda: "")() or "?",
        action=action,
        target=" ".join(params[name] for name in names if name != "token")[:300] or "all SKUs",
        displaced=outcome.displaced,
        outcome=outcome.message[:300],
    )
