"""Bar charts as geometry: where each bar, tick and grid line of the dashboard's SVG goes.

Pure arithmetic on counts: no markup. The admin's template draws the SVG
from it (so every text in it is escaped as any template text is), with a
``<title>`` on each bar and the same figures as a table beside the chart,
for screen readers and for anyone who wants the numbers.

Each bucket (an hour, a day) has two bars side by side: runs started, and
runs finished, stacked by outcome (completed, failed, cancelled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from kumiko_workflows.operations.dashboard import Series

#: The finished bar's segments, bottom first.
STACK = ("completed", "failed", "cancelled")


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str
    title: str


@dataclass
class Tick:
    x: float
    text: str


@dataclass
class Grid:
    y: float
    text: str


@dataclass
class Chart:
    width: int
    height: int
    #: The plot area's left and bottom edges (the axis).
    left: int
    bottom: int
    bars: list[Bar] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    grid: list[Grid] = field(default_factory=list)
    #: One sentence saying what the chart shows (its accessible name).
    summary: str = ""


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``value`` (1 for 0)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def bar_chart(
    series: Series,
    label: Callable[[datetime], str],
    *,
    width: int = 720,
    height: int = 200,
    tick_every: int = 3,
    what: str = "",
    compact: bool = False,
) -> Chart:
    """The geometry of ``series`` drawn ``width`` × ``height`` (SVG user units).

    ``label`` names a bucket (its start) on the axis and in bar titles;
    every ``tick_every``-th bucket gets a tick label. ``compact``: no
    margins, grid or ticks (a sparkline beside its figures).
    """
    left, right, top, bottom_pad = (0, 0, 1, 0) if compact else (44, 8, 10, 26)
    bottom = height - bottom_pad
    plot_w, plot_h = width - left - right, bottom - top
    count = len(series.starts) or 1
    slot = plot_w / count
    bar_w = max(1.0, slot * 0.38)
    peak = series.peak()
    ceiling = nice_ceiling(peak)
    scale = plot_h / ceiling
    chart = Chart(width, height, left, bottom)
    lines = (0, ceiling // 2, ceiling) if ceiling % 2 == 0 else (0, ceiling)
    for value in () if compact else lines:
        chart.grid.append(Grid(round(bottom - value * scale, 1), f"{value:,}"))
    for i, start in enumerate(series.starts):
        x = left + i * slot + slot * 0.1
        name = label(start)
        started = series.counts["started"][i]
        if started:
            chart.bars.append(
                Bar(
                    round(x, 1),
                    round(bottom - started * scale, 1),
                    round(bar_w, 1),
                    round(started * scale, 1),
                    "started",
                    f"{name}: {started:,} started",
                )
            )
        y = float(bottom)
        for kind in STACK:
            n = series.counts[kind][i]
            if not n:
                continue
            h = n * scale
            y -= h
            chart.bars.append(
                Bar(
                    round(x + bar_w + 1, 1),
                    round(y, 1),
                    round(bar_w, 1),
                    round(h, 1),
                    kind,
                    f"{name}: {n:,} {kind}",
                )
            )
        if not compact and (count - 1 - i) % tick_every == 0:  # the latest always named
            chart.ticks.append(Tick(round(x + bar_w, 1), name))
    totals = ", ".join(f"{series.total(kind):,} {kind}" for kind in ("started", *STACK))
    chart.summary = f"{what}: {totals}" if what else totals
    return chart
