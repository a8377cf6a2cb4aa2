"""Asynchronous inference through the Python client against a live server: batch jobs and infer-async requests.

The server's in-process inference runtime runs the chunks; every model is ``y = x + bias``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelyard.client import AsyncRequest, BadRequest, Client, Conflict, Forbidden, InferenceJob, NotFound
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model

ROWS = np.arange(24, dtype=np.float32).reshape(6, 4)


@pytest.fixture(scope="module")
def people(live: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Client, Client]:
    """(a maintainer who pushed 'summer' v1, y = x + 3; a pipeline with the inference role)."""
    owner = Client(live.url, live.createtoken("max", "maintainer"))
    pipeline = Client(live.url, live.createtoken("pipe", "inference"))
    path = tmp_path_factory.mktemp("summer") / "summer.onnx"
    onnx.save(add_model(bias=3.0), path)
    owner.wait_ready("summer", owner.push("summer", path).version)
    return owner, pipeline


def test_a_job_submitted_waited_for_and_fetched(people, tmp_path: Path):
    owner, pipeline = people
    np.savez(tmp_path / "rows.npz", x=ROWS)
    sent: list[tuple[int, int]] = []
    job = pipeline.submit_job("summer", tmp_path / "rows.npz", version=1, progress=lambda a, b: sent.append((a, b)))
    assert isinstance(job, InferenceJob)
    assert (job.model, job.version, job.ref, job.format, job.rows, job.created_by) == (
        "summer",
        1,
        "1",
        "npz",
        6,
        "pipe",
    )
    size = (tmp_path / "rows.npz").stat().st_size
    assert sent[-1] == (size, size) and job.input_bytes == size

    seen: list[str] = []
    done = pipeline.wait_job(job.id, timeout=180, progress=lambda found: seen.append(found.state))
    assert (done.state, done.rows_done, done.ended) == ("succeeded", 6, True)
    assert done.result == f"/api/v1/inference-jobs/{job.id}/result" and seen[-1] == "succeeded"
    assert pipeline.job(job.id).raw == done.raw
    assert [found.id for found in pipeline.jobs(state="succeeded", model="summer")] == [job.id]
    assert pipeline.jobs(state="failed") == []
    assert owner.jobs() == []  # not theirs

    path = pipeline.fetch_job_result(job.id, tmp_path / "out.npz")
    with np.load(path, allow_pickle=False) as result:
        np.testing.assert_array_equal(result["y"], ROWS + 3)
    assert not list(tmp_path.glob(".*.part"))

    with pytest.raises(Conflict) as refused:
        pipeline.cancel_job(job.id)
    assert refused.value.error == f"job {job.id} is succeeded; only a queued or running job can be cancelled"


def test_json_lines_choose_their_outputs(people, tmp_path: Path):
    _, pipeline = people
    lines = [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": row.tolist()}]} for row in ROWS]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    job = pipeline.submit_job("summer", tmp_path / "rows.jsonl", version=1, outputs=["y"])
    assert (job.format, job.rows) == ("jsonl", 6)
    assert pipeline.wait_job(job.id, timeout=180).state == "succeeded"
    answers = [
        json.loads(line) for line in pipeline.fetch_job_result(job.id, tmp_path / "out.jsonl").read_text().splitlines()
    ]
    assert [answer["outputs"][0]["data"] for answer in answers] == (ROWS + 3).tolist()


def test_refusals_raise_the_servers_errors(people, tmp_path: Path):
    owner, pipeline = people
    np.savez(tmp_path / "rows.npz", x=ROWS)
    with pytest.raises(Forbidden) as no_role:
        owner.submit_job("summer", tmp_path / "rows.npz", version=1)
    assert no_role.value.error == "asynchronous inference needs the inference or admin role"
    with pytest.raises(NotFound):
        pipeline.submit_job("summer", tmp_path / "rows.npz", alias="nowhere")
    with pytest.raises(BadRequest):
        pipeline.submit_job("summer", tmp_path / "rows.npz", version=1, format="jsonl")
    with pytest.raises(NotFound):
        pipeline.job("0000000000000000")


def test_an_async_request_and_its_answer(people):
    _, pipeline = people
    body = {"id": "q1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]}
    queued = pipeline.infer_async("summer", body, version=1)
    assert isinstance(queued, AsyncRequest)
    assert queued.location == f"/api/v1/models/summer/infer-async/{queued.id}"
    answer = pipeline.async_result("summer", queued.id, wait=120)
    assert answer is not None
    assert (answer["id"], answer["model_name"], answer["model_version"]) == ("q1", "summer", "1")
    assert answer["outputs"][0]["data"] == [3.0, 4.0, 5.0, 6.0]
    # A request the model cannot take is refused: when it is sent, or on the GET of its answer.
    wrong = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [0, 1, 2]}]}
    with pytest.raises(BadRequest):
        pipeline.async_result("summer", pipeline.infer_async("summer", wrong, version=1).id, wait=120)
