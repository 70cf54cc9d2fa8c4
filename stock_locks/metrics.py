"""What stock_locks counts, and where it goes.

Recorded at the points where things are decided, never around call sites:
the lease driver's acquire (every lock and semaphore, every backend, sync and
async), the places a lease is found lost, the fence checks, a strategy's
reserve, the delay queue's claim and dead-lettering, and the reservation
expiry. Each figure goes to three places:

* this process's own tally (:func:`snapshot`, and the text served by
  :func:`exposition` when prometheus-client is not installed);
* prometheus-client's metrics when it is installed (the ``[prometheus]``
  extra), multiprocess-safe when ``PROMETHEUS_MULTIPROC_DIR`` is set (gunicorn,
  Celery prefork: see prometheus-client's multiprocess mode);
* the per-second timeline in Redis that the dashboard charts
  (:mod:`stock_locks.dashboard.timeline` reads it), flushed by one daemon thread
  per process about once a second (:func:`flush`), so that the figures of every
  process add up on one clock.

Metric names (Prometheus): ``stock_locks_lock_acquisitions_total{primitive,
backend,outcome}`` (outcome ``granted``, ``timeout``, ``error``),
``stock_locks_lock_wait_seconds{primitive,backend}`` (histogram),
``stock_locks_leases_lost_total{primitive,backend}``,
``stock_locks_stale_fences_total``, ``stock_locks_reservations_total{strategy}``,
``stock_locks_refusals_total{strategy}``, ``stock_locks_errors_total{type}``
(``unavailable``: Redis did not answer a reserve; ``database``, ``deadlock``: the
database refused one; ``stale_fence``), ``stock_locks_reserve_retries_total
{strategy}``, ``stock_locks_expiries_total``, ``stock_locks_dead_letters_total
{queue}``, ``stock_locks_delay_lag_seconds{queue}`` (histogram: how late a
claimed batch's earliest item was).

Every process that records, serves requests (``request_started``), runs Celery
tasks or beat (their ``*_init`` signals) also writes a heartbeat beside the
timeline at each flush: ``role|host|pid`` -> when (Redis clock), roles ``web``,
``worker``, ``beat``, and ``drainer`` after each delay-queue drain
(:func:`announce`, :func:`seen`, :func:`connect_roles`).

Signals (:mod:`stock_locks.signals`) ``lock_lost`` and ``stock_refused`` are
sent from here too. ``STOCK_LOCKS["METRICS"] = False`` turns recording off.
"""

from __future__ import annotations

import bisect
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.signals import request_started

from . import scripts
from .backends.redis.client import get_redis
from .conf import settings
from .keys import timeline_key
from .signals import lock_lost, stock_refused

log = logging.getLogger("stock_locks.metrics")

# Upper bounds of the wait and lag histograms, milliseconds (then +Inf).
BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
FLUSH_EVERY = 1.0  # seconds between flushes of the timeline deltas
TIMELINE_KEEP = 900  # seconds a second's bucket of the timeline stays in Redis
COARSE_KEEP = 3900  # seconds a ten-second bucket stays (an hour of history, and some)
# The timeline's fields besides the histograms ("<name>_ms|<upper bound or inf>").
RESERVATIONS = "reservations:"  # + strategy name: count per second
UNITS = "units"  # units reserved, every strategy: count per second
REFUSALS = "refusals:"  # + strategy name: count per second
DEAD_LETTERS = "dead_letters"  # count per second
ERRORS = "errors:"  # + type (unavailable, database, deadlock, stale_fence): count per second
ERROR_TYPES = ("unavailable", "database", "deadlock", "stale_fence", "cap")
CAPPED = "capped:"  # + SKU: reserves refused by a purchase cap, count per second
ROLES = ("web", "worker", "beat", "drainer")

_COUNTERS = {
    "lock_acquisitions": ("primitive", "backend", "outcome"),
    "leases_lost": ("primitive", "backend"),
    "stale_fences": (),
    "reservations": ("strategy",),
    "refusals": ("strategy",),
    "errors": ("type",),
    "reserve_retries": ("strategy",),
    "expiries": (),
    "dead_letters": ("queue",),
}
_HISTOGRAMS = {"lock_wait": ("primitive", "backend"), "delay_lag": ("queue",)}
_HELP = {
    "lock_acquisitions": "Lock and semaphore acquires by outcome (granted, timeout, error).",
    "leases_lost": "Leases found lost by their holder (expired or taken over).",
    "stale_fences": "Writes refused because their fencing token was stale.",
    "reservations": "Reservations made (repeats of an existing order ref not counted).",
    "refusals": "Reservations refused for lack of stock.",
    "errors": "Reserves that failed (unavailable, database, deadlock) and stale fences.",
    "reserve_retries": "Optimistic retries of reservations.",
    "expiries": "Unpaid reservations released because they were due.",
    "dead_letters": "Delay-queue items moved to the dead-letter set.",
    "lock_wait": "Time from the start of an acquire to its outcome.",
    "delay_lag": "How late the earliest item of a claimed delay-queue batch was.",
}

_lock = threading.Lock()
_counts: dict[tuple, float] = {}  # (name, *labels) -> count
_hist: dict[tuple, list[float]] = {}  # (name, *labels) -> bucket counts..., +Inf, sum (ms)
_pending: Counter[str] = Counter()  # timeline field -> delta since the last flush
_roles: set[str] = set()  # what this process is, written at every flush
_seen: set[str] = set()  # what it did since the last flush (a drain), written once
_flusher_pid = 0
_prom: dict[str, Any] | None = None
_prom_children: dict[tuple, Any] = {}
_prom_lock = threading.Lock()


def _enabled() -> bool:
    return bool(settings.METRICS)


def _count(name: str, labels: tuple, amount: float = 1, field: str | None = None) -> None:
    with _lock:
        key = (name, *labels)
        _counts[key] = _counts.get(key, 0) + amount
        if field is not None:
            _pending[field] += int(amount)
    _ensure_flusher()
    child = _prometheus(name, labels)
    if child is not None:
        child.inc(amount)


def _observe(name: str, labels: tuple, ms: float, field: str) -> None:
    index = bisect.bisect_left(BUCKETS_MS, ms)
    bucket = str(BUCKETS_MS[index]) if index < len(BUCKETS_MS) else "inf"
    with _lock:
        row = _hist.get((name, *labels))
        if row is None:
            row = _hist[(name, *labels)] = [0.0] * (len(BUCKETS_MS) + 2)
        row[index] += 1
        row[-1] += ms
        _pending[f"{field}|{bucket}"] += 1
    _ensure_flusher()
    child = _prometheus(name, labels)
    if child is not None:
        child.observe(ms / 1000)


# -- what the library records ---------------------------------------------------------


# The timeline's lock-wait fields, by histogram bucket index.
_WAIT_FIELDS = tuple(f"lock_wait_ms|{bound}" for bound in (*BUCKETS_MS, "inf"))
# lock_acquired's keys and prometheus-client children by (primitive, backend, outcome):
# every acquire records here, so what _count and _observe look up each time is kept.
_acquired: dict[tuple[str, str, str], tuple[tuple, tuple, Any, Any]] = {}


def lock_acquired(primitive: str, backend: str, outcome: str, seconds: float) -> None:
    """An acquire ended: ``outcome`` granted, timeout or error, after ``seconds``.

    (What ``_count`` then ``_observe`` do, in one pass under the lock.)"""
    if not settings.METRICS:
        return
    entry = _acquired.get((primitive, backend, outcome))
    if entry is None:
        labels = (primitive, backend)
        entry = _acquired[(primitive, backend, outcome)] = (
            ("lock_acquisitions", *labels, outcome),
            ("lock_wait", *labels),
            _prometheus("lock_acquisitions", (*labels, outcome)),
            _prometheus("lock_wait", labels),
        )
    counted, observed, counter, histogram = entry
    ms = seconds * 1000
    index = bisect.bisect_left(BUCKETS_MS, ms)
    if _flusher_pid != os.getpid():
        _ensure_flusher()  # (first: in a forked child it drops the parent's deltas)
    with _lock:
        _counts[counted] = _counts.get(counted, 0) + 1
        row = _hist.get(observed)
        if row is None:
            row = _hist[observed] = [0.0] * (len(BUCKETS_MS) + 2)
        row[index] += 1
        row[-1] += ms
        _pending[_WAIT_FIELDS[index]] += 1
    if counter is not None:
        counter.inc()
        histogram.observe(seconds)


def lease_lost(primitive: str, backend: str, name: str) -> None:
    """A holder found its lease gone; sends ``lock_lost``."""
    if _enabled():
        _count("leases_lost", (primitive, backend))
    lock_lost.send(sender=None, primitive=primitive, backend=backend, name=name)


def stale_fence() -> None:
    if _enabled():
        _count("stale_fences", ())
        _count("errors", ("stale_fence",), field=ERRORS + "stale_fence")


def capped(sku: str) -> None:
    """A reserve was refused by a purchase cap (first capped SKU of the cart)."""
    if _enabled():
        _count("errors", ("cap",), field=ERRORS + "cap")
        with _lock:
            _pending[CAPPED + sku] += 1


def failed(kind: str) -> None:
    """A reserve failed: ``kind`` is ``unavailable`` (Redis did not answer),
    ``deadlock`` or ``database`` (the database refused it)."""
    if _enabled():
        _count("errors", (kind,), field=ERRORS + kind)


def reserved(strategy: str, created: bool, retries: int, units: int = 0) -> None:
    """A reserve succeeded (``created``: it made the reservation, of ``units`` units)."""
    if not _enabled():
        return
    if created:
        _count("reservations", (strategy,), field=RESERVATIONS + strategy)
        if units:
            with _lock:
                _pending[UNITS] += units
    if retries:
        _count("reserve_retries", (strategy,), retries)


def refused(strategy: str, order_ref: str, sku: str, requested: int, available: int) -> None:
    """A reserve was refused for lack of stock; sends ``stock_refused``."""
    if _enabled():
        _count("refusals", (strategy,), field=REFUSALS + strategy)
    if stock_refused.receivers:
        stock_refused.send(
            sender=None, strategy=strategy, order_ref=order_ref, sku=sku,
            requested=requested, available=available,
        )  # fmt: skip


def expired() -> None:
    if _enabled():
        _count("expiries", ())


def dead_lettered(queue: str) -> None:
    if _enabled():
        _count("dead_letters", (queue,), field=DEAD_LETTERS)


def delay_claimed(queue: str, lag_ms: float) -> None:
    """A batch was claimed; its earliest item was due ``lag_ms`` before (Redis clock)."""
    if _enabled():
        _observe("delay_lag", (queue,), max(0.0, lag_ms), "delay_lag_ms")


# -- reading ------------------------------------------------------------------------


def snapshot() -> dict[str, Any]:
    """This process's figures: ``{"counters": {name: {labels: n}}, "histograms": ...}``
    (labels joined by ``,``; histograms as count, sum in ms and bucket counts)."""
    with _lock:
        counters: dict[str, dict[str, float]] = {}
        for (name, *labels), value in _counts.items():
            counters.setdefault(name, {})[",".join(labels)] = value
        histograms: dict[str, dict[str, Any]] = {}
        for (name, *labels), row in _hist.items():
            histograms.setdefault(name, {})[",".join(labels)] = {
                "count": sum(row[:-1]),
                "sum_ms": row[-1],
                "buckets": dict(zip([*map(str, BUCKETS_MS), "inf"], row[:-1], strict=True)),
            }
    return {"counters": counters, "histograms": histograms}


def exposition() -> tuple[bytes, str]:
    """(body, content type) for a Prometheus scrape: prometheus-client's registry
    (every process's figures under ``PROMETHEUS_MULTIPROC_DIR``) when installed, else
    this process's tally in the text format."""
    try:
        import prometheus_client  # (the optional [prometheus] extra)
    except ImportError:
        return _own_exposition().encode(), "text/plain; version=0.0.4; charset=utf-8"
    _prometheus_metrics()
    registry = prometheus_client.REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess  # (the optional [prometheus] extra)

        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    return prometheus_client.generate_latest(registry), prometheus_client.CONTENT_TYPE_LATEST


def _own_exposition() -> str:
    lines = []
    with _lock:
        counts, hist = dict(_counts), {k: list(v) for k, v in _hist.items()}
    for name, labelnames in _COUNTERS.items():
        lines += [f"# HELP stock_locks_{name}_total {_HELP[name]}",
                  f"# TYPE stock_locks_{name}_total counter"]  # fmt: skip
        for (metric, *labels), value in sorted(counts.items()):
            if metric == name:
                lines.append(f"stock_locks_{name}_total{_labels(labelnames, labels)} {value:g}")
    for name, labelnames in _HISTOGRAMS.items():
        lines += [f"# HELP stock_locks_{name}_seconds {_HELP[name]}",
                  f"# TYPE stock_locks_{name}_seconds histogram"]  # fmt: skip
        for (metric, *labels), row in sorted(hist.items()):
            if metric != name:
                continue
            running = 0.0
            for bound, count in zip([*BUCKETS_MS, None], row[:-1], strict=True):
                running += count
                le = "+Inf" if bound is None else f"{bound / 1000:g}"
                extra = _labels((*labelnames, "le"), (*labels, le))
                lines.append(f"stock_locks_{name}_seconds_bucket{extra} {running:g}")
            plain = _labels(labelnames, labels)
            lines.append(f"stock_locks_{name}_seconds_count{plain} {running:g}")
            lines.append(f"stock_locks_{name}_seconds_sum{plain} {row[-1] / 1000:g}")
    return "\n".join(lines) + "\n"


def _labels(names: Iterable[str], values: Iterable[str]) -> str:
    pairs = [
        f'{n}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for n, v in zip(names, values, strict=True)
    ]
    return "{" + ",".join(pairs) + "}" if pairs else ""


# -- prometheus-client ------------------------------------------------------------


def prepare() -> None:
    """Make this process's prometheus-client metrics now (importing it), so that the
    first event recorded does not pay for it. Optional: they are made on first use."""
    _prometheus_metrics()


def _prometheus_metrics() -> dict[str, Any] | None:
    """prometheus-client's metrics, made once per process (None: not installed)."""
    global _prom
    if _prom is not None:
        return _prom or None
    with _prom_lock:  # (two threads registering the same names: DuplicateTimeseries)
        return _make_prometheus_metrics()


def _make_prometheus_metrics() -> dict[str, Any] | None:
    global _prom
    if _prom is None:
        try:
            import prometheus_client as prom  # (the optional [prometheus] extra)
        except ImportError:
            _prom = {}
            return None
        made: dict[str, Any] = {}
        try:
            for name, labelnames in _COUNTERS.items():
                made[name] = prom.Counter(f"stock_locks_{name}", _HELP[name], labelnames)
            buckets = [ms / 1000 for ms in BUCKETS_MS]
            for name, labelnames in _HISTOGRAMS.items():
                made[name] = prom.Histogram(
                    f"stock_locks_{name}_seconds", _HELP[name], labelnames, buckets=buckets
                )
        except ValueError as exc:  # the names are taken in this registry (a reload?)
            log.warning("stock_locks metrics not exported to prometheus-client: %s", exc)
            made = {}
        _prom = made
    return _prom or None


def _prometheus(name: str, labels: tuple) -> Any:
    key = (name, *labels)
    child = _prom_children.get(key)
    if child is None:
        metrics = _prometheus_metrics()
        if metrics is None:
            return None
        metric = metrics[name]
        child = metric.labels(*labels) if labels else metric
        _prom_children[key] = child
    return child


# -- heartbeats -----------------------------------------------------------------------


def announce(role: str) -> None:
    """This process is a ``role`` (``web``, ``worker``, ``beat``) from now on: its
    heartbeat is written at every flush, about once a second."""
    if role not in _roles and _enabled():
        with _lock:
            _roles.add(role)
        _ensure_flusher()


def seen(role: str) -> None:
    """This process just did the work of ``role`` (``drainer``: a delay-queue drain):
    written once, at the next flush."""
    if _enabled():
        with _lock:
            _seen.add(role)
        _ensure_flusher()


def connect_roles() -> None:
    """Announce the roles from Django's and Celery's signals: ``web`` at a request's
    start, ``worker`` in a Celery worker (and each of its pool processes), ``beat`` in
    Celery beat. Called once by the app config."""
    from celery import signals as celery  # (Celery's signals import its app machinery)

    def role(name: str) -> Any:
        def receiver(**_kwargs: Any) -> None:
            announce(name)

        return receiver

    for signal, name in [
        (request_started, "web"),
        (celery.worker_init, "worker"),
        (celery.worker_ready, "worker"),
        (celery.worker_process_init, "worker"),
        (celery.beat_init, "beat"),
    ]:
        signal.connect(role(name), weak=False, dispatch_uid=f"stock_locks.metrics.{name}")


def _heartbeat_fields() -> list[str]:
    with _lock:
        roles = _roles | _seen
        _seen.clear()
    where = f"{socket.gethostname()}|{os.getpid()}"
    return [f"{name}|{where}" for name in sorted(roles)]


# -- the timeline flusher ------------------------------------------------------------


def _ensure_flusher() -> None:
    global _flusher_pid
    if _flusher_pid == os.getpid():
        return
    with _lock:
        if _flusher_pid == os.getpid():
            return
        if _flusher_pid:  # a forked child: the parent's deltas are the parent's
            _pending.clear()
            _seen.clear()
        _flusher_pid = os.getpid()
    threading.Thread(target=_flush_forever, name="stock_locks-metrics", daemon=True).start()


def _flush_forever() -> None:
    pid = os.getpid()
    stop = threading.Event()
    while _flusher_pid == pid:
        stop.wait(FLUSH_EVERY)
        flush()


def flush(client: Any = None) -> bool:
    """Add this process's figures since the last flush to the timeline in Redis now,
    with its heartbeat. True when there was nothing to write or it was written; False
    when Redis could not be reached (the figures are kept for the next flush)."""
    with _lock:
        deltas = dict(_pending)
        _pending.clear()
    beats = _heartbeat_fields()
    if not deltas and not beats:
        return True
    try:
        add_to_timeline(deltas, client, beats)
        return True
    except Exception as exc:  # noqa: BLE001 (metrics never break the caller; kept for later)
        log.debug("metrics not flushed to Redis (%s); kept for the next flush", exc)
        with _lock:
            _pending.update(deltas)
        return False


def add_to_timeline(deltas: dict[str, int], client: Any = None, beats: Sequence[str] = ()) -> int:
    """Add ``deltas`` (field -> amount) to the timeline's buckets of the Redis server's
    current second (and ten seconds), and set the heartbeat ``beats`` (fields
    ``role|host|pid``) to now; that second. Raises redis-py's errors (the caller
    keeps the deltas)."""
    argv: list[Any] = [TIMELINE_KEEP, COARSE_KEEP, len(beats), *beats]
    for name, amount in deltas.items():
        argv += [name, amount]
    # EVAL, not EVALSHA: once a second per process the source costs nothing, and the
    # flush then stays out of the EVALSHA figures of the hot path (commandstats).
    client = client or get_redis()
    return int(client.eval(scripts.METRICS_FLUSH.script, 1, timeline_key(), *argv))


def reset() -> None:
    """Forget this process's figures, unflushed deltas and roles (tests)."""
    with _lock:
        _counts.clear()
        _hist.clear()
        _pending.clear()
        _roles.clear()
        _seen.clear()
