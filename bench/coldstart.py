"""Cold start: from ``modelyard serve --role inference`` to ready, against fetching the bytes plus a raw session build.

    .venv/bin/python bench/coldstart.py [MODEL_DIR] [--big-mb 1024] [--rounds 3] [--database-url postgres://...]
    .venv/bin/python bench/coldstart.py --big-mb 64 --rounds 1        # a smoke run

Everything runs on 127.0.0.1. Cases: MiniLM (MODEL_DIR, default ``../shared/models/minilm-l6``) in the
local artifact folder and in S3 (moto's ThreadedMotoServer in a child process), and a model of
``--big-mb`` MiB of external data (``y = x + ReduceSum(w)``, as ``bench/upload.py`` writes it) in S3.
Each model is registered, validated and promoted through the services first. Then, per round and
case, with an empty artifact cache each time:

- **modelyard**: the time from starting ``modelyard serve --role inference`` to its
  ``/v2/models/<name>/ready`` answering 200 (the process's start, Django, the registry's desired
  state, the download into the cache with every sha256 checked, the signature check, the session
  build and the warm-up), and, within it, to ``/v2/health/live`` (the process alone, no model: the
  floor of any start);
- **baseline**: a fresh Python process that fetches the same bytes (one streamed boto3 ``get_object`` from
  the same S3 endpoint, or a file copy from the local store) and builds an ONNX Runtime session on them:
  the time from its start to the session's being built.

The goal (issue 28): modelyard at most 1.3x the baseline, judged on the median of the rounds per case.
It prints a table and writes bench/results/coldstart.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import run_in_workdir, stop_process
from serve import BIN, free_port, register_served
from upload import MIB, MOTO_SERVER, write_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = ROOT.parent / "shared" / "models" / "minilm-l6"
RESULTS = ROOT / "bench" / "results" / "coldstart.json"
BUCKET = "modelyard-coldstart"
GOAL = 1.3
AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}

BASELINE = """
import shutil, sys, time
from pathlib import Path

started = float(sys.argv[1])
kind, source, target = sys.argv[2], sys.argv[3], Path(sys.argv[4])
files = sys.argv[5].split(",")
model_file = sys.argv[6]
target.mkdir(parents=True, exist_ok=True)
if kind == "s3":
    import boto3

    endpoint, bucket, prefix = source.split("|")
    s3 = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for name in files:
        key, _, local = name.partition("=")
        # One streamed GET, as Modelyard's cache reads an object: download_file's parallel ranged GETs
        # make moto copy the whole object for every 8 MB range (90 s for 1 GiB), which no real store does.
        body = s3.get_object(Bucket=bucket, Key=prefix + key)["Body"]
        with (target / local).open("wb") as out:
            shutil.copyfileobj(body, out, 1024 * 1024)
else:
    for name in files:
        key, _, local = name.partition("=")
        shutil.copyfile(Path(source) / key, target / local)
fetched = time.time()
import onnxruntime as ort

ort.InferenceSession(str(target / model_file), providers=["CPUExecutionProvider"])
done = time.time()
print(f"{fetched - started} {done - started}")
"""


def register(options_json: str) -> None:
    """Runs in a child process (the case's storage in its environment): register, validate and promote."""
    options = json.loads(options_json)
    register_served(
        name=options["name"],
        description="bench/coldstart.py",
        files=[(name, Path(path)) for name, path in options["files"]],
        model_settings={},
    )


def stored_files(env: dict[str, str], name: str) -> list[tuple[str, str]]:
    """(storage key, file name) of the served version's files, read through Django in a child."""
    code = (
        "import django, json; django.setup();"
        "from registry.models import RegisteredModel;"
        f"v = RegisteredModel.objects.get(name={name!r}).versions.get(version=1);"
        "print(json.dumps([[f.storage_key, f.name] for f in v.files.all()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    return [(key, name) for key, name in json.loads(out.stdout.strip().splitlines()[-1])]


def _answers(port: int, path: str) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False


def serve_to_ready(env: dict[str, str], name: str, work: Path) -> tuple[float, float]:
    """Seconds from the start to ``/v2/health/live`` (the process alone) and to the model's being ready."""
    shutil.rmtree(Path(env["MODELYARD_CACHE_DIR"]), ignore_errors=True)
    port = free_port()
    log = work / f"serve-{name}.log"
    argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--port", str(port), "--grpc-port", "0"]
    started = time.monotonic()
    process = subprocess.Popen(
        [*argv, "--log-level", "warning"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work
    )
    try:
        deadline = started + 600
        live = None
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
            if live is None and _answers(port, "/v2/health/live"):
                live = time.monotonic() - started
            if live is not None and _answers(port, f"/v2/models/{name}/ready"):
                return live, time.monotonic() - started
            time.sleep(0.02)
        raise RuntimeError(f"{name} was not ready in 600 s:\n{log.read_text()[-3000:]}")
    finally:
        stop_process(process)


def baseline(kind: str, source: str, files: list[tuple[str, str]], model_file: str, work: Path) -> tuple[float, float]:
    target = work / "baseline"
    shutil.rmtree(target, ignore_errors=True)
    listing = ",".join(f"{key}={local}" for key, local in files)
    out = subprocess.run(
        [sys.executable, "-c", BASELINE, str(time.time()), kind, source, str(target), listing, model_file],
        env={**os.environ, **AWS},
        check=True,
        capture_output=True,
        text=True,
    )
    shutil.rmtree(target, ignore_errors=True)
    fetched, done = (float(value) for value in out.stdout.split())
    return fetched, done


def case_env(work: Path, case: str, database_url: str | None, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELYARD_")}
    env |= AWS | {
        "DJANGO_SETTINGS_MODULE": "modelyard.settings",
        "MODELYARD_DATA_DIR": str(work / case),
        "MODELYARD_CACHE_DIR": str(work / case / "cache"),
        "MODELYARD_INFERENCE_PUBLIC": "1",
        "MODELYARD_LOG_LEVEL": "WARNING",
        "MODELYARD_PROVIDERS": "cpu",
        "MODELYARD_BENCHMARKS": "false",
        "MODELYARD_VALIDATION_TIMEOUT_SECONDS": "900",
        "MODELYARD_VALIDATION_MEMORY_MB": "8192",
    }
    if database_url:
        env["MODELYARD_DATABASE_URL"] = f"{database_url.rstrip('/')}_{case.replace('-', '_')}"
    if case.endswith("s3"):
        env |= {
            "MODELYARD_STORAGE_URL": f"s3://{BUCKET}/{case}",
            "MODELYARD_S3_ENDPOINT_URL": endpoint,
            "MODELYARD_S3_ADDRESSING_STYLE": "path",
            "MODELYARD_S3_REGION": "us-east-1",
        }
    return env


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    import boto3

    model_dir = Path(args.model_dir)
    moto_tmp = work / "moto-tmp"
    moto_tmp.mkdir()
    moto = subprocess.Popen(
        [sys.executable, "-c", MOTO_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(work / "moto.log").open("wb"),
        env={**os.environ, "TMPDIR": str(moto_tmp)},
    )
    try:
        assert moto.stdout is not None
        endpoint = f"http://127.0.0.1:{int(moto.stdout.readline())}"
        os.environ.update(AWS)
        boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=BUCKET
        )
        cases: dict[str, dict[str, Any]] = {
            "minilm-local": {"name": "minilm", "files": [["model.onnx", str(model_dir / "model.onnx")]]},
            "minilm-s3": {"name": "minilm", "files": [["model.onnx", str(model_dir / "model.onnx")]]},
        }
        if args.big_mb:
            print(f"writing a {args.big_mb} MiB model ...", flush=True)
            write_model(work / "big", args.big_mb * MIB)
            cases["big-s3"] = {
                "name": "big",
                "files": [
                    ["model.onnx", str(work / "big" / "model.onnx")],
                    ["weights.bin", str(work / "big" / "weights.bin")],
                ],
            }
        prepared = {}
        for case, options in cases.items():
            env = case_env(work, case, args.database_url, endpoint)
            if args.database_url:
                _recreate_database(env["MODELYARD_DATABASE_URL"])
            print(f"registering {case} ...", flush=True)
            subprocess.run([sys.executable, __file__, "--register", json.dumps(options)], env=env, check=True, cwd=ROOT)
            files = stored_files(env, options["name"])
            if case.endswith("s3"):
                source = f"{endpoint}|{BUCKET}|{case}/"
                kind = "s3"
            else:
                source, kind = str(work / case / "artifacts"), "local"
            prepared[case] = (env, options["name"], kind, source, files)
        rounds: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
        for number in range(args.rounds):
            for case, (env, name, kind, source, files) in prepared.items():
                model_file = next(local for _key, local in files if local == "model.onnx")
                fetched, built = baseline(kind, source, files, model_file, work)
                live, served = serve_to_ready(env, name, work)
                rounds[case].append(
                    {"modelyard_s": served, "live_s": live, "baseline_s": built, "baseline_fetch_s": fetched}
                )
                print(
                    f"round {number + 1} {case}: modelyard {served:.2f} s (live at {live:.2f} s), "
                    f"baseline {built:.2f} s (fetch {fetched:.2f} s): {served / built:.2f}x",
                    flush=True,
                )
    finally:
        if moto.stdin is not None:
            moto.stdin.close()
        stop_process(moto)
        if args.database_url:
            for case in rounds if "rounds" in locals() else []:
                _drop_database(f"{args.database_url.rstrip('/')}_{case.replace('-', '_')}")
    summary = {}
    for case, values in rounds.items():
        served = statistics.median(v["modelyard_s"] for v in values)
        built = statistics.median(v["baseline_s"] for v in values)
        summary[case] = {
            "modelyard_s": round(served, 2),
            "live_s": round(statistics.median(v["live_s"] for v in values), 2),
            "baseline_s": round(built, 2),
            "baseline_fetch_s": round(statistics.median(v["baseline_fetch_s"] for v in values), 2),
            "ratio": round(served / built, 2),
            "rounds": [{k: round(v, 3) for k, v in value.items()} for value in values],
        }
    return {"big_mb": args.big_mb, "rounds": args.rounds, "cases": summary, "goal": GOAL}


def _admin_dsn(url: str) -> tuple[str, str]:
    base, _, name = url.rpartition("/")
    return f"{base}/postgres", name


def _recreate_database(url: str) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _drop_database(url: str) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def report(result: dict[str, Any]) -> None:
    print(
        f"{'case':<14} {'modelyard s':>12} {'live s':>7} {'baseline s':>11} {'fetch s':>8} {'ratio':>6}"
        f"  goal <= {GOAL}x"
    )
    for case, row in result["cases"].items():
        print(
            f"{case:<14} {row['modelyard_s']:>12} {row['live_s']:>7} {row['baseline_s']:>11} "
            f"{row['baseline_fetch_s']:>8} {row['ratio']:>6}"
        )


def passed(result: dict[str, Any]) -> bool:
    return all(row["ratio"] <= GOAL for row in result["cases"].values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--big-mb", type=int, default=1024, help="the large model's size (0: leave it out)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server URL prefix; a database per case")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--register", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.register:
        register(args.register)
        return 0
    return run_in_workdir(
        prefix="modelyard-bench-coldstart-",
        run=lambda work: run(work, args),
        report=report,
        output=RESULTS,
        keep=args.keep,
        passed=passed,
    )


if __name__ == "__main__":
    sys.exit(main())
