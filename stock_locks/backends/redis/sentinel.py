"""Redis Sentinel options of a Redis backend: where its primary is found.

Two forms name the same thing: a ``LOCATION`` of the form
``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
(``rediss+sentinel://``: TLS to the servers and the sentinels), or ``OPTIONS``
``SENTINELS`` (a list of ``(host, port)`` or ``"host:port"``) and
``SERVICE_NAME``. ``OPTIONS["SENTINEL_KWARGS"]``: the sentinels' own client
arguments (e.g. their password). The clients are made in ``client.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS


@dataclass(frozen=True)
class SentinelOptions:
    """Where a Sentinel-managed primary is found: the sentinels' ``addresses``, the
    ``service`` name they monitor, and the arguments of the clients that ask them
    (``sentinel_kwargs``: ``OPTIONS["SENTINEL_KWARGS"]``, else the backend's socket
    timeouts, no retries, and TLS when the ``LOCATION`` is ``rediss+sentinel://``)."""

    addresses: tuple[tuple[str, int], ...]
    service: str
    sentinel_kwargs: dict[str, Any]

    @classmethod
    def from_url(cls, alias: str, url: str) -> tuple[SentinelOptions, dict[str, Any]]:
        """(the options, the Redis servers' connection arguments: db, username,
        password, ssl) of ``redis+sentinel://[user:password@]host:port[,host:port...]/
        service[/db]`` or ``rediss+sentinel://...`` (TLS to the servers and the
        sentinels). Raises ImproperlyConfigured for any other shape."""
        scheme, _, rest = url.partition("://")
        netloc, _, path = rest.partition("/")
        userinfo, _, hosts = netloc.rpartition("@")
        parts = [p for p in path.split("/") if p]

        def refuse(why: str) -> ImproperlyConfigured:
            shape = "redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]"
            return ImproperlyConfigured(
                f"stock_locks backend {alias!r}: LOCATION {url!r} {why} (expected {shape})"
            )

        if "?" in url or "#" in url:
            raise refuse("has a query or fragment; put options in OPTIONS")
        if not hosts:
            raise refuse("names no sentinel")
        if not 1 <= len(parts) <= 2:
            raise refuse("does not name one service (and optionally a database)")
        if len(parts) == 2 and not parts[1].isdigit():
            raise refuse(f"has database {parts[1]!r}, not a number")
        addresses = tuple(_address(alias, h) for h in hosts.split(","))
        connection: dict[str, Any] = {}
        if userinfo:
            user, has_password, password = userinfo.partition(":")
            if user:
                connection["username"] = unquote(user)
            if has_password:
                connection["password"] = unquote(password)
        if len(parts) == 2:
            connection["db"] = int(parts[1])
        tls = SENTINEL_SCHEMES[scheme]
        if tls:
            connection["ssl"] = True
        return cls(addresses, unquote(parts[0]), {"ssl": True} if tls else {}), connection

    def client_kwargs(self, timeouts: dict[str, Any]) -> dict[str, Any]:
        """The sentinels' client arguments: ``sentinel_kwargs`` over the backend's socket
        ``timeouts`` and no retries. (redis-py's own default is no timeout at all in
        5.x, and three retries with backoff in 8.x: one sentinel that stops answering
        would hold every call for that long, past the socket timeout it was given.)"""
        return {**timeouts, "retry": Retry(NoBackoff(), 0), **self.sentinel_kwargs}


def sentinel_options(
    alias: str,
    location: str | tuple[str, ...] | None,
    options: dict[str, Any],
    cluster: bool,
    kwargs: dict[str, Any],
) -> SentinelOptions | None:
    """The Sentinel options of a backend entry (None: not Sentinel-managed); the Redis
    servers' arguments from a ``redis+sentinel://`` URL go into ``kwargs``."""
    by_url = isinstance(location, str) and location.split("://")[0] in SENTINEL_SCHEMES
    by_options = "SENTINELS" in options or "SERVICE_NAME" in options
    if not (by_url or by_options):
        if "SENTINEL_KWARGS" in options:
            raise ImproperlyConfigured(
                f"stock_locks backend {alias!r}: SENTINEL_KWARGS without Sentinel "
                "(a redis+sentinel:// LOCATION, or SENTINELS and SERVICE_NAME)"
            )
        return None
    if cluster:
        raise ImproperlyConfigured(
            f"stock_locks backend {alias!r}: CLUSTER and Sentinel exclude each other "
            "(a Redis Cluster fails over by itself)"
        )
    extra = dict(options.get("SENTINEL_KWARGS") or {})
    if by_url:
        if by_options:
            raise ImproperlyConfigured(
                f"stock_locks backend {alias!r}: a redis+sentinel:// LOCATION names the "
                "sentinels and the service; drop OPTIONS SENTINELS and SERVICE_NAME"
            )
        assert isinstance(location, str)
        found, connection = SentinelOptions.from_url(alias, location)
        kwargs.update(connection)
        return SentinelOptions(found.addresses, found.service, {**found.sentinel_kwargs, **extra})
    if location:
        raise ImproperlyConfigured(
            f"stock_locks backend {alias!r}: OPTIONS SENTINELS and SERVICE_NAME replace the "
            "LOCATION; remove it (or use a redis+sentinel:// LOCATION alone)"
        )
    sentinels, service = options.get("SENTINELS"), options.get("SERVICE_NAME")
    if not sentinels or not service or not isinstance(service, str):
        raise ImproperlyConfigured(
            f"stock_locks backend {alias!r}: Sentinel needs OPTIONS SENTINELS (a list of "
            "(host, port) or 'host:port') and SERVICE_NAME (the monitored service's name)"
        )
    addresses = tuple(
        _address(alias, s) if isinstance(s, str) else _address(alias, ":".join(map(str, s)))
        for s in sentinels
    )
    return SentinelOptions(addresses, service, extra)


def _address(alias: str, text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ImproperlyConfigured(
            f"stock_locks backend {alias!r}: sentinel address {text!r} is not host:port"
        )
    return host.strip("[]"), int(port)
