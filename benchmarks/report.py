"""``benchmarks/results/REPORT.md`` and its plots, from one run of every benchmark.

The text of each benchmark (its tables and same-run ratios) goes in as it was
printed; its targets (the PASS/FAIL lines) are gathered at the top; the
figures it handed over (``support.figure``) become PNG plots (matplotlib).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import support

RESULTS = Path(__file__).resolve().parent / "results"
VERDICT = re.compile(r"\b(PASS|FAIL)\b")


@dataclass
class ModuleRun:
    name: str
    text: str
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)


def write(runs: list[ModuleRun], total_seconds: float, directory: Path = RESULTS) -> Path:
    """Write REPORT.md and the PNGs into ``directory``; the report's path."""
    directory.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    for run in runs:
        figures.update(run.figures)
    plots = _plots(figures, directory)
    lines = [
        "# stock_locks benchmark report",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `make bench` in {total_seconds / 60:.1f} "
        f"min; {_machine()}.",
        f"Versions: {_versions()}.",
        "",
        "The machine is shared and noisy: compare the figures within this run (every "
        "benchmark interleaves its contenders in rounds and reports same-round ratios), "
        "not with another run's absolute numbers.",
        "",
        "## Targets",
        "",
    ]
    for run in runs:
        for line in run.text.splitlines():
            if VERDICT.search(line):
                lines.append(f"- `{run.name}`: {line.strip()}")
    if plots:
        lines += ["", "## Plots", ""]
        for title, path in plots:
            lines += [f"### {title}", "", f"![{title}]({path.name})", ""]
    lines += ["## Every benchmark's report", ""]
    for run in runs:
        lines += [f"### `{run.name}` ({run.seconds:.0f} s)", "", "```", run.text.strip(), "```", ""]
    path = directory / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def _machine() -> str:
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )


def _versions() -> str:
    names = ("Django", "redis", "hiredis", "django-redis", "celery", "psycopg", "kazoo")
    return ", ".join(f"{name} {support.dist_version(name)}" for name in names)


# -- plots ---------------------------------------------------------------------------


def _plots(figures: dict[str, Any], directory: Path) -> list[tuple[str, Path]]:
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    made: list[tuple[str, Path]] = []

    def save(fig: Any, title: str, name: str) -> None:
        fig.suptitle(title)
        path = directory / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        made.append((title, path))

    def lines(series: dict, xlabel: str, ylabel: str, title: str, name: str) -> None:
        """One line per label of ``series`` ({label: {x: y}}), log y."""
        fig, axes = plt.subplots(figsize=(7, 4), layout="constrained")
        for label, points in series.items():
            xs = sorted(points)
            axes.plot(xs, [points[x] for x in xs], marker="o", label=label)
        axes.set(xlabel=xlabel, ylabel=ylabel, yscale="log")
        axes.legend(fontsize=8)
        save(fig, title, name)

    if by_processes := figures.get("reservations/s by processes"):
        lines(
            by_processes,
            "processes",
            "reservations/s",
            "Reservations/s per strategy vs processes (one hot SKU)",
            "reservations.png",
        )
    flash = figures.get("flash sale attempts/s")
    if flash:
        fig, axes = plt.subplots(figsize=(8, 4), layout="constrained")
        bars = axes.bar(list(flash), list(flash.values()), color="#2f6fb0")
        axes.bar_label(bars, fmt="{:,.0f}", fontsize=8)
        axes.set(ylabel="attempts/s", yscale="log")
        axes.tick_params(axis="x", labelrotation=20, labelsize=8)
        save(fig, "Flash sale: 10,000 attempts for 1,000 units, 16 processes", "flash_sale.png")
    if refresh := figures.get("dashboard refresh ms by keys"):
        lines(
            refresh,
            "unrelated keys in Redis",
            "ms per refresh",
            "Dashboard: one refresh's Redis reads vs the keyspace",
            "dashboard_refresh.png",
        )
    for key, title, name, unit in (
        ("lock handoff waits (ms)", "Contended lock: wait from acquire() to grant",
         "lock_waits.png", "wait, ms"),
        ("delay queue lateness (ms)", "Delay queue: handled minus due",
         "delay_lateness.png", "lateness, ms"),
    ):  # fmt: skip
        samples = figures.get(key)
        if samples:
            fig, axes = plt.subplots(figsize=(7, 4), layout="constrained")
            for label, values in samples.items():
                ordered = sorted(v for v in values if v > 0)
                if ordered:
                    share = [(i + 1) / len(ordered) for i in range(len(ordered))]
                    axes.step(ordered, share, where="post", label=label)
            axes.set(xlabel=f"{unit} (log)", ylabel="share of samples at or below", xscale="log")
            axes.legend(fontsize=8)
            save(fig, title, name)
    backends = {
        **figures.get("uncontended cycles/s (redlock)", {}),
        **figures.get("uncontended cycles/s (zookeeper)", {}),
    }
    if backends:
        fig, axes = plt.subplots(figsize=(8, 4), layout="constrained")
        bars = axes.bar(list(backends), list(backends.values()), color="#3c9a5f")
        axes.bar_label(bars, fmt="{:,.0f}", fontsize=8)
        axes.set(ylabel="acquire+release cycles/s")
        axes.tick_params(axis="x", labelrotation=20, labelsize=8)
        save(fig, "Uncontended lock cycles: one Redis, RedLock, ZooKeeper", "lock_backends.png")
    return made
