"""Inference jobs run to their end inside a test, without inference processes.

The registry's steps are called as its tasks call them (``job_prepare``, ``job_finish``), and each
chunk is taken, run and given back through the seam an inference process uses (``registry.serving``:
``job_chunk_claim``, ``job_chunk_done``, ``job_chunk_failed``), on a real ONNX Runtime session of the
version's stored model. ``tests/inference/`` runs the real inference processes.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import onnxruntime as ort

from registry import serving
from registry.jobs import services as jobs
from registry.models import InferenceJob, ModelVersion
from storage import get_storage

WORKER = "test-worker"
_NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
_DATATYPE = {np.dtype(numpy): name for name, numpy in _NUMPY.items()}


def session_of(version: ModelVersion) -> ort.InferenceSession:
    with get_storage().open(version.model_file.storage_key) as stream:
        return ort.InferenceSession(stream.read(), providers=["CPUExecutionProvider"])


def _v2_answer(session: ort.InferenceSession, version: ModelVersion, body: dict[str, Any]) -> dict[str, Any]:
    feeds = {
        item["name"]: np.asarray(item["data"], dtype=_NUMPY[item["datatype"]]).reshape(item["shape"])
        for item in body["inputs"]
    }
    names = [output.name for output in session.get_outputs()]
    arrays = session.run(names, feeds)
    answer: dict[str, Any] = {"model_name": version.model.name, "model_version": str(version.version)}
    if "id" in body:
        answer["id"] = body["id"]
    answer["outputs"] = [
        {"name": name, "datatype": _DATATYPE[array.dtype], "shape": list(array.shape), "data": array.ravel().tolist()}
        for name, array in zip(names, arrays, strict=True)
    ]
    return answer


def _run_chunk(chunk: serving.JobChunk, session: ort.InferenceSession, version: ModelVersion) -> int:
    storage = get_storage()
    with storage.open(chunk.input_key) as stream:
        data = stream.read()
    if chunk.format == "npz":
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            feeds = {name: arrays[name] for name in arrays.files}
        names = list(chunk.outputs) or [output.name for output in session.get_outputs()]
        out = io.BytesIO()
        np.savez(out, **dict(zip(names, session.run(names, feeds), strict=True)))
        payload = out.getvalue()
    elif chunk.format == "jsonl":
        lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        payload = "".join(json.dumps(_v2_answer(session, version, body)) + "\n" for body in lines).encode()
    elif chunk.format == "v2":
        payload = json.dumps(_v2_answer(session, version, json.loads(data))).encode()
    else:
        raise AssertionError(f"no hand runner for {chunk.format}")
    storage.delete(chunk.output_key)
    storage.write(chunk.output_key, io.BytesIO(payload))
    return chunk.rows


def run_chunks(job: InferenceJob) -> int:
    """Take and run every chunk of ``job`` as an inference process would; returns how many ran."""
    version = ModelVersion.objects.select_related("model").get(pk=job.version_id)
    session = session_of(version)
    ran = 0
    while (chunk := serving.job_chunk_claim(worker_id=WORKER, version_ids=[job.version_id])) is not None:
        rows = _run_chunk(chunk, session, version)
        serving.job_chunk_done(chunk.chunk_id, worker_id=WORKER, rows=rows)
        ran += 1
    return ran


def run_job(job_id: str) -> InferenceJob:
    """Prepare, run and finish the batch job ``job_id`` (its public id); returns it as it ended."""
    job = InferenceJob.objects.get(public_id=job_id)
    assert jobs.job_prepare(job.pk) == "prepared"
    run_chunks(job)
    assert jobs.job_finish(job.pk) == "succeeded"
    job.refresh_from_db()
    return job


def refuse_request(job_id: str, message: str, status: int = 400) -> None:
    """The model refuses an infer-async request, as the runner reports an InvalidInput."""
    job = InferenceJob.objects.get(public_id=job_id)
    chunk = serving.job_chunk_claim(worker_id=WORKER, version_ids=[job.version_id])
    assert chunk is not None and chunk.job_id == job_id
    serving.job_chunk_failed(chunk.chunk_id, worker_id=WORKER, error=message, retry=False, status=status)
