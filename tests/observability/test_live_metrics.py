"""``/metrics`` of a real ``modelyard serve --role all --workers 2``: it adds up, and has what rules and dashboard
read; and its worker processes start with the server's cap on malloc arenas.

Before, each worker process had its own registry: successive scrapes flipped between the counts
of whichever process answered (8, then 3, ...), which Prometheus reads as counter resets.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from inference.metrics import JOB_CHUNK_RETRIES, JOB_ROWS, GpuCollector
from registry.tasks import verify_audit_chain
from tests.support.live import LiveServer, promote
from tests.support.polling import eventually
from tests.support.prometheus import (
    dashboard_expressions,
    metric_names,
    rule_expressions,
    samples,
    scrape,
    value,
)

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

REQUESTS = "modelyard_inference_requests_total"


def served_ok(live: LiveServer, version: str) -> float:
    return value(
        scrape(live.host, live.port, live.inference_token), REQUESTS, model="demo", version=version, status="200"
    )


def test_scrapes_of_a_two_worker_server_add_up_and_never_go_back(live: LiveServer):
    workers = live.workers()
    before = served_ok(live, "1")

    # Fresh connections until each worker has answered some (the kernel picks who accepts).
    sent = 0
    while sent < 40 or any(live.requests_counted_by(pid, model="demo", status="200") == 0 for pid in workers):
        assert live.infer("demo") == 200
        sent += 1
        assert sent < 400, "one worker took every request"
    per_worker = [live.requests_counted_by(pid, model="demo", version="1", status="200") for pid in workers]
    assert all(count > 0 for count in per_worker) and sum(per_worker) >= sent

    seen = [served_ok(live, "1") for _ in range(12)]
    assert seen == [before + sent] * 12  # every scrape, whichever worker answers it: the sum

    # A worker killed outright: its counts stay in the sum (uvicorn starts another in its place).
    live.kill_worker(workers[0])
    eventually(lambda: workers[0] not in live.workers(), timeout=30)
    live.wait_serving("demo", 1)
    assert [served_ok(live, "1") for _ in range(6)] == [before + sent] * 6
    for _ in range(10):
        assert live.infer("demo") == 200
    assert [served_ok(live, "1") for _ in range(6)] == [before + sent + 10] * 6


def test_requests_are_labelled_with_model_and_version_bounded_to_what_is_served(live: LiveServer):
    assert live.infer("broken") == 503  # promoted, never loaded: known, so it keeps its name
    assert live.infer("no-such-model-x") == 404
    assert live.infer("no-such-model-y") == 404
    exposition = scrape(live.host, live.port, live.inference_token)
    assert value(exposition, REQUESTS, model="broken", version="", status="503") >= 1
    assert value(exposition, REQUESTS, model="_unknown", version="", status="404") >= 2
    assert "no-such-model" not in exposition
    latency = {
        (lab["model"], lab["version"])
        for n, lab, _ in samples(exposition)
        if n == "modelyard_inference_request_seconds_count"
    }
    assert ("demo", "1") in latency and ("_unknown", "") in latency
    assert value(exposition, "modelyard_model_load_failures", model="broken", version="1") >= 1


def test_every_metric_the_rules_and_the_dashboard_read_is_exported(live: LiveServer):
    # Make every series exist: traffic, errors, a refused and an accepted upload, a swap, an audit check.
    assert live.infer("demo") == 200
    assert live.infer("broken") == 503
    upload(live, b"not onnx", expect=400)
    upload(live, onnx_bytes(), expect=201)  # queued on the broker, which no worker reads: backlog 1
    verify_audit_chain.apply()
    promote(live, "demo", 2)
    live.wait_serving("demo", 2)
    exposition = scrape(live.host, live.port, live.inference_token)
    exported = {name for name, _, _ in samples(exposition)}

    # GPU readings exist only on a GPU host; their names come from the collector that exports them.
    gpu = {sample.name for family in GpuCollector().describe() for sample in _described(family)}
    # Inference jobs' counters have a series per model once a process has computed a job's rows.
    gpu |= {f"{family.name}_total" for metric in (JOB_ROWS, JOB_CHUNK_RETRIES) for family in metric.describe()}
    wanted = {
        where: names
        for where, expr in {**rule_expressions(), **dashboard_expressions()}.items()
        if (names := metric_names(expr))
    }
    missing = {where: names - exported - gpu for where, names in wanted.items() if names - exported - gpu}
    assert missing == {}
    every = set().union(*wanted.values())
    assert {"modelyard_queue_depth", "modelyard_model_swaps_total", "modelyard_celery_queue_length"} <= every
    assert {"modelyard_inference_job_rows_queued", "modelyard_priority_queue_depth"} <= every
    assert value(exposition, "modelyard_inference_jobs", state="queued") == 0
    assert value(exposition, "modelyard_validation_backlog") == 1
    assert value(exposition, "modelyard_celery_queue_length", queue="celery") == 1
    assert value(exposition, "modelyard_model_swaps_total", model="demo", alias="production") >= 1
    assert value(exposition, "modelyard_audit_chain_ok") == 1


def upload(live: LiveServer, data: bytes, *, expect: int) -> None:
    import requests

    response = requests.post(
        f"{live.server.base}/api/v1/models/demo/versions",
        headers={"Authorization": f"Bearer {live.maintainer_token}"},
        files=[("file", ("model.onnx", data))],
        timeout=60,
    )
    assert response.status_code == expect, response.text


def onnx_bytes() -> bytes:
    from tests.support.onnx_models import add_model_bytes

    return add_model_bytes(bias=9.0)


def _described(family: Metric) -> list[SimpleNamespace]:
    """A described family has no samples; stand in its sample names (a gauge's sample is its name)."""
    return [SimpleNamespace(name=family.name)]


def test_a_real_prometheus_sees_the_error_rate_alert_go_pending(live: LiveServer, tmp_path):
    from tests.support.prometheus import RULES, PrometheusServer

    prometheus = PrometheusServer(
        target=f"{live.host}:{live.port}", rule_file=RULES, token=live.inference_token, folder=tmp_path
    )
    try:
        eventually(prometheus.targets_up, timeout=60, interval=0.5, what=prometheus.log)

        def pending() -> list[dict[str, str]]:
            live.infer("demo")
            live.infer("broken")  # 503: its error rate is 100%
            return [
                alert["labels"]
                for alert in prometheus.alerts()
                if alert["labels"]["alertname"] == "ModelyardInferenceErrorRateHigh" and alert["state"] == "pending"
            ]

        labels = eventually(pending, timeout=60, interval=0.2, what=lambda: str(prometheus.alerts()))
        assert labels == [{"alertname": "ModelyardInferenceErrorRateHigh", "model": "broken", "severity": "critical"}]
    finally:
        prometheus.stop()


def test_every_worker_process_starts_with_the_servers_cap_on_malloc_arenas(live: LiveServer):
    # MODELYARD_MALLOC_ARENA_MAX (2 by default) reaches each worker as glibc's MALLOC_ARENA_MAX, which glibc
    # reads as a process starts (modelyard/malloc_arenas.py); the test's environment has none of its own.
    def environment(pid: int) -> list[bytes]:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")

    assert not any(entry.startswith(b"MALLOC_ARENA_MAX=") for entry in environment(live.server.process.pid))
    workers = live.workers()
    assert len(workers) == 2
    for pid in workers:
        assert b"MALLOC_ARENA_MAX=2" in environment(pid)
