"""Test-only async views for tests/test_aio_asgi.py, served by uvicorn (routed under
``asgi/`` in tests/urls.py).

- ``asgi/orders/<id>/wait/``: ``@locked("asgi:{order_id}")`` waiting long (the lock's
  release, not its timeout, ends the wait); answers the worker's pid.
- ``asgi/orders/<id>/quick/``: the same lock with a short timeout (423 when held).
- ``asgi/debug/``: what this worker process is doing right now: its pid, every
  thread with what its Python stack is in ("loop": the one running this view,
  "mine": this request's executor), the coroutines waiting in this event
  loop's wake-up listeners, and asgiref's per-request executors.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from asgiref.sync import SyncToAsync
from django.http import JsonResponse
from django.urls import path

from stock_locks import locked

# Long enough that only the test's release ends a wait (the test's HTTP timeout is shorter).
WAIT_TIMEOUT = 300  # seconds
QUICK_TIMEOUT = 0.5  # seconds


@locked("asgi:{order_id}", timeout=WAIT_TIMEOUT)
async def wait_order(request, order_id):
    return JsonResponse({"order": order_id, "pid": os.getpid()})


@locked("asgi:{order_id}", timeout=QUICK_TIMEOUT)
async def quick_order(request, order_id):
    return JsonResponse({"order": order_id, "pid": os.getpid()})


def _state(frame) -> tuple[str, list[str]]:
    """What a thread's stack is in: "redis" (any frame of redis-py or stock_locks: a
    Redis call or a lock wait), "idle" (a thread pool's worker waiting for work),
    "uvicorn" (uvicorn's own), or "running"; with its frames, innermost last."""
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    frames.reverse()
    sep = os.sep
    if any(line.endswith(" _flush_forever") for line in frames):
        return "library", frames  # the metrics flusher (a daemon, once a second; no request)
    if any(f"{sep}redis{sep}" in line or f"{sep}stock_locks{sep}" in line for line in frames):
        return "redis", frames
    innermost = frames[-1] if frames else ""
    if f"concurrent{sep}futures{sep}thread.py" in innermost and innermost.endswith(" _worker"):
        return "idle", frames
    if any(f"{sep}uvicorn{sep}" in line for line in frames):
        return "uvicorn", frames  # (0.54's supervisor: a ping-answering thread per worker)
    return "running", frames


def _waiters() -> int:
    from stock_locks import loops

    found = loops._by_loop.get(asyncio.get_running_loop())
    if found is None:
        return 0
    return sum(
        len(listener)
        for transport in found.transports.values()
        for listener in getattr(transport, "listeners", {}).values()
    )


async def debug(request):
    frames = sys._current_frames()
    here = threading.get_ident()
    # This request's own executor (it ran the sync middlewares, and may still be unwinding).
    context = SyncToAsync.thread_sensitive_context.get(None)
    executor = SyncToAsync.context_to_thread_executor.get(context)
    mine = {thread.ident for thread in getattr(executor, "_threads", ())}
    threads = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        if thread.ident == here:
            state, stack = "loop", []
        elif thread.ident in mine:
            state, stack = "mine", []
        else:
            state, stack = _state(frame)
        threads.append({"name": thread.name, "state": state, "stack": stack})
    return JsonResponse(
        {
            "pid": os.getpid(),
            "active_count": threading.active_count(),
            "threads": threads,
            "waiters": _waiters(),
            # one single-thread executor per request in flight (Django's ThreadSensitiveContext)
            "request_executors": len(SyncToAsync.context_to_thread_executor),
        }
    )


urlpatterns = [
    path("orders/<int:order_id>/wait/", wait_order),
    path("orders/<int:order_id>/quick/", quick_order),
    path("debug/", debug),
]
