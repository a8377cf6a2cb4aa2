"""Loads that leave the cores to what serves: ONNX Runtime's optimised graph saved once, and a lower priority.

Real ONNX Runtime on tiny models written here; no database. The saved graph is checked like the
version's own files are: a byte changed, or its record rewritten, and it is deleted, counted and
made again, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from inference import sessions
from inference.cache import OPTIMIZED_MODELS, OptimizedModels
from inference.sessions import (
    CPU,
    build_session,
    load_priority,
    optimized_key,
    priority_restorable,
    run_at_priority,
    thread_nice,
)
from tests.support.settings_probe import settings_outcomes


def foldable_model(path: Path, *, width: int = 8) -> Path:
    """y = (x @ W) + (b1 + b2): a constant sub-graph (b1 + b2) and a MatMul+Add that ORT folds and fuses."""
    rng = np.random.default_rng(7)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    weights = [
        numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Add", ["b1", "b2"], ["b"]),
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "foldable", [x], [y], weights)
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def digests_of(path: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}


def direct(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(os.fspath(path), providers=[CPU]).run(None, feeds)


def count(event: str) -> float:
    return OPTIMIZED_MODELS.labels(event)._value.get()


@pytest.fixture
def cpu_settings(settings):
    settings.PROVIDERS = ["cpu"]
    settings.REQUIRE_GPU = False
    settings.ORT_GRAPH_OPTIMIZATION = "all"
    settings.LOAD_NICE = 10
    return settings


@pytest.fixture
def feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)}


def saved_files(store: OptimizedModels) -> list[Path]:
    return sorted(p for p in store.root.glob("*.onnx") if not p.name.startswith("."))


def test_the_optimised_graph_is_saved_once_then_loaded_without_optimising(cpu_settings, tmp_path, feeds):
    model = foldable_model(tmp_path / "bundle" / "model.onnx")
    store = OptimizedModels(tmp_path / "optimized", 1 << 30, "secret")
    saved, hits = count("saved"), count("hit")

    first = build_session(model, optimized=store, digests=digests_of(model))

    [path] = saved_files(store)
    assert first.preoptimized and first.model_path == path
    assert path.with_suffix(".json").exists()
    assert onnx.load(os.fspath(path)).graph.node != onnx.load(os.fspath(model)).graph.node  # ORT's graph, not ours
    inode = path.stat().st_ino

    second = build_session(model, optimized=store, digests=digests_of(model))

    assert second.preoptimized and second.model_path == path and path.stat().st_ino == inode  # not written again
    assert (count("saved") - saved, count("hit") - hits) == (1, 1)
    expected = direct(model, feeds)
    for got in (first.session.run(None, feeds), second.session.run(None, feeds)):
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "damage", ["a byte of the graph", "a byte, its mtime put back", "the record rewritten to match"]
)
def test_a_tampered_optimised_graph_is_rejected_counted_and_made_again(cpu_settings, tmp_path, feeds, damage, caplog):
    model = foldable_model(tmp_path / "bundle" / "model.onnx")
    store = OptimizedModels(tmp_path / "optimized", 1 << 30, "secret")
    build_session(model, optimized=store, digests=digests_of(model))
    [path] = saved_files(store)
    good = path.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    if damage == "a byte, its mtime put back":  # what this process checked is not taken on its mtime alone
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    if damage == "the record rewritten to match":  # who has the disk but not the secret key
        record = json.loads(path.with_suffix(".json").read_text())
        record["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
        path.with_suffix(".json").write_text(json.dumps(record))
    rejected, saved = count("rejected"), count("saved")

    built = build_session(model, optimized=store, digests=digests_of(model))

    assert (count("rejected") - rejected, count("saved") - saved) == (1, 1)
    assert "does not match its record" in caplog.text
    assert built.preoptimized and path.read_bytes() == good  # made again, the same graph
    np.testing.assert_allclose(built.session.run(None, feeds)[0], direct(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert store.get(optimized_key(digests_of(model), CPU, "all")) == path


def test_a_graph_saved_under_another_secret_is_not_trusted_nor_replaced(tmp_path):
    store = OptimizedModels(tmp_path, 1 << 20, "secret")
    mine = store.get_or_make("k" * 64, lambda target: target.write_bytes(b"graph"))
    other = OptimizedModels(tmp_path, 1 << 20, "another")  # a process with another secret key, same cache
    assert other.get("k" * 64) is None
    theirs = other.get_or_make("k" * 64, lambda target: target.write_bytes(b"their graph"))
    assert theirs is not None and theirs != mine and theirs.read_bytes() == b"their graph"
    rejected = count("rejected")
    assert store.get("k" * 64) == mine and mine.read_bytes() == b"graph"  # no one rejects the other's in turn
    assert count("rejected") == rejected


def test_keys_differ_by_every_input_that_makes_another_graph(monkeypatch):
    digests = {"model.onnx": "a" * 64, "weights.bin": "b" * 64}
    base = optimized_key(digests, CPU, "all")
    others = {
        optimized_key({**digests, "weights.bin": "c" * 64}, CPU, "all"),
        optimized_key(digests, "CUDAExecutionProvider", "all"),
        optimized_key(digests, CPU, "extended"),
    }
    monkeypatch.setattr(ort, "__version__", "0.0.0-other")
    others.add(optimized_key(digests, CPU, "all"))
    monkeypatch.undo()
    assert base not in others and len(others) == 4
    assert optimized_key(dict(reversed(list(digests.items()))), CPU, "all") == base  # the order of files does not


def test_the_byte_bound_evicts_the_least_recently_used_and_refuses_a_graph_over_it(cpu_settings, tmp_path, feeds):
    store = OptimizedModels(tmp_path / "optimized", 100, "secret")
    for name in ("a", "b"):
        assert store.get_or_make(name * 64, lambda target: target.write_bytes(b"x" * 60)) is not None
    assert [p.stem.split("-")[0] for p in saved_files(store)] == ["b" * 64]  # 120 bytes > 100: a, the older, went

    model = foldable_model(tmp_path / "bundle" / "model.onnx")
    failed = count("saved")
    built = build_session(model, optimized=store, digests=digests_of(model))  # the graph is over 100 bytes

    assert not built.preoptimized and built.model_path == model and count("saved") == failed
    assert not list(store.root.glob(".*.part.*"))  # no temporary file left behind
    np.testing.assert_allclose(built.session.run(None, feeds)[0], direct(model, feeds)[0], rtol=1e-5, atol=1e-5)
    off = OptimizedModels(tmp_path / "off", 0, "secret")  # MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES=0
    assert not build_session(model, optimized=off, digests=digests_of(model)).preoptimized
    assert saved_files(off) == []


def test_a_graph_that_cannot_be_saved_leaves_the_load_to_optimise_as_before(cpu_settings, tmp_path, feeds):
    model = foldable_model(tmp_path / "bundle" / "model.onnx")
    store = OptimizedModels(tmp_path / "optimized", 1 << 30, "secret")
    failed = count("failed")
    key = optimized_key(digests_of(model), CPU, "all")
    store._paths(key)[0].mkdir()  # in the way of the rename

    built = build_session(model, optimized=store, digests=digests_of(model))

    assert not built.preoptimized and count("failed") - failed == 1
    np.testing.assert_allclose(built.session.run(None, feeds)[0], direct(model, feeds)[0], rtol=1e-5, atol=1e-5)


def native_nice_of_threads(tids: set[int]) -> dict[int, int]:
    out = {}
    for tid in tids:
        try:
            out[tid] = os.getpriority(os.PRIO_PROCESS, tid)
        except OSError:
            continue
    return out


def tasks() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_the_load_nice_reaches_the_optimisation_and_the_build_and_the_sessions_threads_serve_at_full_priority(
    cpu_settings, tmp_path, monkeypatch, feeds
):
    cpu_settings.LOAD_NICE = 7
    cpu_settings.ORT_INTRA_OP_THREADS = 3  # the serving session: a pool of its own threads
    seen: list[tuple[str, int, int]] = []
    real = ort.InferenceSession

    def recording(path, options=None, *args, **kwargs):
        role = "optimise" if options is not None and options.optimized_model_filepath else "serve"
        seen.append((role, thread_nice(), options.intra_op_num_threads if options is not None else -1))
        return real(path, options, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    model = foldable_model(tmp_path / "bundle" / "model.onnx")
    store = OptimizedModels(tmp_path / "optimized", 1 << 30, "secret")
    base = thread_nice()
    before = tasks()

    with load_priority(cpu_settings.LOAD_NICE) as lowered:
        assert thread_nice() == (base + 7 if lowered else base)
        built = build_session(model, optimized=store, digests=digests_of(model))
        built.session.run(None, feeds)

    assert lowered == priority_restorable()
    # The optimisation: its own thread, lowered even where priority cannot be raised back, one intra-op thread.
    assert seen[0] == ("optimise", min(19, base + 7 * (2 if lowered else 1)), 1)
    assert seen[1] == ("serve", base + 7 if lowered else base, 3)  # the serving session keeps its settings
    assert thread_nice() == base
    # Its ONNX Runtime threads went back up to serve; the optimisation's thread, lowered, ends (Python's
    # join returns a moment before the kernel's thread is gone).
    session_threads = native_nice_of_threads(tasks() - before)
    deadline = time.monotonic() + 5
    while set(session_threads.values()) != {base} and time.monotonic() < deadline:
        time.sleep(0.05)
        session_threads = native_nice_of_threads(tasks() - before)
    assert len(session_threads) >= 2 and set(session_threads.values()) == {base}


def test_run_at_priority_lowers_only_its_own_thread_and_raises_what_failed():
    base = thread_nice()
    seen = []
    run_at_priority(lambda: seen.append(thread_nice()), 4)
    assert seen == [min(19, base + 4)] and thread_nice() == base

    def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        run_at_priority(fails, 4)
    assert threading.current_thread().name != "model-optimise"


@pytest.mark.skipif(not priority_restorable(), reason="this process may not raise a thread's priority back")
def test_past_the_deadline_the_load_and_the_threads_it_started_go_back_to_serving_priority():
    base = thread_nice()
    started = threading.Event()
    finish = threading.Event()
    seen = []

    def session_thread() -> None:  # what ONNX Runtime starts for a session: it inherits the load's priority
        seen.append(thread_nice())
        started.set()
        finish.wait(10)
        seen.append(thread_nice())

    with load_priority(6, 0.3) as lowered:
        assert lowered and thread_nice() == base + 6
        helper = threading.Thread(target=session_thread)
        helper.start()
        started.wait(5)
        time.sleep(0.6)
        assert thread_nice() == base  # the deadline passed inside the block
        finish.set()
        helper.join()
    assert seen == [base + 6, base]


def test_without_the_right_to_go_back_a_load_keeps_its_priority(monkeypatch):
    monkeypatch.setattr(sessions, "priority_restorable", lambda: False)
    base = thread_nice()
    with load_priority(10) as lowered:
        assert not lowered and thread_nice() == base
    with load_priority(0) as lowered:
        assert not lowered


def test_bad_load_settings_stop_startup_naming_the_variable(tmp_path):
    cases = {
        "MODELYARD_LOAD_NICE=20": "MODELYARD_LOAD_NICE: must be at most 19, got 20",
        "MODELYARD_LOAD_NICE=-1": "MODELYARD_LOAD_NICE: must be at least 0, got -1",
        "MODELYARD_LOAD_NICE=low": "MODELYARD_LOAD_NICE: expected an integer, got 'low'",
        "MODELYARD_LOAD_NICE=5": "ok 5 0",  # both off by default
        "MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES=-5": (
            "MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES: must be at least 0, got -5"
        ),
        "MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES=1024": "ok 0 1024",
        "MODELYARD_LOAD_NICE_SECONDS=-1": "MODELYARD_LOAD_NICE_SECONDS: must be at least 0, got -1.0",
    }
    assert settings_outcomes(tmp_path, cases, ["LOAD_NICE", "ORT_OPTIMIZED_CACHE_MAX_BYTES"]) == list(cases.values())
