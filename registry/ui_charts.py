"""Small SVG sparklines of a version's last minutes of traffic, drawn on the server: no chart library, no script.

An inference process reports its traffic per loaded version as up to ``TRAFFIC_BUCKETS`` intervals of
``TRAFFIC_BUCKET_SECONDS`` (``registry.serving.TrafficBucket``). Here they are laid on the fixed
window that ends at the process's last heartbeat, so an idle interval shows as zero requests and
a gap in the latency lines, and each series becomes the ``points`` of SVG polylines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from registry.serving import TRAFFIC_BUCKET_SECONDS, TRAFFIC_BUCKETS, TrafficBucket

WIDTH = 120
HEIGHT = 28
PAD = 2


@dataclass(frozen=True)
class Sparkline:
    """One series: polyline segments (SVG ``points``), the latest value and the largest, as text."""

    label: str
    segments: tuple[str, ...]
    latest: str
    peak: str
    width: int = WIDTH
    height: int = HEIGHT


def _text(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}{unit}"


def sparkline(label: str, values: Sequence[float | None], unit: str = "", *, idle: float | None = None) -> Sparkline:
    """Scale ``values`` (one per interval, None for no data) into the box.

    None breaks the line, unless ``idle`` says what an interval without requests counts as (0 for a
    rate). "Now" is the newest of the last two intervals that saw requests: the newest one has only
    just begun.
    """
    recent = next((v for v in reversed(values[-2:]) if v is not None), idle)
    if idle is not None:
        values = [idle if v is None else v for v in values]
    known = [v for v in values if v is not None]
    top = max(known, default=0.0) or 1.0
    step = (WIDTH - 2 * PAD) / max(1, len(values) - 1)
    segments: list[str] = []
    current: list[str] = []
    for index, value in enumerate(values):
        if value is None:
            if current:
                segments.append(" ".join(current))
            current = []
            continue
        x = PAD + index * step
        y = HEIGHT - PAD - (value / top) * (HEIGHT - 2 * PAD)
        current.append(f"{x:.1f},{y:.1f}")
    if current:
        segments.append(" ".join(current))
    # A lone point draws nothing as a polyline: make it a short dash.
    segments = [seg if " " in seg else f"{_nudge(seg)} {seg}" for seg in segments]
    return Sparkline(
        label=label,
        segments=tuple(segments),
        latest=_text(recent, unit),
        peak=_text(max(known) if known else None, unit),
    )


def _nudge(point: str) -> str:
    x, y = point.split(",")
    return f"{max(0.0, float(x) - 3):.1f},{y}"


def traffic_charts(buckets: Sequence[TrafficBucket], *, until: datetime) -> list[Sparkline]:
    """requests/s, p50 and p99 latency (ms) and errors over the window that ends at ``until``."""
    last = int(until.timestamp() // TRAFFIC_BUCKET_SECONDS)
    slots: list[TrafficBucket | None] = [None] * TRAFFIC_BUCKETS
    for bucket in buckets:
        position = int(bucket.start // TRAFFIC_BUCKET_SECONDS) - (last - TRAFFIC_BUCKETS + 1)
        if 0 <= position < TRAFFIC_BUCKETS:
            slots[position] = bucket
    return [
        sparkline("requests/s", [b.rate if b else None for b in slots], idle=0.0),
        sparkline("p50", [b.p50_ms if b else None for b in slots], " ms"),
        sparkline("p99", [b.p99_ms if b else None for b in slots], " ms"),
        sparkline("errors", [float(b.errors) if b else None for b in slots], idle=0.0),
    ]
