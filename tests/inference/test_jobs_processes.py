"""Inference jobs run by real ``modelyard serve`` processes: every format, a cancel, a killed process, a promotion.

Jobs are accepted through the registry's services in this process (which also splits them into chunks);
the inference processes take the chunks from the test database, read and write them in the test's
artifact folder, and run them through their batchers. The models are ``y = x @ I @ ... @ I + bias``:
the identity matrices cost real ONNX Runtime time per row, and leave every output exactly ``x + bias``,
so each row says which version computed it. References are ONNX Runtime sessions run here, row by row.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from django.test import TestCase
from django.utils import timezone
from onnx import TensorProto, helper, numpy_helper

from registry.jobs import services
from registry.models import InferenceJob, InferenceJobChunk, InferenceJobState, JobStatus, RegisteredModel
from storage import get_storage
from tests.support.onnx_models import IR, OPSET
from tests.support.polling import eventually
from tests.support.prometheus import samples, value
from tests.support.registry import create_model, promote
from tests.support.text_models import direct_run, text_model_bytes, tiny_tokenizer_json

pytestmark = pytest.mark.django_db(transaction=True)

WIDTH = 64
WIDE = 256
JOB_ENV = {"MODELYARD_INFERENCE_JOB_LEASE_SECONDS": "2"}


def chain_model_bytes(*, bias: float, layers: int = 8, width: int = WIDTH) -> bytes:
    """``y = x @ I^layers + bias`` with x [N, width]: as slow per row as ``layers`` MatMuls, exactly ``x + bias``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    initializers = [
        numpy_helper.from_array(np.eye(width, dtype=np.float32), "w"),
        numpy_helper.from_array(np.full([width], bias, dtype=np.float32), "b"),
    ]
    nodes, previous = [], "x"
    for index in range(layers):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"h{index}"]))
        previous = f"h{index}"
    nodes.append(helper.make_node("Add", [previous, "b"], ["y"]))
    graph = helper.make_graph(nodes, "chain", [x], [y], initializers)
    model = helper.make_model(graph, ir_version=IR, opset_imports=[helper.make_opsetid("", OPSET)])
    return model.SerializeToString()


def upload(person: Any, model: str, files: list[tuple[str, bytes]]) -> None:
    response = person.upload(model, files)
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "ready", response.json()


def setup_model(
    owner: Any, approver: Any, biases: list[float], *, layers: int = 8, width: int = WIDTH, name: str = "demo"
) -> None:
    create_model(owner, name)
    for bias in biases:
        upload(owner, name, [("model.onnx", chain_model_bytes(bias=bias, layers=layers, width=width))])
    RegisteredModel.objects.filter(name=name).update(max_batch_size=8, max_queue_delay_us=0)
    promote(owner, approver, 1, model=name)


def npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def submit(
    person: Any, data: bytes, filename: str, *, model: str = "demo", ref: str = "production", result_format: str = ""
) -> InferenceJob:
    with TestCase.captureOnCommitCallbacks(execute=True):  # the prepare task, queued after commit
        job = services.job_submit(
            model=RegisteredModel.objects.get(name=model),
            ref=ref,
            fmt=None,
            filename=filename,
            stream=io.BytesIO(data),
            input_url="",
            outputs=[],
            result_format=result_format,
            user=person.actor.user,
            token=None,
            actor=person.actor,
        )
    return job


def job_state(job: InferenceJob) -> InferenceJob:
    job.refresh_from_db()
    return job


def wait_ended(job: InferenceJob, timeout: float = 90) -> InferenceJob:
    eventually(
        lambda: job_state(job).state not in (InferenceJobState.QUEUED, InferenceJobState.RUNNING),
        timeout=timeout,
        interval=0.1,
        what=lambda: f"job {job.public_id}: {job.state} {job.rows_done}/{job.rows} {job.errors}",
    )
    return job


def result_bytes(job: InferenceJob) -> bytes:
    assert job.state == InferenceJobState.SUCCEEDED, (job.state, job.errors)
    stream, _type, _name, _size = services.job_result(job)
    with stream:
        return stream.read()


def result_npz(job: InferenceJob) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(result_bytes(job)), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def direct_rows(model: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])


def rows_of(seed: int, rows: int, width: int = WIDTH) -> np.ndarray:
    return np.random.default_rng(seed).integers(-1000, 1000, (rows, width)).astype(np.float32)


def v2_body(x: np.ndarray, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def test_jobs_in_every_format_give_what_direct_runs_and_v2_give(owner, approver, start_server, settings):
    settings.INFERENCE_JOB_CHUNK_ROWS = 16
    setup_model(owner, approver, [1.0])
    create_model(owner, "words")
    upload(owner, "words", [("model.onnx", text_model_bytes()), ("tokenizer.json", tiny_tokenizer_json())])
    RegisteredModel.objects.filter(name="words").update(max_batch_size=2, max_queue_delay_us=0)
    promote(owner, approver, 1, model="words")

    x = rows_of(1, 40)
    tensors = submit(owner, npz(x=x), "rows.npz")
    lines = [v2_body(rows_of(10 + i, 1 + i % 3), request_id=f"r{i}" if i % 2 else None) for i in range(6)]
    jsonl = submit(owner, b"".join(json.dumps(line).encode() + b"\n" for line in lines), "lines.jsonl")
    texts = ["hello world", "the model registry stores versioned onnx artifacts", "one two three", "text", "a"]
    text = submit(owner, "\n".join(texts).encode() + b"\n", "texts.txt", model="words", result_format="npz")
    one = v2_body(rows_of(20, 2), request_id="async")
    request = services.request_submit(
        model=RegisteredModel.objects.get(name="demo"),
        ref="production",
        body=json.dumps(one).encode(),
        user=owner.actor.user,
        token=None,
        actor=owner.actor,
    )
    server = start_server("inf-jobs", extra_env=JOB_ENV)

    np.testing.assert_array_equal(result_npz(wait_ended(tensors))["y"], direct_rows(chain_model_bytes(bias=1.0), x))
    assert tensors.rows == tensors.rows_done == 40

    answers = result_bytes(wait_ended(jsonl)).decode().splitlines()
    assert len(answers) == len(lines)
    for line, answer in zip(lines, answers, strict=True):
        status, expected = server.request("POST", "/v2/models/demo/infer", line)
        assert status == 200 and json.loads(answer) == expected

    pooled = result_npz(wait_ended(text))["sentence_embedding"]
    for row, words in enumerate(texts):
        np.testing.assert_allclose(
            pooled[row], direct_run(text_model_bytes(), [words])["sentence_embedding"][0], atol=1e-5
        )

    wait_ended(request)
    status, expected = server.request("POST", "/v2/models/demo/infer", one)
    assert status == 200
    answered = services.request_answer(request)
    assert answered[0] == 200 and json.loads(answered[1]) == expected


def test_a_killed_process_loses_only_its_chunk_and_a_cancel_stops_a_job(owner, approver, admin, start_server, settings):
    settings.INFERENCE_JOB_CHUNK_ROWS = 8
    # Chunks of a few hundred milliseconds, so that one is caught while it runs.
    setup_model(owner, approver, [1.0], layers=400, width=WIDE)
    first = start_server("inf-a", extra_env=JOB_ENV, wait=False)
    second = start_server("inf-b", extra_env=JOB_ENV, wait=False)  # both start at once
    body = v2_body(rows_of(0, 1, WIDE))
    for server in (first, second):
        server.wait_ready()

        def answers(server: Any = server) -> bool:
            return bool(server.request("POST", "/v2/models/demo/infer", body)[0] == 200)

        eventually(answers, timeout=30)

    x = rows_of(2, 48, WIDE)
    job = submit(owner, npz(x=x), "rows.npz")

    def caught_running() -> InferenceJobChunk | None:
        """A chunk inf-a runs, with inf-a stopped while it still does: nothing can finish it before the kill.

        Seen running and then killed, a chunk could finish in between on a busy machine (it did in CI).
        """
        chunk = InferenceJobChunk.objects.filter(job=job, state=JobStatus.RUNNING, worker_id="inf-a").first()
        if chunk is None:
            return None
        os.killpg(first.process.pid, signal.SIGSTOP)
        chunk.refresh_from_db()  # what inf-a had committed when it stopped
        if chunk.state == JobStatus.RUNNING and chunk.worker_id == "inf-a":
            return chunk
        os.killpg(first.process.pid, signal.SIGCONT)  # it finished that one first: catch the next
        return None

    held = eventually(caught_running, timeout=60, interval=0.01, what="inf-a never ran a chunk")
    os.killpg(first.process.pid, signal.SIGKILL)  # mid-chunk: its lease lapses, and inf-b takes the chunk again
    first.process.wait()
    np.testing.assert_array_equal(result_npz(wait_ended(job))["y"], x + np.float32(1.0))
    held.refresh_from_db()
    assert (held.state, held.worker_id, held.attempts) == (JobStatus.SUCCEEDED, "inf-b", 2)
    assert job.rows_done == 48
    status, text = second.request("GET", "/metrics", token=admin.token)
    assert status == 200, text
    assert value(text, "modelyard_inference_job_chunk_retries_total", model="demo") >= 1
    assert value(text, "modelyard_inference_job_rows_total", model="demo") >= 8
    depths = {labels["priority"] for name, labels, _ in samples(text) if name == "modelyard_priority_queue_depth"}
    assert depths == {"high", "normal", "low", "job"}

    doomed = submit(owner, npz(x=rows_of(3, 160, WIDE)), "more.npz")
    eventually(lambda: job_state(doomed).rows_done > 0, timeout=60, interval=0.05, what="the job never started")
    services.job_cancel(doomed, actor=owner.actor)
    time.sleep(1.5)  # the chunk running at the cancel stops at its next renewal, well within this
    done = job_state(doomed).rows_done
    time.sleep(1.5)
    assert job_state(doomed).state == InferenceJobState.CANCELLED
    assert doomed.rows_done == done < 160
    assert InferenceJobChunk.objects.filter(job=doomed, state=JobStatus.PENDING).exists()

    after = submit(owner, npz(x=x[:8]), "after.npz")  # the runner is free again
    np.testing.assert_array_equal(result_npz(wait_ended(after))["y"], x[:8] + np.float32(1.0))


def chunk_outputs(job: InferenceJob, *, finished_after: Any = None) -> list[tuple[int, np.ndarray]]:
    """(start, y) of each chunk of ``job`` done so far (after ``finished_after``), read from the store."""
    chunks = InferenceJobChunk.objects.filter(job=job, state=JobStatus.SUCCEEDED)
    if finished_after is not None:
        chunks = chunks.filter(finished_at__gt=finished_after)
    found = []
    for chunk in chunks:
        with get_storage().open(chunk.output_key) as stream, np.load(io.BytesIO(stream.read())) as archive:
            found.append((chunk.start, archive["y"]))
    return found


def test_a_promotion_during_a_job_keeps_its_version_and_online_requests_are_answered_first(
    owner, approver, start_server, settings
):
    settings.INFERENCE_JOB_CHUNK_ROWS = 16
    setup_model(owner, approver, [1.0, 2.0], layers=40)
    server = start_server("inf-promote", extra_env=JOB_ENV)
    probe = rows_of(4, 2)
    eventually(lambda: server.request("POST", "/v2/models/demo/infer", v2_body(probe))[0] == 200, timeout=30)

    x = rows_of(5, 3200)  # far more than the test waits for: it is cancelled at the end
    job = submit(owner, npz(x=x), "rows.npz")
    eventually(lambda: job_state(job).rows_done > 0, timeout=60, interval=0.05, what="the job never started")
    # Online requests to the job's own version go ahead of its chunks: answered while chunks remain.
    status, body = server.request("POST", "/v2/models/demo/versions/1/infer", v2_body(probe))
    assert status == 200 and body["outputs"][0]["data"] == (probe + np.float32(1.0)).ravel().tolist()
    assert job_state(job).state == InferenceJobState.RUNNING

    promote(owner, approver, 2)

    def answers_v2() -> bool:
        status, body = server.request("POST", "/v2/models/demo/infer", v2_body(probe))
        return status == 200 and body["model_version"] == "2"

    eventually(answers_v2, timeout=60, interval=0.1, what="v2 never served")
    promoted = timezone.now()
    later = eventually(lambda: len(chunk_outputs(job, finished_after=promoted)) >= 3, timeout=60, interval=0.1)
    assert later
    for start, y in chunk_outputs(job):  # every chunk, before and after the promotion, computed by v1
        np.testing.assert_array_equal(y, x[start : start + len(y)] + np.float32(1.0))
    assert job_state(job).state == InferenceJobState.RUNNING and job.version.version == 1
    services.job_cancel(job, actor=owner.actor)
