"""Running a callable while holding a lock or a semaphore: the machinery behind
``stock_locks.locked``, ``lock_model`` and ``limit_concurrency``.

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
the backend (Redis) is unreachable; anything else raises :class:`LockTimeout` or
:class:`~stock_locks.exceptions.BackendUnavailable` (``RedisUnavailable`` for Redis).
Put these decorators below Celery's ``@app.task``.

On an ``async def`` function or view they use the asyncio primitives: a waiting
call awaits a wake-up and parks no thread (a reentrant lock's owner is then the
calling task). :class:`Decorators` is given both sets of primitives
(:class:`Primitives`): ``stock_locks.decorators`` and ``stock_locks.aio`` each
make theirs from the same classes, so neither imports the other.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import string
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.http import HttpRequest, HttpResponse, JsonResponse

from . import _validate
from .backends.base import Backend
from .conf import settings
from .exceptions import BackendUnavailable, LockError, LockTimeout, StaleFencingToken

if TYPE_CHECKING:
    from django.db.models import Model

F = TypeVar("F", bound=Callable[..., Any])
LockedResponse = Callable[[HttpRequest, str], HttpResponse]

_release_logs = {
    "lock": logging.getLogger("stock_locks.lock.release"),
    "semaphore": logging.getLogger("stock_locks.semaphore.release"),
}


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


def stale_fence_response(
    request: HttpRequest, name: str, exc: StaleFencingToken, *, kind: str = "lock"
) -> HttpResponse:
    """The answer of a view whose fenced write was refused: a newer holder wrote first."""
    return JsonResponse(
        {
            "error": "stale_fence",
            kind: name,
            "fence": exc.fence,
            "current": exc.current,
            "message": (
                f"a newer holder of {name} has written since this request took it; "
                "nothing was written by this request, try again"
            ),
        },
        status=409,
    )


@dataclass(frozen=True)
class Primitives:
    """The classes a decorator makes: a lock, a semaphore, a fair semaphore."""

    lock: type[Any]
    semaphore: type[Any]
    fair_semaphore: type[Any]


class Decorators:
    """``locked``, ``lock_model`` and ``limit_concurrency`` over ``sync`` primitives for
    plain callables and ``asyncio`` ones for ``async def`` callables."""

    def __init__(self, sync: Primitives, asyncio: Primitives) -> None:
        self.sync = sync
        self.asyncio = asyncio

    def primitives_for(self, func: Callable[..., Any]) -> Primitives:
        return self.asyncio if inspect.iscoroutinefunction(func) else self.sync

    def locked(
        self,
        key: str,
        ttl: float | None = None,
        timeout: float | None = None,
        *,
        blocking: bool = True,
        reentrant: bool = False,
        watchdog: bool = False,
        max_hold: float | None = None,
        backend: Backend | str | None = None,
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
            blocking, reentrant, watchdog, max_hold: as for :class:`stock_locks.Lock`
                (``max_hold`` without ``watchdog=True`` raises :class:`LockError`
                at decoration time). A call still running when ``max_hold`` ends
                loses the lock; its release then logs a WARNING and its result or
                exception stands.
            backend: the backend alias (or object) the lock lives on (default
                ``"default"``), as for :class:`stock_locks.Lock`.
            response: for views, ``response(request, lock_name)`` builds the answer
                when the lock is not granted (default: 423 JSON).
        """
        fields = _template_fields(key, "lock key")
        _check_max_hold(max_hold, watchdog, key)

        def decorate(func: F) -> F:
            signature = _check_names(func, fields, f"lock key {key!r}")
            build = _formatter(key, "lock key")
            return self._wrap(
                func, signature, build, ttl, timeout, blocking, reentrant, watchdog, max_hold,
                backend, response,
            )  # fmt: skip

        return decorate

    def lock_model(
        self,
        model: type[Model],
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
        _check_max_hold(options.get("max_hold"), options.get("watchdog", False), label)

        def decorate(func: F) -> F:
            signature = _check_names(
                func, {kwarg}, f"lock_model({model.__name__}, kwarg={kwarg!r})"
            )

            def build(arguments: Mapping[str, Any]) -> str:
                if kwarg not in arguments:
                    raise LockError(f"lock_model: the call passed no {kwarg!r} argument")
                value = arguments[kwarg]
                return f"{label}:{getattr(value, 'pk', value)}"

            return self._wrap(func, signature, build, ttl, timeout, **options)

        return decorate

    def limit_concurrency(
        self,
        name: str,
        limit: int,
        ttl: float | None = None,
        timeout: float | None = None,
        *,
        fair: bool = False,
        backend: Backend | str | None = None,
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
            backend: the backend alias (or object) of the semaphore (default
                ``"default"``).
            response: for views, ``response(request, name, limit)`` builds the
                answer when no permit is granted (default: JSON with status
                ``STOCK_LOCKS["SEMAPHORE_TIMEOUT_STATUS"]``, 429, and Retry-After).

        Views answer that response, or 503 when Redis is down; anything else
        raises :class:`LockTimeout` or :class:`BackendUnavailable`.
        """
        fields = _template_fields(name, "semaphore name")
        _validate.limit(limit, name)
        if ttl is not None:
            _validate.lease_ms(ttl, "ttl", name)
        _validate.wait_seconds(timeout, "timeout", name)
        on_busy = response or too_many_response

        def decorate(func: F) -> F:
            signature = _check_names(func, fields, f"semaphore name {name!r}")
            build = _formatter(name, "semaphore name")
            caller = _caller(func)
            kit = self.primitives_for(func)
            kind = kit.fair_semaphore if fair else kit.semaphore

            def make(args: tuple, kwargs: dict) -> Any:
                wait = settings.SEMAPHORE_TIMEOUT if timeout is None else timeout
                return kind(
                    build(_arguments(signature, args, kwargs)), limit, ttl, timeout=wait,
                    backend=backend, caller=caller,
                )  # fmt: skip

            return _guard(
                func,
                make,
                lambda request, semaphore: on_busy(request, semaphore.name, semaphore.limit),
                "semaphore",
            )

        return decorate

    def _wrap(
        self,
        func: F,
        signature: inspect.Signature,
        build: Callable[[Mapping[str, Any]], str],
        ttl: float | None,
        timeout: float | None,
        blocking: bool = True,
        reentrant: bool = False,
        watchdog: bool = False,
        max_hold: float | None = None,
        backend: Backend | str | None = None,
        response: LockedResponse | None = None,
    ) -> F:
        caller = _caller(func)
        on_busy = response or locked_response
        kind = self.primitives_for(func).lock  # (asyncio's: a reentrant one's owner is the task)

        def make_lock(args: tuple, kwargs: dict) -> Any:
            name = build(_arguments(signature, args, kwargs))
            wait = settings.DECORATOR_TIMEOUT if timeout is None else timeout
            return kind(
                name, ttl, timeout=wait, blocking=blocking, reentrant=reentrant,
                watchdog=watchdog, max_hold=max_hold, backend=backend, caller=caller,
            )  # fmt: skip

        return _guard(func, make_lock, lambda request, lock: on_busy(request, lock.name), "lock")


def _check_max_hold(max_hold: object, watchdog: object, name: str) -> None:
    if max_hold is None:
        return
    if watchdog is not True:
        raise LockError(f"{name!r}: max_hold caps the watchdog's renewals; it needs watchdog=True")
    if not (isinstance(max_hold, float) and max_hold == math.inf):
        _validate.lease_ms(max_hold, "max_hold", name)


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


def _signature(func: Callable) -> inspect.Signature:
    """The signature the decorated callable is called with.

    ``method_decorator`` hands the decorator a ``functools.partial`` of the
    method bound to the view, with ``__wrapped__`` pointing at the plain
    function: following that would put ``self`` back in first place and bind
    the request to it, so a partial's own signature is used.
    """
    if isinstance(func, functools.partial):
        return inspect.signature(func, follow_wrapped=False)
    return inspect.signature(func)


def _check_names(func: Callable, fields: set[str], what: str) -> inspect.Signature:
    signature = _signature(func)
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
            raise exc
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

    log = _release_logs[kind]

    def release_failed(guard: Any, outcome: str, exc: Exception) -> None:
        log.warning(
            "%s %r: release failed after %s %s (%s: %s); the %s stands",
            kind, guard.name, caller, outcome, type(exc).__name__, exc,
            "result" if outcome == "returned" else "exception",
        )  # fmt: skip

    def stale(guard: Any, request: HttpRequest | None, exc: StaleFencingToken) -> Any:
        if request is None:
            raise exc
        return stale_fence_response(request, guard.name, exc, kind=kind)

    if inspect.iscoroutinefunction(func):
        # (make() gives the stock_locks.aio twin: waiting parks no thread)

        async def async_finish(guard: Any, exc_info: tuple) -> None:
            outcome = "returned" if exc_info[0] is None else "raised"
            try:
                await guard.__aexit__(*exc_info)
            except Exception as exc:
                release_failed(guard, outcome, exc)

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            guard = make(args, kwargs)
            try:
                granted = await guard.acquire()
            except BackendUnavailable as exc:
                return refused(guard, _find_request(args), exc)
            if not granted:
                return refused(guard, _find_request(args), None)
            try:
                result = await func(*args, **kwargs)
            except StaleFencingToken as exc:
                await async_finish(guard, sys.exc_info())
                return stale(guard, _find_request(args), exc)
            except BaseException:
                await async_finish(guard, sys.exc_info())
                raise
            await async_finish(guard, (None, None, None))
            return result

        return async_wrapper  # type: ignore[return-value]

    def finish(guard: Any, exc_info: tuple) -> None:
        outcome = "returned" if exc_info[0] is None else "raised"
        try:
            guard.__exit__(*exc_info)
        except Exception as exc:
            release_failed(guard, outcome, exc)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        guard = make(args, kwargs)
        try:
            granted = guard.acquire()
        except BackendUnavailable as exc:
            return refused(guard, _find_request(args), exc)
        if not granted:
            return refused(guard, _find_request(args), None)
        try:
            result = func(*args, **kwargs)
        except StaleFencingToken as exc:
            finish(guard, sys.exc_info())
            return stale(guard, _find_request(args), exc)
        except BaseException:
            finish(guard, sys.exc_info())
            raise
        finish(guard, (None, None, None))
        return result

    return wrapper  # type: ignore[return-value]
