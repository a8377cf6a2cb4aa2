"""Small SVG line charts of a version's last minutes of traffic, drawn on the server: no chart library, no script.

An inference process reports its traffic per loaded version as up to ``TRAFFIC_BUCKETS`` intervals of
``TRAFFIC_BUCKET_SECONDS`` (``registry.serving.TrafficBucket``). Here they are laid on the fixed
window that ends at the process's last heartbeat, so an idle interval shows as zero requests and
a gap in the latency lines, and each series becomes the ``points`` of SVG polylines inside a plot
with its axes: the value axis from 0 to a round number in the series' unit, the time axis in
minutes before the newest interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from registry.serving import TRAFFIC_BUCKET_SECONDS, TRAFFIC_BUCKETS, TrafficBucket

# The SVG's own units; the page scales the whole drawing, text included, to the width it has.
WIDTH = 240
HEIGHT = 110
LEFT = 34  # room for the value axis's labels
RIGHT = WIDTH - 8
TOP = 14  # room for the unit above the value axis
BOTTOM = HEIGHT - 18  # room for the time axis's labels


@dataclass(frozen=True)
class Chart:
    """One series: its polyline segments (SVG ``points``), its axes' ticks, and the latest and largest values."""

    label: str  # what the series is, as its accessible name says it ("requests/s", "p99")
    title: str
    unit: str  # of the value axis
    segments: tuple[str, ...]
    y_ticks: tuple[tuple[str, str], ...]  # (y, label), from 0 at the bottom
    x_ticks: tuple[tuple[str, str], ...]  # (x, label), oldest first
    latest: str
    peak: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = RIGHT
    top: int = TOP
    bottom: int = BOTTOM


def _text(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}{unit}"


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten that is at least ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 3, 4, 5, 6, 8, 10) if step * power >= value * (1 - 1e-9))


def _tick(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _y(value: float, top: float) -> float:
    return BOTTOM - (value / top) * (BOTTOM - TOP)


def line_chart(
    label: str,
    values: Sequence[float | None],
    *,
    title: str,
    unit: str,
    suffix: str = "",
    idle: float | None = None,
    bucket_seconds: float = TRAFFIC_BUCKET_SECONDS,
) -> Chart:
    """Plot ``values`` (one per interval, oldest first, None for no data) on axes in ``unit``.

    None breaks the line, unless ``idle`` says what an interval without requests counts as (0 for a
    rate). "Now" is the newest of the last two intervals that saw requests: the newest one has only
    just begun. ``suffix`` follows the latest and largest values in their text (" ms").
    """
    recent = next((v for v in reversed(values[-2:]) if v is not None), idle)
    if idle is not None:
        values = [idle if v is None else v for v in values]
    known = [v for v in values if v is not None]
    top = nice_ceiling(max(known, default=0.0))
    step = (RIGHT - LEFT) / max(1, len(values) - 1)
    segments: list[str] = []
    current: list[str] = []
    for index, value in enumerate(values):
        if value is None:
            if current:
                segments.append(" ".join(current))
            current = []
            continue
        current.append(f"{LEFT + index * step:.1f},{_y(value, top):.1f}")
    if current:
        segments.append(" ".join(current))
    # A lone point draws nothing as a polyline: make it a short dash.
    segments = [seg if " " in seg else f"{_nudge(seg)} {seg}" for seg in segments]
    y_ticks = tuple((f"{_y(value, top):.1f}", _tick(value)) for value in (0.0, top / 2, top))
    # The newest interval sits at the right edge; a tick each minute before it.
    span = max(1, len(values) - 1) * bucket_seconds
    minutes = range(int(span // 60), -1, -1)
    x_ticks = tuple(
        (f"{RIGHT - (minute * 60 / span) * (RIGHT - LEFT):.1f}", f"\u2212{minute} min" if minute else "now")
        for minute in minutes
    )
    return Chart(
        label=label,
        title=title,
        unit=unit,
        segments=tuple(segments),
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        latest=_text(recent, suffix),
        peak=_text(max(known) if known else None, suffix),
    )


def _nudge(point: str) -> str:
    x, y = point.split(",")
    return f"{max(float(LEFT), float(x) - 3):.1f},{y}"


def traffic_charts(buckets: Sequence[TrafficBucket], *, until: datetime) -> list[Chart]:
    """requests/s, p50 and p99 latency (ms) and errors over the window that ends at ``until``."""
    last = int(until.timestamp() // TRAFFIC_BUCKET_SECONDS)
    slots: list[TrafficBucket | None] = [None] * TRAFFIC_BUCKETS
    for bucket in buckets:
        position = int(bucket.start // TRAFFIC_BUCKET_SECONDS) - (last - TRAFFIC_BUCKETS + 1)
        if 0 <= position < TRAFFIC_BUCKETS:
            slots[position] = bucket
    per = f"per {TRAFFIC_BUCKET_SECONDS:g} s"
    return [
        line_chart("requests/s", [b.rate if b else None for b in slots], title="Requests", unit="requests/s", idle=0.0),
        line_chart("p50", [b.p50_ms if b else None for b in slots], title="p50 latency", unit="ms", suffix=" ms"),
        line_chart("p99", [b.p99_ms if b else None for b in slots], title="p99 latency", unit="ms", suffix=" ms"),
        line_chart(
            "errors", [float(b.errors) if b else None for b in slots], title="Errors", unit=f"errors {per}", idle=0.0
        ),
    ]
