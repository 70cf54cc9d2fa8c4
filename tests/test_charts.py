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


def test_an_empty_timeline_says_so():
    timeline = Timeline(start=0, step=1, series={"dead_letters": [0.0] * 300})
    assert "no data yet" in line_chart(timeline, {"dead letters": [0.0] * 300}, "per s")
    assert "no data yet" in line_chart(Timeline(0, 1, {}), {}, "ms")


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
    assert set(charts) == {"reservations", "refusals", "lock-wait", "delay-lag", "dead-letters"}
    assert ">lua</text>" in charts["refusals"]["svg"]
    assert "no data yet" in charts["dead-letters"]["svg"]
