"""Exporting a large audit log streams in constant memory instead of loading every event.

Constant means it does not grow with the log: each export is measured at 2,500 events and again at
7,500, and its peak must stay put (within a chunk's worth) and under a fixed bound. Holding the rows,
or the body, would triple the peak; the second test shows the measure sees exactly that.

The export's chunk is made 500 rows here instead of 2,000, so that the logs are 5 and 15 chunks long,
as they would be at 10,000 and 30,000 events, in a quarter of the rows (tracemalloc slows every
allocation several times: 8 s against 26 s for the two tests at the larger sizes).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import pytest

from registry.api import audit_views
from registry.models import AuditEvent, AuditHeadSignature, Role
from tests.support.audit_factory import append_bulk_events
from tests.support.people import make_person

# Slow (tens of seconds on a busy machine): left out of a plain `pytest`; `make test` runs it first.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SMALL, LARGE = 2_500, 7_500
CHUNK = 500
# Streaming holds one chunk of 500 rows at a time and peaks near 2.5 MB, whatever the log's length.
PEAK_BOUND = 8 * 1024 * 1024
# How much the peak may move between the two sizes: well under one chunk's rows as model instances
# (about 1.1 MB: 2.3 KB a row), and under the growth of a held body (2.2 MB of CSV, 3 MB of JSONL).
GROWTH_BOUND = 512 * 1024

T = TypeVar("T")


def _peak_while(consume: Callable[[], T]) -> tuple[T, int]:
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        result = consume()
        return result, tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()


def _count_lines(response) -> tuple[int, int]:
    lines = size = 0
    for chunk in response.streaming_content:
        lines += chunk.count(b"\n")
        size += len(chunk)
    return lines, size


def _export_peaks(auditor) -> dict[str, tuple[int, int]]:
    """Each format's (peak, body size), checking that every event came out (plus CSV's header, JSONL's signed head)."""
    total = AuditEvent.objects.count()
    peaks = {}
    for fmt in ("csv", "jsonl"):
        response = auditor.get(f"/api/v1/audit/export?format={fmt}")
        assert response.status_code == 200
        (lines, size), peak = _peak_while(partial(_count_lines, response))
        trailer = 1 if fmt == "csv" else AuditHeadSignature.objects.count()  # each export signed a head
        assert lines == total + trailer, fmt
        peaks[fmt] = (peak, size)
    return peaks


def test_an_export_streams_in_memory_that_does_not_grow_with_the_log(db, monkeypatch):
    monkeypatch.setattr(audit_views, "EXPORT_CHUNK", CHUNK)
    auditor = make_person("auditor", Role.AUDITOR)
    append_bulk_events(SMALL)
    small = _export_peaks(auditor)
    append_bulk_events(LARGE - SMALL)
    large = _export_peaks(auditor)

    for fmt in ("csv", "jsonl"):
        (small_peak, small_size), (large_peak, large_size) = small[fmt], large[fmt]
        assert large_size > 2.5 * small_size, fmt  # three times the events, three times the body
        assert large_peak - small_peak < GROWTH_BOUND, (
            f"{fmt}: peak {small_peak / 2**20:.1f} MB at {SMALL} events, {large_peak / 2**20:.1f} MB at {LARGE}"
        )
        assert large_peak < PEAK_BOUND, fmt


def test_the_measure_would_catch_a_materialised_export(db):
    # Loading the events as model instances, as an export that held its rows would: the peak triples.
    append_bulk_events(SMALL)
    events, small_peak = _peak_while(lambda: list(AuditEvent.objects.all()))
    assert len(events) == SMALL
    del events
    append_bulk_events(LARGE - SMALL)
    events, large_peak = _peak_while(lambda: list(AuditEvent.objects.all()))
    assert len(events) == LARGE
    assert large_peak - small_peak > 5 * GROWTH_BOUND, (
        f"{small_peak / 2**20:.1f} MB at {SMALL} events, {large_peak / 2**20:.1f} MB at {LARGE}"
    )
