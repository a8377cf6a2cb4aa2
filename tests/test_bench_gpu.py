"""``bench/gpu/gpu_serve.py``, the H200 run's driver, end to end on the CPU, so it still works when a GPU is lent.

The device run cannot happen in CI, and a device call is too scarce to find a broken script with. This
runs the same script with ``--device cpu`` on a tiny encoder of the same signature (built with
``onnx.helper``, no torch): a real ``modelyard serve --role all --workers 2`` on SQLite, the model
uploaded and promoted through the REST API, the fleet waited on, the answer checked against ONNX
Runtime, and the load generator's closed-loop clients. Speed is not asserted, only that every step
happened and nothing failed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def tiny_encoder(path: Path) -> Path:
    """input_ids, attention_mask [batch, seq] -> sentence_embedding [batch, 8]: masked mean of embeddings."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 8])
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32), "E")
    last = numpy_helper.from_array(np.array([-1], dtype=np.int64), "last")
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["h"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "last"], ["m3"]),
        helper.make_node("Mul", ["h", "m3"], ["hm"]),
        helper.make_node("ReduceMean", ["hm"], ["sentence_embedding"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "tiny-encoder", [ids, mask], [out], [table, last])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_the_h200_driver_runs_every_step_on_the_cpu(tmp_path):
    model = tiny_encoder(tmp_path / "model.onnx")
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELYARD_", "DJANGO_"))}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, str(ROOT / "bench" / "gpu" / "gpu_serve.py"), "--model", str(model)]
    command += ["--device", "cpu", "--workers", "2", "--clients", "1,4", "--duration", "0.5", "--warmup", "0.2"]
    command += ["--raw-seconds", "0.2", "--load-processes", "2", "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    result = json.loads(out.read_text())
    assert "error" not in result
    assert result["raw_ort"]["providers"] == ["CPUExecutionProvider"]
    assert result["registered"]["version"] == 1
    [served] = result["served"]
    assert served["workers"] == 2
    assert [(row["state"], row["provider"], row["device"]) for row in served["fleet"]] == [
        ("ready", "CPUExecutionProvider", "cpu")
    ] * 2
    assert served["max_difference_from_raw"] <= 1e-3
    # Each client count at each instances (the default sweep, 1 then 2), set through the models API.
    assert [(run["instances"], run["clients"], run["errors"]) for run in served["runs"]] == [
        (1, 1, 0),
        (1, 4, 0),
        (2, 1, 0),
        (2, 4, 0),
    ]
    assert result["setup"]["instances"] == [1, 2]
    assert all(run["requests"] > 0 for run in served["runs"])


def test_a_pack_split_in_two_is_joined_and_unpacked_across_the_two_calls(tmp_path):
    """``pack.sh split`` here, ``run.sh unpack`` (call 1), then ``run.sh`` (call 2) joining the parts into SITE."""
    checkout = tmp_path / "checkout"
    (checkout / "bench").mkdir(parents=True)
    shutil.copytree(ROOT / "bench" / "gpu", checkout / "bench" / "gpu")
    payload = np.random.default_rng(1).integers(0, 256, size=300_000, dtype=np.uint8).tobytes()  # incompressible
    tree = tmp_path / "tree"
    (tree / "onnxruntime").mkdir(parents=True)
    (tree / "onnxruntime" / "__init__.py").write_text("__version__ = 'packed'\n")
    (tree / "onnxruntime" / "payload.bin").write_bytes(payload)
    (checkout / ".gpu").mkdir()
    with tarfile.open(checkout / ".gpu" / "ort-gpu-sm90.tar.xz", "w:xz") as pack:
        pack.add(tree / "onnxruntime", arcname="onnxruntime")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELYARD_", "DJANGO_"))}
    env |= {"SPLIT_AT": "200000", "PARTS": str(tmp_path / "parts"), "SITE": str(tmp_path / "site")}
    env |= {"PYTHON": sys.executable, "EXPORT_PYTHON": "false", "NVIDIA_DIR": "", "OUT": str(tmp_path / "out")}

    def sh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=120)

    assert sh("bench/gpu/pack.sh", "split").returncode == 0
    assert not (checkout / ".gpu" / "ort-gpu-sm90.tar.xz").exists()
    part_a = checkout / ".gpu" / "ort-gpu-sm90.tar.xz.part-a"
    part_b = checkout / ".gpu-wheels" / "ort-gpu-sm90.tar.xz.part-b"
    assert part_a.stat().st_size == 200_000 and part_b.stat().st_size > 100_000

    # Call 1 carries only .gpu: part a waits in PARTS, nothing is unpacked yet.
    part_b.rename(tmp_path / "part-b")
    assert sh("bench/gpu/run.sh", "unpack").returncode == 0
    assert not (tmp_path / "site").exists()
    # Call 2 carries .gpu-wheels: the parts are joined and unpacked, then the run goes on to the export,
    # which this test's EXPORT_PYTHON (`false`) stops.
    (tmp_path / "part-b").rename(part_b)
    shutil.rmtree(checkout / ".gpu")
    done = sh("bench/gpu/run.sh")
    assert done.returncode != 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "onnxruntime" / "payload.bin").read_bytes() == payload
    assert (tmp_path / "site" / "onnxruntime" / "__init__.py").read_text() == "__version__ = 'packed'\n"
