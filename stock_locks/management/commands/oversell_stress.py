import json as jsonlib

from django.core.management.base import BaseCommand, CommandError

from ...stock import strategy_names
from ...stress import StressConfig, render_table, run_stress, stderr_if_tty


class Command(BaseCommand):
    help = (
        "Fire many concurrent buyers at the same stock with each strategy and report sold, "
        "refused, oversold (must be 0), final stock, drift, throughput and latency. "
        "Exits 1 when anything oversold, drifted or an attempt failed with an error."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--strategy", default="all", help=f"one of {', '.join(strategy_names())} or all"
        )
        parser.add_argument("--stock", type=int, default=100, help="units per SKU (default 100)")
        parser.add_argument(
            "--buyers", type=int, default=1000, help="total attempts (default 1000)"
        )
        parser.add_argument("--processes", type=int, default=8, help="buyer processes (default 8)")
        parser.add_argument("--qty", type=int, default=1, help="units per cart line (default 1)")
        parser.add_argument("--cart-size", type=int, default=1, help="SKUs per cart (default 1)")
        parser.add_argument(
            "--skus", type=int, default=0, help="SKUs per strategy (default: cart size)"
        )
        parser.add_argument("--via", choices=["orm", "http"], default="orm")
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000/api/orders/", help="order API (--via http)"
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of the random carts")
        parser.add_argument(
            "--json", action="store_true", help="one JSON object per strategy, one per line"
        )

    def handle(self, *args, strategy: str, json: bool, **options):
        names = strategy_names() if strategy == "all" else [strategy]
        if strategy != "all" and strategy not in strategy_names():
            raise CommandError(
                f"unknown strategy {strategy!r}; choose {', '.join(strategy_names())} or all"
            )
        fields = ("stock", "buyers", "processes", "qty", "cart_size", "skus", "via", "url", "seed")
        config = StressConfig(**{name: options[name] for name in fields})
        problems = _check(config)
        if problems:
            raise CommandError("; ".join(problems))
        results = []
        for name in names:
            results.append(run_stress(config, name, progress=None if json else stderr_if_tty()))
            if json:
                self.stdout.write(_json_line(results[-1].as_dict()))
        if not json:
            self.stdout.write(render_table(results))
            for result in results:
                for sample in result.error_samples:
                    self.stdout.write(f"  {result.strategy} error: {sample}")
        failed = [r.strategy for r in results if not r.ok]
        if failed:
            raise CommandError(f"oversold, drift, lost stock or errors with: {', '.join(failed)}")


def _json_line(data: dict) -> str:
    return jsonlib.dumps(data)


def _check(config: StressConfig) -> list[str]:
    problems = []
    for name in ("stock", "buyers", "processes", "qty", "cart_size"):
        if getattr(config, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1")
    if config.skus and config.skus < config.cart_size:
        problems.append("--skus must be at least --cart-size")
    return problems
