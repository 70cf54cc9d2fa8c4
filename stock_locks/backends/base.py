"""The seam between the lease algorithms and the coordinators: what a backend provides.

A backend is one coordinator (one Redis, a Redis Cluster, RedLock over N
masters, ZooKeeper) seen through the operations the lease algorithms
(:mod:`stock_locks.lease`) ask for: :class:`LockBackend` and
:class:`SemaphoreBackend` name them, one method each. An operation is a
generator of the backend's own transport requests that returns the
operation's result; nothing runs until the backend executes it. The
algorithms never call an operation themselves: they yield a :class:`Call`
(made with :func:`call`, which type-checks the arguments against the
method), and a driver hands it to the backend's :meth:`Backend.execute` (or
:meth:`Backend.aexecute` under asyncio). A call marked ``bounded`` is a
clean-up or a repeat: the backend performs it on a connection of its own
whose every step has a short bound, so that it cannot hang the caller.

Operations take a frozen description of the primitive (:class:`LockSpec`,
:class:`SemaphoreSpec`: name, keys, lease, caller), never the ``Lock`` or
``Semaphore`` object. A backend reports "the coordinator did not answer"
(the outcome unknown) as :class:`~stock_locks.exceptions.BackendUnavailable`,
and nothing else.

:class:`Capability` says what a backend guarantees, so that code needing one
can refuse a backend without it (a system check, a skipped contract test).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    NamedTuple,
    NoReturn,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
)

from ..exceptions import UnknownReply

if TYPE_CHECKING:
    from ..holder import LockInfo

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
P = ParamSpec("P")

# The longest each step of a bounded call (a clean-up, a repeat after a lost reply)
# waits: connect, send, reply.
GIVE_BACK_TIMEOUT = 1.0  # seconds

#: A backend operation: a generator of that backend's transport requests, sent their
#: replies, returning the operation's result.
Operation = Generator[Any, Any, T]


class Capability(enum.Flag):
    """What a backend guarantees.

    - ``FENCED``: every grant carries a fencing token greater than every earlier
      grant's for the same name.
    - ``LEASED``: a grant ends by itself after its ttl; ``extend()`` and the
      watchdog renew it. (A session-bound backend ends it with the session.)
    - ``SESSION_BOUND``: a grant lasts as long as the client's session, not a ttl.
    - ``SERVER_CLOCK``: lease ends and grant times come from the coordinator's clock.
    - ``WAKE_UP``: a release wakes a waiter; waiting costs no polling.
    - ``HOLDER_METADATA``: host, pid, thread, caller and grant time of each holder
      can be read back (the admin page shows them).
    - ``SEMAPHORES``: ``Semaphore`` and ``FairSemaphore`` run on it.
    - ``FORCE_RELEASE``: an operator can free a lock whoever holds it.
    - ``ASYNCIO``: ``stock_locks.aio``'s primitives run on it (:meth:`Backend.aexecute`).
    """

    FENCED = enum.auto()
    LEASED = enum.auto()
    SESSION_BOUND = enum.auto()
    SERVER_CLOCK = enum.auto()
    WAKE_UP = enum.auto()
    HOLDER_METADATA = enum.auto()
    SEMAPHORES = enum.auto()
    FORCE_RELEASE = enum.auto()
    ASYNCIO = enum.auto()


FENCED = Capability.FENCED
LEASED = Capability.LEASED
SESSION_BOUND = Capability.SESSION_BOUND
SERVER_CLOCK = Capability.SERVER_CLOCK
WAKE_UP = Capability.WAKE_UP
HOLDER_METADATA = Capability.HOLDER_METADATA
SEMAPHORES = Capability.SEMAPHORES
FORCE_RELEASE = Capability.FORCE_RELEASE
ASYNCIO = Capability.ASYNCIO
ALL_CAPABILITIES = frozenset(Capability)


class _Codes(enum.IntEnum):
    """Reply codes: a code the enum does not know raises :class:`UnknownReply` (a
    coordinator's script of another version, a bug), never read as an outcome."""

    @classmethod
    def _missing_(cls, value: object) -> NoReturn:
        raise UnknownReply(f"{cls.__name__}: unknown reply code {value!r}")

    @classmethod
    def of(cls, value: Any) -> Self:
        """The member of ``value`` (a reply's integer): ``cls(value)``, without the enum
        machinery's cost on a hot path (a dictionary lookup)."""
        try:
            member: Self = cls._value2member_map_[value]  # type: ignore[assignment]
        except (KeyError, TypeError):
            return cls(value)
        return member


class ReleaseOutcome(_Codes):
    """What a lock release found."""

    NOT_OWNED = 0  # the token held nothing (its lease ran out, or it was force-released)
    RELEASED = 1  # freed now, or by an earlier call whose reply was lost
    STILL_HELD = 2  # a reentrant hold counted down; the lock stays held


class ExtendOutcome(_Codes):
    """What a lock extend (or a watchdog renewal) found."""

    LOST = 0  # the token no longer holds the lock
    EXTENDED = 1
    CAPPED = 2  # max_hold cut the lease: it ends at the cap


class ReleaseMode(enum.StrEnum):
    """Why a lock is released."""

    RELEASE = "release"  # the holder's own release
    ABANDON = "abandon"  # an acquire gives back what it may hold (and refuses its late copy)
    FORCE = "force"  # an operator's release of another holder
    RETRACT = "retract"  # RedLock: a try not granted takes back what a minority granted


@dataclass(slots=True)
class Attempt:
    """A backend's answer to one try (not frozen: frozen dataclasses cost a
    microsecond more to make, on every acquire).

    ``wait``: when refused, the longest the caller must sleep before a try could
    succeed without a wake-up (the holder's lease end), seconds; None when
    unknown. ``fence``/``count``: a lock grant's fencing token and reentrant
    count. ``ticket``: a fair semaphore's place in the queue.
    """

    granted: bool
    wait: float | None = None
    fence: int | None = None
    count: int = 0
    ticket: int | None = None


@dataclass(frozen=True, slots=True)
class LockSpec:
    """What a backend needs to know of a lock: its ``name``, its ``keys`` on that
    backend (:meth:`LockBackend.lock_keys`), its lease in ms, and the holder's
    ``caller`` label and ``watchdog`` flag (holder metadata). Made once per
    ``Lock`` by :meth:`LockBackend.lock_spec`; a backend may return a subclass
    carrying what it prepares once (packed commands)."""

    name: str
    keys: Any
    ttl_ms: int
    caller: str
    watchdog: bool


@dataclass(frozen=True, slots=True)
class SemaphoreSpec:
    """What a backend needs to know of a semaphore: ``name``, ``keys``, ``limit``,
    the default lease in ms, the holder's ``caller`` label, and whether it is ``fair``."""

    name: str
    keys: Any
    limit: int
    ttl_ms: int
    caller: str
    fair: bool


class Renewal(Protocol):
    """One watchdog renewal as :meth:`LockBackend.renew_many` reads it."""

    @property
    def spec(self) -> LockSpec: ...

    @property
    def token(self) -> str: ...

    @property
    def ttl_ms(self) -> int: ...

    @property
    def max_hold_ms(self) -> int: ...


class HoldState(Protocol):
    """The owner's side of a grant: a backend that learns of a loss by itself (a
    session that ended) sets ``lost``."""

    lost: bool


class Call(NamedTuple, Generic[T]):
    """One backend operation, ready to run: ``operation(*args)`` on its backend's
    transport. ``bounded``: a clean-up or repeat, each of whose steps is short."""

    operation: Callable[..., Operation[T]]
    args: tuple[Any, ...]
    bounded: bool = False

    @property
    def verb(self) -> str:
        """The operation's name (``lock_try``, ``semaphore_release``, ...)."""
        return self.operation.__name__


def call(operation: Callable[P, Operation[T]], *args: P.args, **kwargs: P.kwargs) -> Call[T]:
    """A :class:`Call` of ``operation`` (a backend's method) with ``args``; the
    arguments are checked against the method's signature (positional only)."""
    if kwargs:
        raise TypeError(f"{operation.__name__}: backend operations take positional arguments")
    return Call(operation, args)


def bounded(pending: Call[T]) -> Call[T]:
    """``pending`` marked bounded (performed on a connection of its own, every step short)."""
    return pending._replace(bounded=True)


class LockBackend(Protocol):
    """The lock operations every backend provides."""

    alias: str
    capabilities: ClassVar[Capability]

    def lock_keys(self, name: str) -> Any:
        """Where lock ``name`` lives on this backend. Raises ValueError for a bad name."""

    def lock_spec(self, name: str, *, ttl_ms: int, caller: str, watchdog: bool) -> LockSpec:
        """The :class:`LockSpec` of lock ``name``. Raises ValueError for a bad name."""

    def lock_try(
        self, spec: LockSpec, token: str, count: int, waited: bool, hold: HoldState | None
    ) -> Operation[Attempt]:
        """One try. ``count``: how many holds the reentrant owner has (0: a fresh
        grant); ``waited``: whether the caller slept before it; ``hold``: the
        owner's state, for a backend that learns of a loss by itself. Raises
        ``LockNotOwned`` for a re-entry whose token no longer holds the lock,
        ``LockError`` for a token already given back."""

    def lock_release(
        self, spec: LockSpec, token: str, count: int, mode: ReleaseMode
    ) -> Operation[ReleaseOutcome]:
        """Release one hold of ``token`` (``count``: how many holds the owner has)."""

    def lock_extend(
        self, spec: LockSpec, token: str, ttl_ms: int, max_hold_ms: int
    ) -> Operation[ExtendOutcome]:
        """Reset ``token``'s lease to ``ttl_ms`` (never past ``max_hold_ms`` from the
        grant when that is not 0)."""

    def lock_wait(self, spec: LockSpec, seconds: float) -> Operation[bool]:
        """Sleep until a release wakes the caller (True) or ``seconds`` pass (False)."""

    def lock_inspect(self, name: str, keys: Any) -> Operation[LockInfo | None]:
        """Who holds lock ``name`` now (one atomic read), or None."""

    def lock_token(self, keys: Any) -> Operation[str | None]:
        """The token holding the lock now, or None."""

    def force_release(self, info: LockInfo, keys: Any) -> Operation[ReleaseOutcome]:
        """Release the hold of ``info.token`` as an operator (remembered as forced)."""

    def held_lock_names(self) -> Operation[list[str]]:
        """Names of the locks held now, sorted."""

    def inspect_many(self, chunk: Sequence[tuple[str, Any]]) -> Operation[list[LockInfo | None]]:
        """The holders of many locks, ``(name, keys)`` pairs."""

    def force_release_many(
        self, matches: Sequence[tuple[Any, LockInfo]]
    ) -> Operation[list[ReleaseOutcome]]:
        """:meth:`force_release` of many ``(keys, holder)`` pairs."""

    def renew_many(
        self, renewals: Sequence[Renewal]
    ) -> Operation[list[ExtendOutcome | BaseException]]:
        """Extend many leases in one round trip where the backend can; per renewal its
        outcome, or the exception that left it unknown (the watchdog tries again)."""


class SemaphoreBackend(Protocol):
    """The semaphore operations of a backend that declares ``SEMAPHORES``."""

    def semaphore_keys(self, name: str) -> Any:
        """Where semaphore ``name`` lives. Raises ValueError for a bad name."""

    def semaphore_try(
        self, spec: SemaphoreSpec, holder: str, lease_ms: int, patience_ms: int
    ) -> Operation[Attempt]:
        """One try of holder id ``holder`` for a permit of ``lease_ms``; ``patience_ms``:
        how long the caller sleeps if refused (0: a last try, -1: no bound)."""

    def semaphore_release(
        self, spec: SemaphoreSpec, holder: str, lease_ms: int, abandon: bool
    ) -> Operation[int]:
        """Give ``holder``'s permit back: 1 when it held a live one (or this repeats a
        release that found one). ``abandon``: also refuse a late copy of its try."""

    def semaphore_refresh(self, spec: SemaphoreSpec, holder: str, ttl_ms: int) -> Operation[int]:
        """Reset ``holder``'s lease: 1 when it still held a live permit."""

    def semaphore_wait(self, spec: SemaphoreSpec, holder: str, seconds: float) -> Operation[bool]:
        """Sleep until a wake-up (True) or ``seconds`` pass (False)."""

    def semaphore_state(self, keys: Any) -> Operation[list[Any]]:
        """``[now ms, limit, waiting, flat holders]`` of one semaphore."""

    def semaphore_evict(self, keys: Any, holder: str, limit: int) -> Operation[int]:
        """Take ``holder``'s permit (an operator's action): 1 when it held a live one."""


def run(steps: Generator[Any, Any, T], perform: Callable[[Any], Any]) -> T:
    """Drive ``steps`` synchronously: each yielded request goes to ``perform``, its
    result (or exception) back into the generator; the generator's return value."""
    send: Callable[[Any], Any] = steps.send
    value: Any = None
    while True:
        try:
            request = send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            value, send = perform(request), steps.send
        except BaseException as exc:
            value, send = exc, steps.throw


async def arun(steps: Generator[Any, Any, T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`run` under asyncio: each yielded request is awaited through ``perform``.

    A cancellation while a request is awaited is thrown into the generator like
    any other exception (an acquire then gives back what it may hold, awaiting
    once more, before the cancellation propagates)."""
    send: Callable[[Any], Any] = steps.send
    value: Any = None
    while True:
        try:
            request = send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            value, send = await perform(request), steps.send
        except BaseException as exc:
            value, send = exc, steps.throw


class Backend:
    """Base of every backend: an alias, declared capabilities, and the drivers'
    entry points :meth:`execute` and :meth:`aexecute`."""

    capabilities: ClassVar[Capability] = Capability(0)

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias!r}>"

    def has(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def execute(self, pending: Call[T]) -> T:
        """Run ``pending`` to its result (the synchronous drivers' one entry point).

        Raises :class:`~stock_locks.exceptions.BackendUnavailable` when the
        coordinator did not answer, or what the operation raises.
        """
        raise NotImplementedError

    async def aexecute(self, pending: Call[T]) -> T:
        """:meth:`execute` under asyncio; only on a backend that declares ``ASYNCIO``."""
        raise NotImplementedError(f"{self!r} does not support asyncio")

    def close(self) -> None:
        """Drop connections this backend opened itself (not a shared client's)."""
