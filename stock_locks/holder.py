"""Who holds what: this process's identity as a holder, and :class:`LockInfo`.

Every backend that records holder metadata writes the same fields (host, pid,
thread, caller, when granted) and reads them back as a :class:`LockInfo`, so
the admin page shows a Redis, RedLock or ZooKeeper holder alike.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType


class _Process:
    """This process's identity, as written into holder metadata. Renewed after fork."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = str(os.getpid())


_process = _Process()


def process_identity() -> tuple[str, str]:
    """(host, pid) of this process, as holder metadata records it (fresh after fork)."""
    return _process.host, _process.pid


def thread_name() -> str:
    """The holder's "thread" label: the running asyncio task's name inside one (an
    async holder's owner is its task), else the thread's name."""
    if asyncio._get_running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:
            return task.get_name()
    return threading.current_thread().name


def caller_of(frame: FrameType | None) -> str:
    """``module.qualname`` of the code running in ``frame``: a holder's "caller"."""
    if frame is None:
        return "?"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"


@dataclass(frozen=True)
class LockInfo:
    """Who holds a lock, as its backend records it at one instant.

    ``remaining`` is the lease left in seconds (None: no expiry, e.g. a
    session-bound ZooKeeper lock), ``ttl`` the lease of the grant or last
    extension in seconds, ``count`` how many times a reentrant owner holds it,
    ``acquired_at`` the grant's time on the coordinator's clock (aware, UTC).
    ``token`` is the holder's release credential: show or log only a prefix
    of it. Fields the holder's record lacks are None. ``backend`` is the
    alias of the backend that holds it.
    """

    name: str
    token: str
    fence: int | None
    count: int
    remaining: float | None
    ttl: float | None
    acquired_at: dt.datetime | None
    host: str | None
    pid: str | None
    thread: str | None
    caller: str | None
    watchdog: bool
    backend: str = "default"

    def as_dict(self) -> dict[str, Any]:
        """The fields, JSON-ready (``acquired_at`` as ISO 8601)."""
        data = asdict(self)
        data["acquired_at"] = self.acquired_at.isoformat() if self.acquired_at else None
        return data


def _after_fork_in_child() -> None:
    global _process
    _process = _Process()


os.register_at_fork(after_in_child=_after_fork_in_child)
