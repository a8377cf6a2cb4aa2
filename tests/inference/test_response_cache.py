"""The response cache of an alias (``inference/response_cache.py``), through ``DataPlane`` on real sessions.

The stores are checked on their own (the byte bound, the TTL, the per-entry limit, the key), then
through an in-process runtime serving ``y = x + bias`` models: the bias an answer carries says which
version computed it, so an answer of v1 after the alias moved to v2 cannot hide. The Redis store
runs against the real Redis on loopback, in the database ``MODELYARD_TEST_REDIS_DB`` names.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import redis

from inference.dataplane import DataPlane
from inference.loaded import LoadedVersion
from inference.protocol import InferRequest, decode_request, encode_response
from inference.response_cache import (
    ENTRY_OVERHEAD,
    MemoryStore,
    RedisStore,
    ResponseCaches,
    VersionCounts,
    inputs_digest,
)
from modelyard import metrics as exposition
from registry.models import AuditEvent
from registry.serving import CacheSpec
from tests.support.inference import sample
from tests.support.polling import reconcile_until
from tests.support.prometheus import value
from tests.support.registry import artifact_path, create_model, promote, upload_versions

REDIS_URL = f"redis://127.0.0.1:6379/{os.environ.get('MODELYARD_TEST_REDIS_DB', '13')}"


def answer(rows: int, value_: float = 1.0) -> dict[str, np.ndarray]:
    return {"y": np.full((rows, 4), value_, dtype=np.float32)}


def counts() -> VersionCounts:
    return VersionCounts("unit", "1")


# --- The stores on their own ------------------------------------------------------------------------


def test_memory_store_evicts_least_recently_used_past_its_bytes_and_counts_it(run):
    one = ENTRY_OVERHEAD + 4 * 4 * 4  # an answer of 4 rows of 4 float32
    store = MemoryStore(CacheSpec(max_bytes=4 * one, ttl_seconds=60), max_entry_bytes=10**6)
    tally = counts()
    for key in "abcd":
        assert run(store.put(key, answer(4), tally))
    assert run(store.get("a")) is not None  # a is now the most recently used
    assert run(store.put("e", answer(4), tally))
    assert run(store.get("b")) is None  # the least recently used went
    assert {k for k in "acde" if run(store.get(k)) is not None} == set("acde")
    assert (tally.evictions, store.nbytes, len(store)) == (1, 4 * one, 4)
    assert tally.totals().bytes == 4 * one


def test_memory_store_keeps_no_answer_larger_than_a_quarter_of_its_bytes(run):
    store = MemoryStore(CacheSpec(max_bytes=4096, ttl_seconds=60), max_entry_bytes=10**6)
    tally = counts()
    assert run(store.put("small", answer(4), tally))
    assert not run(store.put("huge", answer(64), tally))  # 1 KiB of floats + overhead > 4096 / 4
    assert run(store.get("small")) is not None and run(store.get("huge")) is None
    assert tally.evictions == 0
    # The setting's own limit, when lower than a quarter of the bound.
    tight = MemoryStore(CacheSpec(max_bytes=10**6, ttl_seconds=60), max_entry_bytes=ENTRY_OVERHEAD + 10)
    assert not run(tight.put("k", answer(4), tally))


def test_memory_store_entries_expire_after_their_ttl(run, monkeypatch):
    store = MemoryStore(CacheSpec(max_bytes=10**6, ttl_seconds=5), max_entry_bytes=10**6)
    tally = counts()
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now)
    run(store.put("k", answer(2), tally))
    monkeypatch.setattr(time, "monotonic", lambda: now + 4.9)
    assert run(store.get("k")) is not None
    monkeypatch.setattr(time, "monotonic", lambda: now + 5.0)
    assert run(store.get("k")) is None
    assert (store.nbytes, len(store), tally.evictions) == (0, 0, 0)  # expiry is not an eviction


def test_cached_arrays_are_read_only_copies(run):
    store = MemoryStore(CacheSpec(max_bytes=10**6, ttl_seconds=60), max_entry_bytes=10**6)
    batch = np.zeros((8, 4), dtype=np.float32)
    run(store.put("k", {"y": batch[:2]}, counts()))  # a view of a batch's output
    kept = run(store.get("k"))["y"]
    assert kept.base is None and not kept.flags.writeable
    batch[:] = 7
    assert (kept == 0).all()


def test_the_inputs_digest_covers_name_datatype_shape_and_bytes():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    base = inputs_digest({"x": x})
    assert inputs_digest({"x": x.copy()}) == base
    assert inputs_digest({"z": x}) != base
    assert inputs_digest({"x": x.astype(np.float64)}) != base
    assert inputs_digest({"x": x.reshape(4, 2)}) != base
    assert inputs_digest({"x": x + 1}) != base
    assert inputs_digest({"x": np.asfortranarray(x)}) == base  # the same values, whatever the memory order
    text = np.array([b"ab", b"c"], dtype=object)
    assert inputs_digest({"t": text}) != inputs_digest({"t": np.array([b"a", b"bc"], dtype=object)})


@pytest.fixture
def redis_db() -> Any:
    """The test Redis database, without the cache's keys (others' keys there, the Celery queues, are left alone)."""
    client = redis.Redis.from_url(REDIS_URL)

    def clear() -> None:
        for key in client.scan_iter(match="modelyard:response:*"):
            client.delete(key)

    clear()
    yield client
    clear()
    client.close()


def test_redis_store_round_trips_expires_and_drops_a_version(run, redis_db):
    store = RedisStore(REDIS_URL, CacheSpec(max_bytes=10**6, ttl_seconds=30), max_entry_bytes=10**6)
    tally = counts()
    outputs: dict[str, np.ndarray] = {
        "y": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i": np.array([1, 2], dtype=np.int64),
    }
    assert run(store.put("v1:aa", outputs, tally))
    assert run(store.put("v2:aa", answer(1), tally))
    back = run(store.get("v1:aa"))
    assert back.keys() == outputs.keys() and all(np.array_equal(back[k], outputs[k]) for k in outputs)
    assert back["y"].dtype == np.float32 and back["i"].dtype == np.int64
    assert 0 < redis_db.ttl("modelyard:response:v1:aa") <= 30
    assert not run(store.put("v1:big", answer(100_000), tally))  # past a quarter of max_bytes: not kept
    store.drop_version("v1")
    assert run(store.get("v1:aa")) is None and run(store.get("v2:aa")) is not None


def test_an_unreachable_redis_is_a_miss_not_a_failure(run):
    store = RedisStore("redis://127.0.0.1:1/0", CacheSpec(max_bytes=10**6, ttl_seconds=30), max_entry_bytes=10**6)
    assert run(store.get("k")) is None
    assert not run(store.put("k", answer(1), counts()))


# --- Through the data plane, on real sessions ---------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


def request_for(loaded: LoadedVersion, x: np.ndarray, *, top: int | None = None) -> InferRequest:
    """A JSON /v2 request for ``x``; ``top``: the ``y`` output as its top-N classes (the extension)."""
    body: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}]}
    if top is not None:
        body["outputs"] = [{"name": "y", "parameters": {"classification": top}}]
    return decode_request(json.dumps(body).encode(), None, loaded.spec.signature)


def set_cache(admin: Any, cache: Any, alias: str = "production") -> Any:
    return admin.patch(f"/api/v1/models/demo/aliases/{alias}", {"cache": cache})


def serving(runtime: Any) -> int | None:
    loaded = runtime.router.resolve("demo")
    return loaded.spec.version if loaded is not None else None


def scrape() -> str:
    return exposition.render()[0].decode()


@pytest.fixture
def cached_runtime(owner, approver, admin, make_runtime):
    """A runtime serving v1 (bias 1) under production, whose cache is on; v2 (bias 2) is ready."""
    create_model(owner)
    versions = upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    response = set_cache(admin, {"max_bytes": 1 << 20, "ttl_seconds": 300})
    assert response.status_code == 200, response.content
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    runtime.versions = versions
    return runtime


def ort_run(version: Any, x: np.ndarray) -> np.ndarray:
    """The version's model run by ONNX Runtime directly, outside the server."""
    session = ort.InferenceSession(str(artifact_path(version)), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytestmark_db
def test_a_repeated_request_is_answered_from_the_cache_without_a_run(cached_runtime, run, monkeypatch):
    plane = DataPlane(cached_runtime)
    loaded = cached_runtime.router.resolve("demo")
    runs: list[int] = []
    real = loaded.run

    def counted(feeds: dict[str, Any], names: list[str] | None = None) -> Any:
        runs.append(1)
        return real(feeds, names)

    monkeypatch.setattr(loaded, "run", counted)
    x = sample(3)

    first = run(plane.infer("demo", None, request_for(loaded, x)))
    second = run(plane.infer("demo", None, request_for(loaded, x)))
    assert (first.cached, second.cached) == (False, True)
    assert len(runs) == 1  # the hit skipped the batcher and the session
    expected = ort_run(cached_runtime.versions[0], x)
    assert np.array_equal(first.outputs["y"], expected) and np.array_equal(second.outputs["y"], expected)
    # The flag reaches the response parameters; a version number (no alias) caches nothing.
    body, _ = encode_response(
        model="demo", version="1", request=request_for(loaded, x), values=second.outputs, cached=True
    )
    assert json.loads(body)["parameters"] == {"cached": True}
    assert run(plane.infer("demo", "1", request_for(loaded, x))).cached is None

    other = run(plane.infer("demo", None, request_for(loaded, x + 1)))
    assert other.cached is False and len(runs) == 3
    # What shapes the answer and not its values shares the entry: classification is applied after it.
    classified = run(plane.infer("demo", None, request_for(loaded, x, top=2)))
    assert classified.cached is True and classified.outputs["y"].dtype == object
    assert len(runs) == 3
    totals = cached_runtime.responses.totals(loaded.spec.version_id)
    assert (totals.hits, totals.misses, totals.evictions) == (2, 2, 0) and totals.bytes > 0
    exposed = scrape()
    assert value(exposed, "modelyard_response_cache_hits_total", model="demo", version="1") >= 2
    assert value(exposed, "modelyard_response_cache_misses_total", model="demo", version="1") >= 2
    # Triton's statistics count them as Triton does: a hit is a success with no run.
    stats = plane.statistics("demo", "1")["model_stats"][0]
    assert stats["inference_stats"]["cache_hit"]["count"] == 2
    assert stats["inference_stats"]["cache_miss"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 5 and stats["execution_count"] == 3
    # The fleet page's figures: the heartbeat row of the version carries them.
    [row] = [r for r in cached_runtime.snapshot() if r.version == 1]
    assert row.cache is not None and row.cache.hits == 2 and row.cache.hit_rate == 0.5


@pytestmark_db
def test_after_a_swap_the_old_versions_cached_answer_is_never_served(cached_runtime, owner, approver, run):
    plane = DataPlane(cached_runtime)
    x = sample(2, seed=5)
    v1 = cached_runtime.router.resolve("demo")
    assert run(plane.infer("demo", None, request_for(v1, x))).cached is False
    assert run(plane.infer("demo", None, request_for(v1, x))).cached is True

    promote(owner, approver, 2)
    reconcile_until(cached_runtime, lambda: serving(cached_runtime) == 2, what="v2 never served")
    v2 = cached_runtime.router.resolve("demo")
    after = run(plane.infer("demo", None, request_for(v2, x)))
    assert after.cached is False and after.version == "2"
    assert np.array_equal(after.outputs["y"], ort_run(cached_runtime.versions[1], x))
    again = run(plane.infer("demo", None, request_for(v2, x)))
    assert again.cached is True and np.array_equal(again.outputs["y"], x + np.float32(2))

    # v1, released once drained, leaves nothing behind in the alias's store.
    store = cached_runtime.responses.lookup("demo", None).store
    reconcile_until(cached_runtime, lambda: len(store) == 1, what="v1's entry was never dropped")


@pytestmark_db
def test_the_redis_store_never_crosses_a_swap_either(owner, approver, admin, make_runtime, run, redis_db, settings):
    settings.RESPONSE_CACHE_REDIS_URL = REDIS_URL
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    assert set_cache(admin, {"max_bytes": 1 << 20, "ttl_seconds": 60}).status_code == 200
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    plane = DataPlane(runtime)
    x = sample(2, seed=9)
    v1 = runtime.router.resolve("demo")
    assert [run(plane.infer("demo", None, request_for(v1, x))).cached for _ in range(2)] == [False, True]
    assert len(redis_db.keys("modelyard:response:*")) == 1

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    v2 = runtime.router.resolve("demo")
    answers = [run(plane.infer("demo", None, request_for(v2, x))) for _ in range(2)]
    assert [a.cached for a in answers] == [False, True]
    assert all(np.array_equal(a.outputs["y"], x + np.float32(2)) for a in answers)
    # v1's key is deleted once it is released.
    reconcile_until(runtime, lambda: len(redis_db.keys("modelyard:response:*")) == 1, what="v1's key stayed")


@pytestmark_db
def test_a_small_cache_evicts_the_oldest_answers_and_counts_them(cached_runtime, admin, run):
    # Each answer of 2 rows costs 32 bytes of floats + the overhead: 288 bytes, 7 of them in 2048.
    assert set_cache(admin, {"max_bytes": 2048, "ttl_seconds": 300}).status_code == 200
    store = cached_runtime.responses.lookup("demo", None).store
    reconcile_until(cached_runtime, lambda: store.spec.max_bytes == 2048, what="the new bound never arrived")
    plane = DataPlane(cached_runtime)
    v1 = cached_runtime.router.resolve("demo")
    inputs = [sample(2, seed=100 + i) for i in range(10)]
    for x in inputs:
        assert run(plane.infer("demo", None, request_for(v1, x))).cached is False
    assert (len(store), store.nbytes) == (7, 7 * (ENTRY_OVERHEAD + 32))
    totals = cached_runtime.responses.totals(v1.spec.version_id)
    assert totals.evictions == 3 and totals.bytes == store.nbytes
    assert value(scrape(), "modelyard_response_cache_evictions_total", model="demo", version="1") >= 3
    assert value(scrape(), "modelyard_response_cache_bytes", model="demo", version="1") == store.nbytes
    # The three oldest went; the newest are still answered from the cache.
    assert run(plane.infer("demo", None, request_for(v1, inputs[-1]))).cached is True
    assert run(plane.infer("demo", None, request_for(v1, inputs[0]))).cached is False


@pytestmark_db
def test_turning_the_cache_off_stops_caching_and_frees_its_memory(cached_runtime, admin, run):
    plane = DataPlane(cached_runtime)
    v1 = cached_runtime.router.resolve("demo")
    x = sample(2)
    run(plane.infer("demo", None, request_for(v1, x)))
    store = cached_runtime.responses.lookup("demo", None).store
    assert len(store) == 1
    assert set_cache(admin, None).status_code == 200
    reconcile_until(cached_runtime, lambda: cached_runtime.responses.lookup("demo", None) is None, what="still on")
    assert len(store) == 0
    assert run(plane.infer("demo", None, request_for(v1, x))).cached is None
    assert AuditEvent.objects.filter(action="alias.cache").count() == 2


def test_response_caches_follow_the_desired_settings():
    caches = ResponseCaches(redis_url="", max_entry_bytes=10**6)
    caches.configure({"demo": {"production": CacheSpec(4096, 60)}})
    first = caches.lookup("demo", None)
    assert first is not None and caches.lookup("demo", "production") is first
    assert caches.lookup("demo", "1") is None and caches.lookup("demo", "staging") is None
    caches.configure({"demo": {"production": CacheSpec(8192, 30)}})
    assert caches.lookup("demo", None) is first and first.spec == CacheSpec(8192, 30)
    caches.configure({})
    assert caches.lookup("demo", None) is None


def test_a_bad_redis_url_stops_start_up_naming_the_variable():
    from django.core.exceptions import ImproperlyConfigured

    from modelyard.env import redis_url

    name = "MODELYARD_RESPONSE_CACHE_REDIS_URL"
    with pytest.raises(ImproperlyConfigured) as caught:
        redis_url(name, "http://127.0.0.1:6379/0")
    assert str(caught.value) == (
        "MODELYARD_RESPONSE_CACHE_REDIS_URL: expected a redis://, rediss:// or unix:// URL, got scheme 'http'"
    )
    assert redis_url(name, "") is None and redis_url(name, REDIS_URL) == REDIS_URL


def test_grpc_answers_carry_the_cached_flag_in_their_parameters():
    from inference.grpc.codec import encode_infer_response
    from inference.protocol import InferResult

    request = InferRequest(id="r", inputs={}, outputs=["y"], binary_outputs=set(), signature={})
    outputs = {"y": np.zeros((1, 2), dtype=np.float32)}
    hit = encode_infer_response(InferResult("demo", "1", outputs, cached=True), request)
    assert hit.parameters["cached"].bool_param is True
    miss = encode_infer_response(InferResult("demo", "1", outputs, cached=False), request)
    assert miss.parameters["cached"].HasField("bool_param") and miss.parameters["cached"].bool_param is False
    uncached = encode_infer_response(InferResult("demo", "1", outputs), request)
    assert "cached" not in uncached.parameters
