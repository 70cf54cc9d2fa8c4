"""A stress run's figures as text: the progress bar and the results table."""

from __future__ import annotations

import statistics
import sys
from typing import TextIO

from .plan import StressResult


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
