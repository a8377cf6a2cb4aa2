"""Prometheus metrics of the data plane: requests, latency, batches and queues by model and version.

Every metric here is made on ``modelyard.metrics.REGISTRY``; ``modelyard serve`` puts the process
in prometheus_client's multiprocess mode, so a scrape of any process of a server gives the sums
over all of them (see ``modelyard/metrics.py``). Gauges say how they add up across processes.

Labels are bounded: ``model`` is a model this process is meant to serve, or ``_unknown`` for any
other name from a URL; ``version`` is a version it loaded, or empty when no version answered
(unknown model, not loaded yet, refused before routing).

The request path touches no label dictionary: each loaded version gets a :class:`VersionMetrics`
with its children made once, and a request costs a dictionary lookup by status, one counter
increment and one histogram observation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from inference import telemetry
from modelyard import metrics as exposition

UNKNOWN_MODEL = "_unknown"
NO_VERSION = ""

REQUESTS = Counter(
    "modelyard_inference_requests",
    "Inference requests answered, by model, version and HTTP status",
    ["model", "version", "status"],
    registry=exposition.REGISTRY,
)
LATENCY = Histogram(
    "modelyard_inference_request_seconds",
    "Time from request to response, by model and version",
    ["model", "version"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1, 2, 5),
    registry=exposition.REGISTRY,
)
BATCH_SIZE = Histogram(
    "modelyard_batch_requests",
    "Requests merged into one ONNX Runtime run, by model and version",
    ["model", "version"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=exposition.REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "modelyard_queue_depth",
    "Requests waiting in a version's batcher (summed over the server's processes)",
    ["model", "version"],
    multiprocess_mode="livesum",
    registry=exposition.REGISTRY,
)
SWAPS = Counter(
    "modelyard_model_swaps",
    "Hot swaps: an alias of a model moved to another loaded version in an inference process",
    ["model", "alias"],
    registry=exposition.REGISTRY,
)
LOAD_FAILURES = Gauge(
    "modelyard_model_load_failures",
    "Failed attempts in a row to load a version this server should serve (0 once loaded or no longer wanted)",
    ["model", "version"],
    multiprocess_mode="livemax",
    registry=exposition.REGISTRY,
)

VERIFY_FAILURES = Counter(
    "modelyard_model_verify_failures",
    "Loads refused because the bytes read do not match the version's signatures (or it has none trusted)",
    ["model", "version"],
    registry=exposition.REGISTRY,
)


class VersionMetrics:
    """The label children of one loaded version, made once so the request path does no label lookup."""

    __slots__ = ("_lock", "_queued", "_requests", "batch", "latency", "model", "queue", "version")

    def __init__(self, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self.latency = LATENCY.labels(model, version)
        self.batch = BATCH_SIZE.labels(model, version)
        self.queue = QUEUE_DEPTH.labels(model, version) if version else None
        # The depth last set, so the gauge is written only when it changes. Both are set under the lock:
        # the loop thread and the batcher's threads set the depth.
        self._queued = -1
        self._lock = threading.Lock()
        self._requests: dict[int, Any] = {}

    def answered(self, status: int, seconds: float) -> None:
        """One request answered with ``status`` after ``seconds``."""
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = REQUESTS.labels(self.model, self.version, str(status))
        child.inc()
        self.latency.observe(seconds)

    def batched(self, requests: int, queued: int) -> None:
        """One ONNX Runtime run of ``requests`` merged requests, with ``queued`` still waiting."""
        self.batch.observe(requests)
        self.queue_depth(queued)

    def queue_depth(self, queued: int) -> None:
        if self.queue is None:
            return
        with self._lock:
            if queued != self._queued:
                self._queued = queued
                self.queue.set(queued)

    def retire(self) -> None:
        """The version is unloaded: nothing waits in its queue any more.

        In multiprocess mode the value lives in this process's file until it exits, so it is set
        to 0 before the child is dropped, or the sum would keep the last depth.
        """
        if self.queue is not None:
            self.queue_depth(0)
            try:
                QUEUE_DEPTH.remove(self.model, self.version)
            except KeyError:
                pass


RESPONSE_CACHE_HITS = Counter(
    "modelyard_response_cache_hits",
    "Inference requests answered from an alias's response cache, by model and version",
    ["model", "version"],
    registry=exposition.REGISTRY,
)
RESPONSE_CACHE_MISSES = Counter(
    "modelyard_response_cache_misses",
    "Inference requests through a caching alias that the cache could not answer, by model and version",
    ["model", "version"],
    registry=exposition.REGISTRY,
)
RESPONSE_CACHE_EVICTIONS = Counter(
    "modelyard_response_cache_evictions",
    "Response cache entries pushed out by the alias's byte bound (not by their TTL), by model and version",
    ["model", "version"],
    registry=exposition.REGISTRY,
)
RESPONSE_CACHE_BYTES = Gauge(
    "modelyard_response_cache_bytes",
    "Bytes of cached answers held in the inference processes' memory (summed over them), by model and version",
    ["model", "version"],
    multiprocess_mode="livesum",
    registry=exposition.REGISTRY,
)


class CacheMetrics:
    """The response cache's label children of one loaded version, made once (``inference/response_cache.py``)."""

    __slots__ = ("_bytes", "evictions", "hits", "misses", "model", "nbytes", "version")

    def __init__(self, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self.hits = RESPONSE_CACHE_HITS.labels(model, version)
        self.misses = RESPONSE_CACHE_MISSES.labels(model, version)
        self.evictions = RESPONSE_CACHE_EVICTIONS.labels(model, version)
        self._bytes = RESPONSE_CACHE_BYTES.labels(model, version)
        self.nbytes = 0

    def held(self, delta: int) -> None:
        """``delta`` bytes more (or fewer) of this version's answers held in memory."""
        self.nbytes += delta
        self._bytes.set(self.nbytes)

    def retire(self) -> None:
        """The version is released: its bytes are gone (set to 0 first, as :meth:`VersionMetrics.retire` says)."""
        self._bytes.set(0)
        self.nbytes = 0
        try:
            RESPONSE_CACHE_BYTES.remove(self.model, self.version)
        except KeyError:
            pass


JOB_ROWS = Counter(
    "modelyard_inference_job_rows",
    "Rows of asynchronous inference jobs computed by this server's processes, by model",
    ["model"],
    registry=exposition.REGISTRY,
)
JOB_CHUNK_RETRIES = Counter(
    "modelyard_inference_job_chunk_retries",
    "Inference job chunks taken again after their earlier attempt failed or its lease lapsed, by model",
    ["model"],
    registry=exposition.REGISTRY,
)
CLASS_QUEUE_DEPTH = Gauge(
    "modelyard_priority_queue_depth",
    "Requests waiting in the batchers by priority class (high, normal, low, job; summed over processes)",
    ["priority"],
    multiprocess_mode="livesum",
    registry=exposition.REGISTRY,
)


def job_rows(model: str, rows: int) -> None:
    """``rows`` more rows of an inference job of ``model`` computed here."""
    JOB_ROWS.labels(model).inc(rows)


def job_chunk_retry(model: str) -> None:
    """A chunk of an inference job of ``model`` taken here for a second (or later) attempt."""
    JOB_CHUNK_RETRIES.labels(model).inc()


def class_queue_depths(depths: Mapping[str, int]) -> None:
    """The requests waiting in this process's batchers, by class (``inference.batcher.CLASS_NAMES``)."""
    for name, depth in depths.items():
        CLASS_QUEUE_DEPTH.labels(name).set(depth)


_unrouted: dict[str, VersionMetrics] = {}


def unrouted(model: str) -> VersionMetrics:
    """The metrics of requests no version answered, for ``model`` (a served name or ``_unknown``)."""
    found = _unrouted.get(model)
    if found is None:
        found = _unrouted[model] = VersionMetrics(model, NO_VERSION)
    return found


class _Loaded(Protocol):
    """What a routing table holds, as far as swaps are counted (``inference.loaded.LoadedVersion``)."""

    @property
    def version_label(self) -> str: ...


def count_swaps(old: Mapping[str, Mapping[str, _Loaded]], new: Mapping[str, Mapping[str, _Loaded]]) -> None:
    """Count each alias whose route moved from one loaded version to another between two routing tables."""
    for model, routes in new.items():
        before = old.get(model)
        if not before:
            continue
        for alias, loaded in routes.items():
            if alias.isdigit():
                continue
            previous = before.get(alias)
            if previous is not None and previous is not loaded and previous.version_label != loaded.version_label:
                SWAPS.labels(model, alias).inc()


_failing: set[tuple[str, str]] = set()


def load_failures(failing: Mapping[tuple[str, int], int]) -> None:
    """Set the failed-attempt counts of versions that fail to load now, and 0 for those that stopped failing."""
    current = {(model, str(version)): attempts for (model, version), attempts in failing.items()}
    for key in _failing - set(current):
        LOAD_FAILURES.labels(*key).set(0)
    for key, attempts in current.items():
        LOAD_FAILURES.labels(*key).set(attempts)
    _failing.clear()
    _failing.update(current)


# --- Each version's share of an alias's requests (a rollout's split) --------------------------------

ALIAS_REQUESTS = Counter(
    "modelyard_alias_requests",
    "Inference requests routed through an alias, by model, alias and the version that answered",
    ["model", "alias", "version"],
    registry=exposition.REGISTRY,
)
_alias_children: dict[tuple[str, str, str], Any] = {}


def alias_answered(model: str, alias: str | None, version: str) -> None:
    """One request through ``alias`` (None: production) answered (or failed) by ``version``."""
    key = (model, alias or "production", version)
    child = _alias_children.get(key)
    if child is None:
        child = _alias_children[key] = ALIAS_REQUESTS.labels(*key)
    child.inc()


# --- Shadow traffic (inference/shadow.py) -------------------------------------------------------------

SHADOW_MIRRORED = Counter(
    "modelyard_shadow_requests",
    "Requests mirrored to a shadow candidate, by model, alias and outcome (compared, candidate_error, primary_error)",
    ["model", "alias", "outcome"],
    registry=exposition.REGISTRY,
)
SHADOW_DROPPED = Counter(
    "modelyard_shadow_dropped",
    "Sampled requests not mirrored to the shadow, by model, alias and reason (queue_full, busy, unloaded)",
    ["model", "alias", "reason"],
    registry=exposition.REGISTRY,
)


def shadow_mirrored(model: str, alias: str, outcome: str) -> None:
    SHADOW_MIRRORED.labels(model, alias, outcome).inc()


def shadow_dropped(model: str, alias: str, reason: str) -> None:
    SHADOW_DROPPED.labels(model, alias, reason).inc()


# --- GPU telemetry -----------------------------------------------------------------------------------

GPU_LABELS = ["gpu", "name"]


class GpuCollector:
    """Reads every GPU's utilisation, memory, temperature and power through NVML at scrape time.

    The readings are of the devices, the same whichever process of the server reads them, so they
    are read live by the process that answers the scrape rather than summed over files. Without
    NVML or a GPU the collector yields nothing: the metrics are absent, not zero.
    """

    def describe(self) -> Iterator[Metric]:
        return iter(self._families([]))

    def collect(self) -> Iterator[Metric]:
        devices = telemetry.read_devices()
        return iter(self._families(devices) if devices else [])

    @staticmethod
    def _families(devices: list[telemetry.DeviceReading]) -> list[Metric]:
        families = {
            "utilization": GaugeMetricFamily(
                "modelyard_gpu_utilization_ratio",
                "Share of the last sample period in which a kernel ran on the GPU (NVML), 0 to 1",
                labels=GPU_LABELS,
            ),
            "memory_used": GaugeMetricFamily(
                "modelyard_gpu_memory_used_bytes", "GPU memory in use, all processes (NVML)", labels=GPU_LABELS
            ),
            "memory_total": GaugeMetricFamily(
                "modelyard_gpu_memory_total_bytes", "GPU memory installed (NVML)", labels=GPU_LABELS
            ),
            "temperature": GaugeMetricFamily(
                "modelyard_gpu_temperature_celsius", "GPU core temperature (NVML)", labels=GPU_LABELS
            ),
            "power": GaugeMetricFamily("modelyard_gpu_power_watts", "GPU power draw (NVML)", labels=GPU_LABELS),
        }
        for device in devices:
            labels = [str(device.index), device.name]
            for key, value in (
                ("utilization", device.utilization),
                ("memory_used", device.memory_used_bytes),
                ("memory_total", device.memory_total_bytes),
                ("temperature", device.temperature_celsius),
                ("power", device.power_watts),
            ):
                if value is not None:  # a reading the device does not support is left out
                    families[key].add_metric(labels, value)
        return list(families.values())


GPU = GpuCollector()
exposition.add_collector(GPU)


def render() -> tuple[bytes, str]:
    """The exposition of this server (blocking: run it in a thread)."""
    return exposition.render()
