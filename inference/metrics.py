"""Prometheus metrics of the data plane (per process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "modelyard_inference_requests", "Inference requests by model and status", ["model", "status"], registry=REGISTRY
)
LATENCY = Histogram(
    "modelyard_inference_request_seconds",
    "Time from request to response",
    ["model"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "modelyard_batch_requests",
    "Requests merged into one ONNX Runtime run",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge("modelyard_queue_depth", "Requests waiting in a batcher", ["model", "version"], registry=REGISTRY)


def render() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
