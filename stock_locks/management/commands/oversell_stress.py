"""``manage.py oversell_stress``: fire concurrent buyers at stock with each strategy, count.

What it needs, checked before anything is written (a clear error otherwise,
nothing written): the stock model and the strategies configured and usable,
Redis reachable, and stock to sell. By default each strategy gets stock rows
of its own, created through the stock model: a text field the model requires
without a default (``CharField`` or ``TextField`` without choices, such as a
name) gets the row's SKU; any other required field without a default (other
than the SKU, quantity and ``fence`` fields) needs ``--field NAME=VALUE``
(``{sku}`` in a value becomes the row's SKU), which a text field may have
too, instead of the SKU. Or
``--sku CODE`` (repeated) stresses SKUs that already exist with their
current stock, which is given back afterwards. Over HTTP (``--via http``) the
shop must use the same database and Redis, and accept ``"strategy"`` in the
order body (the demo: ``SHOP_STRATEGY_FROM_REQUEST=1``).

What it leaves: nothing. After each strategy's figures are printed, whatever
happened (success, an oversell, errors, Ctrl-C), its reservations, the rows
it created and their Redis records, counters and expiry items are removed,
and existing SKUs get their units back (see :mod:`stock_locks.stock.stress`).
"""

import json as jsonlib
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from ...stock import strategy_names
from ...stock.stress import (
    StressConfig,
    StressError,
    StressResult,
    StressRun,
    check,
    new_token,
    stderr_if_tty,
    table_header,
    table_row,
    table_widths,
)

INTERRUPTED = 130  # exit status after Ctrl-C, as a shell reports it


class Command(BaseCommand):
    help = (
        "Fire many concurrent buyers at the same stock with each strategy and report sold, "
        "refused, oversold (must be 0), final stock, drift, throughput and latency. Exits 1 "
        "when anything oversold, drifted or an attempt failed with an error. Each strategy "
        "sells stock rows it creates (a required text field without a default gets the "
        "row's SKU; other required fields without a default need --field NAME=VALUE) or, "
        "with --sku, SKUs that exist (their stock is given back). Afterwards, even after "
        "an error or Ctrl-C, everything the run made is removed: reservations, created "
        "rows, their Redis records and counters. What is missing is reported before "
        "anything is written."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--strategy", default="all", help=f"one of {', '.join(strategy_names())} or all"
        )
        parser.add_argument(
            "--stock", type=int, default=None, help="units per created SKU (default 100)"
        )
        parser.add_argument(
            "--buyers", type=int, default=1000, help="total attempts (default 1000)"
        )
        parser.add_argument("--processes", type=int, default=8, help="buyer processes (default 8)")
        parser.add_argument("--qty", type=int, default=1, help="units per cart line (default 1)")
        parser.add_argument("--cart-size", type=int, default=1, help="SKUs per cart (default 1)")
        parser.add_argument(
            "--skus", type=int, default=0, help="SKUs created per strategy (default: cart size)"
        )
        parser.add_argument(
            "--field",
            dest="fields",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a value for a field of the stock rows the run creates (repeat it per "
            "field): needed for a required field without a default, but for text fields, "
            "which get the row's SKU unless given here; '{sku}' in VALUE becomes the row's "
            "SKU (a unique field needs it)",
        )
        parser.add_argument(
            "--sku",
            dest="existing",
            action="append",
            default=[],
            metavar="CODE",
            help="stress this existing SKU instead of creating rows (repeat it for more): it "
            "is sold with the stock it has, which is given back afterwards; run it where "
            "nothing else sells the SKU meanwhile",
        )
        parser.add_argument("--via", choices=["orm", "http"], default="orm")
        parser.add_argument(
            "--url",
            default="http://127.0.0.1:8000/api/orders/",
            help="order API (--via http); the shop must use this project's database and Redis "
            'and accept "strategy" in the body (demo: SHOP_STRATEGY_FROM_REQUEST=1)',
        )
        parser.add_argument(
            "--prefix", default="STRESS", help="start of the run's SKUs and order refs"
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of the random carts")
        parser.add_argument(
            "--json", action="store_true", help="one JSON object per strategy, one per line"
        )

    def handle(self, *args, strategy: str, json: bool, **options):
        if strategy != "all" and strategy not in strategy_names():
            raise CommandError(
                f"unknown strategy {strategy!r}; choose {', '.join(strategy_names())} or all"
            )
        names = strategy_names() if strategy == "all" else [strategy]
        config = self._config(options)
        token = new_token()
        try:
            check(config, names, token)
        except StressError as exc:
            raise CommandError(f"{exc}. Nothing was written.") from None
        stop_on_sigterm = _sigterm_interrupts()
        try:
            self._run(config, names, token, json)
        except KeyboardInterrupt:
            if getattr(self, "_called_from_command_line", False):
                raise CommandError(
                    "interrupted; the data of the interrupted run was removed",
                    returncode=INTERRUPTED,
                ) from None
            raise
        finally:
            stop_on_sigterm()

    def _config(self, options) -> StressConfig:
        existing = tuple(options["existing"])
        if existing and options["stock"] is not None:
            raise CommandError(
                "--stock sets the stock of the rows the run creates; --sku SKUs are sold "
                "with the stock they have"
            )
        fields = {}
        for item in options["fields"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--field {item!r}: give NAME=VALUE")
            if name in fields:
                raise CommandError(f"--field {name} given twice")
            fields[name] = value
        simple = ("buyers", "processes", "qty", "cart_size", "skus", "via", "url", "prefix", "seed")
        return StressConfig(
            stock=100 if options["stock"] is None else options["stock"],
            existing=existing,
            fields=fields,
            **{name: options[name] for name in simple},
        )

    def _run(self, config: StressConfig, names: list[str], token: str, json: bool) -> None:
        widths = table_widths(names)
        failed = []
        self.results: list[StressResult] = []  # for a caller that passes this command object
        for number, name in enumerate(names):
            run = StressRun(config, name, token)
            run.notify = self._note
            try:
                with run:
                    result = run.fire(progress=None if json else stderr_if_tty())
                    self.results.append(result)
                    # The figures first; the block's end then removes the run's data.
                    if json:
                        self.stdout.write(jsonlib.dumps(result.as_dict()))
                    else:
                        if number == 0:
                            self.stdout.write(table_header(widths))
                        self.stdout.write(table_row(result, widths))
                        for sample in result.error_samples:
                            self._note(f"{name} error: {sample}")
            except StressError as exc:  # refused at the start, or aborted: data removed
                raise CommandError(str(exc)) from None
            finally:
                if run.cleanup is not None:
                    self._note(f"{name}: {run.cleanup.summary()}")
            if run.cleanup is not None and run.cleanup.problems:
                raise CommandError(
                    f"{name}: could not remove everything the run made: "
                    + "; ".join(run.cleanup.problems)
                )
            if not result.ok:
                failed.append(name)
        if failed:
            raise CommandError(f"oversold, drift, lost stock or errors with: {', '.join(failed)}")

    def _note(self, text: str) -> None:
        self.stderr.write(text, style_func=lambda line: line)


def _sigterm_interrupts():
    """Make SIGTERM stop the run like Ctrl-C (so it cleans up), unless someone already
    handles it; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
