"""The inference runtime in this process, driven pass by pass with ``reconcile_once()``.

Real registry (the API and its services on the test database), real local or S3 storage, real ONNX Runtime
sessions. Only the reconcile thread is not started: the tests call its pass themselves, so every step is
observable. ``BuildGate`` holds a session build where a test must look at the state in between.
"""

from __future__ import annotations

import io
import threading
from datetime import timedelta
from importlib.metadata import version as dist_version
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from django.utils import timezone

from inference.cache import OPTIMIZED_DIR, ArtifactCache, CachedFile, HashMismatch, sha256_of
from inference.loaded import NotLoaded
from registry.models import InferenceWorker, RegisteredModel, Role
from storage import get_storage
from tests.support.inference import answered_bias, infer_body, sample
from tests.support.onnx_models import add_model_bytes
from tests.support.people import make_person
from tests.support.polling import eventually, reconcile_until
from tests.support.registry import artifact_path, create_model, promote, set_alias, set_served, upload_versions
from tests.support.s3 import closed_port_url

pytestmark = pytest.mark.django_db(transaction=True)

CPU = "CPUExecutionProvider"
CUDA_AVAILABLE = "CUDAExecutionProvider" in ort.get_available_providers()


def serving(runtime, ref: str | None = None) -> int | None:
    loaded = runtime.router.resolve("demo", ref)
    return loaded.spec.version if loaded is not None else None


def fleet_row(runtime) -> InferenceWorker:
    return InferenceWorker.objects.get(worker_id=runtime.worker_id)


def rows_by_version(runtime) -> dict[int, dict]:
    return {row["version"]: row for row in fleet_row(runtime).loaded}


def outputs(runtime, x: np.ndarray, ref: str | None = None) -> np.ndarray:
    loaded = runtime.router.resolve("demo", ref)
    assert loaded is not None, f"nothing serves demo {ref or 'production'}"
    loaded.acquire()
    try:
        return loaded.run({"x": x}, ["y"])[0]
    finally:
        loaded.release()


@pytest.fixture
def two_versions(owner):
    create_model(owner)
    return upload_versions(owner, [1.0, 2.0])


@pytest.fixture
def serving_v1(owner, approver, two_versions, make_runtime):
    """A runtime that serves v1 (bias 1) under production; v2 (bias 2) is uploaded and ready."""
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    return runtime


# --- Loading and serving ------------------------------------------------------------------------------


def test_served_version_loads_on_the_cpu_fallback_and_matches_onnxruntime(owner, approver, settings, make_runtime):
    settings.PROVIDERS = ["cuda", "cpu"]
    create_model(owner)
    [v1] = upload_versions(owner, [1.0])
    runtime = make_runtime("inproc-cpu")
    expected = "CUDAExecutionProvider" if CUDA_AVAILABLE else CPU
    device = "cuda:0" if CUDA_AVAILABLE else "cpu (no CUDA in this ONNX Runtime build)"
    assert (runtime.device, runtime.provider) == (device, expected)

    # Nothing is promoted yet: the first pass reads an empty desired state and is ready at once.
    runtime.reconcile_once()
    assert runtime.ready
    assert runtime.router.resolve("demo") is None
    assert fleet_row(runtime).loaded == []

    promote(owner, approver, 1)
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    loaded = runtime.router.resolve("demo")
    assert runtime.router.resolve("demo", "production") is loaded
    assert runtime.router.resolve("demo", "1") is loaded
    assert runtime.router.resolve("demo", "staging") is None
    assert runtime.router.resolve("other") is None
    assert loaded.provider == expected
    if not CUDA_AVAILABLE:
        wheel = f"onnxruntime {dist_version('onnxruntime')}, the CPU wheel,"
        assert (
            loaded.note
            == f"this ONNX Runtime build has no CUDA provider ({wheel} is installed; install modelyard[gpu])"
        )

    x = sample(5)
    direct = ort.InferenceSession(str(artifact_path(v1)), providers=[CPU]).run(["y"], {"x": x})[0]
    served = outputs(runtime, x)
    np.testing.assert_array_equal(served, direct)
    np.testing.assert_array_equal(served, x + np.float32(1.0))

    worker = fleet_row(runtime)
    assert (worker.device, worker.provider, worker.errors) == (runtime.device, expected, [])
    [row] = worker.loaded
    assert row["load_seconds"] > 0 and row["memory_bytes"] >= 0
    assert {k: row[k] for k in ("model", "version", "aliases", "state", "error", "provider", "attempts")} == {
        "model": "demo",
        "version": 1,
        "aliases": ["production"],
        "state": "ready",
        "error": "",
        "provider": expected,
        "attempts": 0,
    }
    assert row["note"] == loaded.note


def test_promotion_switches_routes_while_the_old_version_serves_until_the_new_one_is_ready(
    owner, approver, two_versions, serving_v1, build_gate
):
    runtime = serving_v1
    v1 = runtime.router.resolve("demo")
    build_gate.hold(two_versions[1].sha256)
    x = sample()

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: build_gate.waiting(two_versions[1].sha256), what="v2 build never started")
    # Blue-green: v2 is being built; production still answers with v1.
    runtime.reconcile_once()
    assert serving(runtime) == 1
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(1.0))
    rows = rows_by_version(runtime)
    assert (rows[1]["state"], rows[1]["aliases"]) == ("ready", ["production"])
    assert (rows[2]["state"], rows[2]["aliases"]) == ("loading", [])

    build_gate.open()
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(2.0))
    assert runtime.router.resolve("demo", "1") is None
    assert runtime.router.resolve("demo", "2") is runtime.router.resolve("demo")
    assert 1 not in {v.spec.version for v in runtime.loaded.values()}
    # Nothing held v1, so the drain ends at once and the session is dropped.
    eventually(lambda: v1.closed and v1.session is None, what=f"v1 still {v1.state}")
    with pytest.raises(NotLoaded):
        v1.acquire()
    reconcile_until(runtime, lambda: list(rows_by_version(runtime)) == [2], what="v1 still in the fleet row")
    assert rows_by_version(runtime)[2]["aliases"] == ["production"]


def test_a_request_in_flight_delays_the_release_of_the_old_version(owner, approver, serving_v1):
    runtime = serving_v1
    held = runtime.router.resolve("demo")
    held.acquire()  # a request that started on v1 and is still running
    x = sample()

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    # v1 left the routing table, and its drain waits for the request it still runs.
    eventually(lambda: held.state == "draining", what=f"v1 is {held.state}")
    for _ in range(3):
        runtime.reconcile_once()
    assert not held.closed and held.session is not None
    assert held.inflight == 1
    np.testing.assert_array_equal(held.run({"x": x}, ["y"])[0], x + np.float32(1.0))
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(2.0))

    held.release()
    eventually(lambda: held.closed and held.session is None, what=f"v1 is {held.state}")
    assert held.state == "closed"
    with pytest.raises(NotLoaded):
        held.acquire()


def test_an_alias_that_is_not_served_is_not_loaded(owner, admin, serving_v1):
    runtime = serving_v1
    assert set_alias(owner, "staging", 2).status_code == 200  # unprotected, not served
    runtime.reconcile_once()
    # Loads start within the pass that sees a served version, so nothing else is loading or loaded.
    assert [v.spec.version for v in runtime.loaded.values()] == [1]
    assert runtime.status.loading == {}
    assert runtime.router.resolve("demo", "staging") is None
    assert runtime.router.resolve("demo", "2") is None

    set_served(admin, "staging", True)
    reconcile_until(runtime, lambda: serving(runtime, "staging") == 2, what="staging never served")
    assert serving(runtime) == 1
    assert rows_by_version(runtime)[2]["aliases"] == ["staging"]

    set_served(admin, "staging", False)
    reconcile_until(runtime, lambda: serving(runtime, "staging") is None, what="staging still served")
    assert [v.spec.version for v in runtime.loaded.values()] == [1]


def test_replace_strategy_unloads_the_old_version_before_loading_the_new_one(
    owner, approver, two_versions, serving_v1, build_gate
):
    runtime = serving_v1
    RegisteredModel.objects.filter(name="demo").update(serving_strategy="replace")
    runtime.reconcile_once()
    v1 = runtime.router.resolve("demo")
    assert v1 is not None
    build_gate.hold(two_versions[1].sha256)

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: build_gate.waiting(two_versions[1].sha256), what="v2 build never started")
    # v2 is not built yet, and v1 is already gone: out of the routing table, drained and closed.
    assert runtime.router.resolve("demo") is None
    assert runtime.router.resolve("demo", "1") is None
    assert runtime.loaded == {}
    eventually(lambda: v1.closed and v1.session is None, what=f"v1 is {v1.state}")
    runtime.reconcile_once()
    assert [(r["version"], r["state"]) for r in fleet_row(runtime).loaded] == [(2, "loading")]

    build_gate.open()
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    x = sample()
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(2.0))


# --- The artifact cache -------------------------------------------------------------------------------


def test_the_cached_copy_is_verified_on_every_load(owner, approver, two_versions, serving_v1, inference_settings):
    runtime = serving_v1
    v1 = two_versions[0]
    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    cached = Path(inference_settings.CACHE_DIR) / v1.sha256 / "model.onnx"
    assert sha256_of(cached) == v1.sha256  # v1 is released but its bundle stays cached

    # The cached copy changes behind the cache's back into another valid model (bias 7).
    cached.write_bytes(add_model_bytes(bias=7.0))
    rollback = approver.post("/api/v1/models/demo/aliases/production/rollback", {"reason": "back"})
    assert rollback.status_code == 200, rollback.content
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served again")
    x = sample()
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(1.0))  # not x + 7
    assert sha256_of(cached) == v1.sha256  # downloaded again from storage
    assert rows_by_version(runtime)[1]["attempts"] == 0


def bundle_names(root: Path) -> set[str]:
    """The bundles in the artifact cache (the saved optimised graphs beside them are bounded on their own)."""
    return {p.name for p in root.iterdir() if p.name != OPTIMIZED_DIR}


def test_lru_eviction_keeps_loaded_and_loading_bundles(
    owner, admin, approver, two_versions, serving_v1, inference_settings, build_gate
):
    runtime = serving_v1
    [v3] = upload_versions(owner, [3.0])
    v1, v2 = two_versions
    cache_dir = Path(inference_settings.CACHE_DIR)
    runtime.cache.max_bytes = 1  # every bundle is over the limit; only what serves or loads may stay

    assert set_alias(owner, "staging", 2).status_code == 200
    set_served(admin, "staging", True)
    reconcile_until(runtime, lambda: serving(runtime, "staging") == 2, what="staging never served")
    assert bundle_names(cache_dir) == {v1.sha256, v2.sha256}

    # While v3 is being built, passes evict what they can: never the bundle being loaded.
    build_gate.hold(v3.sha256)
    assert set_alias(owner, "staging", 3).status_code == 200
    reconcile_until(runtime, lambda: build_gate.waiting(v3.sha256), what="v3 build never started")
    for _ in range(3):
        runtime.reconcile_once()
    assert bundle_names(cache_dir) == {v1.sha256, v2.sha256, v3.sha256}

    build_gate.open()
    reconcile_until(runtime, lambda: serving(runtime, "staging") == 3, what="v3 never served")
    assert runtime.status.failures == {}
    # v2 is released now, so its bundle goes; the two that serve stay although they exceed the limit.
    reconcile_until(runtime, lambda: bundle_names(cache_dir) == {v1.sha256, v3.sha256})
    assert serving(runtime) == 1


def test_lru_eviction_removes_the_least_recently_used_bundle_first(tmp_path):
    storage = get_storage()
    bundles = {}
    for bias in (1.0, 2.0, 3.0):
        data = add_model_bytes(bias=bias)
        key = f"lru/{bias}/model.onnx"
        written = storage.write(key, io.BytesIO(data))
        bundles[bias] = (written.sha256, (CachedFile("model.onnx", key, written.sha256, len(data)),))
    size = len(add_model_bytes(bias=1.0))
    cache = ArtifactCache(tmp_path / "lru-cache", max_bytes=2 * size)
    for bias in (1.0, 2.0, 3.0, 1.0):  # 2.0 is now the least recently used
        cache.bundle(*bundles[bias])
    assert cache.evict(keep=set()) == [bundles[2.0][0]]
    assert bundle_names(cache.root) == {bundles[1.0][0], bundles[3.0][0]}

    cache.max_bytes = 0
    assert cache.evict(keep={bundles[1.0][0]}) == [bundles[3.0][0]]
    # Bytes that do not match the recorded hash are refused, and not left in the cache.
    wrong = CachedFile("model.onnx", "lru/2.0/model.onnx", bundles[1.0][0], size)
    with pytest.raises(HashMismatch, match=r"sha256 mismatch for model\.onnx"):
        cache.bundle(bundles[1.0][0] + "-x", (wrong,))
    assert not (cache.root / (bundles[1.0][0] + "-x") / "model.onnx").exists()


# --- Failures never take down what serves -------------------------------------------------------------


def test_a_corrupt_artifact_is_not_loaded_and_the_old_version_keeps_serving(
    owner, approver, two_versions, serving_v1, inference_settings
):
    runtime = serving_v1
    v2 = two_versions[1]
    stored = artifact_path(v2)
    original = stored.read_bytes()
    # Behind the registry's back the stored bytes become another valid model, which must never serve.
    stored.write_bytes(add_model_bytes(bias=9.0))
    x = sample()

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: v2.pk in runtime.status.failures, what="the v2 load never failed")
    assert serving(runtime) == 1
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(1.0))
    rows = rows_by_version(runtime)
    assert (rows[1]["state"], rows[1]["aliases"]) == ("ready", ["production"])
    assert rows[2]["state"] == "failed"
    assert rows[2]["attempts"] == 1
    assert rows[2]["error"].startswith("HashMismatch: sha256 mismatch for model.onnx: storage holds ")
    assert not (Path(inference_settings.CACHE_DIR) / v2.sha256 / "model.onnx").exists()
    # The fleet API reports it too.
    [worker] = owner.get("/api/v1/fleet").json()
    assert [(r["version"], r["state"]) for r in worker["loaded"]] == [(1, "ready"), (2, "failed")]

    # The load is retried after a back-off, and fails again.
    reconcile_until(runtime, lambda: runtime.status.failures[v2.pk].attempts >= 2, timeout=30, what="v2 never retried")
    reconcile_until(runtime, lambda: rows_by_version(runtime)[2]["attempts"] >= 2, what="attempts not reported")
    assert serving(runtime) == 1

    # Rolled back, the failed version is forgotten; repaired and promoted again, it loads at once.
    assert approver.post("/api/v1/models/demo/aliases/production/rollback", {}).status_code == 200
    reconcile_until(runtime, lambda: v2.pk not in runtime.status.failures, what="the failure was kept")
    assert list(rows_by_version(runtime)) == [1]
    stored.write_bytes(original)
    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="the repaired v2 never served")
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(2.0))


@pytest.mark.parametrize("kind", ["s3-closed-port", "local-folder-moved"])
def test_storage_outage_during_a_load_keeps_the_old_version_serving(
    kind, request, owner, approver, make_runtime, settings
):
    if kind.startswith("s3"):
        request.getfixturevalue("s3_settings")
        settings.S3_MAX_ATTEMPTS = 1
    create_model(owner)
    _, v2 = upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    x = sample()

    # Storage goes away.
    if kind.startswith("s3"):
        endpoint = settings.S3_ENDPOINT_URL
        settings.S3_ENDPOINT_URL = closed_port_url()
    else:
        folder = Path(settings.STORAGE.path)
        away = folder.with_name(folder.name + ".away")
        folder.rename(away)
    get_storage.cache_clear()

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: v2.pk in runtime.status.failures, what="the v2 load never failed")
    assert serving(runtime) == 1
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(1.0))
    error = rows_by_version(runtime)[2]["error"]
    assert error.startswith("StorageUnavailable: " if kind.startswith("s3") else "ObjectNotFound: "), error
    assert rows_by_version(runtime)[2]["state"] == "failed"

    # Storage comes back: the retry loads v2, which takes over.
    if kind.startswith("s3"):
        settings.S3_ENDPOINT_URL = endpoint
    else:
        away.rename(folder)
    get_storage.cache_clear()
    reconcile_until(runtime, lambda: serving(runtime) == 2, timeout=30, what="v2 never served after the outage")
    np.testing.assert_array_equal(outputs(runtime, x), x + np.float32(2.0))
    assert runtime.status.failures == {}
    assert [(r["version"], r["state"], r["error"]) for r in fleet_row(runtime).loaded] == [(2, "ready", "")]


# --- The fleet --------------------------------------------------------------------------------------


def test_fleet_api_shows_live_workers_online_and_stale_ones_offline(owner, serving_v1):
    runtime = serving_v1
    long_ago = timezone.now() - timedelta(hours=1)
    InferenceWorker.objects.create(
        worker_id="gone-1",
        host="elsewhere",
        pid=1,
        device="cpu",
        provider=CPU,
        loaded=[],
        started_at=long_ago,
        heartbeat_at=long_ago,
    )
    runtime.heartbeat()
    workers = {w["worker_id"]: w for w in owner.get("/api/v1/fleet").json()}
    assert set(workers) == {"gone-1", runtime.worker_id}
    assert workers["gone-1"]["online"] is False
    mine = workers[runtime.worker_id]
    assert mine["online"] is True
    assert (mine["device"], mine["provider"], mine["errors"]) == (runtime.device, runtime.provider, [])
    assert [(r["model"], r["version"], r["aliases"], r["state"]) for r in mine["loaded"]] == [
        ("demo", 1, ["production"], "ready")
    ]
    online = owner.get("/api/v1/fleet?online=true").json()
    assert [w["worker_id"] for w in online] == [runtime.worker_id]


# --- The /v2 app on this runtime ----------------------------------------------------------------------


def batcher_threads() -> set[threading.Thread]:
    """The threads in which batchers run ONNX Runtime (objects, not idents: a new thread may reuse an ident)."""
    return {t for t in threading.enumerate() if t.name.startswith("ort-run")}


def test_v2_app_follows_the_switch_and_retires_the_old_versions_batcher(owner, approver, serving_v1, asgi_loop):
    from inference.app import build_app

    runtime = serving_v1
    app = build_app(runtime)
    client = make_person("app", Role.INFERENCE)
    before = batcher_threads()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    def infer(path: str = "/v2/models/demo/infer") -> tuple[int, dict]:
        return asgi_loop.request(app, "POST", path, infer_body(x), token=client.token)

    assert asgi_loop.request(app, "GET", "/v2/health/ready") == (200, {"ready": True})
    assert asgi_loop.request(app, "POST", "/v2/models/demo/infer", infer_body(x))[0] == 401
    assert asgi_loop.request(app, "POST", "/v2/models/demo/infer", infer_body(x), token=owner.token)[0] == 403
    status, body = infer()
    assert status == 200, body
    assert (body["model_version"], answered_bias(x, body)) == ("1", 1.0)
    v1_threads = batcher_threads() - before
    assert len(v1_threads) == 1  # v1's batcher runs ONNX Runtime in a thread of its own

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    status, body = infer()
    assert (status, body["model_version"], answered_bias(x, body)) == (200, "2", 2.0)
    assert infer("/v2/models/demo/versions/1/infer")[0] == 404
    # v1 was drained and released: its batcher and thread are gone with it; v2's remains.
    eventually(lambda: not (batcher_threads() & v1_threads), what="v1's batcher thread is still alive")
    assert len(batcher_threads() - before) == 1
    status, body = infer("/v2/models/demo/versions/2/infer")
    assert (status, body["model_version"]) == (200, "2")
