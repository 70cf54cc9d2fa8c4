"""Reading a ZooKeeper lock's holders: who holds one lock, which locks are held, the
holders of many locks at once (the admin page, the operator's tools)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ...holder import LockInfo
from .queue import ZooKeeperKeys, children, name_of, queue_order, token_of


def inspect(
    client: KazooClient, alias: str, name: str, keys: ZooKeeperKeys, timeout: float
) -> LockInfo | None:
    """The holder (the first child) of lock ``name``, or None when free. Two round
    trips (the queue, then the holder's record)."""
    while True:
        ordered = queue_order(children(client, keys.lock, timeout))
        if not ordered:
            return None
        try:
            data, stat = client.get_async(f"{keys.lock}/{ordered[0]}").get(timeout)
        except NoNodeError:
            continue  # released meanwhile: look again
        return holder_info(alias, name, ordered[0], data, stat)


def holder_info(alias: str, name: str, child: str, data: bytes, stat: Any) -> LockInfo:
    """The :class:`LockInfo` of the holding child ``child`` (its data and stat)."""
    try:
        record = json.loads(data.decode())
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}

    def text(field: str) -> str | None:
        value = record.get(field)
        return None if value is None else str(value)

    return LockInfo(
        name=name,
        token=text("token") or token_of(child),
        fence=stat.czxid,
        count=int(record.get("count") or 1),
        remaining=None,
        ttl=None,
        acquired_at=dt.datetime.fromtimestamp(stat.ctime / 1000, tz=dt.UTC),
        host=text("host"),
        pid=text("pid"),
        thread=text("thread"),
        caller=text("caller"),
        watchdog=bool(record.get("watchdog")),
        backend=alias,
    )


def held_lock_names(client: KazooClient, root: str, timeout: float) -> list[str]:
    """Names of the locks with a holder now: the lock znodes with children (their
    stats read together, one round trip for all)."""
    base = f"{root}/locks"
    nodes = children(client, base, timeout)
    stats = [client.exists_async(f"{base}/{node}") for node in nodes]
    names = []
    for node, request in zip(nodes, stats, strict=True):
        stat = request.get(timeout=timeout)
        if stat is not None and stat.numChildren:
            names.append(name_of(node))
    return sorted(names)


def inspect_many(
    client: KazooClient, alias: str, chunk: Sequence[tuple[str, ZooKeeperKeys]], timeout: float
) -> list[LockInfo | None]:
    """The holders of many locks: every queue listed together, then every holder's
    record read together (two round trips for the chunk)."""
    listings = [client.get_children_async(keys.lock) for _, keys in chunk]
    firsts: list[str | None] = []
    for request in listings:
        try:
            ordered = queue_order(request.get(timeout=timeout))
        except NoNodeError:
            ordered = []
        firsts.append(ordered[0] if ordered else None)
    reads = [
        None if first is None else client.get_async(f"{keys.lock}/{first}")
        for (_, keys), first in zip(chunk, firsts, strict=True)
    ]
    infos: list[LockInfo | None] = []
    for (name, keys), first, read in zip(chunk, firsts, reads, strict=True):
        if read is None or first is None:
            infos.append(None)
            continue
        try:
            data, stat = read.get(timeout=timeout)
        except NoNodeError:  # released meanwhile: that one alone, again
            infos.append(inspect(client, alias, name, keys, timeout))
            continue
        infos.append(holder_info(alias, name, first, data, stat))
    return infos
