"""The dashboard's charts: SVG drawn on the server from the Redis timeline."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from stock_locks import metrics
from stock_locks.dashboard.charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    line_chart,
    nice_ceiling,
)
from stock_locks.dashboard.timeline import Timeline
from tests.test_dashboard import client_for


def plotted(svg: str) -> tuple[list[list[tuple[float, float]]], list[tuple[float, float]]]:
    """The polylines' points and the lone points (circles) of a chart."""
    lines = [
        [tuple(map(float, p.split(","))) for p in points.split()]
        for points in re.findall(r'<polyline points="([^"]+)"', svg)
    ]
    dots = [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([^"]+)" cy="([^"]+)"', svg)]
    return lines, dots  # type: ignore[return-value]


def test_values_land_where_they_belong_and_none_is_a_gap():
    timeline = Timeline(start=1000, step=1, series={"lua": [0, 8, None, 4]})
    svg = line_chart(timeline, {"lua": timeline.series["lua"]}, "per s")
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = 10  # the round ceiling above 8

    def at(i: int, v: float) -> tuple[float, float]:
        return round(LEFT + plot_w * i / 3, 1), round(TOP + plot_h * (1 - v / top), 1)

    lines, dots = plotted(svg)
    assert lines == [[at(0, 0), at(1, 8)]]  # then the gap
    assert dots == [at(3, 4)]  # alone after the gap
    assert ">10<" in svg and ">now<" in svg and "-3 s" in svg


def test_labels_are_escaped_and_nothing_needs_an_inline_allowance():
    hostile = '<script>alert("x")</script>'
    timeline = Timeline(start=0, step=1, series={"r": [1, 2, 3]})
    svg = line_chart(timeline, {hostile: [1, 2, 3]}, "per s")
    assert "<script" not in svg and "&lt;script&gt;" in svg
    assert "style=" not in svg and not re.search(r"\son\w+=", svg)


def test_a_count_of_zero_is_a_line_at_zero_and_no_samples_say_so():
    timeline = Timeline(start=0, step=1, series={"dead_letters": [0.0] * 300})
    svg = line_chart(timeline, {"dead letters": [0.0] * 300}, "per s")
    lines, _ = plotted(svg)
    bottom = HEIGHT - BOTTOM
    assert lines == [
        [(round(LEFT + (WIDTH - LEFT - RIGHT) * i / 299, 1), bottom) for i in range(300)]
    ]
    assert "no data yet" not in svg and ">0<" in svg
    p99 = Timeline(start=0, step=1, series={"p99": [None] * 300})
    assert "no samples" in line_chart(p99, {"p99": [None] * 300}, "ms", empty="no samples")


def test_the_unit_sits_above_the_plot_clear_of_the_tick_labels():
    svg = line_chart(Timeline(0, 1, {"lua": [3, 7]}), {"lua": [3, 7]}, "per s")
    unit_y = float(re.search(r'y="([^"]+)"[^>]*>per s<', svg).group(1))
    tick_ys = [float(y) for y in re.findall(r'y="([^"]+)" text-anchor="end"[^>]*>[\d.k]+<', svg)]
    assert tick_ys and unit_y < TOP and unit_y <= min(tick_ys) - 10  # a 10 px line apart


def test_an_hour_of_ten_second_buckets_is_labelled_at_round_minutes():
    timeline = Timeline(start=0, step=10, series={"lua": [1.0] * 360})
    svg = line_chart(timeline, {"lua": timeline.series["lua"]}, "per s")
    labels = re.findall(r'font-size="10" fill="#555">(now|-[^<]+)</text>', svg)
    assert labels == ["now", "-10 min", "-20 min", "-30 min", "-40 min", "-50 min"]


@pytest.mark.parametrize(
    "value, ceiling", [(0.3, 0.5), (1, 1), (7, 10), (12, 20), (240, 250), (2600, 5000)]
)
def test_the_y_axis_tops_out_at_a_round_number(value, ceiling):
    assert nice_ceiling(value) == pytest.approx(ceiling)


@pytest.mark.django_db
def test_the_dashboard_draws_what_the_processes_recorded(redis_client):
    metrics.reset()
    for _ in range(3):
        metrics.reserved("lua", True, 0)
    metrics.refused("lua", "o", "TEA", 1, 0)
    assert metrics.flush()
    client = client_for(User.objects.create_superuser("root", password="pw"))
    page = client.get(reverse("admin:stock_locks_dashboard")).content.decode()
    figure = re.search(r'<figure class="sl-chart" id="sl-chart-reservations">(.*?)</figure>',
                       page, re.S).group(1)  # fmt: skip
    assert "<svg" in figure and ">lua</text>" in figure and "no data yet" not in figure
    lines, dots = plotted(figure)
    assert lines or dots  # the 3 reservations of this second
    refresh = client.get(reverse("admin:stock_locks_dashboard_json")).json()
    charts = {chart["id"]: chart for chart in refresh["charts"]}
    assert set(charts) == {
        "reservations", "refusals", "errors", "lock-wait", "delay-lag", "dead-letters"
    }  # fmt: skip
    assert ">lua</text>" in charts["refusals"]["svg"]
    assert plotted(charts["dead-letters"]["svg"])[0]  # a line at zero, not "no data yet"
    assert ">none</text>" in charts["errors"]["svg"]
