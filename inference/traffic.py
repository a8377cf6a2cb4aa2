"""Rolling traffic figures of one loaded version, for the fleet page: requests/s, p50/p99 latency and errors.

Each inference process reports these with its heartbeat (``registry.serving.LoadedRow.traffic``),
so the registry draws the last minutes of traffic per version without a Prometheus server. The
hot path pays one call per request: :meth:`Traffic.watch` adds a done-callback to the request's
future, which files the request into the current bucket of a fixed ring (``BUCKETS`` buckets of
``BUCKET_SECONDS`` each, five minutes in all) under one lock that nothing holds for long.

Latencies go into a fixed log-scale histogram per bucket (bins ``2**(1/4)`` apart, so a quantile
is known to within about 19 %, from 0.1 ms to two minutes), which costs the same whatever the
traffic. A quantile is reported as the upper edge of the bin it falls in.

Counted: every request that reached the version's batcher and ended with outputs (a request) or an
error (a request and an error: a failed ONNX Runtime run, a queue timeout, running out of memory).
A request whose client went away before it ran is not counted. Requests refused before they reach
the batcher (a full queue, say) are Prometheus's to count (``inference/metrics.py``).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from registry.serving import (
    TRAFFIC_BUCKET_SECONDS,
    TRAFFIC_BUCKETS,
    TRAFFIC_LATENCY_BOUNDS,
    TRAFFIC_LATENCY_RATIO,
    TrafficBucket,
    TrafficTotals,
)

BUCKET_SECONDS = TRAFFIC_BUCKET_SECONDS
BUCKETS = TRAFFIC_BUCKETS  # five minutes
_RATIO = TRAFFIC_LATENCY_RATIO
# Upper edges of the latency bins; one more bin past the last catches anything slower.
BOUNDS: tuple[float, ...] = TRAFFIC_LATENCY_BOUNDS


class _Bucket:
    """The requests of one ``BUCKET_SECONDS`` interval, by its index since the epoch."""

    __slots__ = ("errors", "histogram", "index", "requests")

    def __init__(self) -> None:
        self.index = -1
        self.requests = 0
        self.errors = 0
        self.histogram = [0] * (len(BOUNDS) + 1)

    def reset(self, index: int) -> None:
        self.index = index
        self.requests = 0
        self.errors = 0
        self.histogram = [0] * (len(BOUNDS) + 1)

    def quantile_ms(self, q: float) -> float | None:
        if not self.requests:
            return None
        rank = max(1, math.ceil(q * self.requests))
        seen = 0
        for position, count in enumerate(self.histogram):
            seen += count
            if seen >= rank:
                edge = BOUNDS[position] if position < len(BOUNDS) else BOUNDS[-1] * _RATIO
                return float(f"{edge * 1000:.3g}")
        raise AssertionError("the histogram holds fewer requests than counted")  # pragma: no cover


class Traffic:
    """The ring of buckets of one loaded version. ``clock`` returns seconds since the epoch (tests pass their own)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ring = [_Bucket() for _ in range(BUCKETS)]
        # Since the version loaded: what a rollout's step is measured from (deltas between two reports).
        self._total = _Bucket()

    def record(self, seconds: float, *, error: bool = False) -> None:
        """File one finished request that took ``seconds``."""
        index = int(self._clock() // BUCKET_SECONDS)
        position = bisect_left(BOUNDS, seconds)
        with self._lock:
            bucket = self._ring[index % BUCKETS]
            if bucket.index != index:
                bucket.reset(index)
            bucket.requests += 1
            bucket.errors += error
            bucket.histogram[position] += 1
            total = self._total
            total.requests += 1
            total.errors += error
            total.histogram[position] += 1

    def watch(self, future: asyncio.Future[Any]) -> None:
        """Record the request behind ``future`` when it finishes: the data plane's one call per request."""
        started = time.perf_counter()

        def done(finished: asyncio.Future[Any]) -> None:
            if finished.cancelled():
                return  # the client went away: nothing was served
            self.record(time.perf_counter() - started, error=finished.exception() is not None)

        future.add_done_callback(done)

    def summary(self) -> tuple[TrafficBucket, ...]:
        """The buckets of the last ``BUCKETS * BUCKET_SECONDS`` seconds that saw requests, oldest first.

        The current bucket is still filling: its ``seconds`` is how much of it has passed, so that
        requests/s stays right.
        """
        now = self._clock()
        current = int(now // BUCKET_SECONDS)
        with self._lock:
            live = sorted(
                (b for b in self._ring if current - BUCKETS < b.index <= current and b.requests),
                key=lambda b: b.index,
            )
            return tuple(
                TrafficBucket(
                    start=float(b.index * BUCKET_SECONDS),
                    seconds=BUCKET_SECONDS if b.index < current else max(1.0, round(now - b.index * BUCKET_SECONDS, 3)),
                    requests=b.requests,
                    errors=b.errors,
                    p50_ms=b.quantile_ms(0.5),
                    p99_ms=b.quantile_ms(0.99),
                )
                for b in live
            )

    def totals(self) -> TrafficTotals:
        """Every request since the version loaded: counts, and the latency histogram's non-empty bins."""
        with self._lock:
            total = self._total
            return TrafficTotals(
                requests=total.requests,
                errors=total.errors,
                latency={str(i): n for i, n in enumerate(total.histogram) if n},
            )
