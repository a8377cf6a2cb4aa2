"""Chunks of inference jobs run by ``inference.jobs``: each format's output, slices, refusals, a cancel, the runner.

An in-process runtime loads a real version (validated for real, through the API); the chunks are run on
an event loop of their own, as a server's, through the version's batcher: first one by one by hand
(:class:`ChunkRun`), then claimed from the database by the runtime's :class:`JobRunner` and answered
through the registry's services, in a local folder and in S3. The references are ONNX Runtime sessions
run directly, row by row, and the /v2 app's own answers.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from inference.app import build_app
from inference.jobs import ChunkFailed, ChunkRun, Dropped
from inference.loaded import LoadedVersion
from registry.models import RegisteredModel
from registry.serving import JobChunk
from storage import get_storage
from tests.support.onnx_models import mlp_model
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = mlp_model().SerializeToString()


def npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def chunk(fmt: str, rows: int, *, start: int = 0, outputs: tuple[str, ...] = (), version_id: int = 0) -> JobChunk:
    return JobChunk(
        chunk_id=1,
        job_id="job",
        kind="request" if fmt == "v2" else "batch",
        format=fmt,
        version_id=version_id,
        model="demo",
        version=1,
        input_key="in",
        output_key="out",
        start=start,
        stop=start + rows,
        outputs=outputs,
    )


class Slices:
    """Records the rows of every ONNX Runtime run of a loaded version."""

    def __init__(self, loaded: LoadedVersion, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows: list[int] = []
        real = loaded.run

        def logged(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
            self.rows.append(next(iter(feeds.values())).shape[0])
            return real(feeds, output_names)

        monkeypatch.setattr(loaded, "run", logged)


def run_chunk(loaded: LoadedVersion, loop: Any, job: JobChunk, data: bytes, renew: Any = None) -> bytes:
    return ChunkRun(job, loaded, loop, renew=renew or (lambda: None)).output(data)


def test_an_npz_chunk_gives_each_rows_outputs_in_slices_of_the_largest_batch(served_mlp, asgi_loop, monkeypatch):
    _, loaded = served_mlp
    slices = Slices(loaded, monkeypatch)
    x = np.random.default_rng(5).standard_normal((10, 32)).astype(np.float32)
    out = run_chunk(loaded, asgi_loop.loop, chunk("npz", 10), npz(x=x))
    with np.load(io.BytesIO(out), allow_pickle=False) as result:
        y = result["y"]
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    expected = np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(10)])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    assert slices.rows == [4, 4, 2]  # max_batch_size rows at most: an online request waits for one slice at most


def test_slices_are_as_small_as_the_slice_setting_asks(served_mlp, asgi_loop, monkeypatch, settings):
    _, loaded = served_mlp
    settings.INFERENCE_JOB_SLICE_ROWS = 3
    slices = Slices(loaded, monkeypatch)
    x = np.random.default_rng(8).standard_normal((10, 32)).astype(np.float32)
    out = run_chunk(loaded, asgi_loop.loop, chunk("npz", 10), npz(x=x))
    with np.load(io.BytesIO(out), allow_pickle=False) as result:
        y = result["y"]
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert slices.rows == [3, 3, 3, 1]
    settings.INFERENCE_JOB_SLICE_ROWS = 64  # never more than the model's max_batch_size
    slices.rows.clear()
    run_chunk(loaded, asgi_loop.loop, chunk("npz", 10), npz(x=x))
    assert slices.rows == [4, 4, 2]


def test_jsonl_lines_are_answered_with_the_body_v2_gives(served_mlp, asgi_loop):
    runtime, loaded = served_mlp
    rng = np.random.default_rng(6)
    bodies = []
    for index in range(5):
        x = rng.standard_normal((1 + index % 2, 32)).astype(np.float32)
        body: dict[str, Any] = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]
        }
        if index % 2:
            body["id"] = f"line-{index}"
        if index == 3:
            body["outputs"] = [{"name": "y", "parameters": {"classification": 2}}]
        bodies.append(body)
    data = b"".join(json.dumps(body).encode() + b"\n" for body in bodies)
    out = run_chunk(loaded, asgi_loop.loop, chunk("jsonl", 5, start=10), data)
    app = build_app(runtime)
    lines = out.decode().splitlines()
    assert len(lines) == 5
    for body, line in zip(bodies, lines, strict=True):
        status, answer = asgi_loop.request(app, "POST", "/v2/models/demo/infer", body)
        assert status == 200
        assert json.loads(line) == answer


def test_a_v2_request_answers_as_v2_does_and_a_refused_one_fails_with_v2s_message(served_mlp, asgi_loop):
    runtime, loaded = served_mlp
    app = build_app(runtime)
    x = np.ones((2, 32), np.float32)
    body = {"id": "r", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 32], "data": x.ravel().tolist()}]}
    out = run_chunk(loaded, asgi_loop.loop, chunk("v2", 1), json.dumps(body).encode())
    assert json.loads(out) == asgi_loop.request(app, "POST", "/v2/models/demo/infer", body)[1]

    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    status, refusal = asgi_loop.request(app, "POST", "/v2/models/demo/infer", bad)
    with pytest.raises(ChunkFailed) as failed:
        run_chunk(loaded, asgi_loop.loop, chunk("v2", 1), json.dumps(bad).encode())
    assert (failed.value.status, failed.value.message, failed.value.retry) == (status, refusal["error"], False)


def test_a_bad_line_fails_the_job_naming_its_line(served_mlp, asgi_loop):
    _, loaded = served_mlp
    line = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 32], "data": [0.0] * 32}]}
    data = json.dumps(line).encode() + b"\nnot json\n"
    with pytest.raises(ChunkFailed, match=r"^line 8: the request is not valid JSON") as failed:
        run_chunk(loaded, asgi_loop.loop, chunk("jsonl", 2, start=6), data)
    assert failed.value.retry is False and failed.value.status == 400


def test_npz_arrays_that_do_not_fit_the_model_are_refused_by_name(served_mlp, asgi_loop):
    _, loaded = served_mlp
    with pytest.raises(ChunkFailed, match=r"missing input.s. x; unknown input.s. z; the model takes x"):
        run_chunk(loaded, asgi_loop.loop, chunk("npz", 2), npz(z=np.ones((2, 32), np.float32)))
    with pytest.raises(ChunkFailed, match=r"unknown output.s. nope"):
        run_chunk(loaded, asgi_loop.loop, chunk("npz", 2, outputs=("nope",)), npz(x=np.ones((2, 32), np.float32)))
    with pytest.raises(ChunkFailed, match="first dimension must be the chunk's 3 rows"):
        run_chunk(loaded, asgi_loop.loop, chunk("npz", 3), npz(x=np.ones((2, 32), np.float32)))


def test_a_chunk_whose_job_no_longer_wants_it_stops_between_slices(served_mlp, asgi_loop, monkeypatch):
    _, loaded = served_mlp
    slices = Slices(loaded, monkeypatch)
    calls = 0

    def renew() -> None:
        nonlocal calls
        calls += 1
        if calls > 2:  # cancelled after two slices
            raise Dropped

    with pytest.raises(Dropped):
        run_chunk(loaded, asgi_loop.loop, chunk("npz", 20), npz(x=np.ones((20, 32), np.float32)), renew)
    assert slices.rows == [4, 4]


def test_a_text_chunk_gives_what_onnx_runtime_gives_on_each_texts_ids(
    owner, approver, make_runtime, asgi_loop, settings
):
    from tests.support.text_models import direct_run, text_model_bytes, tiny_tokenizer_json

    settings.INFERENCE_PUBLIC = True
    create_model(owner)
    files = [("model.onnx", text_model_bytes()), ("tokenizer.json", tiny_tokenizer_json())]
    assert owner.upload("demo", files).status_code == 201
    RegisteredModel.objects.filter(name="demo").update(max_batch_size=2, max_queue_delay_us=0)
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="the text version never loaded")
    texts = ["hello world", "the model registry stores versioned onnx artifacts", "", "one two three", "text"]
    out = run_chunk(loaded, asgi_loop.loop, chunk("text", len(texts)), npz(text=np.array(texts)))
    with np.load(io.BytesIO(out), allow_pickle=False) as result:
        pooled, tokens = result["sentence_embedding"], result["token_embeddings"]
    assert tokens.shape[:2] == (5, 9)  # the chunk's longest text, [CLS] and [SEP] included
    for row, text in enumerate(texts):
        expected = direct_run(text_model_bytes(), [text])
        np.testing.assert_allclose(pooled[row], expected["sentence_embedding"][0], atol=1e-5, rtol=0)
        length = expected["token_embeddings"].shape[1]
        np.testing.assert_allclose(tokens[row, :length], expected["token_embeddings"][0], atol=1e-5, rtol=0)
        assert not tokens[row, length:].any()  # padded positions are zeros, whatever slice the text ran in

    # Text in JSON Lines (v2 bodies with a "text" input) is tokenised as /v2 tokenises it.
    bodies = [
        {"id": str(i), "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [t]}]}
        for i, t in enumerate(texts[:3])
    ]
    data = b"".join(json.dumps(body).encode() + b"\n" for body in bodies)
    lines = run_chunk(loaded, asgi_loop.loop, chunk("jsonl", 3), data).decode().splitlines()
    app = build_app(runtime)
    for body, line in zip(bodies, lines, strict=True):
        assert json.loads(line) == asgi_loop.request(app, "POST", "/v2/models/demo/infer", body)[1]


# --- The runner: claimed from the database, answered through the registry ----------------------------------


def ask_async(person: Any, body: dict[str, Any]) -> Any:
    from registry.jobs import services

    return services.request_submit(
        model=RegisteredModel.objects.get(name="demo"),
        ref="production",
        body=json.dumps(body).encode(),
        user=person.actor.user,
        token=None,
        actor=person.actor,
    )


def test_the_runner_answers_an_async_request_as_v2_and_a_refused_one_with_v2s_status(served_mlp, owner, asgi_loop):
    from registry.jobs import services

    runtime, _ = served_mlp
    app = build_app(runtime)
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    good = {"id": "a", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 32], "data": x.ravel().tolist()}]}
    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}  # the wrong shape
    answered, refused = ask_async(owner, good), ask_async(owner, bad)
    assert runtime.jobs.run_next() and runtime.jobs.run_next()
    assert not runtime.jobs.run_next()  # nothing left to take

    answered.refresh_from_db()
    status, body = services.request_answer(answered)
    assert (status, json.loads(body)) == asgi_loop.request(app, "POST", "/v2/models/demo/infer", good)
    refused.refresh_from_db()
    status, body = services.request_answer(refused)
    v2_status, v2_body = asgi_loop.request(app, "POST", "/v2/models/demo/infer", bad)
    assert (status, json.loads(body)["error"]) == (v2_status, v2_body["error"]) and status == 400


def test_the_runner_takes_nothing_without_the_servers_loop(served_mlp, owner):
    runtime, _ = served_mlp
    runtime.loop = None
    job = ask_async(owner, {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 32], "data": [0.0] * 32}]})
    assert not runtime.jobs.run_next()
    job.refresh_from_db()
    assert job.state == "queued"


@pytest.fixture
def served_from_s3(s3_settings, served_mlp) -> tuple[Any, LoadedVersion]:
    """``served_mlp`` with the artifact store in an S3 bucket (moto's server): the version, the chunks, the answers."""
    return served_mlp


def test_the_runner_reads_and_writes_its_chunks_in_an_s3_store(served_from_s3, owner):
    from registry.jobs import services

    runtime, _ = served_from_s3
    x = np.arange(32, dtype=np.float32).reshape(1, 32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 32], "data": x.ravel().tolist()}]}
    job = ask_async(owner, body)
    assert type(get_storage()).__name__ == "S3Storage" and get_storage().exists(job.input_key)
    assert runtime.jobs.run_next()
    job.refresh_from_db()
    status, answer = services.request_answer(job)
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    assert status == 200
    [output] = json.loads(answer)["outputs"]
    np.testing.assert_allclose(np.array(output["data"], np.float32), session.run(None, {"x": x})[0].ravel(), rtol=1e-6)
