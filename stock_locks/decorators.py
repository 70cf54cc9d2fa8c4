"""Decorators that run a function, view or Celery task under a lock or a semaphore.

    @locked("order:{order_id}")
    def pay(request, order_id): ...

    @lock_model(Product, kwarg="pk")
    def restock(pk, qty): ...

    @limit_concurrency("export:{request.user.pk}", 2)
    def export(request): ...

The lock or semaphore name is formatted from the call's bound arguments
(``{request.user.pk}`` and ``{kwargs[pk]}`` work as in ``str.format``). A view
(a function whose first or second argument is an ``HttpRequest``) that does not
get its lock in time answers HTTP 423 with ``{"error": "locked", "lock": ...}``
(no permit: 429 with ``{"error": "too_many", "semaphore": ...}``), and 503 when
Redis is unreachable; anything else raises :class:`LockTimeout` or
:class:`RedisUnavailable`. Put these decorators below Celery's ``@app.task``.
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
from .locks import Lock, seconds_to_ms
from .semaphores import FairSemaphore, Semaphore, check_limit, check_timeout

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


def unavailable_response(
    request: HttpRequest, lock_name: str, *, kind: str = "lock"
) -> HttpResponse:
    """The answer of a view when Redis cannot be reached; nothing was changed.

    ``kind`` names the body's field that carries the name: "lock" or "semaphore".
    """
    return JsonResponse(
        {"error": "unavailable", kind: lock_name, "message": "lock service unavailable"},
        status=settings.REDIS_UNAVAILABLE_STATUS,
        headers={"Retry-After": "1"},
    )


def too_many_response(request: HttpRequest, semaphore_name: str, limit: int) -> HttpResponse:
    """The default answer of a view that got no permit of its semaphore in time."""
    return JsonResponse(
        {
            "error": "too_many",
            "semaphore": semaphore_name,
            "limit": limit,
            "message": f"{semaphore_name} already runs {limit} at once, try again",
        },
        status=settings.SEMAPHORE_TIMEOUT_STATUS,
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
    fields = _template_fields(key, "lock key")

    def decorate(func: F) -> F:
        signature = _check_names(func, fields, f"lock key {key!r}")
        build = _formatter(key, "lock key")
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


def limit_concurrency(
    name: str,
    limit: int,
    ttl: float | None = None,
    timeout: float | None = None,
    *,
    fair: bool = False,
    response: Callable[[HttpRequest, str, int], HttpResponse] | None = None,
) -> Callable[[F], F]:
    """Run the decorated callable holding one of ``limit`` permits of a semaphore.

    Args:
        name: the semaphore's name, a ``str.format`` template over the
            callable's argument names like ``@locked``'s key (``"exports"``,
            ``"export:{request.user.pk}"``). Naming an argument the callable
            does not take raises :class:`LockError` at decoration time.
        limit: how many calls may run at once (an int >= 1).
        ttl: the lease of a permit in seconds (default
            ``STOCK_LOCKS["SEMAPHORE_TTL"]``): a call running longer loses its
            permit, and the release at its end logs a WARNING.
        timeout: how long to wait for a permit, seconds (default
            ``STOCK_LOCKS["SEMAPHORE_TIMEOUT"]``; ``0`` tries once,
            ``math.inf`` waits forever).
        fair: admit waiting calls in arrival order (:class:`FairSemaphore`).
        response: for views, ``response(request, name, limit)`` builds the
            answer when no permit is granted (default: JSON with status
            ``STOCK_LOCKS["SEMAPHORE_TIMEOUT_STATUS"]``, 429, and Retry-After).

    Views answer that response, or 503 when Redis is down; anything else
    raises :class:`LockTimeout` or :class:`RedisUnavailable`.
    """
    fields = _template_fields(name, "semaphore name")
    check_limit(limit, name)
    if ttl is not None:
        seconds_to_ms(ttl, "ttl", name)
    check_timeout(timeout, name)
    kind = FairSemaphore if fair else Semaphore
    on_busy = response or too_many_response

    def decorate(func: F) -> F:
        signature = _check_names(func, fields, f"semaphore name {name!r}")
        build = _formatter(name, "semaphore name")
        caller = _caller(func)

        def make(args: tuple, kwargs: dict) -> Semaphore:
            wait = settings.SEMAPHORE_TIMEOUT if timeout is None else timeout
            return kind(
                build(_arguments(signature, args, kwargs)), limit, ttl, timeout=wait, caller=caller
            )

        return _guard(
            func,
            make,
            lambda request, semaphore: on_busy(request, semaphore.name, semaphore.limit),
            "semaphore",
        )

    return decorate


def _template_fields(template: str, what: str) -> set[str]:
    if not isinstance(template, str) or not template:
        raise LockError(f"a {what} template must be a non-empty string, got {template!r}")
    fields = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise LockError(f"{what} {template!r}: name the argument in every {{field}}")
        fields.add(root)
    return fields


def _formatter(template: str, what: str) -> Callable[[Mapping[str, Any]], str]:
    def build(arguments: Mapping[str, Any]) -> str:
        try:
            return template.format_map(arguments)
        except (KeyError, AttributeError, IndexError, LookupError) as exc:
            raise LockError(f"{what} {template!r} cannot be formatted: {exc!r}") from None

    return build


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


def _caller(func: Callable) -> str:
    return f"{func.__module__}.{func.__qualname__}"


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
    caller = _caller(func)
    on_busy = response or locked_response
    if reentrant and inspect.iscoroutinefunction(func):
        raise LockError(f"{caller}: reentrant locks follow threads; async code cannot use them")

    def make_lock(args: tuple, kwargs: dict) -> Lock:
        name = build(_arguments(signature, args, kwargs))
        wait = settings.DECORATOR_TIMEOUT if timeout is None else timeout
        return Lock(
            name, ttl, timeout=wait, blocking=blocking, reentrant=reentrant,
            watchdog=watchdog, caller=caller,
        )  # fmt: skip

    return _guard(func, make_lock, lambda request, lock: on_busy(request, lock.name), "lock")


def _guard(
    func: F,
    make: Callable[[tuple, dict], Any],
    on_busy: Callable[[HttpRequest, Any], HttpResponse],
    kind: str,
) -> F:
    """Wrap ``func`` so that it runs holding ``make(args, kwargs)`` (a Lock or a
    Semaphore: ``acquire()``, the context manager's ``__exit__``, ``name``, ``timeout``)."""
    caller = _caller(func)

    def refused(guard: Any, request: HttpRequest | None, exc: Exception | None) -> Any:
        if exc is not None:
            if request is not None:
                return unavailable_response(request, guard.name, kind=kind)
            raise RedisUnavailable(
                f"Redis unreachable while taking {kind} {guard.name!r}: {exc}"
            ) from exc
        if request is not None:
            return on_busy(request, guard)
        if kind == "lock":
            what = f"lock {guard.name!r} not granted"
        else:
            what = f"no permit of {kind} {guard.name!r}"
        raise LockTimeout(
            f"{what} within {guard.timeout}s for {caller}",
            name=guard.name,
            timeout=guard.timeout,
        )

    if inspect.iscoroutinefunction(func):
        from asgiref.sync import sync_to_async

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            guard = make(args, kwargs)
            try:
                granted = await sync_to_async(guard.acquire, thread_sensitive=False)()
            except _REDIS_DOWN as exc:
                return refused(guard, _find_request(args), exc)
            if not granted:
                return refused(guard, _find_request(args), None)
            exit_guard = sync_to_async(guard.__exit__, thread_sensitive=False)
            try:
                result = await func(*args, **kwargs)
            except BaseException:
                await exit_guard(*sys.exc_info())
                raise
            await exit_guard(None, None, None)
            return result

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        guard = make(args, kwargs)
        try:
            granted = guard.acquire()
        except _REDIS_DOWN as exc:
            return refused(guard, _find_request(args), exc)
        if not granted:
            return refused(guard, _find_request(args), None)
        try:
            result = func(*args, **kwargs)
        except BaseException:
            guard.__exit__(*sys.exc_info())
            raise
        guard.__exit__(None, None, None)
        return result

    return wrapper  # type: ignore[return-value]
