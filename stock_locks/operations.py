"""The operator's tools: who holds a lock, freeing a stuck one, releasing everything
a dead host held, and taking a semaphore permit away.

They read and release by name, whoever the holder is; none of them adds
anything to an acquire or a release. The admin page (``stock_locks.dashboard``)
and ``manage.py release_locks`` use them; the caller writes its own audit record
from the returned :class:`~stock_locks.holder.LockInfo`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import _validate, lease
from .backends.base import Backend, ReleaseOutcome, call
from .core.lock import lock_backend as lock_ops
from .core.lock import pick_backend
from .core.semaphore import semaphore_backend, semaphore_keys, snapshot_of
from .exceptions import LockError
from .holder import LockInfo

if TYPE_CHECKING:
    from redis import Redis

force_log = logging.getLogger("stock_locks.lock.force")

# Locks whose holders release_held_by() reads (and releases) per round trip.
RELEASE_BATCH = 500
# Attempts of force_release(name) without a token when the holder changes meanwhile.
FORCE_ATTEMPTS = 3


def _backend_and_keys(
    name: str, backend: Backend | str | None, redis: Redis | None
) -> tuple[Backend, Any]:
    chosen = pick_backend(backend, redis)
    try:
        return chosen, lock_ops(chosen).lock_keys(name)
    except ValueError as exc:
        raise LockError(str(exc), name=name if isinstance(name, str) else None) from None


def inspect(
    name: str, *, backend: Backend | str | None = None, redis: Redis | None = None
) -> LockInfo | None:
    """Who holds the lock ``name`` now, or None when it is free.

    One round trip (on Redis a read-only script: token, lease left and the
    holder's record at one instant). ``backend``: an alias or backend
    (default ``"default"``); ``redis``: an explicit client instead. Raises
    :class:`LockError` for an invalid name, :class:`BackendUnavailable` when
    the backend cannot be reached.
    """
    chosen, keys = _backend_and_keys(name, backend, redis)
    return chosen.execute(call(lock_ops(chosen).lock_inspect, name, keys))


def _displaced(info: LockInfo, how: str) -> LockInfo:
    force_log.warning(
        "lock %r force-released (%s): holder host=%s pid=%s thread=%s caller=%s fence=%s",
        info.name, how, info.host, info.pid, info.thread, info.caller, info.fence,
    )  # fmt: skip
    return info


def force_release(
    name: str,
    *,
    token: str | None = None,
    backend: Backend | str | None = None,
    redis: Redis | None = None,
) -> LockInfo | None:
    """Free the lock ``name`` whoever holds it; the holder it displaced, or None.

    With ``token``, only that holder is displaced (compare-and-delete: a lock
    that changed hands is left alone, and None returned). Without, whoever
    holds it at the moment of the release. Nothing is audited here: the
    caller writes its own record from the returned :class:`LockInfo` (the
    dashboard writes an ``AuditEntry``). A WARNING is logged on
    ``stock_locks.lock.force``.

    The displaced holder is told: its ``release()`` and ``extend()`` raise
    :class:`LockNotOwned`, its watchdog marks it ``lost``; and once the next
    holder has written or claimed a fenced row (``stock_locks.fencing``), the
    displaced holder's fenced writes to it are refused (its fence is older).
    Waiters are woken as by a release. Two round trips (read, release); a
    release whose reply is lost is repeated once, bounded, and the backend
    recognises the force release that happened (the holder is still returned).

    Raises :class:`LockError` for an invalid name or token,
    :class:`BackendUnavailable` when the backend cannot be reached.
    """
    if token is not None and (not isinstance(token, str) or not token):
        raise LockError(f"token must be None or a non-empty str, got {token!r}", name=name)
    chosen, keys = _backend_and_keys(name, backend, redis)
    ops = lock_ops(chosen)
    for _ in range(FORCE_ATTEMPTS):
        info = chosen.execute(call(ops.lock_inspect, name, keys))
        if info is None or (token is not None and info.token != token):
            return None
        result = lease.run(lease.repeatable(call(ops.force_release, info, keys)), chosen.execute)
        if result == ReleaseOutcome.RELEASED:
            return _displaced(info, "by token" if token else "by name")
        if token is not None:
            return None
        # Released or taken over between the read and the release: look again.
    return None


def release_held_by(
    *,
    host: str,
    pid: int | str | None = None,
    dry_run: bool = False,
    backend: Backend | str | None = None,
    redis: Redis | None = None,
) -> list[LockInfo]:
    """Force-release every lock held by processes on ``host`` (and ``pid``).

    For deploy scripts and operators, once those processes are known to be
    gone (a restart, a crashed host): their locks would otherwise stay taken
    until their leases end. ``host`` is the holder's ``socket.gethostname()``
    as recorded at the grant; ``pid`` narrows it to one process (default: any).
    ``dry_run`` releases nothing and returns what would be released.

    Reads the backend's held-locks index (not SCAN), then the holders and the
    releases in batches of ``RELEASE_BATCH`` locks (one round trip each). Each
    release is compare-and-delete on the token read, so a lock that changed
    hands meanwhile is left alone. Returns the displaced holders, by lock
    name; as with :func:`force_release`, the caller audits. Raises
    :class:`LockError` for an invalid host or pid.
    """
    if not isinstance(host, str) or not host:
        raise LockError(f"host must be a non-empty str, got {host!r}")
    if pid is not None and (isinstance(pid, bool) or not str(pid).isdigit()):
        raise LockError(f"pid must be None or a process id, got {pid!r}")
    dry_run = _validate.flag(dry_run, "dry_run")
    wanted_pid = None if pid is None else str(pid)
    chosen = pick_backend(backend, redis)
    ops = lock_ops(chosen)
    names = chosen.execute(call(ops.held_lock_names))
    displaced: list[LockInfo] = []
    for start in range(0, len(names), RELEASE_BATCH):
        chunk = [(name, ops.lock_keys(name)) for name in names[start : start + RELEASE_BATCH]]
        infos = chosen.execute(call(ops.inspect_many, chunk))
        matches = [
            (keys, info)
            for (_, keys), info in zip(chunk, infos, strict=True)
            if info and info.host == host and wanted_pid in (None, info.pid)
        ]
        if dry_run or not matches:
            displaced.extend(info for _, info in matches)
            continue
        results = chosen.execute(call(ops.force_release_many, matches))
        for (_, info), result in zip(matches, results, strict=True):
            if result == ReleaseOutcome.RELEASED:
                displaced.append(_displaced(info, f"held by {host} pid {info.pid}"))
    return displaced


def evict_holder(
    name: str,
    holder_id: str,
    *,
    backend: Backend | str | None = None,
    redis: Redis | None = None,
    limit: int | None = None,
) -> bool:
    """Take the permit of holder ``holder_id`` away (an operator's action); whether it
    held a live one. Wakes the waiters this lets in. The evicted holder's next
    ``refresh()`` or ``release()`` raises :class:`LockNotOwned`. ``limit``: the
    semaphore's stored limit when the caller has just read it (else one more read)."""
    chosen = pick_backend(backend, redis)
    ops = semaphore_backend(chosen, name)
    keys = semaphore_keys(chosen, name)
    if limit is None:
        limit = snapshot_of(chosen.execute(call(ops.semaphore_state, keys)))["limit"]
    return chosen.execute(call(ops.semaphore_evict, keys, holder_id, limit or 1)) == 1


def semaphore_state(
    name: str, *, backend: Backend | str | None = None, redis: Redis | None = None
) -> dict[str, Any]:
    """What the admin page shows of one semaphore, read in one round trip.

    Returns ``{"name", "limit", "holders", "waiting"}``: ``limit`` as stored by
    the last grant (None when nobody holds or waits), ``holders`` as
    :meth:`Semaphore.holders`, ``waiting`` the length of a fair semaphore's
    queue (places about to lapse included; 0 for a plain semaphore).
    """
    chosen = pick_backend(backend, redis)
    ops = semaphore_backend(chosen, name)
    state = chosen.execute(call(ops.semaphore_state, semaphore_keys(chosen, name)))
    return {"name": name, **snapshot_of(state)}
