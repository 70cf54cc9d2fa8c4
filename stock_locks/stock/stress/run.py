"""A stress run: prepare, fire the buyers, count from the database, clean up."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from django.db import IntegrityError, connections, models, transaction
from redis.exceptions import RedisError

from ... import scripts
from ...backends.redis.client import get_redis
from ...backends.redis.protocol import decoded
from ...conf import settings
from ...delayqueue import DelayQueue
from ...exceptions import RedisUnavailable
from ...keys import StockKeys
from ...models import Reservation
from ..counters import RELEASED, RedisStockStrategy
from ..expiry import item_id
from ..reconcile import stock_report
from ..registry import get_strategy
from ..sync import restock, stock_changed
from ..table import StockTable
from .buyers import _worker
from .plan import (
    BATCH,
    STOP_GRACE,
    CleanupReport,
    StressAborted,
    StressConfig,
    StressError,
    StressRefused,
    StressResult,
    check,
    new_rows,
    new_token,
    stress_cleanup,
)
from .report import _draw, _percentile


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
        self.stock = StockTable()
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
            except (RedisError, RedisUnavailable, OSError) as exc:
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
                expiries = DelayQueue(settings.RESERVATION_QUEUE)
                report.expiries = sum(expiries.cancel(item_id(ref)) for ref in sorted(due))
        except (RedisError, RedisUnavailable, OSError) as exc:
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
                "delete those, e.g. in a receiver of stock_locks.stock.stress.stress_cleanup, "
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
        except (RedisError, RedisUnavailable, OSError) as exc:
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
