"""The demo's flash-sale plot: attempts/s and p99 latency per strategy (matplotlib PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stock_locks.stock.stress import StressResult


def flash_sale_png(results: Sequence[StressResult], path: Path, title: str) -> Path | None:
    """Write the plot to ``path``; None (nothing written) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # no display: a file
    from matplotlib import pyplot as plt

    names = [r.strategy for r in results]
    figure, (rate, p99) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    figure.suptitle(title)
    for axes, values, label in (
        (rate, [r.throughput_per_s for r in results], "attempts per second (higher is better)"),
        (p99, [r.p99_ms for r in results], "p99 latency, ms (lower is better)"),
    ):
        bars = axes.bar(names, values, color="#2f6fb0")
        axes.bar_label(bars, fmt="{:,.0f}" if axes is rate else "{:,.1f}", fontsize=8)
        axes.set_title(label, fontsize=10)
        axes.tick_params(axis="x", labelrotation=20, labelsize=9)
        axes.spines[["top", "right"]].set_visible(False)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
