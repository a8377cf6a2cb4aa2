"""Text in, embeddings out: MiniLM-L6 given raw texts, checked against its reference, and how fast, in one run.

    .venv/bin/python bench/text.py [MODEL_DIR] [--duration 8] [--clients 16] [--database-url postgres://...]

MODEL_DIR (default ``../shared/models/minilm-l6``) holds ``model.onnx``, ``tokenizer.json`` and
``reference.json`` (texts, their token ids and the sentence embeddings PyTorch computed); without
it the benchmark says so and exits 0. It:

1. registers MiniLM with its ``tokenizer.json`` through ``version_upload`` (validation records the
   ``text`` input), promotes it, and starts ``modelyard serve --role inference`` on 127.0.0.1;
2. checks that the server's tokenizer gives the reference's token ids, then sends the reference's raw
   texts (all in one request, each alone, and each alone concurrently, so that they batch by bucket)
   and compares the embeddings with the reference: the largest absolute difference must be under 1e-4;
3. measures, in alternating rounds with the same load generator (``wrk`` when installed, as ``bench/serve.py`` does):
   - text in: one text per request as a JSON BYTES input, tokenised by the server;
   - tokens in: the same text tokenised by the client into ``input_ids`` and ``attention_mask``
     binary tensors (the tokenising is timed apart: wrk replays one prepared body);
   - tokens in padded as the server pads them (its bucket: the next power of two, at least 8), which
     splits what text in costs into padding and the rest (JSON, tokenising);
   - raw ONNX Runtime in this process, batch 1 on the same tokens, as the ceiling.

It prints the numbers and writes bench/results/text.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from common import run_in_workdir, stop_process
from serve import Load, binary_body, decode_embedding, free_port, modelyard_env, post, register_served, wait_ready

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL_DIR = ROOT.parent / "shared" / "models" / "minilm-l6"
MODEL_NAME = "minilm-text"
RESULTS = ROOT / "bench" / "results" / "text.json"
TOLERANCE = 1e-4
INFER = f"/v2/models/{MODEL_NAME}/infer"
JSON_HEADERS = {"Content-Type": "application/json"}


def register(model_dir: str) -> None:
    """Runs in a child process: register MiniLM with its tokenizer, validate it, promote it (four eyes)."""
    folder = Path(model_dir)
    version = register_served(
        name=MODEL_NAME,
        description="MiniLM-L6, text in (bench/text.py)",
        files=[("model.onnx", folder / "model.onnx"), ("tokenizer.json", folder / "tokenizer.json")],
        model_settings={},
    )
    assert version is None or "text" in version.signature, version.signature


def text_body(texts: list[str]) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    ).encode()


def embed(port: int, texts: list[str]) -> np.ndarray:
    return decode_embedding(*post(port, INFER, text_body(texts), JSON_HEADERS))


def client_tokens(model_dir: Path, text: str) -> tuple[dict[str, np.ndarray], float]:
    """``text`` tokenised on the client's side as a client would (its own length), and microseconds per tokenising."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    runs, started = 2000, time.perf_counter()
    for _ in range(runs):
        encoding = tokenizer.encode(text)
    per_text_us = (time.perf_counter() - started) / runs * 1e6
    feeds = {
        "input_ids": np.array([encoding.ids], dtype=np.int64),
        "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
    }
    return feeds, per_text_us


def raw_ort(model_dir: Path, feeds: dict[str, np.ndarray], duration: float) -> dict[str, Any]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    for _ in range(20):
        session.run(None, feeds)
    runs, end = 0, time.perf_counter() + duration
    started = time.perf_counter()
    while time.perf_counter() < end:
        session.run(None, feeds)
        runs += 1
    return {"seq_per_s": runs / (time.perf_counter() - started), "runs": runs}


def check_reference(port: int, model_dir: Path, reference: dict[str, Any]) -> dict[str, Any]:
    """The server's embeddings of the reference texts, sent three ways, against the reference."""
    from onnxkit.tokenizer import load_tokenizer

    texts: list[str] = reference["texts"]
    expected = np.asarray(reference["sentence_embedding"], dtype=np.float32)
    tokenizer, _pad, _own = load_tokenizer(model_dir / "tokenizer.json", max_bytes=64 << 20)
    unpadded = [
        [i for i, m in zip(ids, mask, strict=True) if m]
        for ids, mask in zip(reference["input_ids"], reference["attention_mask"], strict=True)
    ]
    ids_match = [e.ids for e in tokenizer.encode_batch(texts)] == unpadded
    together = embed(port, texts)
    alone = np.concatenate([embed(port, [text]) for text in texts])
    with ThreadPoolExecutor(len(texts)) as pool:
        concurrent = np.concatenate(list(pool.map(lambda text: embed(port, [text]), texts)))
    diffs = {
        "one_request": float(np.abs(together - expected).max()),
        "each_alone": float(np.abs(alone - expected).max()),
        "concurrent": float(np.abs(concurrent - expected).max()),
    }
    return {
        "texts": len(texts),
        "token_ids_match_reference": ids_match,
        "max_abs_diff": diffs,
        "max_abs_diff_overall": max(diffs.values()),
        "tolerance": TOLERANCE,
    }


def measure(port: int, load: Load, bodies: dict[str, tuple[bytes, int | None]], clients: int, rounds: int) -> Any:
    """Each body under the same load, in turns (``rounds`` times), so that a noisy spell hits both alike."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in bodies}
    for body, header_length in bodies.values():
        load.run(port, INFER, body, header_length, clients, warm=True)
    for _ in range(rounds):
        for name, (body, header_length) in bodies.items():
            runs[name].append(load.run(port, INFER, body, header_length, clients, warm=False))
    return {
        name: {
            "req_per_s": float(np.mean([r["req_per_s"] for r in results])),
            "p50_ms": float(np.median([r["p50_ms"] for r in results])),
            "p99_ms": float(max(r["p99_ms"] for r in results)),
            "errors": sum(r["errors"] for r in results),
            "rounds": [round(r["req_per_s"], 1) for r in results],
        }
        for name, results in runs.items()
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    model_dir = Path(args.model_dir)
    reference = json.loads((model_dir / "reference.json").read_text())
    env = modelyard_env(work / "data", args.database_url)
    subprocess.run([sys.executable, __file__, "--register", str(model_dir)], env=env, check=True, cwd=ROOT)
    port = free_port()
    log = work / "modelyard.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--port", str(port), "--grpc-port", "0"]
    process = subprocess.Popen(
        [*argv, "--log-level", "warning"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work
    )
    try:
        wait_ready(port, f"/v2/models/{MODEL_NAME}/ready", process, log)
        accuracy = check_reference(port, model_dir, reference)
        print(
            f"MiniLM text in vs reference.json ({accuracy['texts']} texts): max abs diff "
            f"{accuracy['max_abs_diff_overall']:.2e} (limit {TOLERANCE:.0e}); token ids match: "
            f"{accuracy['token_ids_match_reference']}",
            flush=True,
        )
        text = reference["texts"][0]
        feeds, tokenise_us = client_tokens(model_dir, text)
        load = Load(work, args.duration, warmup=2.0)
        bucket = 8
        while bucket < feeds["input_ids"].shape[1]:
            bucket *= 2
        padded = {name: np.pad(array, ((0, 0), (0, bucket - array.shape[1]))) for name, array in feeds.items()}
        bodies = {
            "text_in": (text_body([text]), None),
            "tokens_in": binary_body(feeds),
            "tokens_in_padded": binary_body(padded),
        }
        measured = measure(port, load, bodies, args.clients, args.rounds)
        text_in, tokens_in, tokens_padded = measured["text_in"], measured["tokens_in"], measured["tokens_in_padded"]
    finally:
        stop_process(process)
    ceiling = raw_ort(model_dir, feeds, args.duration)
    result = {
        "model_dir": str(model_dir),
        "text": text,
        "tokens": int(feeds["input_ids"].shape[1]),
        "clients": args.clients,
        "load_generator": load.generator,
        "accuracy": accuracy,
        "text_in": text_in,
        "tokens_in": tokens_in,
        "bucket": bucket,
        "tokens_in_padded_to_bucket": tokens_padded,
        "client_tokenise_us_per_text": round(tokenise_us, 1),
        "raw_ort_batch1": ceiling,
        "text_in_vs_tokens_in": round(text_in["req_per_s"] / tokens_in["req_per_s"], 3),
        "text_in_vs_tokens_in_padded": round(text_in["req_per_s"] / tokens_padded["req_per_s"], 3),
        "text_in_vs_raw_ort_batch1": round(text_in["req_per_s"] / ceiling["seq_per_s"], 3),
    }
    return result


def report(result: dict[str, Any]) -> None:
    print(f"load: {result['load_generator']}, {result['clients']} clients, one text of {result['tokens']} tokens")
    rows = (
        ("text in (server tokenises)", "text_in"),
        ("tokens in (binary tensors)", "tokens_in"),
        (f"tokens in, padded to {result['bucket']}", "tokens_in_padded_to_bucket"),
    )
    for label, key in rows:
        r = result[key]
        print(
            f"  {label:<28} {r['req_per_s']:8.1f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
            f"errors {r['errors']}  (rounds: {r['rounds']})"
        )
    print(f"  raw ONNX Runtime, batch 1    {result['raw_ort_batch1']['seq_per_s']:8.1f} seq/s (in process)")
    print(f"  client-side tokenising: {result['client_tokenise_us_per_text']} us per text (not in 'tokens in')")
    print(
        f"text in / tokens in = {result['text_in_vs_tokens_in']}, text in / tokens in padded alike = "
        f"{result['text_in_vs_tokens_in_padded']}, "
        f"text in / raw ORT batch 1 = {result['text_in_vs_raw_ort_batch1']}"
    )


def passed(result: dict[str, Any]) -> bool:
    accuracy = result["accuracy"]
    errors = sum(result[key]["errors"] for key in ("text_in", "tokens_in", "tokens_in_padded_to_bucket"))
    return accuracy["token_ids_match_reference"] and accuracy["max_abs_diff_overall"] < TOLERANCE and errors == 0


def main() -> int:
    parser = argparse.ArgumentParser(description="MiniLM given raw texts: accuracy against reference.json and speed")
    parser.add_argument("model_dir", nargs="?", default=str(MODEL_DIR))
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per measurement")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="turns of text in and tokens in, alternating")
    parser.add_argument("--database-url", default=None, help="default: SQLite in the work folder")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register:
        register(args.register)
        return 0
    missing = [
        name
        for name in ("model.onnx", "tokenizer.json", "reference.json")
        if not (Path(args.model_dir) / name).is_file()
    ]
    if missing:
        print(f"skipped: {args.model_dir} lacks {', '.join(missing)}")
        return 0
    return run_in_workdir(
        prefix="modelyard-bench-text-",
        run=lambda work: run(work, args),
        report=report,
        output=args.output,
        keep=args.keep,
        passed=passed,
    )


if __name__ == "__main__":
    sys.exit(main())
