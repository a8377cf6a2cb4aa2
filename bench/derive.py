"""Derived versions of MiniLM-L6 on this machine: fp32 against fp16, int8 and ORT-optimised.

    .venv/bin/python bench/derive.py [--model ../shared/models/minilm-l6/model.onnx] [--seconds 3]

Each derived model is built by the registry's own derive code path (``onnxkit.derive.derive_child``
in the bounded child of ``onnxkit.sandbox``, as a derive job runs it; its accuracy delta is
the one stored on the version), then measured twice:

- by the benchmark child the inference processes run (``onnxkit.measure``, as a
  ``VersionBenchmark`` row records it, here not niced): load time, p50/p99 at batch 1, throughput
  at batch 32;
- by raw ONNX Runtime in this process, same session options, same inputs: p50 at batch 1 and
  throughput at batch 32 with sequence length 32, so the child's numbers have a baseline.

The machine is shared and noisy: each variant runs alternately with fp32, run by run, and its ratio
to fp32 comes from the medians of the pairs.

Accuracy against fp32: cosine of the sentence embeddings of the four reference texts
(``reference.json``) and of 32 random token sequences. It prints a table and writes
bench/results/derive.json. Needs no database and no server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxkit.derive import check_recipe  # noqa: E402
from onnxkit.sandbox import ChildLimits, run_in_child  # noqa: E402

DEFAULT_MODEL = ROOT.parent / "shared" / "models" / "minilm-l6" / "model.onnx"
RECIPES: list[tuple[str, str, dict[str, Any]]] = [
    ("fp16", "fp16", {}),
    ("fp16+optimize", "fp16", {"optimize": True, "model_type": "bert", "num_heads": 12, "hidden_size": 384}),
    ("int8", "int8-dynamic", {}),
    ("int8 per-channel", "int8-dynamic", {"per_channel": True}),
    ("ort-optimized", "ort-optimized", {"level": "extended"}),
]
SEQUENCE = 32
BATCH = 32


def limits(what: str, seconds: float, nice: int = 0) -> ChildLimits:
    return ChildLimits(
        timeout_seconds=seconds,
        memory_mb=8192,
        timeout_setting="--timeout",
        memory_setting="(8192 MB)",
        what=what,
        nice=nice,
        threads=0,
    )


def derive(recipe: str, options: dict[str, Any], source: Path, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True)
    request = {
        "recipe": recipe,
        "options": check_recipe(recipe, options, max_items=256, max_item_chars=128),
        "model_path": str(source),
        "out_dir": str(out),
        "samples_path": None,
        "signature": {},
    }
    started = time.perf_counter()
    outcome = run_in_child("onnxkit.derive:derive_child", request, limits("derivation", 900))
    if not outcome.ok:
        raise SystemExit(f"{recipe}: {outcome.error}")
    assert outcome.reply is not None
    return {"seconds": time.perf_counter() - started, **outcome.reply}


def child_benchmark(model: Path, seconds: float) -> dict[str, Any]:
    request = {
        "model_path": str(model),
        "provider": "CPUExecutionProvider",
        "max_batch_size": BATCH,
        "iterations": 100_000,
        "seconds": seconds,
    }
    # Not niced here (the inference processes nice it): on a shared machine a niced child measures the neighbours.
    outcome = run_in_child("onnxkit.measure:benchmark_child", request, limits("benchmark", 600))
    if not outcome.ok:
        raise SystemExit(f"benchmark of {model}: {outcome.error}")
    assert outcome.reply is not None
    return outcome.reply


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def session_of(model: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])


def paired(reference: Any, candidate: Any, batch: int, seconds: float) -> tuple[float, float]:
    """Median seconds of one run of each, alternating run by run, so both see the same neighbours."""
    inputs = feeds(batch, SEQUENCE)
    for session in (reference, candidate):
        for _ in range(2):
            session.run(None, inputs)
    times: tuple[list[float], list[float]] = ([], [])
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline or len(times[0]) < 10:
        for index, session in enumerate((reference, candidate)):
            begin = time.perf_counter()
            session.run(None, inputs)
            times[index].append(time.perf_counter() - begin)
    return float(np.median(times[0])), float(np.median(times[1]))


def cosines(reference: Any, candidate: Any, reference_json: Path) -> dict[str, float]:
    """Per-sentence cosine of the embeddings (min and mean): the reference texts and 32 random sequences."""
    data = json.loads(reference_json.read_text())
    texts = {
        "input_ids": np.asarray(data["input_ids"], dtype=np.int64),
        "attention_mask": np.asarray(data["attention_mask"], dtype=np.int64),
    }
    result = {}
    for name, batch in (("texts", texts), ("random", feeds(BATCH, SEQUENCE, seed=1))):
        a, b = reference.run(None, batch)[0].astype(np.float64), candidate.run(None, batch)[0].astype(np.float64)
        per_row = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        result[f"{name}_min"], result[f"{name}_mean"] = float(per_row.min()), float(per_row.mean())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "derive.json")
    args = parser.parse_args()
    if not args.model.is_file():
        print(f"skipped: {args.model} is not there", file=sys.stderr)
        return 0
    import onnxruntime as ort

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="modelyard-derive-") as tmp:
        paths = {"fp32": args.model}
        rows.append({"name": "fp32", "size_bytes": args.model.stat().st_size})
        for name, recipe, options in RECIPES:
            out = Path(tmp) / name.replace(" ", "-")
            built = derive(recipe, options, args.model, out)
            paths[name] = out / "model.onnx"
            rows.append(
                {
                    "name": name,
                    "size_bytes": sum(p.stat().st_size for p in out.iterdir()),
                    "derive_seconds": built["seconds"],
                    "stored_delta": built["accuracy"].get("worst"),
                }
            )
        # The machine is shared and noisy: each variant runs alternately with fp32, run by run, and the
        # medians of the pairs give its ratio; fp32's absolute numbers are the median over all pairs.
        sessions = {row["name"]: session_of(paths[row["name"]]) for row in rows}
        reference = sessions["fp32"]
        fp32_one: list[float] = []
        fp32_many: list[float] = []
        for row in rows:
            session = sessions[row["name"]]
            ref_one, one = paired(reference, session, 1, args.seconds)
            ref_many, many = paired(reference, session, BATCH, args.seconds)
            fp32_one.append(ref_one)
            fp32_many.append(ref_many)
            row["raw"] = {
                "p50_ms": one * 1000,
                "throughput_32": BATCH / many,
                "p50_vs_fp32": one / ref_one,
                "throughput_vs_fp32": ref_many / many,
            }
            row["child"] = child_benchmark(paths[row["name"]], args.seconds)
            row["cosine"] = cosines(reference, session, args.model.parent / "reference.json")
        base_one, base_many = float(np.median(fp32_one)), float(np.median(fp32_many))
        rows[0]["raw"].update(p50_ms=base_one * 1000, throughput_32=BATCH / base_many)
    print(f"MiniLM-L6 on {os.cpu_count()} CPU(s), ONNX Runtime {ort.__version__}, batch {BATCH} x seq {SEQUENCE}")
    header = (
        f"{'variant':17} {'size MB':>8} {'p50 b1 ms':>10} {'p50 vs fp32':>11} {'seq/s b32':>10} {'tput vs fp32':>12} "
        f"{'child seq/s':>12} {'child/raw':>10} {'cos texts':>10} {'cos rand':>9}"
    )
    print(header)
    for row in rows:
        tp = row["raw"]["throughput_32"]
        child_tp = row["child"]["throughput"][str(BATCH)]
        print(
            f"{row['name']:17} {row['size_bytes'] / 1e6:8.1f} {row['raw']['p50_ms']:10.2f} "
            f"{row['raw']['p50_vs_fp32']:11.2f} {tp:10.1f} "
            f"{row['raw']['throughput_vs_fp32']:12.2f} {child_tp:12.1f} {child_tp / tp:10.2f} "
            f"{row['cosine']['texts_min']:10.6f} {row['cosine']['random_min']:9.6f}"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    result = {"cpus": os.cpu_count(), "onnxruntime": ort.__version__, "batch": BATCH, "sequence": SEQUENCE}
    result["rows"] = rows
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
