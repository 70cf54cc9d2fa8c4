"""The dashboard's charts: SVG drawn on the server from a timeline (:mod:`.timeline`).

No script and no third-party bundle: each chart is a string of SVG markup
(every label escaped; colours as presentation attributes, which a strict
Content-Security-Policy allows), rendered into the page on the server and
swapped in by the dashboard's own script when it refreshes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from . import timeline as tl

WIDTH, HEIGHT = 300, 150
LEFT, RIGHT, TOP, BOTTOM = 44, 10, 20, 40  # margins around the plot area (the unit above it)
X_LABELS = 6  # at most this many time labels under a chart
X_STEPS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800)  # seconds between time labels
PALETTE = ("#2f6fb0", "#d1603d", "#3c9a5f", "#8a5cb8", "#c49a1a", "#4fa3a5", "#b5466b")


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    svg: SafeString


def dashboard_charts(timeline: tl.Timeline) -> list[Chart]:
    """The sale at a glance: reservations and refusals per second per strategy, errors
    per second by type, lock wait p99, delay-queue lag p99 and dead letters, over the
    timeline's window. A count with nothing recorded is drawn as a line at zero."""
    zeros: list[float | None] = [0.0] * timeline.length

    def by_name(prefix: str, nothing: str) -> dict[str, Sequence[float | None]]:
        found: dict[str, Sequence[float | None]] = {
            name[len(prefix) :]: timeline.series[name] for name in timeline.names(prefix)
        }
        return found or {nothing: zeros}

    def one(name: str, label: str) -> dict[str, Sequence[float | None]]:
        return {label: timeline.series.get(name, zeros)}

    return [
        Chart("reservations", "Reservations per second",
              line_chart(timeline, by_name(tl.RESERVATIONS, "none"), "per s")),
        Chart("refusals", "Refusals per second",
              line_chart(timeline, by_name(tl.REFUSALS, "none"), "per s")),
        Chart("errors", "Errors per second",
              line_chart(timeline, by_name(tl.ERRORS, "none"), "per s")),
        Chart("lock-wait", "Lock wait, p99 (ms)",
              line_chart(timeline, one(tl.LOCK_WAIT_P99_MS, "p99"), "ms",
                         empty="no lock acquired in this window")),
        Chart("delay-lag", "Delay queue lag, p99 (ms)",
              line_chart(timeline, one(tl.DELAY_LAG_P99_MS, "p99"), "ms",
                         empty="no delay-queue item claimed in this window")),
        Chart("dead-letters", "Dead letters per second",
              line_chart(timeline, one(tl.DEAD_LETTERS, "dead letters"), "per s")),
    ]  # fmt: skip


def line_chart(
    timeline: tl.Timeline,
    lines: dict[str, Sequence[float | None]],
    unit: str,
    *,
    empty: str = "no data yet",
) -> SafeString:
    """One SVG chart: a line per entry of ``lines`` (label -> one value per bucket of
    ``timeline``; None draws a gap, 0 a line at zero), x = time before the last
    bucket, y from 0 to a round maximum, ``unit`` above the y axis. ``empty`` is
    written across it when no value is recorded at all (every one None)."""
    n = timeline.length
    values = [v for series in lines.values() for v in series if v is not None]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="sl-chart-svg" viewBox="0 0 {WIDTH} '
        f'{HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">'
    ]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>'
        f'<text x="{LEFT - 4}" y="{TOP - 8}" text-anchor="end" font-size="10" fill="#555">'
        f"{escape(unit)}</text>"
    )
    if n < 2 or not values:
        parts.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" '
            f'fill="#888" font-size="12">{escape(empty)}</text></svg>'
        )
        return mark_safe("".join(parts))  # (every text above is ours or escaped)
    top = nice_ceiling(max(values))

    def x(i: int) -> float:
        return LEFT + plot_w * i / (n - 1)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    for fraction in (0, 0.5, 1):  # y axis: 0, half, top
        value = top * fraction
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 4}" y="{y(value) + 4:.1f}" text-anchor="end" '
            f'font-size="10" fill="#555">{escape(_number(value))}</text>'
        )
    span = (n - 1) * timeline.step  # x axis: time ago, at round steps, a step a bucket's multiple
    steps = [s for s in X_STEPS if s % timeline.step == 0] or [timeline.step]
    every = next((s for s in steps if span // s < X_LABELS), steps[-1])
    for ago in range(0, span + 1, every):
        i = n - 1 - ago // timeline.step
        label = "now" if ago == 0 else f"-{_duration(ago)}"
        parts.append(
            f'<text x="{x(i):.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" font-size="10" '
            f'fill="#555">{escape(label)}</text>'
        )
    legend_x = LEFT
    for k, (label, series) in enumerate(lines.items()):
        colour = PALETTE[k % len(PALETTE)]
        for run in _runs(series):
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            if len(run) == 1:
                (i, v) = run[0]
                parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="1.5" fill="{colour}"/>')
            else:
                parts.append(
                    f'<polyline points="{points}" fill="none" stroke="{colour}" '
                    f'stroke-width="1.5"/>'
                )
        text = escape(label)
        parts.append(
            f'<rect x="{legend_x}" y="{HEIGHT - 14}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{legend_x + 14}" y="{HEIGHT - 5}" font-size="11" fill="#333">{text}'
            "</text>"
        )
        legend_x += 24 + 7 * len(label)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # (labels escaped above)


def _runs(series: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The stretches of ``series`` without a None, as (index, value) lists."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, value in enumerate(series):
        if value is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, value))
    if current:
        runs.append(current)
    return runs


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _duration(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"
