"""What the runtime adds to ``/metrics``: hot swaps by model and alias, and versions that fail to load.

Real registry, storage and ONNX Runtime; the runtime is driven pass by pass.
"""

from __future__ import annotations

import pytest

from modelyard import metrics as exposition
from tests.support.polling import reconcile_until
from tests.support.prometheus import value
from tests.support.registry import artifact_path, create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)


def scraped(name: str, **labels: str) -> float:
    body, _ = exposition.render()
    return value(body.decode(), name, **labels)


def serving(runtime) -> int | None:
    loaded = runtime.router.resolve("demo")
    return loaded.spec.version if loaded is not None else None


def test_an_alias_moving_to_another_loaded_version_counts_one_swap(owner, approver, make_runtime):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    before = scraped("modelyard_model_swaps_total", model="demo", alias="production")
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 not served")
    assert scraped("modelyard_model_swaps_total", model="demo", alias="production") == before  # a first load is no swap

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 not served")
    for _ in range(3):
        runtime.reconcile_once()
    assert scraped("modelyard_model_swaps_total", model="demo", alias="production") == before + 1


def test_a_version_failing_to_load_is_counted_until_it_is_no_longer_wanted(owner, approver, make_runtime):
    create_model(owner)
    v1, _ = upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    artifact_path(v1).unlink()  # v1 can never load
    runtime = make_runtime()
    reconcile_until(runtime, lambda: runtime.status.failures, what="v1 never failed")
    assert scraped("modelyard_model_load_failures", model="demo", version="1") == 1

    promote(owner, approver, 2)  # v1 is no longer wanted: its count goes back to 0
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 not served")
    assert scraped("modelyard_model_load_failures", model="demo", version="1") == 0
    assert scraped("modelyard_model_load_failures", model="demo", version="2") == 0


def test_the_queue_depth_gauge_is_written_only_when_it_changes(monkeypatch):
    """Each request reports its version's queue depth; in multiprocess mode a write is a file write."""
    from inference.metrics import VersionMetrics

    counted = VersionMetrics("demo-depth", "1")
    writes: list[float] = []
    write = counted.queue.set

    def recording(value: float) -> None:
        writes.append(value)
        write(value)

    monkeypatch.setattr(counted.queue, "set", recording)
    for depth in (0, 0, 0, 3, 3, 1, 0, 0):
        counted.queue_depth(depth)
    assert writes == [0, 3, 1, 0]
    assert scraped("modelyard_queue_depth", model="demo-depth", version="1") == 0
    counted.queue_depth(2)
    assert scraped("modelyard_queue_depth", model="demo-depth", version="1") == 2
    counted.retire()  # back to 0, then the series is gone
    assert writes == [0, 3, 1, 0, 2, 0]
