"""The /v2 data plane without a server: ``DataPlane`` over an in-process runtime, on real ONNX Runtime sessions.

Every model is ``y = x + bias`` uploaded through the API and loaded by a runtime driven pass by
pass, so the bias an answer carries says which version computed it. Requests are decoded with the
real codec and run through each version's own batcher on an event loop of the test's own. A
``RunGate`` holds ONNX Runtime runs where a test must look at the queue in between.
"""

from __future__ import annotations

import asyncio
import json
import threading
import types
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest

from inference.dataplane import DataPlane
from inference.errors import (
    BodyTooLarge,
    ClientGone,
    Forbidden,
    InferenceFailed,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    Overloaded,
    RateLimited,
    RequestTimeout,
    Unauthorised,
)
from inference.loaded import LoadedVersion, NotLoaded
from inference.protocol import InferRequest, InferResult, decode_request
from modelyard import metrics as exposition
from registry.access import services
from registry.audit.chain import SYSTEM
from registry.models import RegisteredModel, Role
from tests.support import onnx_compat
from tests.support.inference import sample
from tests.support.people import make_person
from tests.support.polling import eventually, reconcile_until
from tests.support.prometheus import value
from tests.support.registry import create_model, promote, set_alias, set_served, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)  # token checks run in worker threads, as in a server


# --- Helpers ------------------------------------------------------------------------------------------


def serving(runtime: Any, ref: str | None = None) -> int | None:
    loaded = runtime.router.resolve("demo", ref)
    return loaded.spec.version if loaded is not None else None


def request_for(loaded: LoadedVersion, x: np.ndarray, **parameters: Any) -> InferRequest:
    """A JSON /v2 request for ``x``, decoded by the real codec against ``loaded``'s signature."""
    body: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}]}
    if parameters:
        body["parameters"] = parameters
    return decode_request(json.dumps(body).encode(), None, loaded.spec.signature)


class RunGate:
    """Wraps a loaded version's ONNX Runtime run: counts the rows of each run, and holds runs while shut."""

    def __init__(self, loaded: LoadedVersion, monkeypatch: pytest.MonkeyPatch, *, shut: bool = False) -> None:
        self.rows: list[int] = []
        self.running = threading.Event()
        self.open = threading.Event()
        if not shut:
            self.open.set()
        real = loaded.run

        def gated(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
            self.rows.append(len(feeds["x"]))
            self.running.set()
            assert self.open.wait(30), "the gate was never opened"
            return real(feeds, output_names)

        monkeypatch.setattr(loaded, "run", gated)


async def until(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Yield to the loop until ``condition`` holds (the batcher runs on this loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def force_promote(requester: Any, approver: Any, version: int) -> None:
    """Promote a version whose signature breaks production's: that needs force and a reason."""
    response = requester.client.put(
        "/api/v1/models/demo/aliases/production",
        {"version": version, "reason": "new signature", "force": True},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {requester.token}",
    )
    assert response.status_code == 202, response.content
    approved = approver.post(f"/api/v1/promotions/{response.json()['id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content


@pytest.fixture
def two_versions(owner):
    create_model(owner)
    return upload_versions(owner, [1.0, 2.0])


@pytest.fixture
def runtime(owner, approver, two_versions, make_runtime):
    """A runtime that serves v1 (bias 1) under production; v2 (bias 2) is uploaded and ready."""
    promote(owner, approver, 1)
    made = make_runtime()
    reconcile_until(made, lambda: serving(made) == 1, what="v1 never served")
    return made


@pytest.fixture
def plane(runtime) -> DataPlane:
    return DataPlane(runtime)


@pytest.fixture
def bare_plane(make_runtime) -> DataPlane:
    """A data plane over a runtime that serves nothing: enough for the checks made before a body is read."""
    return DataPlane(make_runtime("bare"))


# --- Server and model metadata ------------------------------------------------------------------------


def test_server_metadata_live_and_ready(plane, make_runtime):
    metadata = plane.server_metadata()
    assert metadata["name"] == "modelyard"
    assert metadata["extensions"] == [
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "model_repository",
        "parameters",
        "statistics",
    ]
    assert (plane.live(), plane.ready()) == (True, True)
    # A runtime that has not read the desired state yet takes no traffic.
    assert DataPlane(make_runtime("not-synced")).ready() is False


def test_model_metadata_ready_and_config(plane, owner, admin, runtime):
    signature = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    metadata = {"name": "demo", "versions": ["1"], "platform": "onnxruntime_onnx", **signature}
    assert plane.model_metadata("demo") == metadata
    assert set_alias(owner, "staging", 2).status_code == 200
    set_served(admin, "staging", True)
    reconcile_until(runtime, lambda: serving(runtime, "staging") == 2, what="staging never served")
    # Without a version, every served version of the model; with one, that version alone.
    assert plane.model_metadata("demo")["versions"] == ["1", "2"]
    assert plane.model_metadata("demo", "staging")["versions"] == ["2"]
    assert plane.model_metadata("demo", "1")["versions"] == ["1"]

    assert plane.model_ready("demo") == {"name": "demo", "version": "1", "ready": True}
    assert plane.model_ready("demo", "staging") == {"name": "demo", "version": "2", "ready": True}

    config = plane.model_config("demo", "2")
    provider = runtime.router.resolve("demo", "2").provider
    assert config == {
        "name": "demo",
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "version_policy": {"specific": {"versions": [2]}},
        "max_batch_size": 32,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_GPU" if "CUDA" in provider else "KIND_CPU", "count": 1}],
        "parameters": {"execution_provider": {"string_value": provider}},
        "dynamic_batching": {"max_queue_delay_microseconds": 0, "default_queue_policy": {"max_queue_size": 1024}},
    }


def test_unknown_models_and_refs_are_not_found_and_unloaded_ones_not_ready(plane, owner, admin, runtime, build_gate):
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'nope' is not found$"):
        plane.model_metadata("nope")
    with pytest.raises(
        ModelNotFound,
        match=r"^Request for unknown model: 'demo' version staging is not found: model 'demo' has no served ",
    ):
        plane.model_ready("demo", "staging")
    with pytest.raises(
        ModelNotFound, match=r"^Request for unknown model: 'demo' version 2 is not found: model 'demo' has no served "
    ):
        plane.model_config("demo", "2")

    # staging is served and points to v2, whose session is still being built: meant to be served, not loaded.
    build_gate.hold(RegisteredModel.objects.get(name="demo").versions.get(version=2).sha256)
    assert set_alias(owner, "staging", 2).status_code == 200
    set_served(admin, "staging", True)
    reconcile_until(runtime, lambda: 2 in {s.version for s in runtime.status.loading.values()}, what="no v2 load")
    with pytest.raises(ModelNotReady, match=r"^model 'demo' version 'staging' is not loaded yet$"):
        plane.model_ready("demo", "staging")
    with pytest.raises(ModelNotReady, match=r"^model 'demo' version '2' is not loaded yet$"):
        plane.resolve("demo", "2")
    assert plane.resolve("demo").spec.version == 1  # what serves is untouched


# --- Refusals before the body -------------------------------------------------------------------------


def test_authorise_needs_an_inference_token_unless_public(bare_plane, run, settings, owner):
    plane = bare_plane
    settings.INFERENCE_PUBLIC = False
    client = make_person("client", Role.INFERENCE)
    admin = make_person("root", Role.ADMIN)
    assert plane.needs_token is True
    for refused in ("", "not-a-token", owner.token + "x"):
        with pytest.raises(Unauthorised, match=r"^a bearer token with the inference role is required$"):
            run(plane.authorise(refused))
    with pytest.raises(Forbidden, match=r"^inference needs the inference or admin role, and this token carries"):
        run(plane.authorise(owner.token))  # a valid token, but a maintainer has no inference role
    run(plane.authorise(client.token))
    run(plane.authorise(admin.token))  # admins have every role

    token, raw = services.token_create(username="revoked", create_user=True, roles=[Role.INFERENCE], actor=SYSTEM)
    services.token_revoke(token=token, actor=SYSTEM)
    assert run(DataPlane(plane.runtime).token_allowed(raw)) is False

    settings.INFERENCE_PUBLIC = True
    assert plane.needs_token is False
    run(plane.authorise(""))


def test_throttle_is_per_token_or_per_address_and_names_its_setting(bare_plane, settings):
    plane = bare_plane
    plane.throttle(token="", address="10.0.0.1")  # no limit unless MODELYARD_V2_RATE is set
    settings.INFERENCE_PUBLIC = False
    settings.V2_RATE = (2, 60.0)
    first, second = make_person("first", Role.INFERENCE).token, make_person("second", Role.INFERENCE).token
    plane.throttle(token=first, address="10.0.0.1")
    plane.throttle(token=first, address="10.0.0.2")
    with pytest.raises(RateLimited) as refused:
        plane.throttle(token=first, address="10.0.0.3")
    assert refused.value.message == "rate limit of 2 requests per minute passed (MODELYARD_V2_RATE); retry in 30 s"
    assert refused.value.retry_after == 30
    plane.throttle(token=second, address="10.0.0.1")  # a bucket of its own

    settings.INFERENCE_PUBLIC = True  # public: the client is its address
    settings.V2_RATE = (1, 1.0)
    plane.throttle(token="", address="10.0.0.1")
    plane.throttle(token="", address="10.0.0.2")
    with pytest.raises(RateLimited, match=r"^rate limit of 1 requests per second passed"):
        plane.throttle(token="", address="10.0.0.1")


def test_body_limit_follows_the_setting_and_the_fixed_shapes(plane, runtime, owner, approver, settings):
    loaded = plane.resolve("demo")
    settings.V2_MAX_BODY_BYTES = 1000
    limit = plane.body_limit(loaded)
    assert (limit.bytes, limit.source) == (1000, "MODELYARD_V2_MAX_BODY_BYTES")
    with pytest.raises(BodyTooLarge, match=r"^the request body is larger than the limit of 1000 bytes "):
        raise limit.exceeded("the request body")
    settings.V2_MAX_BODY_BYTES = 2000  # the setting is read per request
    assert plane.body_limit(loaded).bytes == 2000

    # Every input fixed ([2, 4] FP32): what those inputs can need, below the global limit.
    fixed = owner.upload("demo", [("model.onnx", onnx_compat.add_model(3.0, rows=2).SerializeToString())])
    assert fixed.status_code == 201, fixed.content
    force_promote(owner, approver, 3)
    reconcile_until(runtime, lambda: serving(runtime) == 3, what="v3 never served")
    settings.V2_MAX_BODY_BYTES = 10**9
    limit = plane.body_limit(plane.resolve("demo"))
    assert (limit.bytes, limit.source) == (64 * 1024 + 8 * 64, "what the fixed-shape inputs of model 'demo' can need")


def test_admit_checks_the_token_then_the_rate_then_the_route_and_counts_every_outcome(plane, run, settings):
    """One admission for both transports: what it refuses, in which order, and under which labels it counts."""
    settings.INFERENCE_PUBLIC = False
    settings.V2_RATE = (1, 60.0)
    client = make_person("client", Role.INFERENCE).token
    read: list[str] = []

    def admit(model: str, token: str) -> Any:
        call = {"token": token, "address": "10.0.0.1"}

        def token_of(call: dict[str, str]) -> str:
            read.append("token")
            return call["token"]

        def address_of(call: dict[str, str]) -> str:
            read.append("address")
            return call["address"]

        return run(plane.admit(model, None, call, token=token_of, address=address_of))

    def counted(model: str, version: str, status: str) -> float:
        body, _ = exposition.render()
        return value(body.decode(), "modelyard_inference_requests_total", model=model, version=version, status=status)

    before = {
        key: counted(*key)
        for key in [("_unknown", "", "401"), ("_unknown", "", "404"), ("demo", "", "429"), ("demo", "1", "200")]
    }
    with pytest.raises(Unauthorised):  # no token: refused before the rate limit or the route is looked at
        admit("nothing", "")
    assert read == ["token"]
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'nothing' is not found$"):
        admit("nothing", client)  # takes the client's one request of the minute
    assert read == ["token", "token", "address"]
    with pytest.raises(RateLimited):
        admit("demo", client)
    assert counted("_unknown", "", "401") == before["_unknown", "", "401"] + 1
    assert counted("_unknown", "", "404") == before["_unknown", "", "404"] + 1
    assert counted("demo", "", "429") == before["demo", "", "429"] + 1

    settings.V2_RATE = None  # no limit: the address is not read
    admitted = admit("demo", client)
    assert read == ["token", "token", "address", "token", "address", "token"]
    assert admitted.loaded is plane.resolve("demo")
    assert admitted.body_limit == plane.body_limit(admitted.loaded)
    admitted.answered(200)  # the transport counts what it answered, under the version's labels
    assert counted("demo", "1", "200") == before["demo", "1", "200"] + 1


# --- Inference ----------------------------------------------------------------------------------------


def test_infer_runs_on_the_served_version_and_releases_it(plane, run):
    loaded = plane.resolve("demo")
    x = sample(3)
    result = run(plane.infer("demo", None, request_for(loaded, x)))
    assert isinstance(result, InferResult)
    assert (result.model, result.version, list(result.outputs)) == ("demo", "1", ["y"])
    np.testing.assert_array_equal(result.outputs["y"], x + np.float32(1.0))
    assert loaded.inflight == 0
    # The same through the version number and the alias name.
    assert run(plane.infer("demo", "1", request_for(loaded, x))).version == "1"
    assert run(plane.infer("demo", "production", request_for(loaded, x))).version == "1"
    assert loaded.inflight == 0


def test_concurrent_requests_are_merged_into_one_run(owner, approver, two_versions, make_runtime, run, monkeypatch):
    RegisteredModel.objects.filter(name="demo").update(max_queue_delay_us=200_000, max_batch_size=64)
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    plane = DataPlane(runtime)
    loaded = plane.resolve("demo")
    gate = RunGate(loaded, monkeypatch)
    inputs = [sample(rows, seed=rows) for rows in (1, 2, 3, 4)]

    async def together() -> list[InferResult]:
        return await asyncio.gather(*(plane.infer("demo", None, request_for(loaded, x)) for x in inputs))

    results = run(together())
    assert gate.rows == [10]  # one ONNX Runtime run of all ten rows
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result.outputs["y"], x + np.float32(1.0))  # each gets its own rows back
    assert loaded.inflight == 0


def test_a_fixed_shape_model_runs_each_request_alone(owner, approver, make_runtime, run, monkeypatch):
    create_model(owner)
    response = owner.upload("demo", [("model.onnx", onnx_compat.add_model(1.0, rows=2).SerializeToString())])
    assert response.status_code == 201, response.content
    RegisteredModel.objects.filter(name="demo").update(max_queue_delay_us=200_000)
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    plane = DataPlane(runtime)
    loaded = plane.resolve("demo")
    assert loaded.batching is False
    assert plane.model_config("demo")["max_batch_size"] == 0
    gate = RunGate(loaded, monkeypatch)

    async def together() -> list[InferResult]:
        return await asyncio.gather(*(plane.infer("demo", None, request_for(loaded, sample(2, i))) for i in range(3)))

    results = run(together())
    assert gate.rows == [2, 2, 2]
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs["y"], sample(2, i) + np.float32(1.0))


def test_what_ort_refuses_is_inference_failed_and_out_of_memory_is_its_own(plane, run, monkeypatch):
    loaded = plane.resolve("demo")

    def refuse(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad input")

    monkeypatch.setattr(loaded, "run", refuse)
    with pytest.raises(InferenceFailed, match=r"^inference failed: \[ONNXRuntimeError\] : 2 : INVALID_ARGUMENT"):
        run(plane.infer("demo", None, request_for(loaded, sample())))

    def no_memory(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
        raise MemoryError

    monkeypatch.setattr(loaded, "run", no_memory)
    with pytest.raises(OutOfMemory, match=r"^the server has not enough memory for this request now"):
        run(plane.infer("demo", None, request_for(loaded, sample())))
    assert loaded.inflight == 0


def test_a_full_queue_is_overloaded_and_a_late_request_times_out(
    owner, approver, two_versions, make_runtime, run, monkeypatch
):
    RegisteredModel.objects.filter(name="demo").update(max_queue_size=1)
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: serving(runtime) == 1, what="v1 never served")
    plane = DataPlane(runtime)
    loaded = plane.resolve("demo")
    gate = RunGate(loaded, monkeypatch, shut=True)

    async def scenario() -> tuple[Any, ...]:
        first = asyncio.ensure_future(plane.infer("demo", None, request_for(loaded, sample(1, 1))))
        await until(gate.running.is_set, "the first run to start")
        late = asyncio.ensure_future(plane.infer("demo", None, request_for(loaded, sample(1, 2), timeout=1000)))
        await until(lambda: loaded.batcher.queued == 1, "the late request to queue")
        with pytest.raises(Overloaded, match=r"^model 'demo' is overloaded: the queue is full \(1 requests\)$"):
            await plane.infer("demo", None, request_for(loaded, sample(1, 3)))
        await asyncio.sleep(0.01)  # past the late request's 1 ms
        gate.open.set()
        return tuple(await asyncio.gather(first, late, return_exceptions=True))

    first, late = run(scenario())
    np.testing.assert_array_equal(first.outputs["y"], sample(1, 1) + np.float32(1.0))
    assert isinstance(late, RequestTimeout)
    assert late.message == "the request timed out in the queue before it ran (timeout 1000 us)"
    assert gate.rows == [1]  # the late request never ran
    assert loaded.inflight == 0


def test_a_request_whose_client_went_away_is_dropped_before_it_runs(plane, run, monkeypatch):
    loaded = plane.resolve("demo")
    gate = RunGate(loaded, monkeypatch, shut=True)

    async def scenario() -> tuple[Any, ...]:
        blocker = asyncio.ensure_future(plane.infer("demo", None, request_for(loaded, sample(1, 1))))
        await until(gate.running.is_set, "the blocker to run")
        hung_up = asyncio.Event()
        abandoned = asyncio.ensure_future(
            plane.infer("demo", None, request_for(loaded, sample(1, 2)), client_gone=hung_up.wait())
        )
        await until(lambda: loaded.batcher.queued == 1, "the abandoned request to queue")
        hung_up.set()
        outcome = await asyncio.gather(abandoned, return_exceptions=True)
        gate.open.set()
        return (await blocker, *outcome)

    blocker, abandoned = run(scenario())
    assert blocker.version == "1"
    assert isinstance(abandoned, ClientGone)
    assert gate.rows == [1]
    assert loaded.inflight == 0


def test_a_request_that_starts_at_once_does_not_watch_for_its_client(plane, run):
    """Nothing in flight: the request runs at once, and a running batch is not stopped when its client leaves."""
    loaded = plane.resolve("demo")
    started = []

    async def watcher() -> None:
        started.append(True)
        await asyncio.Event().wait()

    # A native coroutine, which has cr_frame; mypy types an async def's call as the Coroutine ABC.
    gone = cast("types.CoroutineType[Any, Any, None]", watcher())
    result = run(plane.infer("demo", None, request_for(loaded, sample(1, 4)), client_gone=gone))
    np.testing.assert_array_equal(result.outputs["y"], sample(1, 4) + np.float32(1.0))
    assert started == [] and gone.cr_frame is None  # never started, and closed
    assert loaded.inflight == 0


def test_an_unused_client_gone_awaitable_is_closed(plane, run):
    """A request refused before it runs leaves no never-awaited coroutine behind."""
    loaded = plane.resolve("demo")

    async def never() -> None:
        await asyncio.Event().wait()

    watcher = cast("types.CoroutineType[Any, Any, None]", never())  # a native coroutine, as above
    with pytest.raises(ModelNotFound):
        run(plane.infer("nope", None, request_for(loaded, sample()), client_gone=watcher))
    assert watcher.cr_frame is None  # closed


# --- Swaps --------------------------------------------------------------------------------------------


def test_a_request_decoded_before_a_swap_runs_on_the_new_version(plane, runtime, owner, approver, run):
    v1 = plane.resolve("demo")
    request = request_for(v1, sample())  # decoded while v1 served; the body arrived before the swap
    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    result = run(plane.infer("demo", None, request))
    assert result.version == "2"
    np.testing.assert_array_equal(result.outputs["y"], sample() + np.float32(2.0))
    eventually(lambda: v1.closed, what=f"v1 is {v1.state}")
    with pytest.raises(NotLoaded):
        v1.acquire()


def test_a_swap_to_another_signature_asks_the_client_to_retry(plane, runtime, owner, approver, run):
    v1 = plane.resolve("demo")
    request = request_for(v1, sample(2))
    other = owner.upload("demo", [("model.onnx", onnx_compat.add_model(3.0, rows=2).SerializeToString())])
    assert other.status_code == 201, other.content
    force_promote(owner, approver, 3)
    reconcile_until(runtime, lambda: serving(runtime) == 3, what="v3 never served")
    with pytest.raises(ModelNotReady, match=r"^model 'demo' changed to version 3 meanwhile; retry$"):
        run(plane.infer("demo", None, request))
    # Decoded against the new signature, it runs.
    assert run(plane.infer("demo", None, request_for(plane.resolve("demo"), sample(2)))).version == "3"


def test_a_request_in_flight_holds_its_version_through_a_swap(plane, runtime, owner, approver, run, monkeypatch):
    v1 = plane.resolve("demo")
    gate = RunGate(v1, monkeypatch, shut=True)
    x = sample()

    async def start() -> asyncio.Future[InferResult]:
        held = asyncio.ensure_future(plane.infer("demo", None, request_for(v1, x)))
        await until(gate.running.is_set, "the request to run on v1")
        return held

    held = run(start())  # the loop pauses here; the request waits for ONNX Runtime in the batcher's thread
    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    eventually(lambda: v1.state == "draining", what=f"v1 is {v1.state}")
    assert not v1.closed and not v1.batcher.closed
    assert v1.inflight == 1
    gate.open.set()
    result = run(held)
    assert result.version == "1"  # it finished where it started
    np.testing.assert_array_equal(result.outputs["y"], x + np.float32(1.0))
    eventually(lambda: v1.closed, what=f"v1 is {v1.state}")
    assert v1.state == "closed"


def test_a_loaded_version_owns_its_batcher_until_it_is_released(plane, runtime, owner, approver, run):
    v1 = plane.resolve("demo")
    assert v1.batcher.started is False  # made with the version; no loop until its first request
    run(plane.infer("demo", None, request_for(v1, sample())))
    assert v1.batcher.started and not v1.batcher.closed
    assert [(loaded.spec.version, queued) for loaded, queued in plane.queue_depths()] == [(1, 0)]
    threads = {t for t in threading.enumerate() if t.name.startswith("ort-run")}

    promote(owner, approver, 2)
    reconcile_until(runtime, lambda: serving(runtime) == 2, what="v2 never served")
    eventually(lambda: v1.closed, what=f"v1 is {v1.state}")
    run(asyncio.sleep(0.05))  # the batcher closes on its loop
    assert v1.batcher.closed
    with pytest.raises(Overloaded, match=r"^the model was unloaded$"):
        v1.batcher.submit({"x": sample()})
    eventually(lambda: not any(t.is_alive() for t in threads), what="v1's ONNX Runtime thread is still alive")
    # v2 has taken no request yet: no queue to report.
    assert list(plane.queue_depths()) == []


def test_a_token_cache_given_to_the_data_plane_is_the_one_it_uses(make_runtime):
    from inference.auth import TokenCache

    # An empty cache is falsy (it has a length); it must still be taken, with its own TTL.
    short = TokenCache(ttl=0.5)
    assert len(short) == 0
    assert DataPlane(make_runtime("bare"), tokens=short).tokens is short
