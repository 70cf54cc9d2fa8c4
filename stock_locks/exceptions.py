"""Typed errors. Every error stock_locks raises derives from StockLocksError.

Errors say who is at fault: caller misuse (``LockError`` and friends raised
before any round trip), lost ownership (``LockNotOwned``, only when Redis says
the token no longer matches), the business outcome (``OutOfStock``) and bad
input (``InvalidQuantity``).
"""

from __future__ import annotations


class StockLocksError(Exception):
    """Base class of every stock_locks error."""


class LockError(StockLocksError):
    """A lock was used wrongly, or could not be granted. ``name`` is the lock's name."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockTimeout(LockError):
    """The lock was not granted within ``timeout`` seconds."""

    def __init__(self, message: str, *, name: str | None = None, timeout: float | None = None):
        super().__init__(message, name=name)
        self.timeout = timeout


class LockNotOwned(LockError):
    """Redis says this holder's token no longer owns the lock (expired or taken over)."""


class LockNotReplicated(LockError):
    """Fewer replicas than required confirmed the grant; the grant was undone."""

    def __init__(self, message: str, *, name: str | None = None, required: int, confirmed: int):
        super().__init__(message, name=name)
        self.required = required
        self.confirmed = confirmed


class StaleFencingToken(StockLocksError):
    """A fenced write carried a fencing token older than the one already stored."""

    def __init__(self, message: str, *, fence: int, current: int | None = None) -> None:
        super().__init__(message)
        self.fence = fence
        self.current = current


class BackendUnavailable(StockLocksError):
    """The coordinator (Redis, a RedLock majority, ZooKeeper) could not be reached or
    did not answer in time.

    Raised by a backend for a call whose outcome is unknown; the primitives and
    strategies that let it through say what they undid first (an acquire gives
    back what it may hold, a reservation reserves nothing). ``backend`` is the
    alias of the backend that failed.
    """

    def __init__(self, message: str, *, backend: str | None = None) -> None:
        super().__init__(message)
        self.backend = backend


class RedisUnavailable(BackendUnavailable):
    """Redis could not be reached or did not answer in time (connection refused, a
    timeout, a server loading its data or turned read-only by a failover)."""


class RedisCommandError(StockLocksError):
    """redis-py refused to send a request it cannot route: keys of one call in several
    Redis Cluster slots (e.g. a ``STOCK_HASH_TAG`` that does not keep a cart in one
    slot), or no key to route by. Nothing was sent. A bug or a configuration error,
    not an outage: retrying will not help, and it is never reported as
    :class:`RedisUnavailable`."""


class ZooKeeperUnavailable(BackendUnavailable):
    """The ZooKeeper ensemble could not be reached, did not answer in time, or ended
    this client's session (a request's outcome is then unknown)."""


class UnknownReply(StockLocksError):
    """A coordinator answered a code this version of stock_locks does not know (a
    script of another version, a bug): reported as such, never guessed."""


class OutOfStock(StockLocksError):
    """A cart line asked for more than is available. Nothing was reserved."""

    def __init__(self, sku: str, requested: int, available: int) -> None:
        super().__init__(f"out of stock: {sku!r} asked {requested}, available {available}")
        self.sku = sku
        self.requested = requested
        self.available = available


class CapExceeded(StockLocksError):
    """A cart would take a customer past a purchase cap. Nothing was reserved.

    ``sku``: the first capped SKU of the cart, ``cap``: the cap's name, ``limit``:
    its max, ``bought``: the customer's units under it in its window already,
    ``requested``: the cart's units under it.
    """

    def __init__(self, *, sku: str, cap: str, limit: int, bought: int, requested: int) -> None:
        super().__init__(
            f"cap {cap!r}: at most {limit} per customer; already {bought}, asked {requested} "
            f"(of {sku!r})"
        )
        self.sku, self.cap, self.limit = sku, cap, limit
        self.bought, self.requested = bought, requested


class CustomerRequired(StockLocksError):
    """A cart touches a SKU capped per customer, and no customer was named. Nothing
    was reserved."""

    def __init__(self, message: str, *, cap: str) -> None:
        super().__init__(message)
        self.cap = cap


class ContentionError(StockLocksError):
    """An optimistic (WATCH) reservation kept conflicting; nothing was reserved."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class ReservationError(StockLocksError):
    """A reservation cannot move to the asked state (e.g. paying a released one)."""

    def __init__(self, message: str, *, order_ref: str, status: str | None = None) -> None:
        super().__init__(message)
        self.order_ref = order_ref
        self.status = status


class InvalidSchedule(StockLocksError, ValueError):
    """A schedule call was malformed; nothing was scheduled."""


class MissingHandler(StockLocksError, LookupError):
    """A claimed item's task has no handler and no Celery task in this process."""


class InvalidQuantity(StockLocksError, ValueError):
    """A cart or quantity is malformed (bad qty, unknown SKU, duplicate line, too large)."""

    def __init__(self, message: str, *, sku: str | None = None) -> None:
        super().__init__(message)
        self.sku = sku


class WaitingRoomError(StockLocksError):
    """A waiting room was used wrongly or refused a request. ``event`` is its slug."""

    def __init__(self, message: str, *, event: str | None = None) -> None:
        super().__init__(message)
        self.event = event


class UnknownEvent(WaitingRoomError, LookupError):
    """No sale event has this slug (a configuration error, not a visitor's)."""


class InvalidPass(WaitingRoomError):
    """An admission pass was refused: forged, made for another event or another
    session, or unreadable. ``reason`` says which ("forged", "malformed")."""

    def __init__(self, message: str, *, event: str | None = None, reason: str = "forged"):
        super().__init__(message, event=event)
        self.reason = reason


class ExpiredPass(InvalidPass):
    """An admission pass older than its event's ``session_ttl``: the visitor queues again."""
