"""Decorators that run a function, view or Celery task under a lock.

    @locked("order:{order_id}")
    def pay(request, order_id): ...

    @lock_model(Product, kwarg="pk")
    def restock(pk, qty): ...

The lock name is formatted from the call's bound arguments (``{request.user.pk}``
and ``{kwargs[pk]}`` work as in ``str.format``). A view (a function whose first
or second argument is an ``HttpRequest``) that does not get its lock in time
answers HTTP 423 with ``{"error": "locked", "lock": ...}``, and 503 when Redis
is unreachable; anything else raises :class:`LockTimeout` or
:class:`RedisUnavailable`. Put ``@locked`` below Celery's ``@app.task``.
"""

from __future__ import annotations

import functools
import inspect
import string
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, JsonResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .conf import settings
from .exceptions import LockError, LockTimeout, RedisUnavailable
from .locks import Lock

F = TypeVar("F", bound=Callable[..., Any])
LockedResponse = Callable[[HttpRequest, str], HttpResponse]

_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)


def locked_response(request: HttpRequest, lock_name: str) -> HttpResponse:
    """The default answer of a view whose lock was not granted in time."""
    return JsonResponse(
        {"error": "locked", "lock": lock_name, "message": f"{lock_name} is busy, try again"},
        status=settings.LOCK_TIMEOUT_STATUS,
        headers={"Retry-After": "1"},
    )


def unavailable_response(request: HttpRequest, lock_name: str) -> HttpResponse:
    """The answer of a view when Redis cannot be reached; nothing was changed."""
    return JsonResponse(
        {"error": "unavailable", "lock": lock_name, "message": "lock service unavailable"},
        status=settings.REDIS_UNAVAILABLE_STATUS,
        headers={"Retry-After": "1"},
    )


def locked(
    key: str,
    ttl: float | None = None,
    timeout: float | None = None,
    *,
    blocking: bool = True,
    reentrant: bool = False,
    watchdog: bool = False,
    response: LockedResponse | None = None,
) -> Callable[[F], F]:
    """Run the decorated callable while holding the lock named by ``key``.

    Args:
        key: a ``str.format`` template over the callable's argument names.
            Naming an argument the callable does not take raises
            :class:`LockError` at decoration time.
        ttl: the lease in seconds (default ``STOCK_LOCKS["LOCK_TTL"]``).
        timeout: how long to wait for the lock, seconds (default
            ``STOCK_LOCKS["DECORATOR_TIMEOUT"]``; ``math.inf`` waits forever).
        blocking, reentrant, watchdog: as for :class:`stock_locks.Lock`.
        response: for views, ``response(request, lock_name)`` builds the answer
            when the lock is not granted (default: 423 JSON).
    """
    if not isinstance(key, str) or not key:
        raise LockError(f"a lock key template must be a non-empty string, got {key!r}")
    fields = _template_fields(key)

    def decorate(func: F) -> F:
        signature = _check_names(func, fields, f"lock key {key!r}")

        def build(arguments: Mapping[str, Any]) -> str:
            try:
                return key.format_map(arguments)
            except (KeyError, AttributeError, IndexError, LookupError) as exc:
                raise LockError(f"lock key {key!r} cannot be formatted: {exc!r}") from None

        return _wrap(func, signature, build, ttl, timeout, blocking, reentrant, watchdog, response)

    return decorate


def lock_model(
    model: type,
    kwarg: str = "pk",
    ttl: float | None = None,
    timeout: float | None = None,
    **options: Any,
) -> Callable[[F], F]:
    """Run the decorated callable while holding the lock of one model row.

    The lock is named ``<app_label>.<model_name>:<value>`` where value is the
    argument ``kwarg`` (a model instance stands for its pk). Other options are
    those of :func:`locked`.
    """
    label = f"{model._meta.app_label}.{model._meta.model_name}"

    def decorate(func: F) -> F:
        signature = _check_names(func, {kwarg}, f"lock_model({model.__name__}, kwarg={kwarg!r})")

        def build(arguments: Mapping[str, Any]) -> str:
            if kwarg not in arguments:
                raise LockError(f"lock_model: the call passed no {kwarg!r} argument")
            value = arguments[kwarg]
            return f"{label}:{getattr(value, 'pk', value)}"

        return _wrap(func, signature, build, ttl, timeout, **options)

    return decorate


def _template_fields(template: str) -> set[str]:
    fields = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise LockError(f"lock key {template!r}: name the argument in every {{field}}")
        fields.add(root)
    return fields


def _check_names(func: Callable, fields: set[str], what: str) -> inspect.Signature:
    signature = inspect.signature(func)
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return signature  # names may arrive in **kwargs: checked at call time
    unknown = sorted(fields - set(params))
    if unknown:
        raise LockError(
            f"{what} names {', '.join(unknown)}, which {func.__qualname__}() does not take "
            f"(its arguments: {', '.join(params) or 'none'})"
        )
    return signature


def _arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(param.name, {}))
    return arguments


def _find_request(args: tuple) -> HttpRequest | None:
    for arg in args[:2]:
        if isinstance(arg, HttpRequest):
            return arg
        inner = getattr(arg, "_request", None)  # DRF's Request wraps Django's
        if isinstance(inner, HttpRequest):
            return inner
    return None


def _wrap(
    func: F,
    signature: inspect.Signature,
    build: Callable[[Mapping[str, Any]], str],
    ttl: float | None,
    timeout: float | None,
    blocking: bool = True,
    reentrant: bool = False,
    watchdog: bool = False,
    response: LockedResponse | None = None,
) -> F:
    caller = f"{func.__module__}.{func.__qualname__}"
    on_busy = response or locked_response

    def make_lock(args: tuple, kwargs: dict) -> Lock:
        name = build(_arguments(signature, args, kwargs))
        wait = settings.DECORATOR_TIMEOUT if timeout is None else timeout
        return Lock(
            name, ttl, timeout=wait, blocking=blocking, reentrant=reentrant,
            watchdog=watchdog, caller=caller,
        )  # fmt: skip

    def refused(lock: Lock, request: HttpRequest | None, exc: Exception | None) -> Any:
        if exc is not None:
            if request is not None:
                return unavailable_response(request, lock.name)
            raise RedisUnavailable(f"Redis unreachable while locking {lock.name!r}: {exc}") from exc
        if request is not None:
            return on_busy(request, lock.name)
        raise LockTimeout(
            f"lock {lock.name!r} not granted within {lock.timeout}s for {caller}",
            name=lock.name,
            timeout=lock.timeout,
        )

    if inspect.iscoroutinefunction(func):
        if reentrant:
            raise LockError(f"{caller}: reentrant locks follow threads; async code cannot use them")
        from asgiref.sync import sync_to_async

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            lock = make_lock(args, kwargs)
            try:
                granted = await sync_to_async(lock.acquire, thread_sensitive=False)()
            except _REDIS_DOWN as exc:
                return refused(lock, _find_request(args), exc)
            if not granted:
                return refused(lock, _find_request(args), None)
            exit_lock = sync_to_async(lock.__exit__, thread_sensitive=False)
            try:
                result = await func(*args, **kwargs)
            except BaseException:
                await exit_lock(*sys.exc_info())
                raise
            await exit_lock(None, None, None)
            return result

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        lock = make_lock(args, kwargs)
        try:
            granted = lock.acquire()
        except _REDIS_DOWN as exc:
            return refused(lock, _find_request(args), exc)
        if not granted:
            return refused(lock, _find_request(args), None)
        try:
            result = func(*args, **kwargs)
        except BaseException:
            lock.__exit__(*sys.exc_info())
            raise
        lock.__exit__(None, None, None)
        return result

    return wrapper  # type: ignore[return-value]
