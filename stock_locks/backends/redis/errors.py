"""What redis-py raises, sorted by what it means for a call.

Every caller of Redis in stock_locks (locks, semaphores, the stock strategies,
the delay queue, the dashboard) decides with these tuples, and turns
:data:`UNAVAILABLE_ERRORS` into :class:`~stock_locks.exceptions.RedisUnavailable`
with :func:`translated_error`, the cause chained. A configuration or script
error (a ``ResponseError`` such as a wrong type, an unknown command, a
cross-slot reply; redis-py refusing to route a call whose keys span slots) is a
bug and is never read as "unavailable".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from redis._parsers.base import BaseParser
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...exceptions import RedisCommandError, RedisUnavailable

# Answers of a cluster node that does not serve the key's slot now (MOVED and ASK:
# AskError is MovedError's base), is between owners (TRYAGAIN) or sees the cluster
# down (CLUSTERDOWN, e.g. while a failed master's replica is not yet promoted). The
# request did not run; sent again on a fresh slot map it may succeed.
STALE_ROUTE_ERRORS: tuple[type[Exception], ...] = (AskError, TryAgainError, ClusterDownError)


class NoReplicasError(ResponseError):
    """``NOREPLICAS``: the primary refused a write because fewer replicas than its
    ``min-replicas-to-write`` are in sync (a primary cut off from its replicas, e.g.
    before Sentinel fails it over). Nothing was written; a later try, on this primary
    or on the one promoted, may succeed."""


# redis-py reads an error reply by its first word and knows no NOREPLICAS: without
# this it is a bare ResponseError, which reads as a bug (HTTP 500), not an outage.
BaseParser.EXCEPTION_CLASSES.setdefault("NOREPLICAS", NoReplicasError)

# Errors after which the node may be gone, or be a replica now (READONLY: a primary
# demoted by a failover, Sentinel's or a cluster's), or refuses writes until a replica
# is back in sync (NOREPLICAS): the request may have run, and a later call through the
# pool finds the primary again (or the new one).
NODE_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    NoReplicasError,
)
# "Redis did not answer": the node errors, a cluster changing hands (redirects that
# did not settle after the retries, no node for a slot yet, no node reachable at all).
# The outcome of the request is unknown and a later try may succeed. (redis-py also
# raises RedisClusterException, before sending, for a call it cannot route, such as
# keys across slots: translated_error() tells that apart as a RedisCommandError.)
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    *NODE_ERRORS,
    *STALE_ROUTE_ERRORS,
    RedisClusterException,
)
# The errors translated_error() translates: the unavailable ones, and a node's CROSSSLOT
# reply (a call whose keys span slots: a bug, as redis-py's own refusal of one).
TRANSLATED_ERRORS: tuple[type[Exception], ...] = (*UNAVAILABLE_ERRORS, ClusterCrossSlotError)
# Anything redis-py raises for a call (unavailable, or an error reply).
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)
# Any failure of a call to Redis, raw or already translated: for best-effort steps
# that log it and leave the repair to the sweeper.
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisUnavailable, *REDIS_ERRORS)
# redis-py's errors, or a socket error below it.
REDIS_OR_OS_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)


def stale_route(reply: object) -> bool:
    """Whether ``reply`` (a pipeline's reply, exceptions included) says the request
    went to a node that does not serve its slot now: it did not run."""
    return isinstance(reply, STALE_ROUTE_ERRORS)


# How redis-py words a RedisClusterException for a call it will not route (5.3 to 8.x):
# "<command> - all keys must map to the same key slot", "... Missing key", "Invalid args".
_UNROUTABLE = re.compile(r"same key slot|same slot|Missing key|Invalid args")


def unroutable(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py refusing, before sending, a call it cannot route, or
    a node's CROSSSLOT reply (keys of one call in several slots)."""
    if isinstance(exc, ClusterCrossSlotError):
        return True
    return isinstance(exc, RedisClusterException) and bool(_UNROUTABLE.search(str(exc)))


def translated_error(
    exc: BaseException, alias: str = "default", what: str = "Redis unavailable"
) -> RedisUnavailable | RedisCommandError:
    """The error to raise ``from exc`` (one of :data:`UNAVAILABLE_ERRORS`; the caller
    chains it): :class:`RedisUnavailable`, or :class:`RedisCommandError` for a call
    redis-py would not route (a bug, not an outage)."""
    if unroutable(exc):
        return RedisCommandError(
            f"Redis Cluster cannot route this call (backend {alias!r}): {exc}. Every key of "
            "one call must share a hash tag; check STOCK_LOCKS['STOCK_HASH_TAG'] and "
            "KEY_PREFIX"
        )
    return RedisUnavailable(f"{what} (backend {alias!r}): {exc}", backend=alias)


@contextmanager
def translated(alias: str = "default") -> Iterator[None]:
    """Inside: redis-py's :data:`UNAVAILABLE_ERRORS` raised as :func:`translated_error`
    says (for code that calls a redis-py client directly)."""
    try:
        yield
    except UNAVAILABLE_ERRORS as exc:
        raise translated_error(exc, alias) from exc
