"""Asynchronous inference: a job of MiniLM texts against raw ONNX Runtime, and online latency while it runs.

    .venv/bin/python bench/jobs.py [MODEL_DIR] [--rows 100000] [--probe-rows 20000] [--probe-seconds 20]
                                   [--database-url postgres://...] [--slice-rows N]
    .venv/bin/python bench/jobs.py --rows 2000 --probe-rows 1000 --probe-seconds 3      # a smoke run

MODEL_DIR (default ``../shared/models/minilm-l6``) holds ``model.onnx`` and ``tokenizer.json``. The
benchmark registers MiniLM with its tokenizer, promotes it, and starts one ``modelyard serve --role all``
(the embedded server: registry, inference and tasks in one process) on 127.0.0.1. Then:

1. raw ONNX Runtime in this process: the same texts tokenised with the server's tokenizer settings and
   run at the model's ``max_batch_size``, each batch padded to its longest text (tokenising included,
   as the server tokenises too): rows per second;
2. a job of ``--rows`` texts (plain text lines) submitted through ``POST /api/v1/inference-jobs``,
   waited for, and its rows per second taken from the job's own ``started_at`` and ``finished_at``;
   a sample of its result rows is compared with the raw run (largest absolute difference under 1e-4);
3. online latency: one client sending one text per request, 20 a second, on the idle server, then
   while a second job (``--probe-rows``) runs: p50 and p99 of each, and their ratio.

Goals (issue 29): the job at least 0.9x raw ONNX Runtime's rows per second; online p99 during the job
at most 1.2x the idle p99. It prints the numbers and writes bench/results/jobs.json.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from common import run_in_workdir, stop_process
from serve import BIN, free_port, modelyard_env, percentile_ms, register_served, wait_ready

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = ROOT.parent / "shared" / "models" / "minilm-l6"
MODEL_NAME = "minilm-text"
RESULTS = ROOT / "bench" / "results" / "jobs.json"
TOLERANCE = 1e-4
ROWS_GOAL = 0.9
P99_GOAL = 1.2
BATCH = 32  # the model's max_batch_size (the default; register() leaves it)


def register(model_dir: str) -> None:
    """Runs in a child process: MiniLM with its tokenizer on production, and an inference token printed."""
    folder = Path(model_dir)
    register_served(
        name=MODEL_NAME,
        description="MiniLM-L6, text in (bench/jobs.py)",
        files=[("model.onnx", folder / "model.onnx"), ("tokenizer.json", folder / "tokenizer.json")],
        model_settings={},
    )
    from registry.access import services as access
    from registry.models import Role

    _token, raw = access.token_create(username="bench-jobs", create_user=True, roles=[Role.INFERENCE])
    print(json.dumps({"token": raw}))


# --- the texts and the raw baseline ---------------------------------------------------------------------


def make_texts(count: int, seed: int = 29) -> list[str]:
    """Deterministic English-like sentences of 6 to 24 words (no downloads)."""
    vocabulary = (
        "model registry stores versioned artifacts the inference service loads promoted version aliases "
        "need approval from a second person every change lands in an audit log which auditors review "
        "embedding search ranks documents by meaning not by words sentences become vectors of numbers "
        "nightly backfill jobs share the fleet with online traffic that must stay fast"
    )
    words = vocabulary.split(" ")
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(6, 24))).capitalize() + "." for _ in range(count)]


def raw_ort(model_dir: Path, texts: list[str], sample: list[int]) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """Tokenise and run ``texts`` at batch ``BATCH``, each batch padded to its longest; the sample rows' outputs."""
    import onnxruntime as ort

    from onnxkit.tokenizer import load_tokenizer

    tokenizer, pad_id, _own = load_tokenizer(model_dir / "tokenizer.json", max_bytes=64 << 20)
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    wanted = set(sample)
    outputs: dict[int, np.ndarray] = {}
    started = time.perf_counter()
    for first in range(0, len(texts), BATCH):
        encodings = tokenizer.encode_batch(texts[first : first + BATCH])
        length = max(len(encoding.ids) for encoding in encodings)
        ids = np.full((len(encodings), length), pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), length), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        (embedding,) = session.run(None, feeds)
        for row in range(embedding.shape[0]):
            if first + row in wanted:
                outputs[first + row] = embedding[row]
    seconds = time.perf_counter() - started
    return {"rows": len(texts), "seconds": round(seconds, 2), "rows_per_s": round(len(texts) / seconds, 1)}, outputs


# --- the server's API -----------------------------------------------------------------------------------


class Api:
    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}"}

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers={**self.headers, **(headers or {})})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {raw[:500]!r}")
        return raw

    def submit(self, texts: list[str]) -> dict[str, Any]:
        """A job of ``texts`` (one per line), results as .npz, streamed as a multipart upload."""
        boundary = uuid.uuid4().hex
        parts = []
        for name, value in (("model", MODEL_NAME), ("alias", "production"), ("result_format", "npz")):
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="input"; filename="texts.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n".encode()
            + "\n".join(texts).encode()
            + b"\n\r\n"
        )
        parts.append(f"--{boundary}--\r\n".encode())
        body = b"".join(parts)
        raw = self.request(
            "POST", "/api/v1/inference-jobs", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        return dict(json.loads(raw))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(json.loads(self.request("GET", f"/api/v1/inference-jobs/{job_id}")))

    def wait(self, job_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in ("succeeded", "failed", "cancelled"):
                if job["state"] != "succeeded":
                    raise RuntimeError(f"job {job_id} {job['state']}: {job.get('errors')}")
                return job
            time.sleep(0.5)
        raise RuntimeError(f"job {job_id} did not end in {timeout}s")

    def result(self, job_id: str) -> dict[str, np.ndarray]:
        raw = self.request("GET", f"/api/v1/inference-jobs/{job_id}/result")
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}


def job_seconds(job: dict[str, Any]) -> float:
    from datetime import datetime

    started = datetime.fromisoformat(job["started_at"].replace("Z", "+00:00"))
    finished = datetime.fromisoformat(job["finished_at"].replace("Z", "+00:00"))
    return (finished - started).total_seconds()


# --- online latency -------------------------------------------------------------------------------------


def probe(port: int, texts: list[str], seconds: float, rate: float, stop: threading.Event | None = None) -> list[float]:
    """One client, one text per request, ``rate`` a second (or fewer when answers are slow): the latencies."""
    latencies: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    end = time.monotonic() + seconds
    index = 0
    while time.monotonic() < end and not (stop is not None and stop.is_set()):
        text = texts[index % len(texts)]
        index += 1
        body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}).encode()
        started = time.perf_counter()
        conn.request("POST", f"/v2/models/{MODEL_NAME}/infer", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        took = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"online request failed: {response.status}")
        latencies.append(took)
        time.sleep(max(0.0, 1 / rate - took))
    conn.close()
    return latencies


def latency_summary(latencies: list[float]) -> dict[str, Any]:
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile_ms(latencies, 50), 2),
        "p99_ms": round(percentile_ms(latencies, 99), 2),
    }


# --- the run --------------------------------------------------------------------------------------------


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    model_dir = Path(args.model_dir)
    env = modelyard_env(work / "data", args.database_url)
    env["MODELYARD_INFERENCE_PUBLIC"] = "1"  # the online probe pays for no token check
    if args.slice_rows:
        env["MODELYARD_INFERENCE_JOB_SLICE_ROWS"] = str(args.slice_rows)
    registered = subprocess.run(
        [sys.executable, __file__, "--register", str(model_dir)],
        env=env,
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    token = json.loads(registered.stdout.strip().splitlines()[-1])["token"]
    port = free_port()
    log = work / "modelyard.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "all", "--port", str(port), "--grpc-port", "0"]
    process = subprocess.Popen(
        [*argv, "--log-level", "warning"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work
    )
    texts = make_texts(args.rows)
    probe_texts = make_texts(args.probe_rows, seed=30)
    rng = random.Random(1)
    sample = sorted(set(range(min(64, len(texts)))) | set(rng.sample(range(len(texts)), min(192, len(texts)))))
    try:
        wait_ready(port, f"/v2/models/{MODEL_NAME}/ready", process, log)
        api = Api(port, token)
        # Warm the model up (the first requests of each bucket), then the idle latency.
        probe(port, probe_texts, 2.0, rate=50)
        idle = probe(port, probe_texts, args.probe_seconds, rate=20)
        raw, expected = raw_ort(model_dir, texts, sample)
        print(f"raw ONNX Runtime at batch {BATCH}: {raw['rows_per_s']} rows/s ({raw['rows']} rows)", flush=True)

        submitted = time.monotonic()
        job = api.submit(texts)
        job = api.wait(job["id"], timeout=args.timeout)
        wall = time.monotonic() - submitted
        seconds = job_seconds(job)
        job_rate = job["rows"] / seconds
        print(
            f"job of {job['rows']} texts: {job_rate:.1f} rows/s running, {wall:.1f} s from submit to done", flush=True
        )
        result = api.result(job["id"])
        (name,) = result
        worst = max(float(np.abs(result[name][row] - expected[row]).max()) for row in sample)

        busy_job = api.submit(probe_texts)
        time.sleep(1.0)  # past the job's preparation: its chunks are running
        stop = threading.Event()
        during: list[float] = []

        def probe_during() -> None:
            during.extend(probe(port, probe_texts, args.probe_seconds, rate=20, stop=stop))

        thread = threading.Thread(target=probe_during)
        thread.start()
        while thread.is_alive():
            state = api.job(busy_job["id"])
            if state["state"] in ("succeeded", "failed", "cancelled"):
                stop.set()  # only latencies measured while the job ran count
            thread.join(timeout=0.5)
        api.wait(busy_job["id"], timeout=args.timeout)
    finally:
        stop_process(process)
    idle_summary, during_summary = latency_summary(idle), latency_summary(during)
    return {
        "model_dir": str(model_dir),
        "rows": args.rows,
        "batch": BATCH,
        "slice_rows": args.slice_rows or BATCH,
        "raw_ort": raw,
        "job": {"rows": job["rows"], "seconds": round(seconds, 2), "rows_per_s": round(job_rate, 1)},
        "submit_to_done_seconds": round(wall, 1),
        "job_vs_raw": round(job_rate / raw["rows_per_s"], 3),
        "max_abs_diff_vs_ort": worst,
        "online_idle": idle_summary,
        "online_during_job": during_summary,
        "p99_during_vs_idle": round(during_summary["p99_ms"] / idle_summary["p99_ms"], 2),
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"job {result['job']['rows_per_s']} rows/s vs raw ORT {result['raw_ort']['rows_per_s']} rows/s: "
        f"{result['job_vs_raw']}x (goal {ROWS_GOAL}x); max abs diff {result['max_abs_diff_vs_ort']:.1e}"
    )
    idle, during = result["online_idle"], result["online_during_job"]
    print(
        f"online p50/p99 idle {idle['p50_ms']}/{idle['p99_ms']} ms, during the job {during['p50_ms']}/"
        f"{during['p99_ms']} ms: p99 {result['p99_during_vs_idle']}x (goal {P99_GOAL}x)"
    )


def passed(result: dict[str, Any]) -> bool:
    return (
        result["max_abs_diff_vs_ort"] < TOLERANCE
        and result["job_vs_raw"] >= ROWS_GOAL
        and result["p99_during_vs_idle"] <= P99_GOAL
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--probe-rows", type=int, default=20_000)
    parser.add_argument("--probe-seconds", type=float, default=20.0)
    parser.add_argument("--slice-rows", type=int, default=0, help="MODELYARD_INFERENCE_JOB_SLICE_ROWS for the server")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register:
        register(args.register)
        return 0
    if not (Path(args.model_dir) / "tokenizer.json").exists():
        print(f"no model in {args.model_dir}; nothing to measure")
        return 0
    return run_in_workdir(
        prefix="modelyard-bench-jobs-",
        run=lambda work: run(work, args),
        report=report,
        output=RESULTS,
        keep=args.keep,
        passed=passed,
    )


if __name__ == "__main__":
    sys.exit(main())
