"""GPU telemetry through NVML: absent without a GPU, exact readings with one (a stand-in NVML), and in the fleet.

This machine has no GPU: the absent path runs the real ``pynvml``, which finds no NVML library. The
present path puts a stand-in module in ``sys.modules`` for the collector only.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model

from inference import telemetry
from inference.metrics import GPU
from modelyard import metrics as exposition
from registry.models import InferenceWorker
from tests.support.nvml import FakeGpu, fake_pynvml
from tests.support.prometheus import samples

GIB = 1024**3
H200 = FakeGpu("NVIDIA H200", 97, 130 * GIB, 141 * GIB, 61, 412_500)
NO_POWER = FakeGpu("NVIDIA L4", 3, 1 * GIB, 24 * GIB, 40, None)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([H200, NO_POWER]))
    telemetry.reset()
    yield
    telemetry.reset()


@pytest.fixture(autouse=True)
def _inference_exposition(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scrape of an inference process: GPU telemetry is its only collector (importing ``modelyard.asgi``,
    as other tests in this process may have, adds the registry's, which reads the database)."""
    monkeypatch.setattr(exposition, "_collectors", [GPU])


@pytest.fixture
def real_nvml() -> Iterator[None]:
    telemetry.reset()
    yield
    telemetry.reset()


def gpu_samples() -> list[tuple[str, dict[str, str], float]]:
    body, _ = exposition.render()
    return [s for s in samples(body.decode()) if s[0].startswith("modelyard_gpu_")]


def test_without_a_gpu_the_gpu_metrics_are_absent_and_nothing_fails(real_nvml, caplog):
    pytest.importorskip("pynvml")
    caplog.set_level(logging.INFO, logger="inference.telemetry")
    assert telemetry.read_devices() == []
    assert gpu_samples() == []
    body, _ = exposition.render()
    assert b"modelyard_gpu_" not in body  # not even HELP lines: absent, not zero
    assert telemetry.read_devices() == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "inference.telemetry"]
    assert line.startswith("no GPU telemetry: NVML could not start:")  # said once, not per scrape


def test_without_nvidia_ml_py_the_gpu_metrics_are_absent(real_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert telemetry.read_devices() == []
    assert gpu_samples() == []


def test_each_gpu_is_read_per_scrape_with_what_it_supports(nvml):
    labels = [{"gpu": "0", "name": "NVIDIA H200"}, {"gpu": "1", "name": "NVIDIA L4"}]
    assert sorted(gpu_samples(), key=lambda s: (s[0], s[1]["gpu"])) == [
        ("modelyard_gpu_memory_total_bytes", labels[0], 141 * GIB),
        ("modelyard_gpu_memory_total_bytes", labels[1], 24 * GIB),
        ("modelyard_gpu_memory_used_bytes", labels[0], 130 * GIB),
        ("modelyard_gpu_memory_used_bytes", labels[1], 1 * GIB),
        ("modelyard_gpu_power_watts", labels[0], 412.5),  # the L4 reports no power: left out, not 0
        ("modelyard_gpu_temperature_celsius", labels[0], 61.0),
        ("modelyard_gpu_temperature_celsius", labels[1], 40.0),
        ("modelyard_gpu_utilization_ratio", labels[0], 0.97),
        ("modelyard_gpu_utilization_ratio", labels[1], 0.03),
    ]
    H200.utilisation_percent = 12
    try:
        assert ("modelyard_gpu_utilization_ratio", labels[0], 0.12) in gpu_samples()  # read again, live
    finally:
        H200.utilisation_percent = 97
    assert sys.modules["pynvml"].inits == 1  # NVML started once


def test_the_collector_describes_every_gpu_metric_it_can_export():
    assert sorted(family.name for family in GPU.describe()) == [
        "modelyard_gpu_memory_total_bytes",
        "modelyard_gpu_memory_used_bytes",
        "modelyard_gpu_power_watts",
        "modelyard_gpu_temperature_celsius",
        "modelyard_gpu_utilization_ratio",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_fleet_shows_each_workers_gpu_memory_in_use(nvml, make_runtime, admin):
    runtime = make_runtime("gpu-host-1")
    runtime.heartbeat()
    assert InferenceWorker.objects.get(worker_id="gpu-host-1").devices == [
        {"index": 0, "name": "NVIDIA H200", "memory_used_bytes": 130 * GIB, "memory_total_bytes": 141 * GIB},
        {"index": 1, "name": "NVIDIA L4", "memory_used_bytes": 1 * GIB, "memory_total_bytes": 24 * GIB},
    ]
    [worker] = admin.get("/api/v1/fleet").json()
    assert worker["devices"][0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "memory_used_bytes": 130 * GIB,
        "memory_total_bytes": 141 * GIB,
    }
    admin.client.force_login(get_user_model().objects.get(username=admin.username))
    page = admin.client.get("/ui/fleet").content.decode()
    assert "GPU 0 NVIDIA H200: 130.0\xa0GB of 141.0\xa0GB in use" in page


@pytest.mark.django_db(transaction=True)
def test_without_a_gpu_the_fleet_row_has_no_devices(real_nvml, make_runtime, admin):
    runtime = make_runtime("cpu-host-1")
    runtime.heartbeat()
    [worker] = admin.get("/api/v1/fleet").json()
    assert worker["devices"] == []
