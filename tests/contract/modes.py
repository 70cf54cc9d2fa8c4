"""The contract suite's two execution modes, behind the sync API the test bodies use.

``Lock``, ``Semaphore``, ``FairSemaphore``, ``locked`` and
``limit_concurrency`` here are the sync primitives in the ``sync`` mode, and
their ``stock_locks.aio`` twins in the ``async`` mode (``STOCK_LOCKS_CONTRACT_MODE``
in the environment, so that spawned processes follow it too), driven through
:class:`Awaited` so that one test body serves both.

In the async mode every call runs on one event loop in a daemon thread of its
own, inside an *actor task* per calling thread: a test thread is to the async
primitive what a task is, so reentrancy (owner = task) and "another thread is
another owner" keep their meaning.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import stock_locks
from stock_locks import aio
from stock_locks.holder import caller_of

MODE_ENV = "STOCK_LOCKS_CONTRACT_MODE"
MODES = ("sync", "async")


def mode() -> str:
    return os.environ.get(MODE_ENV, "sync")


class LoopThread:
    """An event loop running in a daemon thread, with one actor task per caller thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._actors: weakref.WeakKeyDictionary[threading.Thread, tuple[asyncio.Queue, Any]] = (
            weakref.WeakKeyDictionary()
        )
        threading.Thread(target=self.loop.run_forever, name="contract-loop", daemon=True).start()

    def submit(self, coroutine: Any) -> Any:
        """Run ``coroutine`` in a task of its own on the loop; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def call(self, function: Callable[[], Any]) -> Any:
        """``function()`` (awaited when it returns an awaitable) in the calling thread's
        actor task; its result, or what it raised."""
        queue, _ = self._actor()
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(queue.put_nowait, (function, done))
        return done.result()

    def actor_task(self, thread: threading.Thread) -> asyncio.Task | None:
        found = self._actors.get(thread)
        return None if found is None else found[1]

    def _actor(self) -> tuple[asyncio.Queue, Any]:
        thread = threading.current_thread()
        found = self._actors.get(thread)
        if found is None:
            found = self._actors[thread] = self.submit(self._start_actor(thread.name))
        return found

    async def _start_actor(self, name: str) -> tuple[asyncio.Queue, asyncio.Task]:
        # (named after its thread: the holder's "thread" an async holder records)
        queue: asyncio.Queue = asyncio.Queue()
        return queue, asyncio.get_running_loop().create_task(self._act(queue), name=name)

    @staticmethod
    async def _act(queue: asyncio.Queue) -> None:
        while True:
            function, done = await queue.get()
            try:
                result = function()
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as exc:  # handed to the calling thread
                done.set_exception(exc)
            else:
                done.set_result(result)


_loop_thread: LoopThread | None = None
_guard = threading.Lock()


def loop_thread() -> LoopThread:
    global _loop_thread
    with _guard:
        if _loop_thread is None:
            _loop_thread = LoopThread()
        return _loop_thread


def close_async_resources() -> None:
    """Close what stock_locks.aio opened in the loop (the next test opens afresh)."""
    if _loop_thread is not None:
        _loop_thread.submit(aio.aclose())


class Awaited:
    """A ``stock_locks.aio`` primitive used through the sync API: each coroutine
    method is awaited, and each attribute read, in the calling thread's actor task."""

    def __init__(self, runner: LoopThread, target: Any) -> None:
        object.__setattr__(self, "_runner", runner)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        value = self._runner.call(lambda: getattr(self._target, name))
        if inspect.ismethod(value):
            return lambda *args, **kwargs: self._runner.call(lambda: value(*args, **kwargs))
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._runner.call(lambda: setattr(self._target, name, value))

    def __repr__(self) -> str:
        return f"<Awaited {self._target!r}>"

    def __enter__(self) -> Awaited:
        self._runner.call(self._target.__aenter__)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._runner.call(lambda: self._target.__aexit__(*exc_info))


def _primitive(name: str) -> Callable[..., Any]:
    def make(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("caller", caller_of(sys._getframe(1)))  # (the test, not this module)
        if mode() == "sync":
            return getattr(stock_locks, name)(*args, **kwargs)
        runner = loop_thread()
        return Awaited(runner, runner.call(lambda: getattr(aio, name)(*args, **kwargs)))

    make.__name__ = name
    return make


Lock = _primitive("Lock")
Semaphore = _primitive("Semaphore")
FairSemaphore = _primitive("FairSemaphore")


def _decorator(name: str) -> Callable[..., Any]:
    def factory(*args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        decorate = getattr(stock_locks, name)(*args, **kwargs)
        if mode() == "sync":
            return decorate

        def on_async(func: Callable) -> Callable:
            # The body runs in a worker thread (it may use the primitives above, whose
            # calls go through the loop); the decorated coroutine in the actor task.
            @functools.wraps(func)
            async def body(*call_args: Any, **call_kwargs: Any) -> Any:
                return await asyncio.to_thread(func, *call_args, **call_kwargs)

            decorated = decorate(body)
            runner = loop_thread()
            return lambda *a, **k: runner.call(lambda: decorated(*a, **k))

        return on_async

    factory.__name__ = name
    return factory


locked = _decorator("locked")
limit_concurrency = _decorator("limit_concurrency")


def is_verb(verb: str | None, operation: str) -> bool:
    """Whether a call's ``verb`` is ``operation`` or a variant of it (``lock_wait_try``)."""
    return verb is not None and (verb == operation or verb.startswith(operation + "_"))


def waiting_in(thread: threading.Thread, operation: str) -> bool:
    """Async mode: whether ``thread``'s actor task awaits the backend's ``operation``
    (an ``aexecute`` of a call of that verb, down its chain of awaits)."""
    if _loop_thread is None:
        return False
    task = _loop_thread.actor_task(thread)
    if task is None:
        return False

    async def look() -> bool:
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None)
            if frame is None:
                return False
            if frame.f_code.co_name == "aexecute":
                call = frame.f_locals.get("pending")
                if is_verb(getattr(call, "verb", None), operation):
                    return True
            awaited = awaited.cr_await
        return False

    return _loop_thread.submit(look())
