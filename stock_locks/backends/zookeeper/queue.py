"""A ZooKeeper lock's queue: where a lock lives, its children in order, what this
process remembers of them, and kazoo's errors sorted by what they mean. No backend
state here."""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from kazoo import exceptions as kazoo_errors
from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
    ZookeeperStoppedError,
)
from kazoo.handlers.threading import KazooTimeoutError

ROOT = "/stock_locks"
REMEMBERED = 4096  # released, forced and given-back tokens this process remembers

# (kazoo >= 2.11; before, a request's timeout is an OperationTimeoutError)
RequestTimeoutError: type[Exception] = getattr(
    kazoo_errors, "RequestTimeoutError", OperationTimeoutError
)
# Errors after which a request may or may not have run.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionLoss, SessionExpiredError, OperationTimeoutError, RequestTimeoutError,
    SessionMovedError, ZookeeperStoppedError, KazooTimeoutError,
)  # fmt: skip

TOKEN = re.compile(r"[A-Za-z0-9_.~]+")  # what a token may be (a child's name carries it)
_SEQUENCE_DIGITS = 10  # ZooKeeper's sequence suffix


class ZooKeeperKeys(NamedTuple):
    """Where a lock lives: ``lock`` is its znode (the parent of its queue)."""

    lock: str


class Held:
    """A grant this process holds: its child, fence, record, session and owner."""

    __slots__ = ("path", "czxid", "record", "session", "hold", "granted", "lost")

    def __init__(
        self, path: str, czxid: int, record: dict[str, Any], session: Any, hold: Any
    ) -> None:
        self.path = path
        self.czxid = czxid
        self.record = record
        self.session = session
        self.hold = hold  # weakref to the Lock's per-owner state (None: unknown)
        self.granted = time.monotonic()
        self.lost = False


class Remembered:
    """A bounded set (oldest forgotten first)."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self._items: OrderedDict[Any, None] = OrderedDict()
        self._size = size

    def add(self, item: Any) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def discard(self, item: Any) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: Any) -> bool:
        return item in self._items


def node_name(name: str) -> str:
    """``name`` as one znode name (percent-encoded; reversible with :func:`name_of`)."""
    text = quote(name, safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def name_of(node: str) -> str:
    return unquote(node)


def token_of(child: str) -> str:
    """The token of a queue child ``<token>-<sequence>``."""
    return child.rsplit("-", 1)[0]


def queue_order(children: Sequence[str]) -> list[str]:
    """The queue's children, first (the holder) first."""
    return sorted(
        (c for c in children if c[-_SEQUENCE_DIGITS:].isdigit()),
        key=lambda c: int(c[-_SEQUENCE_DIGITS:]),
    )


def children(client: KazooClient, path: str, timeout: float) -> list[str]:
    """The children of ``path`` (none when it does not exist)."""
    try:
        found: list[str] = client.get_children_async(path).get(timeout=timeout)
    except NoNodeError:
        return []
    return found


def delete(client: KazooClient, paths: Sequence[str], timeout: float) -> int:
    """Delete ``paths`` (sent together); how many existed."""
    requests = [client.delete_async(path) for path in paths]
    deleted = 0
    for request in requests:
        try:
            request.get(timeout=timeout)
            deleted += 1
        except NoNodeError:
            pass
    return deleted


def owned_by(client: KazooClient, path: str, token: str, timeout: float) -> list[str]:
    """The full paths of ``token``'s children in the queue of ``path``, oldest first."""
    ordered = queue_order(children(client, path, timeout))
    return [f"{path}/{child}" for child in ordered if token_of(child) == token]
