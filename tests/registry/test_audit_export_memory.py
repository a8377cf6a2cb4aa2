"""Exporting a large audit log streams in constant memory instead of loading every event."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import pytest

from registry.models import AuditEvent, Role
from tests.support.audit_factory import append_bulk_events
from tests.support.people import make_person

# Slow (about two minutes on a busy machine): left out of a plain `pytest`; `make test` runs it first.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

EVENTS = 100_000
# Streaming holds one chunk of 2,000 rows at a time and peaks near 10 MB. The bound is below the
# size of either export body, so holding the body, or the rows, would fail it.
PEAK_BOUND = 25 * 1024 * 1024

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


def test_export_of_100k_events_streams_in_constant_memory(db):
    auditor = make_person("auditor", Role.AUDITOR)
    append_bulk_events(EVENTS)
    total = AuditEvent.objects.count()
    assert total > EVENTS

    # CSV's header; JSONL's signed head at its end.
    for fmt, header_lines in [("csv", 1), ("jsonl", 1)]:
        response = auditor.get(f"/api/v1/audit/export?format={fmt}")
        assert response.status_code == 200
        (lines, size), peak = _peak_while(partial(_count_lines, response))
        assert lines == total + header_lines
        assert size > PEAK_BOUND
        assert peak < PEAK_BOUND, f"{fmt}: peak {peak / 2**20:.1f} MB while streaming {size / 2**20:.0f} MB"


def test_the_memory_bound_would_catch_a_materialised_export(db):
    # Measured: all 100,000 events as model instances peak at about 235 MB; a fifth of them
    # already exceeds the bound.
    append_bulk_events(EVENTS // 5)
    events, peak = _peak_while(lambda: list(AuditEvent.objects.all()))
    assert len(events) == EVENTS // 5
    assert peak > PEAK_BOUND, f"loading a fifth of the events peaked at only {peak / 2**20:.1f} MB"
