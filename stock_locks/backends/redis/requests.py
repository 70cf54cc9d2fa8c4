"""The requests a Redis transport performs, and the policies every transport runs.

An operation of the Redis backend (a lock try, a stock reserve) is a generator
that yields these requests and is sent their replies, or has their errors
thrown into it. A transport (``transport.py`` for redis-py, ``aio_transport.py``
for ``redis.asyncio``) only performs them; everything else is decided here,
once for both:

- :func:`script`: ``EVALSHA``; when the server does not know the script (it
  restarted, or is a new primary) ``EVAL`` of its source; when a cluster node
  no longer serves the slot, the slot map is read again and the call sent once
  more.
- :func:`scripts_batch`: many script calls in one round trip (one pipeline per
  node on a cluster), with the same two policies per call.
- :func:`confirmed_script`: a script then ``WAIT`` on the same connection.

A transport performs a request normally, or *bounded* (a clean-up, a repeat
after a lost reply: the driver was told so): then a :class:`Script` or
:class:`Command` runs on a new connection of the configured pool's kind (so
Sentinel, TLS, a password, a unix socket all follow), every step of which waits
at most ``GIVE_BACK_TIMEOUT`` (``stock_locks.backends.base``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from redis.exceptions import NoScriptError

from ...scripts import by_sha
from .errors import NODE_ERRORS, STALE_ROUTE_ERRORS, stale_route
from .protocol import CommandHead

if TYPE_CHECKING:
    from redis.commands.core import Script as RedisScript

T = TypeVar("T")
Requests = Generator[Any, Any, T]


class Script(NamedTuple):
    """``EVALSHA`` of ``script`` on ``keys`` and ``argv``, on the node serving
    ``keys[0]``; raises the error reply (``NoScriptError`` included). ``head``: the
    packed ``EVALSHA sha numkeys KEYS`` when the caller made it once.
    ``repeatable``: the script is safe to run twice, so a transport may send it
    again at once when the pooled connection it used was found dead (False: only
    the client's own retry policy applies)."""

    script: RedisScript
    keys: Sequence[str]
    argv: Sequence[Any]
    head: CommandHead | None = None
    repeatable: bool = True


class Command(NamedTuple):
    """One command on the node serving ``key`` (None: a command without a key);
    raises the error reply."""

    args: tuple[Any, ...]
    key: str | None = None


class Pipeline(NamedTuple):
    """``commands`` sent together on one connection of the node serving ``key``; the
    replies in order, an error reply as its exception object."""

    commands: Sequence[tuple[Any, ...]]
    key: str


class Batch(NamedTuple):
    """``commands``, each on the node serving its ``key``: one pipeline per node, all in
    one round trip. The replies in order; an error reply, or the transport error of
    a node that could not be reached, as its exception object."""

    commands: Sequence[tuple[str, tuple[Any, ...]]]  # (key, command)


class Pop(NamedTuple):
    """Block until an element of the list ``key`` is popped (its value) or ``seconds``
    pass (None). ``b""``: the wait was cut (a failover): nothing popped, look again."""

    key: str
    seconds: float


# PopThen's reply when ``then`` was sent and may have run (or may still run) with its
# reply lost: the wait's deadline dropped the connection, a failover cut the wait, the
# connection broke after the pop.
UNKNOWN = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()


class PopThen(NamedTuple):
    """:class:`Pop`, then ``then`` (a script) sent behind the ``BLPOP`` on the same
    connection, which the server runs as soon as the pop is served: (what was
    popped, or None; the script's reply or its error reply as an exception object,
    None when it was not sent (a client without a pool; under asyncio, whose waits
    go through one listener) or :data:`UNKNOWN`)."""

    key: str
    seconds: float
    then: Script


class RefreshRoutes(NamedTuple):
    """Read a cluster's slot map again (nothing on a single server)."""


class Blocking(NamedTuple):
    """``function()``: a step bound to a blocking API (the database, a tool reading many
    nodes); under asyncio it runs in a worker thread."""

    function: Callable[[], Any]


class Performer(Protocol):
    """A transport, as :func:`dispatch` reads it: one method per request (each a plain
    function of redis-py's transport, a coroutine function of ``redis.asyncio``'s),
    and ``bounded``: a command on a connection of its own, every step bounded."""

    def script(self, request: Script) -> Any: ...
    def command(self, request: Command) -> Any: ...
    def pipeline(self, request: Pipeline) -> Any: ...
    def batch(self, request: Batch) -> Any: ...
    def pop(self, request: Pop) -> Any: ...
    def pop_then(self, request: PopThen) -> Any: ...
    def refresh_routes(self, request: RefreshRoutes) -> Any: ...
    def blocking(self, request: Blocking) -> Any: ...
    def bounded(self, key: str | None, command: tuple[Any, ...]) -> Any: ...


def dispatch(transport: Performer, bounded: bool) -> dict[type, Callable[[Any], Any]]:
    """Request type -> the transport's method that performs it; ``bounded``: a script
    or a command runs on a connection of its own (:meth:`Performer.bounded`)."""
    table: dict[type, Callable[[Any], Any]] = {
        Script: transport.script,
        Command: transport.command,
        Pipeline: transport.pipeline,
        Batch: transport.batch,
        Pop: transport.pop,
        PopThen: transport.pop_then,
        RefreshRoutes: transport.refresh_routes,
        Blocking: transport.blocking,
    }
    if bounded:
        table[Script] = lambda request: transport.bounded(request.keys[0], evalsha(*request[:3]))
        table[Command] = lambda request: transport.bounded(request.key, request.args)
    return table


def evalsha(script: RedisScript, keys: Sequence[str], argv: Sequence[Any]) -> tuple[Any, ...]:
    return ("EVALSHA", script.sha, len(keys), *keys, *argv)


def with_source(command: tuple[Any, ...]) -> tuple[Any, ...]:
    """``EVALSHA sha ...`` as ``EVAL source ...``: what a server that answered NOSCRIPT
    (it restarted, or is a new primary) is sent instead (EVAL caches it too)."""
    return ("EVAL", by_sha(command[1]).script, *command[2:])


def script(
    source: RedisScript,
    keys: Sequence[str],
    argv: Sequence[Any],
    head: CommandHead | None = None,
    *,
    repeatable: bool = True,
) -> Requests[Any]:
    """Run a script: its reply. ``NOSCRIPT`` sends its source (``EVAL``, which also
    caches it); a stale route (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: it did not run)
    reads the slot map again and sends it once more; a second stale route raises.
    ``repeatable``: see :class:`Script`."""
    request: Script | Command = Script(source, keys, argv, head, repeatable)
    rerouted = False
    while True:
        try:
            return (yield request)
        except NoScriptError:
            request = Command(with_source(evalsha(source, keys, argv)), keys[0])
        except STALE_ROUTE_ERRORS:
            if rerouted:
                raise
            rerouted = True
            yield RefreshRoutes()


def scripts_batch(
    calls: Sequence[tuple[RedisScript, Sequence[str], Sequence[Any]]],
) -> Requests[list[Any]]:
    """Many script calls in one round trip (one pipeline per node on a cluster); the
    replies in order, a call that failed inside Redis as its exception object.

    A call whose script the server does not know is sent again with its source;
    calls a node answered with a redirect (they did not run) are sent once more on
    a fresh slot map (misrouted again: that error is raised). A node that could
    not be reached: its transport error is raised once every other node's calls
    have run, after the slot map is read again. Every call must be safe to repeat.
    """
    first = [(keys[0], evalsha(source, keys, argv)) for source, keys, argv in calls]
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    sourced: set[int] = set()
    rerouted = False
    while todo:
        commands = []
        for i in todo:
            key, command = first[i]
            commands.append((key, with_source(command) if i in sourced else command))
        for i, reply in zip(todo, (yield Batch(commands)), strict=True):
            replies[i] = reply
        unreachable = next((replies[i] for i in todo if isinstance(replies[i], NODE_ERRORS)), None)
        if unreachable is not None:
            yield RefreshRoutes()
            raise unreachable
        unknown = [i for i in todo if isinstance(replies[i], NoScriptError)]
        misrouted = [i for i in todo if stale_route(replies[i])]
        if misrouted:
            if rerouted:
                raise replies[misrouted[0]]
            rerouted = True
            yield RefreshRoutes()
        sourced.update(unknown)
        todo = unknown + misrouted
    return replies


def confirmed_script(
    source: RedisScript, keys: Sequence[str], argv: Sequence[Any], wait: tuple[int, int]
) -> Requests[tuple[Any, Any]]:
    """A script then ``WAIT numreplicas timeout_ms`` (``wait``) on one connection of
    the node serving ``keys[0]`` (WAIT counts the replicas that have that
    connection's writes): (the script's reply, WAIT's reply or its error).
    NOSCRIPT and stale routes as :func:`script`."""
    first = evalsha(source, keys, argv)
    rerouted = False
    while True:
        reply, confirmed = yield Pipeline([first, ("WAIT", *wait)], keys[0])
        if isinstance(reply, NoScriptError):
            first = with_source(first)
            continue
        if stale_route(reply) and not rerouted:
            rerouted = True
            yield RefreshRoutes()
            continue
        if isinstance(reply, BaseException):
            raise reply
        return reply, confirmed
