"""One script call with a bounded wait, for clean-up after an interrupted call.

When a lock call is interrupted mid-round-trip (KeyboardInterrupt, Celery's
``SoftTimeLimitExceeded``, a worker timeout) or its reply is lost, the lock
may be held with nobody left to release it. The clean-up must not hang the
caller in turn: the pooled connections may have no socket timeout, and the one
in use when the call was interrupted has been closed by redis-py. So the
clean-up runs on a connection of its own whose every step (connect, send,
reply) is bounded, and which skips redis-py's ``CLIENT SETINFO`` handshake so
that the request leaves at once: if the reply is late, the request still runs
when it reaches the server.

On a Redis Cluster the connection is to the node serving the script's keys;
a redirect (the slot moved in a failover: the request did not run) reads the
slot map again and sends it once more, to the node now serving it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .connection import is_cluster, on_node

if TYPE_CHECKING:
    from redis.commands.core import Script

# The longest each step of a clean-up call waits (connect, send, reply).
GIVE_BACK_TIMEOUT = 1.0  # seconds

# Connection arguments that turn off redis-py's CLIENT SETINFO on connect (renamed in 7.x).
NO_HANDSHAKE: dict[str, None] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def bounded_call(
    client: Any,
    script: Script,
    keys: Sequence[str],
    argv: Sequence,
    timeout: float | None = None,
) -> Any:
    """Run ``script`` once on a new connection; its reply.

    Every step waits at most ``timeout`` seconds (default
    ``GIVE_BACK_TIMEOUT``). No retries, but for a cluster's redirect (then one
    more try on a fresh slot map; a second redirect raises). Raises redis-py's
    ``TimeoutError`` or ``ConnectionError`` when that is not enough (the
    request may still run on the server later). A client without a connection
    pool runs the script with its own timeouts.
    """
    bound = GIVE_BACK_TIMEOUT if timeout is None else timeout
    if is_cluster(client):
        # No slot map refresh after a transport error here: it could outlast the bound.
        return on_node(
            client,
            keys[0],
            lambda node: bounded_call(node, script, keys, argv, bound),
            refresh_on_node_error=False,
        )
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return script(keys, argv, client=client)
    options = pool.connection_kwargs
    # The connection's own set-up (AUTH or HELLO, SELECT, CLIENT SETINFO) would
    # each wait for a reply before the script is sent: turn it all off (RESP2
    # needs no HELLO) and send what is needed in the same packet as the script.
    kwargs = {
        **options,
        "socket_timeout": bound,
        "socket_connect_timeout": bound,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
        "db": 0,
        "username": None,
        "password": None,
        "credential_provider": None,
        "client_name": None,
        **NO_HANDSHAKE,
    }
    connection = pool.connection_class(**kwargs)
    prelude: list[tuple] = []
    provider = options.get("credential_provider")
    credentials = (
        provider.get_credentials()
        if provider is not None
        else tuple(c for c in (options.get("username"), options.get("password")) if c)
    )
    if credentials:
        prelude.append(("AUTH", *credentials))
    if options.get("db"):
        prelude.append(("SELECT", options["db"]))
    try:
        call = ("EVALSHA", script.sha, len(keys), *keys, *argv)
        connection.send_packed_command(connection.pack_commands([*prelude, call]))
        for _ in prelude:
            connection.read_response()
        try:
            return connection.read_response()
        except NoScriptError:
            connection.send_command("EVAL", script.script, len(keys), *keys, *argv)
            return connection.read_response()
    finally:
        connection.disconnect()
