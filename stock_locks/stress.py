"""The oversell stress test: many processes buy the same stock at once, then we count.

What it sells
    By default a run creates its own stock rows, one set per strategy, named
    ``<prefix>-<run>-<strategy>-<n>`` (``<run>`` a random token, so they are
    never rows of yours), each with ``stock`` units. They are created through
    the project's stock model, so each field the model requires without a
    default, other than the SKU, quantity and ``fence`` fields, needs a value:
    ``fields`` (``--field NAME=VALUE``; ``{sku}`` in a value becomes the row's
    SKU, which a unique field needs). Or it sells SKUs that already exist
    (``existing``, ``--sku``), with the stock they have, and gives it back
    afterwards: run that where nothing else sells them meanwhile (a staging
    copy), since their units are sold out to the buyers during the run.
    :func:`check` finds what is missing before anything is written and
    raises :class:`StressRefused` saying what to give.

How it buys
    ``processes`` forked workers share ``buyers`` attempts, each a random
    cart of ``cart_size`` SKUs of ``qty`` units, through the ORM
    (``strategy.reserve``) or over HTTP against a running shop that uses the
    same database and Redis (``POST`` the order API: 201/200 sold, 409
    refused). What was sold is read back from the database, not trusted from
    the workers: oversold (must be 0), final stock (must equal initial minus
    sold, never below 0), and Redis-vs-database drift.

What it leaves
    Nothing of its own. Once the figures are measured, whatever happened
    (success, an oversell, errors, an interrupt), :class:`StressRun` removes
    what the run made: every reservation of its order refs in any state
    (for existing SKUs released first, or given back when committed, by
    relative writes, so their stock and counters end as they were even if
    something else changed them meanwhile), the Redis records, index entries
    and delay-queue expiry items of those refs, and the stock rows it created
    with their counters. Receivers of :data:`stress_cleanup` remove their own
    records of the run's orders first (a shop sold to over HTTP keeps orders
    that refer to the rows). What the library keeps stays: lock keys (their
    fences expire after ``FENCE_RETENTION``), the ``loaded`` marker, counters
    of existing SKUs (equal to the database), and the raised ``fence`` of an
    existing row the ``lock`` strategy wrote (fences only rise).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing
import queue
import random
import re
import secrets
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import IntegrityError, connections, models, transaction
from django.db.models.fields import NOT_PROVIDED, AutoFieldMixin
from django.dispatch import Signal
from redis.exceptions import RedisError

from . import scripts
from .conf import settings
from .connection import decoded, get_redis
from .exceptions import OutOfStock, StockLocksError
from .keys import StockKeys
from .models import Reservation
from .stock import get_strategy, restock, stock_changed
from .stock.counters import RELEASED, RedisStockStrategy
from .stock.expiry import item_id
from .stock.reconcile import stock_report
from .stock.table import StockModel

PROGRESS_EVERY = 25  # attempts between a worker's progress updates
STOP_GRACE = 10  # seconds a stopped worker gets to finish its attempt, then it is terminated
TOKEN_BYTES = 3  # a run's token: 6 hex digits in its SKUs and order refs
PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,20}")  # order refs travel as Idempotency-Key headers
BATCH = 500  # Redis commands per pipeline

#: Sent once per strategy run after its figures were measured, before its data is
#: removed, with ``sender=StressRun`` and keyword arguments ``strategy`` (str),
#: ``order_refs`` (list of str: every reservation of the run, in any state),
#: ``skus`` (list of str: the SKUs it sold) and ``created`` (bool: whether those
#: rows are the run's own, deleted next). Connect a receiver that deletes your
#: own records of these orders, e.g. a shop's orders placed over HTTP, which
#: may also protect the rows from deletion. Receivers run even after an
#: interrupt; a receiver's error is reported as data left behind.
stress_cleanup = Signal()


class StressError(StockLocksError):
    """What a stress run cannot do; the message says what to change."""


class StressRefused(StressError):
    """Refused before the run wrote anything (a missing value, a bad option)."""


class StressAborted(StressError):
    """The run stopped early; its data was removed all the same."""


class _StrategyNotAccepted(Exception):
    """The shop refuses a strategy in the order body (a worker stops the run)."""


@dataclass
class StressConfig:
    stock: int = 100  # units per created SKU (existing SKUs keep their own)
    buyers: int = 1000
    processes: int = 8
    qty: int = 1
    cart_size: int = 1
    skus: int = 0  # SKUs created per strategy; 0: cart_size (one hot SKU for single-item carts)
    via: str = "orm"
    url: str = "http://127.0.0.1:8000/api/orders/"
    prefix: str = "STRESS"
    seed: int = 0
    existing: tuple[str, ...] = ()  # sell these SKUs (with their stock) instead of creating rows
    fields: dict[str, str] = field(default_factory=dict)  # created rows' other required fields

    @property
    def pool(self) -> int:
        return len(self.existing) if self.existing else max(self.skus, self.cart_size)


@dataclass
class StressResult:
    strategy: str
    attempts: int
    sold: int  # units, read back from the database
    refused: int
    errors: int
    oversold: int
    final_stock: int
    drift: int
    throughput_per_s: float
    p50_ms: float
    p99_ms: float
    retries: int
    orders: int = 0  # attempts that reserved
    initial_stock: int = 0
    conserved: bool = True
    seconds: float = 0.0
    error_samples: list[str] = field(default_factory=list)
    skus: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing oversold, lost or drifted, and every attempt answered (sold or refused)."""
        return (
            self.oversold == 0
            and self.drift == 0
            and self.conserved
            and self.final_stock >= 0
            and self.errors == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CleanupReport:
    """What :meth:`StressRun.clean_up` removed, and what it could not."""

    reservations: int = 0  # reservation rows deleted
    given_back: int = 0  # of which released or given back first (existing SKUs)
    rows: int = 0  # stock rows deleted
    redis: int = 0  # Redis keys and entries removed (records, index entries, counters)
    expiries: int = 0  # delay-queue expiry items removed
    stock: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # existing: before, now
    problems: list[str] = field(default_factory=list)  # what was left behind, and why
    notes: list[str] = field(default_factory=list)  # worth saying, nothing left behind

    def summary(self) -> str:
        parts = [
            f"{self.reservations} reservation(s)"
            + (f" ({self.given_back} given back first)" if self.given_back else ""),
            *([] if self.stock else [f"{self.rows} stock row(s)"]),  # existing SKUs: none made
            f"{self.redis} Redis key(s) and entries",
        ]
        if self.expiries:
            parts.append(f"{self.expiries} expiry item(s)")
        text = "removed " + ", ".join(parts)
        for sku, (before, now) in self.stock.items():
            text += f"; {sku}: {before} before, {now} now"
            if now != before:
                text += " (changed by something else during the run)"
        return "; ".join([text, *self.notes])


def new_token() -> str:
    """A run's random token, in its SKUs and order refs."""
    return secrets.token_hex(TOKEN_BYTES)


# -- what a run needs ---------------------------------------------------------------


def check(config: StressConfig, strategies: list[str], token: str) -> None:
    """Check, without writing anything, everything runs of ``strategies`` need.

    Raises :class:`StressRefused` with what is missing and how to give it:
    bad options, an unknown or unusable strategy, Redis unreachable, required
    fields of the stock model without a value, values the model rejects,
    existing SKUs that do not exist.
    """
    problems = option_problems(config)
    if problems:
        raise StressRefused("; ".join(problems))
    try:
        stock = StockModel()
    except ImproperlyConfigured as exc:
        raise StressRefused(str(exc)) from None
    chosen = []
    for name in strategies:
        try:
            chosen.append(get_strategy(name))
        except (ValueError, ImproperlyConfigured) as exc:
            raise StressRefused(f"strategy {name!r} cannot run here: {exc}") from None
    if config.via == "http" or any(s.uses_redis for s in chosen):
        try:
            get_redis().ping()
        except (RedisError, OSError) as exc:
            raise StressRefused(f"Redis is unreachable: {exc}") from None
    if config.existing:
        levels = stock.levels(list(config.existing))
        unknown = [sku for sku in config.existing if sku not in levels]
        if unknown:
            raise StressRefused(
                f"no {stock.model._meta.label} with {stock.sku} {', '.join(map(repr, unknown))}"
            )
        return
    for name in strategies:
        new_rows(stock, config, name, token)


def option_problems(config: StressConfig) -> list[str]:
    """What is wrong with the options, as the command's flags name them."""
    problems = []
    for name in ("stock", "buyers", "processes", "qty", "cart_size"):
        if getattr(config, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1")
    if config.skus and config.skus < config.cart_size:
        problems.append("--skus must be at least --cart-size")
    if config.via == "http":
        parts = urlsplit(config.url)
        if parts.scheme != "http" or not parts.hostname:
            problems.append(f"--url {config.url!r} must be an http:// URL of the order API")
    if not PREFIX.fullmatch(config.prefix):
        problems.append("--prefix must be 1-20 of A-Z a-z 0-9 _ . : -")
    if config.existing:
        if len(set(config.existing)) != len(config.existing):
            problems.append("--sku names a SKU twice")
        if len(config.existing) < config.cart_size:
            problems.append("--cart-size cannot exceed the number of --sku given")
        if config.skus:
            problems.append("--skus sets how many rows to create; with --sku none are")
        if config.fields:
            problems.append("--field sets fields of rows the run creates; with --sku none are")
    return problems


def required_fields(stock: StockModel) -> list[models.Field]:
    """Fields of the stock model a new row needs a value for that the run cannot make up:
    no default (Python or database), not null, not automatic, not a blank-able text,
    and not the SKU, quantity or fence field."""
    own = {stock.sku, stock.qty, "fence"}
    needed = []
    for f in stock.model._meta.concrete_fields:
        if (
            f.name in own
            or f.auto_created
            or isinstance(f, AutoFieldMixin)
            or getattr(f, "generated", False)
            or getattr(f, "auto_now", False)
            or getattr(f, "auto_now_add", False)
            or f.has_default()
            or getattr(f, "db_default", NOT_PROVIDED) is not NOT_PROVIDED
            or f.null
            or (f.blank and f.empty_strings_allowed)
        ):
            continue
        needed.append(f)
    return needed


def new_rows(stock: StockModel, config: StressConfig, strategy: str, token: str) -> list:
    """The unsaved, validated rows a run of ``strategy`` creates. Read-only.

    Raises :class:`StressRefused` naming the fields that need ``--field`` values,
    unknown or reserved ``--field`` names, and values the model rejects.
    """
    model = stock.model
    label = model._meta.label
    by_name = {f.name: f for f in model._meta.concrete_fields}
    by_name.update({f.attname: f for f in model._meta.concrete_fields})
    unknown = [name for name in config.fields if name not in by_name]
    if unknown:
        raise StressRefused(
            f"{label} has no field {', '.join(map(repr, unknown))} (--field); its fields: "
            f"{', '.join(f.name for f in model._meta.concrete_fields)}"
        )
    own = [name for name in config.fields if by_name[name].name in (stock.sku, stock.qty, "fence")]
    if own:
        raise StressRefused(f"--field {', '.join(own)}: the run sets that field itself")
    given = {by_name[name].name for name in config.fields}
    missing = [f for f in required_fields(stock) if f.name not in given]
    if missing:
        names = ", ".join(f"{f.name} ({type(f).__name__})" for f in missing)
        example = " ".join(f"--field {f.name}=..." for f in missing)
        raise StressRefused(
            f"the stress run creates its own {label} rows, and {label} requires fields it "
            f"cannot fill in: {names}. Give values for them ({example}; '{{sku}}' in a value "
            "becomes the row's SKU, which a unique field needs), or stress SKUs that already "
            "exist with --sku CODE (their stock is sold, then given back)"
        )
    skus = [f"{config.prefix}-{token}-{strategy}-{n}" for n in range(config.pool)]
    rows = []
    for sku in skus:
        values: dict[str, Any] = {stock.sku: sku, stock.qty: config.stock}
        if "fence" in by_name:
            values["fence"] = 0
        for name, text in config.fields.items():
            f = by_name[name]
            values[f.attname] = text.replace("{sku}", sku)
        row = model(**values)
        try:
            row.full_clean()  # reads only: field values, validators, uniqueness, constraints
        except ValidationError as exc:
            details = "; ".join(
                f"{name}: {' '.join(messages)}" for name, messages in exc.message_dict.items()
            )
            raise StressRefused(
                f"the stress row {sku!r} would not be a valid {label}: {details} "
                "(give or fix values with --field)"
            ) from None
        rows.append(row)
    for name, text in config.fields.items():
        f = by_name[name]
        if f.unique and len(rows) > 1 and "{sku}" not in text:
            raise StressRefused(
                f"{label}.{f.name} is unique and the run creates {len(rows)} rows: put "
                f"'{{sku}}' in its value (--field {name}=...{{sku}})"
            )
    return rows


# -- a run ----------------------------------------------------------------------------


class StressRun:
    """One strategy's stress run, which removes what it made when its block ends.

        with StressRun(config, "lua", token) as run:   # creates or measures the stock
            result = run.fire()                         # the buyers; then the figures
            print(result)
        run.cleanup                                     # CleanupReport

    Entering creates the rows (or measures the existing SKUs) and loads the
    counters; leaving, however the block ends, removes the run's data (see the
    module doc), with Ctrl-C deferred once while it does. Call :func:`check`
    first: entering raises :class:`StressRefused` (nothing kept) when the rows
    cannot be created.
    """

    def __init__(self, config: StressConfig, strategy: str, token: str) -> None:
        self.config = config
        self.strategy = strategy
        self.token = token
        self.run_id = f"{config.prefix}-{token}-{strategy}"  # in every order ref of the run
        self.stock = StockModel()
        self.keys = StockKeys()
        self.skus: list[str] = []
        self.created: list[str] = []  # SKUs of the rows this run inserted
        self.initial: dict[str, int] = {}
        self._has_counters = False
        self.cleanup: CleanupReport | None = None
        self.notify: Callable[[str], None] = lambda text: None

    def __enter__(self) -> StressRun:
        try:
            self._prepare()
        except BaseException:
            self._clean_up_shielded()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._clean_up_shielded(raise_deferred=exc_info[0] is None)

    def _prepare(self) -> None:
        chosen = get_strategy(self.strategy)
        if self.config.existing:
            self.skus = list(self.config.existing)
        else:
            rows = new_rows(self.stock, self.config, self.strategy, self.token)
            self.skus = [getattr(row, self.stock.sku) for row in rows]
            self.created = list(self.skus)  # before the write: an interrupt after it cleans up
            try:
                with transaction.atomic():
                    for row in rows:
                        row.save(force_insert=True)
            except IntegrityError as exc:
                self.created = []
                raise StressRefused(
                    f"could not create the stress rows (nothing was kept): {exc}"
                ) from None
            except BaseException:
                self.created = []  # rolled back
                raise
        self._has_counters = isinstance(chosen, RedisStockStrategy)
        if isinstance(chosen, RedisStockStrategy):
            # As a deploy readies Redis (sync_counters): a Redis that lost its data (the
            # benchmarks flush it) is restored now, not by the first buyers on the clock.
            chosen.restore_after_data_loss()
            chosen.load_counters(self.skus)  # SET NX from the database: a live counter stays
        self.initial = self.stock.levels(self.skus)

    def fire(self, progress: TextIO | None = None) -> StressResult:
        """Fire the buyers, wait for them, and measure. Raises :class:`StressAborted`
        when the run had to stop (e.g. the shop refuses a strategy in the body)."""
        config = self.config
        connections.close_all()  # forked workers must open their own
        ctx = multiprocessing.get_context("fork")
        start, results = ctx.Event(), ctx.Queue()
        # Read by every buyer at every attempt: plain shared memory, no lock (an Event's
        # or a locked Value's is one lock the buyers would queue on).
        stop, done = ctx.RawValue("b", 0), ctx.RawArray("q", config.processes)
        ready = ctx.Semaphore(0)
        share, extra = divmod(config.buyers, config.processes)
        workers = [
            ctx.Process(
                target=_worker,
                args=(
                    i,
                    share + (i < extra),
                    config,
                    self.strategy,
                    self.skus,
                    self.run_id,
                    ready,
                    start,
                    stop,
                    done,
                    results,
                ),
            )
            for i in range(config.processes)
        ]
        outcomes: list[dict[str, Any]] = []
        try:
            for worker in workers:
                worker.start()
            # The clock starts once every buyer has its connections: forking and
            # connecting are not the sale's.
            for worker in workers:
                while not ready.acquire(timeout=0.5):
                    if worker.exitcode is not None:
                        break  # it died setting up: its report never comes
            began = time.perf_counter()
            start.set()
            while len(outcomes) < len(workers):
                try:
                    outcomes.append(results.get(timeout=0.2))
                except queue.Empty:
                    if not any(w.is_alive() for w in workers) and results.empty():
                        break
                _draw(progress, self.strategy, sum(done), config.buyers)
            seconds = time.perf_counter() - began
            _draw(progress, self.strategy, config.buyers, config.buyers, end=True)
        except BaseException:
            with _interrupts_deferred(self.notify):
                _stop(workers, start, stop)  # before the clean-up: no buyer may outlive it
            raise
        with _interrupts_deferred(self.notify) as deferred:
            _stop(workers, start, stop)
        if deferred:
            raise KeyboardInterrupt
        fatal = next((o["fatal"] for o in outcomes if o.get("fatal")), None)
        if fatal:
            raise StressAborted(fatal)
        return self._tally(outcomes, seconds)

    def _tally(self, outcomes: list[dict[str, Any]], seconds: float) -> StressResult:
        config, skus = self.config, self.skus
        totals: Counter[str] = Counter()
        latencies: list[float] = []
        samples: list[str] = []
        for outcome in outcomes:
            totals.update(outcome["tally"])
            latencies.extend(outcome["latencies"])
            samples.extend(outcome["samples"])
        sold: Counter[str] = Counter()
        for lines in (
            self._reservations()
            .exclude(status=Reservation.Status.RELEASED)
            .values_list("lines", flat=True)
        ):
            sold.update(lines)
        report = {row.sku: row for row in stock_report(skus)}
        initial = self.initial
        oversold = sum(max(0, sold[s] - initial[s]) + max(0, -report[s].db) for s in skus)
        conserved = all(report[s].db == initial[s] - sold[s] for s in skus)
        attempts = sum(totals[k] for k in ("sold", "refused", "errors"))
        latencies.sort()
        return StressResult(
            strategy=self.strategy,
            attempts=attempts,
            sold=sum(sold.values()),
            refused=totals["refused"],
            errors=totals["errors"] + (config.buyers - attempts),
            oversold=oversold,
            final_stock=sum(report[s].db for s in skus),
            # A strategy without counters leaves a loaded one (an existing SKU's) behind
            # the database by design; the drift measured is the counter strategies'.
            drift=sum(abs(report[s].drift) for s in skus) if self._has_counters else 0,
            throughput_per_s=round(attempts / seconds, 1) if seconds else 0.0,
            p50_ms=round(_percentile(latencies, 50) * 1000, 2),
            p99_ms=round(_percentile(latencies, 99) * 1000, 2),
            retries=totals["retries"],
            orders=totals["sold"],
            initial_stock=sum(initial.values()),
            conserved=conserved,
            seconds=round(seconds, 3),
            error_samples=samples[:5],
            skus=list(skus),
        )

    # -- clean-up ---------------------------------------------------------------------

    def _reservations(self) -> models.QuerySet[Reservation]:
        return Reservation.objects.filter(order_ref__contains=f"{self.run_id}-")

    def _clean_up_shielded(self, raise_deferred: bool = False) -> None:
        with _interrupts_deferred(self.notify) as deferred:
            self.cleanup = self.clean_up()
        if deferred and raise_deferred:
            raise KeyboardInterrupt

    def clean_up(self) -> CleanupReport:
        """Remove what the run made (see the module doc); safe to repeat.

        Each step goes on after another one failed; what could not be removed
        is listed in the report's ``problems``, never raised.
        """
        report = CleanupReport()
        fields = ("order_ref", "status", "lines", "expires_at")
        try:
            refs = set(self._reservations().values_list("order_ref", flat=True))
        except Exception as exc:
            report.problems.append(f"could not read this run's reservations: {exc}")
            return report
        try:
            refs |= set(self._indexed_refs())
        except RedisError as exc:
            report.problems.append(f"could not read the Redis index of reservations: {exc}")
        for receiver, answer in stress_cleanup.send_robust(
            StressRun, strategy=self.strategy, order_refs=sorted(refs), skus=list(self.skus),
            created=bool(self.created),
        ):  # fmt: skip
            if isinstance(answer, Exception):
                report.problems.append(f"stress_cleanup receiver {receiver!r} failed: {answer}")
        try:  # again: a receiver may have paid or cancelled some
            rows = list(self._reservations().values_list(*fields))
        except Exception as exc:
            report.problems.append(f"could not read this run's reservations: {exc}")
            return report
        refs |= {ref for ref, *_ in rows}
        keep: set[str] = set()
        if self.config.existing:
            keep = self._give_back(rows, refs, report)
        gone = refs - keep
        try:
            report.reservations = self._reservations().exclude(order_ref__in=keep).delete()[0]
        except Exception as exc:
            report.problems.append(f"could not delete this run's reservations: {exc}")
        self._forget_in_redis(gone, rows, report)
        if self.created:
            self._delete_rows(report)
        elif self.initial:
            self._settle_counters(report)
        for sku in self.initial if self.config.existing else ():
            try:
                report.stock[sku] = (self.initial[sku], self.stock.levels([sku]).get(sku))
            except Exception as exc:
                report.problems.append(f"could not read the stock of {sku!r}: {exc}")
        if keep:
            report.problems.append(
                f"kept {len(keep)} reservation(s) whose units could not be given back: "
                f"{', '.join(sorted(keep)[:5])}"
            )
        return report

    def _settle_counters(self, report: CleanupReport) -> None:
        """Existing SKUs: a loaded counter the run's strategy did not keep (a database
        strategy's sales and their give-back) is brought in line with the database,
        by the measured drift (relative, refused while something moves it)."""
        try:
            if not stock_changed(*self.skus):
                report.notes.append(f"the counters of {self.skus} kept moving: the sweeper "
                                    "brings them in line")  # fmt: skip
        except Exception as exc:
            report.problems.append(f"could not check the counters of {self.skus}: {exc}")

    def _indexed_refs(self) -> list[str]:
        # The run id holds no glob characters (PREFIX, the token, a strategy name).
        pattern = f"*{self.run_id}-*"
        return [decoded(ref) for ref, _ in get_redis().zscan_iter(self.keys.index, match=pattern)]

    def _give_back(self, rows: list, refs: set[str], report: CleanupReport) -> set[str]:
        """Existing SKUs: release the run's open reservations and give back committed
        ones, by relative writes; settle Redis records without a row. Returns the
        refs that could not be, which are kept."""
        keep: set[str] = set()
        strategy = get_strategy(self.strategy)
        for ref, status, lines, _ in rows:
            try:
                if status == Reservation.Status.RESERVED:
                    strategy.release(ref)  # the row's own strategy: database, then Redis
                    report.given_back += 1
                elif status == Reservation.Status.COMMITTED:
                    for sku, qty in lines.items():
                        restock(sku, qty)  # stays sold in the ledger: bring the units back
                    report.given_back += 1
            except Exception as exc:
                keep.add(ref)
                report.problems.append(f"could not give back {ref!r}: {exc}")
        client = get_redis()
        for ref in sorted(refs - keep):
            try:
                lines = {
                    decoded(k): int(v) for k, v in client.hgetall(self.keys.record(ref)).items()
                }
                if not lines:
                    continue
                rows_now = Reservation.objects.filter(order_ref=ref)
                status = rows_now.values_list("status", flat=True).first()
                if status == Reservation.Status.COMMITTED:
                    scripts.STOCK_COMMIT([self.keys.record(ref), self.keys.index], [ref],
                                         client=client)  # fmt: skip
                elif status == Reservation.Status.RESERVED:
                    keep.add(ref)
                    report.problems.append(f"{ref!r} is still reserved")
                else:  # no row, or released: Redis still holds units the database does not
                    skus = list(lines)
                    reply = scripts.STOCK_RELEASE(
                        [self.keys.record(ref), self.keys.index, self.keys.loaded,
                         self.keys.versions, *map(self.keys.counter, skus)],
                        [ref, *skus], client=client,
                    )  # fmt: skip
                    if reply == RELEASED:
                        report.given_back += 1
            except (RedisError, OSError) as exc:
                keep.add(ref)
                report.problems.append(f"could not settle the Redis record of {ref!r}: {exc}")
        return keep

    def _forget_in_redis(self, refs: set[str], rows: list, report: CleanupReport) -> None:
        """Records, index entries and expiry items of ``refs``; nothing is given back."""
        due = {ref for ref, _, _, expires_at in rows if expires_at is not None and ref in refs}
        try:
            client = get_redis()
            ordered = sorted(refs)
            for start in range(0, len(ordered), BATCH):
                pipe = client.pipeline(transaction=False)
                for ref in ordered[start : start + BATCH]:
                    pipe.delete(self.keys.record(ref))
                    pipe.zrem(self.keys.index, ref)
                report.redis += sum(pipe.execute())
            if due:
                from .delayqueue import DelayQueue

                expiries = DelayQueue(settings.RESERVATION_QUEUE)
                report.expiries = sum(expiries.cancel(item_id(ref)) for ref in sorted(due))
        except (RedisError, OSError) as exc:
            report.problems.append(f"could not remove this run's Redis records: {exc}")

    def _delete_rows(self, report: CleanupReport) -> None:
        stock = self.stock
        try:
            with transaction.atomic():
                deleted = stock.objects.filter(**{f"{stock.sku}__in": self.created}).delete()
            report.rows = deleted[1].get(stock.model._meta.label, 0)
        except (models.ProtectedError, models.RestrictedError) as exc:
            holding = (
                exc.protected_objects
                if isinstance(exc, models.ProtectedError)
                else exc.restricted_objects
            )
            holders = Counter(obj._meta.label for obj in holding)
            kinds = ", ".join(f"{n} {label}" for label, n in holders.items())
            report.problems.append(
                f"kept the stock rows {', '.join(self.created)}: {kinds} row(s) refer to them "
                "(records made for this run's orders, e.g. by a shop sold to over HTTP); "
                "delete those, e.g. in a receiver of stock_locks.stress.stress_cleanup, "
                "then the rows"
            )
            return
        except Exception as exc:
            report.problems.append(f"could not delete the stock rows {self.created}: {exc}")
            return
        left = set(stock.levels(self.created))
        gone = [sku for sku in self.created if sku not in left]
        try:
            client = get_redis()
            pipe = client.pipeline(transaction=False)
            pipe.delete(*[self.keys.counter(sku) for sku in gone])
            pipe.hdel(self.keys.versions, *gone)
            report.redis += sum(pipe.execute())
        except (RedisError, OSError) as exc:
            report.problems.append(f"could not remove the counters of {gone}: {exc}")


def run_stress(config: StressConfig, strategy: str, progress: TextIO | None = None) -> StressResult:
    """Check, run and clean up one strategy's stress run; its figures.

    Raises :class:`StressRefused` (nothing written), :class:`StressAborted`,
    and :class:`StressError` when the run's data could not all be removed.
    """
    token = new_token()
    check(config, [strategy], token)
    with StressRun(config, strategy, token) as run:
        result = run.fire(progress)
    if run.cleanup and run.cleanup.problems:
        raise StressError("left data behind: " + "; ".join(run.cleanup.problems))
    return result


@contextlib.contextmanager
def _interrupts_deferred(notify: Callable[[str], None]) -> Iterator[list[int]]:
    """While the block runs, the first Ctrl-C is only noted (a second one interrupts).
    Yields a list that holds the deferred signal, if any."""
    deferred: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return

    def note(signum: int, frame: Any) -> None:
        if deferred:
            raise KeyboardInterrupt
        deferred.append(signum)
        notify(
            "stopping the buyers and removing this run's data; Ctrl-C again to stop at once "
            "(leaving data behind)"
        )

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(workers: list, start: Any, stop: Any) -> None:
    """Stop the workers after their current attempt; terminate any that do not."""
    stop.value = 1
    start.set()  # workers still waiting to start see the stop at once
    deadline = time.monotonic() + STOP_GRACE
    for worker in workers:
        if worker.pid is not None:
            worker.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
            worker.join()


def _worker(
    index, attempts, config, strategy, skus, run_id, ready, start, stop, done, results
) -> None:
    # A terminal's Ctrl-C reaches every process of the group: the parent stops the
    # workers after their attempt (the stop flag) and cleans up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rng = random.Random(config.seed * 1000 + index)
    buy = _http_buyer(config.url) if config.via == "http" else _orm_buyer(strategy)
    tally: Counter[str] = Counter()
    latencies: list[float] = []
    samples: list[str] = []
    fatal = None
    _connect(strategy, config)
    ready.release()
    start.wait()
    every_sku = len(skus) == config.cart_size  # the same cart each time (a flash sale's)
    for n in range(attempts):
        if stop.value:
            break
        chosen = skus if every_sku else sorted(rng.sample(skus, config.cart_size))
        cart = {sku: config.qty for sku in chosen}
        began = time.perf_counter()
        try:
            outcome, retries = buy(f"{run_id}-{index}-{n}", cart, strategy)
        except _StrategyNotAccepted as exc:
            fatal = str(exc)
            stop.value = 1
            break
        except Exception as exc:  # every failure is counted and sampled, never fatal
            outcome, retries = "errors", 0
            if len(samples) < 3:
                samples.append(f"{type(exc).__name__}: {exc}")
        latencies.append(time.perf_counter() - began)
        tally[outcome] += 1
        tally["retries"] += retries
        if n % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            done[index] = n + 1
    results.put({"tally": dict(tally), "latencies": latencies, "samples": samples, "fatal": fatal})


def _connect(strategy: str, config: StressConfig) -> None:
    """Open this buyer's connections before the start, as a web worker has them before
    a sale (a failure shows in its attempts)."""
    if config.via == "http":
        return
    with contextlib.suppress(Exception):
        get_strategy(strategy).warm_up()


def _orm_buyer(strategy_name: str):
    strategy = get_strategy(strategy_name)

    def buy(ref: str, cart: dict[str, int], _: str) -> tuple[str, int]:
        try:
            return "sold", strategy.reserve(ref, cart).retries
        except OutOfStock:
            return "refused", 0

    return buy


def _http_buyer(url: str):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=60)

    def buy(ref: str, cart: dict[str, int], strategy: str) -> tuple[str, int]:
        body = json.dumps(
            {"items": [{"sku": s, "qty": q} for s, q in cart.items()], "strategy": strategy}
        )
        headers = {"Content-Type": "application/json", "Idempotency-Key": ref}
        try:
            conn.request("POST", parts.path or "/", body, headers)
            response = conn.getresponse()
            payload = json.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException):
            conn.close()  # reconnect on the next request
            raise
        if response.status in (200, 201):
            return "sold", int(payload.get("retries", 0))
        if response.status == 409 and payload.get("error") == "out_of_stock":
            return "refused", 0
        message = str(payload.get("message", payload))
        if response.status == 400 and 'remove "strategy"' in message:
            raise _StrategyNotAccepted(
                f"the shop at {url} chooses the stock strategy itself and refuses one in the "
                f"order body ({message}): start the shop with SHOP_STRATEGY_FROM_REQUEST=1 "
                "(the demo's switch that lets the body pick), or use --via orm"
            )
        raise RuntimeError(f"HTTP {response.status}: {message}")

    return buy


def _percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return 0.0
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(pct) - 1]


def _draw(out: TextIO | None, strategy: str, done: int, total: int, end: bool = False) -> None:
    if out is None:
        return
    width = 30
    filled = int(width * min(done, total) / max(total, 1))
    out.write(
        f"\r  {strategy:<15} [{'#' * filled}{'.' * (width - filled)}] {min(done, total)}/{total}"
    )
    if end:
        out.write("\n")
    out.flush()


COLUMNS = [
    ("strategy", "strategy"), ("attempts", "attempts"), ("orders", "orders"),
    ("units sold", "sold"), ("refused", "refused"),
    ("errors", "errors"), ("oversold", "oversold"), ("final", "final_stock"), ("drift", "drift"),
    ("attempts/s", "throughput_per_s"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
    ("retries", "retries"),
]  # fmt: skip
MIN_WIDTH = 8  # a column's width when the rows are printed one by one


def table_widths(strategies: list[str]) -> list[int]:
    """Column widths for rows printed as each strategy finishes."""
    first = max(len(COLUMNS[0][0]), *map(len, strategies))
    return [first] + [max(len(title), MIN_WIDTH) for title, _ in COLUMNS[1:]]


def table_line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        cell.ljust(w) if i == 0 else cell.rjust(w)
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
    )


def table_header(widths: list[int]) -> str:
    return table_line([title for title, _ in COLUMNS], widths)


def table_row(result: StressResult, widths: list[int]) -> str:
    return table_line([str(getattr(result, attr)) for _, attr in COLUMNS], widths)


def stderr_if_tty() -> TextIO | None:
    return sys.stderr if sys.stderr.isatty() else None
