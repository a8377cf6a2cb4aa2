"""Upload benchmark: a large model with external data through a real Modelyard server into S3 (moto) or a folder.

    .venv/bin/python bench/upload.py [--size-mb 1024] [--store s3|local]

What it does, all on 127.0.0.1 and cleaned up afterwards:

1. with ``--store s3`` (the default), starts moto's ThreadedMotoServer (in a child process, so it does
   not compete for the GIL with the client here) and creates a bucket; with ``--store local``, the
   server keeps the embedded default, the local folder store under its data folder;
2. writes a model whose single initializer ``w`` (float32, ``--size-mb`` MiB) lives in the
   external-data file ``weights.bin``: ``y = x + ReduceSum(w)``. A small copy of the same graph is
   checked with onnx.checker and run in ONNX Runtime first;
3. starts ``modelyard serve`` with that store and a Redis broker (redis://127.0.0.1:6379/15), so
   validation is queued rather than run inside the request (nothing consumes the queue; the
   messages this run queued are removed at the end);
4. starts the relay floor (``bench/relay_floor.py``: the least a Python server does to pass a file on
   to the same store, hashing it once), and with ``--store s3`` writes the two files into moto once,
   unmeasured, and removes them: moto's first large write after it starts is not like the later ones;
5. runs ``--rounds`` rounds (default 3) of three ways of storing the same two files, each way going
   first, second and third in turn (an upload's speed here depends on what ran before it):
   - through Modelyard: one multipart request (``?allow_duplicate=true``, so each round stores a new
     version), streamed from disk in 1 MiB pieces, while the server's RSS is sampled every 50 ms;
   - through the relay floor, each file as a raw body;
   - straight into the store from this process: boto3 ``upload_file`` (default TransferConfig, and the
     server's client setting: no SHA-256 of each part's body for its signature) to the same endpoint,
     or ``shutil.copyfile`` into a folder and fsync.

   Every way writes new files each round, as Modelyard stores every upload under new keys.

Every measured write starts after ``os.sync()``, so none waits for the write-back of the one before.
While each runs, it counts the CPU seconds of the server (all threads, and its main thread: the event
loop for Modelyard), of moto and of this process (the client), since on a small machine they share the
cores. Each ratio of speeds is taken within a round, and the median over the rounds is reported, with
every round's figures. It prints a table and writes bench/results/upload.json (upload-local.json for
the local store). The server's RSS growth, from before the first measured upload to the highest point
of any, should stay under 100 MB whatever the model size.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, cast

from common import run_in_workdir, stat_cpu_seconds, stop_process

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MIB = 1024 * 1024
RSS_LIMIT_BYTES = 100 * 1000 * 1000
BROKER_URL = "redis://127.0.0.1:6379/15"
BUCKET = "modelyard-bench"
MODEL_NAME = "bench"

MOTO_SERVER = """
import sys
from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # serve until the parent closes our stdin
server.stop()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the model -----------------------------------------------------------------------------------


def write_model(folder: Path, size_bytes: int) -> dict[str, str]:
    """y = x + ReduceSum(w); w is float32 [size_bytes / 4] in folder/weights.bin. Returns sha256 per file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir(parents=True, exist_ok=True)
    count = max(1, size_bytes // 4)
    digest = hashlib.sha256()
    rng = np.random.default_rng(0)
    with (folder / "weights.bin").open("wb") as out:
        left = count
        while left:
            block = rng.random(min(left, 4 * MIB), dtype=np.float32).tobytes()
            digest.update(block)
            out.write(block)
            left -= len(block) // 4
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[count])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(count * 4))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("ReduceSum", ["w"], ["s"], keepdims=1), helper.make_node("Add", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "bench", [x], [y], [w])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench")
    data = model.SerializeToString()
    (folder / "model.onnx").write_bytes(data)
    onnx.checker.check_model(str(folder / "model.onnx"))
    return {"model.onnx": hashlib.sha256(data).hexdigest(), "weights.bin": digest.hexdigest()}


def check_small_copy(folder: Path) -> None:
    """The same graph at 4 KiB must pass the full checker and run in ONNX Runtime."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    write_model(folder, 4096)
    path = str(folder / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (result,) = session.run(None, {"x": np.array([1.0], dtype=np.float32)})
    weights = np.fromfile(folder / "weights.bin", dtype=np.float32)
    assert np.allclose(result, 1.0 + weights.sum(), rtol=1e-4), (result, weights.sum())


# --- processes -----------------------------------------------------------------------------------


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self._done.is_set():
            try:
                self.samples.append((time.monotonic() - start, rss_bytes(self.pid)))
            except (OSError, RuntimeError):
                return
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()

    @property
    def peak(self) -> int:
        return max(rss for _, rss in self.samples)


def request(port: int, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, data.decode(errors="replace")


def stream_upload(port: int, token: str, model: str, files: list[Path]) -> tuple[int, Any, int]:
    """POST the files as multipart/form-data, streamed from disk in 1 MiB pieces.

    With ``allow_duplicate=true``: every round uploads the same bytes again as a new version."""
    boundary = uuid.uuid4().hex
    heads = [
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for path in files
    ]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(head) + path.stat().st_size + 2 for head, path in zip(heads, files, strict=True)) + len(tail)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.putrequest("POST", f"/api/v1/models/{model}/versions?allow_duplicate=true")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    try:
        for head, path in zip(heads, files, strict=True):
            conn.send(head)
            with path.open("rb") as source:
                while chunk := source.read(MIB):
                    conn.send(chunk)
            conn.send(b"\r\n")
        conn.send(tail)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered early; read its answer below
    response = conn.getresponse()
    data = response.read()
    conn.close()
    try:
        return response.status, json.loads(data), length
    except ValueError:
        return response.status, data.decode(errors="replace"), length


def wait_for_server(
    port: int, proc: subprocess.Popen[bytes], log: Path, *, path: str = "/api/v1/models", token: str = ""
) -> None:
    """Until ``GET path`` answers 200 (Modelyard's model list, or ``bench/relay_floor.py``'s ``/``)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server of {log.name} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            status, _ = request(port, "GET", path, token)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the server of {log.name} did not answer within 90 s:\n{log.read_text()[-4000:]}")


def drop_queued_messages(server_pid: int) -> int:
    """Remove the validation messages this run's server queued (their origin names its pid)."""
    try:
        import redis
    except ImportError:
        return 0
    client = redis.Redis.from_url(BROKER_URL, decode_responses=True)
    removed = 0
    try:
        for raw in client.lrange("celery", 0, -1):
            text = raw if isinstance(raw, str) else raw.decode()
            try:
                origin = json.loads(text).get("headers", {}).get("origin", "")
            except ValueError:
                continue
            if origin.startswith(f"gen{server_pid}@"):
                removed += int(client.lrem("celery", 1, text))
    except redis.RedisError:
        return removed
    return removed


# --- the run -------------------------------------------------------------------------------------


def mb_per_s(size: int, seconds: float) -> float:
    return size / 1e6 / seconds if seconds > 0 else float("inf")


def post_raw(port: int, path: Path, name: str = "") -> tuple[int, Any]:
    """POST one file's bytes as the raw body, streamed from disk in 1 MiB pieces (``bench/relay_floor.py``),
    to be stored as ``name`` (the file's own name by default)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.putrequest("POST", f"/{name or path.name}")
    conn.putheader("Content-Length", str(path.stat().st_size))
    conn.endheaders()
    with path.open("rb") as source:
        while chunk := source.read(MIB):
            conn.send(chunk)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data)


class CpuSpent:
    """Where the CPU went while one way of storing the bytes ran: the server's process (and its main thread,
    the event loop for Modelyard), the store's server (moto), and this process (the client).

    ``with CpuSpent(server=pid, store=moto_pid) as spent: ...``; then ``spent.seconds``. A pid may be None
    (no such process: the direct write has no server, the local store no moto).
    """

    def __init__(self, *, server: int | None, store: int | None) -> None:
        self.pids = {"server": server, "store": store}
        self.seconds: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        read = {"client": time.process_time()}
        for name, pid in self.pids.items():
            if pid is not None:
                read[name] = stat_cpu_seconds(Path(f"/proc/{pid}/stat"))  # all its threads
                if name == "server":
                    read["server_main_thread"] = stat_cpu_seconds(Path(f"/proc/{pid}/task/{pid}/stat"))
        return read

    def __enter__(self) -> CpuSpent:
        self._before = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._read()
        self.seconds = {name: round(after[name] - before, 2) for name, before in self._before.items()}


def copy_to_folder(files: list[Path], folder: Path) -> float:
    """Seconds to put ``files`` into ``folder`` at the file system's own speed (``shutil.copyfile``, which the
    kernel copies without a trip through Python, then fsync, as the local store does), with no server."""
    folder.mkdir(parents=True)
    started = time.monotonic()
    for path in files:
        target = folder / path.name
        shutil.copyfile(path, target)
        descriptor = os.open(target, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    return time.monotonic() - started


def settle() -> None:
    """Write back every dirty page first, so that no measured write waits for the one before it."""
    os.sync()
    time.sleep(0.5)


def start_moto(work: Path) -> tuple[subprocess.Popen[bytes], str, Any]:
    """moto's S3 server in a child process, with its one bucket, and a boto3 client with the server's setting."""
    import boto3
    from botocore.config import Config

    moto_tmp = work / "moto-tmp"
    moto_tmp.mkdir()
    with (work / "moto.log").open("wb") as moto_log:
        moto = subprocess.Popen(
            [sys.executable, "-c", MOTO_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=moto_log,
            env={**os.environ, "TMPDIR": str(moto_tmp)},
        )
    assert moto.stdout is not None
    endpoint = f"http://127.0.0.1:{int(moto.stdout.readline())}"
    # The server's client settings (storage/s3.py): no SHA-256 of each part's body for its signature.
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", config=Config(s3={"payload_signing_enabled": False})
    )
    s3.create_bucket(Bucket=BUCKET)
    return moto, endpoint, s3


def stop_moto(moto: subprocess.Popen[bytes]) -> None:
    if moto.stdin:
        moto.stdin.close()
    try:
        moto.wait(timeout=30)
    except subprocess.TimeoutExpired:
        moto.kill()
        moto.wait()


def stored_sizes(args: argparse.Namespace, s3: Any, work: Path) -> list[dict[str, int]]:
    """The size of each file of each upload the server stored, by folder."""
    uploads: dict[str, dict[str, int]] = {}
    if args.store == "s3":
        listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"bench/artifacts/{MODEL_NAME}/")
        for item in listing.get("Contents", []):
            folder, name = item["Key"].rsplit("/", 1)
            uploads.setdefault(folder, {})[name] = item["Size"]
    else:
        for path in (work / "data" / "artifacts").rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                uploads.setdefault(str(path.parent), {})[path.name] = path.stat().st_size
    return list(uploads.values())


def start_relay_floor(store_args: list[str], work: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``bench/relay_floor.py`` on a free port, in front of the same store, warmed up as the server is."""
    port = free_port()
    with (work / "relay-floor.log").open("wb") as log:
        floor = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "relay_floor.py"), "--port", str(port), *store_args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_for_server(port, floor, work / "relay-floor.log", path="/")
    for path in (work / "small" / "model.onnx", work / "small" / "weights.bin"):
        assert post_raw(port, path)[0] == 200
    return floor, port


WAYS = ("modelyard", "floor", "direct")


def round_order(index: int) -> tuple[str, ...]:
    """The order of the three ways in round ``index`` (from 0): each goes first, second and third in turn.

    An upload's speed on a small machine depends on when it runs as well as on what does it (the store's
    page cache and allocator, the client's cache of the model's files), so no way always goes first.
    """
    shift = index % len(WAYS)
    return WAYS[shift:] + WAYS[:shift]


def summarise(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The median of each way's seconds and CPU counts, and of each round's ratios of speed (a ratio is
    taken within a round, where the three ways met the same machine, then the median over rounds)."""
    summary: dict[str, Any] = {}
    for way in WAYS:
        summary[f"{way}_seconds"] = statistics.median(r[way]["seconds"] for r in rounds)
    for way, against in (("modelyard", "direct"), ("floor", "direct"), ("modelyard", "floor")):
        ratios = [r[against]["seconds"] / r[way]["seconds"] for r in rounds]  # a ratio of speeds: time inverted
        summary[f"ratio_{way}_to_{against}"] = statistics.median(ratios)
        summary[f"ratios_{way}_to_{against}"] = [round(ratio, 3) for ratio in ratios]
    summary["cpu_seconds"] = {
        way: {
            key: statistics.median(r[way]["cpu_seconds"][key] for r in rounds) for key in rounds[0][way]["cpu_seconds"]
        }
        for way in WAYS
    }
    return summary


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(aws)
    moto: subprocess.Popen[bytes] | None = None
    endpoint, s3 = "", cast(Any, None)
    if args.store == "s3":
        moto, endpoint, s3 = start_moto(work)
    store_pid = None if moto is None else moto.pid
    server: subprocess.Popen[bytes] | None = None
    floor: subprocess.Popen[bytes] | None = None
    try:
        print("checking a small copy of the model with onnx.checker and ONNX Runtime ...", flush=True)
        check_small_copy(work / "small")
        size = args.size_mb * MIB
        print(f"writing a {args.size_mb} MiB model to {work / 'model'} ...", flush=True)
        digests = write_model(work / "model", size)
        files = [work / "model" / "model.onnx", work / "model" / "weights.bin"]
        total = sum(path.stat().st_size for path in files)

        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELYARD_")}
        env.update(aws)
        env.update(
            {
                "MODELYARD_DATA_DIR": str(work / "data"),
                "MODELYARD_MAX_UPLOAD_BYTES": str(total * 2 + 10 * MIB),
                "MODELYARD_BROKER_URL": BROKER_URL,
                "MODELYARD_LOG_LEVEL": "WARNING",
            }
        )
        if args.store == "s3":
            env.update(
                {
                    "MODELYARD_STORAGE_URL": f"s3://{BUCKET}/bench",
                    "MODELYARD_S3_ENDPOINT_URL": endpoint,
                    "MODELYARD_S3_ADDRESSING_STYLE": "path",
                    "MODELYARD_S3_REGION": "us-east-1",
                }
            )
        if args.chunk_mb:
            env["MODELYARD_S3_MULTIPART_CHUNK_MB"] = str(args.chunk_mb)
        if args.concurrency:
            env["MODELYARD_S3_MAX_CONCURRENCY"] = str(args.concurrency)
        if args.malloc_arena_max is not None:
            env["MODELYARD_MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
        modelyard = str(BIN / "modelyard")
        created = subprocess.run(
            [modelyard, "createtoken", "bench", "--create-user", "--role", "admin"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        token = created.stdout.strip().splitlines()[-1]

        port = free_port()
        server_log = work / "server.log"
        with server_log.open("wb") as log:
            server = subprocess.Popen(
                [modelyard, "serve", "--port", str(port), "--grpc-port", "0", "--log-level", "warning"],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for_server(port, server, server_log, token=token)
        status, body = request(port, "POST", "/api/v1/models", token, {"name": MODEL_NAME})
        assert status == 201, (status, body)
        rss_idle = rss_bytes(server.pid)

        # A small upload first, so one-time imports and boto3's thread pools are not counted as growth.
        status, body, _ = stream_upload(
            port, token, MODEL_NAME, [work / "small" / "model.onnx", work / "small" / "weights.bin"]
        )
        assert status == 201, (status, body)
        store_args = (
            ["--s3-endpoint", endpoint, "--bucket", BUCKET] if args.store == "s3" else ["--folder", str(work / "relay")]
        )
        floor, floor_port = start_relay_floor(store_args, work)
        if args.store == "s3":
            # moto's first large write after it starts is not like the later ones (its temp files, the page
            # cache they take): one unmeasured write of the same files, removed again, so that none of the
            # measured ways meets a fresh store.
            print("warming the store with the same files (boto3 upload_file, not measured) ...", flush=True)
            for path in files:
                s3.upload_file(str(path), BUCKET, f"warm-up/{path.name}")
                s3.delete_object(Bucket=BUCKET, Key=f"warm-up/{path.name}")
        time.sleep(0.5)

        uploaded: list[Any] = []

        def through_modelyard(index: int) -> None:
            status, body, _ = stream_upload(port, token, MODEL_NAME, files)
            if status != 201:
                raise RuntimeError(f"upload failed: {status} {body}\n{server_log.read_text()[-4000:]}")
            stored = {f["name"]: f for f in body["files"]}
            for name, digest in digests.items():
                assert stored[name]["sha256"] == digest, (name, stored[name], digest)
            uploaded.append(body)

        # Every way writes new files each round, as Modelyard stores each upload under a new key: writing over
        # the last round's (the store freeing what they held first) costs the store differently.
        def through_floor(index: int) -> None:
            for path in files:
                status, answer = post_raw(floor_port, path, f"{index}-{path.name}")
                assert status == 200 and answer["sha256"] == digests[path.name], (path.name, status, answer)

        def direct(index: int) -> None:
            if args.store == "s3":
                for path in files:
                    s3.upload_file(str(path), BUCKET, f"boto3/{index}-{path.name}")
                head = s3.head_object(Bucket=BUCKET, Key=f"boto3/{index}-weights.bin")
                assert head["ContentLength"] == files[1].stat().st_size
            else:
                copy_to_folder(files, work / f"copy-{index}")

        store = {"modelyard": through_modelyard, "floor": through_floor, "direct": direct}
        watched = {"modelyard": server.pid, "floor": floor.pid, "direct": None}
        settle()
        before = {"modelyard": rss_bytes(server.pid), "floor": rss_bytes(floor.pid)}
        peaks = dict.fromkeys(before, 0)
        rss_timeline: list[list[float]] = []
        rounds: list[dict[str, dict[str, Any]]] = []
        for index in range(args.rounds):
            measured: dict[str, dict[str, Any]] = {}
            for position, way in enumerate(round_order(index), start=1):
                print(f"round {index + 1}/{args.rounds}, {position}. {LABELS[args.store][way]} ...", flush=True)
                settle()
                pid = watched[way]
                sampler = RssSampler(pid) if pid is not None else None
                if sampler is not None:
                    sampler.start()
                started = time.monotonic()
                with CpuSpent(server=pid, store=store_pid) as spent:
                    store[way](index)
                seconds = time.monotonic() - started
                if sampler is not None and pid is not None:
                    time.sleep(0.3)
                    sampler.stop()
                    peaks[way] = max(peaks[way], sampler.peak, rss_bytes(pid, "VmHWM"))
                    if way == "modelyard" and not rss_timeline:
                        rss_timeline = [[round(t, 2), round(rss / 1e6, 1)] for t, rss in sampler.samples[::10]]
                measured[way] = {"seconds": round(seconds, 3), "position": position, "cpu_seconds": spent.seconds}
                if sampler is not None:
                    # This upload's own growth: from the RSS as it started to the highest sample during it.
                    measured[way]["rss_growth_bytes"] = sampler.peak - sampler.samples[0][1]
            rounds.append(measured)
        rss_after = rss_bytes(server.pid)
        expected = {path.name: path.stat().st_size for path in files}
        assert stored_sizes(args, s3, work).count(expected) == args.rounds, (expected, stored_sizes(args, s3, work))
        stop_process(server)
        dropped = drop_queued_messages(server.pid)
        server = None

        summary = summarise(rounds)
        last = uploaded[-1]
        return {
            "size_mb": args.size_mb,
            "bytes": total,
            "store": args.store,
            "direct": DIRECT[args.store],
            "server": {
                "s3_multipart_chunk_mb": int(env.get("MODELYARD_S3_MULTIPART_CHUNK_MB", "8")),
                "s3_max_concurrency": int(env.get("MODELYARD_S3_MAX_CONCURRENCY", "4")),
                "validation": f"queued on {BROKER_URL} (not run; {dropped} message(s) removed afterwards)",
            },
            "rounds": rounds,
            "rss_idle_bytes": rss_idle,
            "rss_before_bytes": before["modelyard"],
            "rss_peak_bytes": peaks["modelyard"],
            "rss_after_bytes": rss_after,
            # From before the first measured upload to the highest point of any: what the server keeps
            # between uploads counts too.
            "rss_growth_bytes": peaks["modelyard"] - before["modelyard"],
            "rss_growth_per_upload_bytes": [r["modelyard"]["rss_growth_bytes"] for r in rounds],
            "rss_timeline_mb": rss_timeline,
            "rss_limit_bytes": RSS_LIMIT_BYTES,
            "version": {"version": last["version"], "status": last["status"], "sha256": last["sha256"]},
            **summary,
            "modelyard_mb_per_s": mb_per_s(total, summary["modelyard_seconds"]),
            "floor_mb_per_s": mb_per_s(total, summary["floor_seconds"]),
            "direct_mb_per_s": mb_per_s(total, summary["direct_seconds"]),
            "floor_rss_growth_bytes": peaks["floor"] - before["floor"],
        }
    finally:
        stop_process(floor)
        if server is not None:
            stop_process(server)
            drop_queued_messages(server.pid)
        if moto is not None:
            stop_moto(moto)


DIRECT = {"s3": "boto3 upload_file", "local": "shutil.copyfile into a folder, fsync"}
LABELS = {
    store: {
        "modelyard": "through Modelyard",
        "floor": "through the relay floor (bench/relay_floor.py)",
        "direct": direct,
    }
    for store, direct in DIRECT.items()
}


def describe_cpu(seconds: dict[str, float]) -> str:
    """``server 9.1 (main thread 2.3), store 7.0, client 1.2``: the CPU seconds of one way of storing."""
    parts = []
    if "server" in seconds:
        parts.append(f"server {seconds['server']:.1f} (main thread {seconds['server_main_thread']:.1f})")
    if "store" in seconds:
        parts.append(f"store {seconds['store']:.1f}")
    parts.append(f"client {seconds['client']:.1f}")
    return ", ".join(parts)


def report(result: dict[str, Any]) -> None:
    mb = 1e6
    growth = result["rss_growth_bytes"]
    print()
    print("  round  order                         seconds: modelyard  floor  direct   modelyard/direct  floor/direct")
    for index, measured in enumerate(result["rounds"]):
        order = sorted(WAYS, key=lambda way: measured[way]["position"])
        seconds = [measured[way]["seconds"] for way in WAYS]
        print(
            f"  {index + 1:>5}  {', '.join(order):<30}{seconds[0]:>18.1f}{seconds[1]:>7.1f}{seconds[2]:>8.1f}"
            f"{seconds[2] / seconds[0]:>19.2f}{seconds[2] / seconds[1]:>14.2f}"
        )
    rows = [
        ("payload", f"{result['bytes'] / mb:,.1f} MB (model.onnx + weights.bin), {len(result['rounds'])} rounds"),
        (
            "server S3 settings",
            "chunk {s3_multipart_chunk_mb} MiB, concurrency {s3_max_concurrency}".format(**result["server"])
            if result["store"] == "s3"
            else "(the local store)",
        ),
        ("server RSS idle", f"{result['rss_idle_bytes'] / mb:,.1f} MB"),
        ("server RSS before", f"{result['rss_before_bytes'] / mb:,.1f} MB (after a small warm-up upload)"),
        ("server RSS peak", f"{result['rss_peak_bytes'] / mb:,.1f} MB (sampled every 50 ms, and VmHWM)"),
        ("server RSS after", f"{result['rss_after_bytes'] / mb:,.1f} MB"),
        (
            "server RSS growth",
            f"{growth / mb:,.1f} MB over all rounds ({'OK' if growth < RSS_LIMIT_BYTES else 'OVER'} the 100 MB limit); "
            f"each upload's own: {', '.join(f'{g / mb:,.1f}' for g in result['rss_growth_per_upload_bytes'])} MB",
        ),
        ("store", result["store"]),
        ("modelyard upload", f"median {result['modelyard_seconds']:.1f} s, {result['modelyard_mb_per_s']:.1f} MB/s"),
        (
            "relay floor",
            f"median {result['floor_seconds']:.1f} s, {result['floor_mb_per_s']:.1f} MB/s, "
            f"RSS growth {result['floor_rss_growth_bytes'] / mb:,.1f} MB",
        ),
        (result["direct"], f"median {result['direct_seconds']:.1f} s, {result['direct_mb_per_s']:.1f} MB/s"),
        *(
            (
                f"ratio {name}",
                f"median {result[key]:.2f} (rounds: {', '.join(f'{r:.2f}' for r in result['ratios' + key[5:]])})",
            )
            for name, key in (
                ("modelyard / direct", "ratio_modelyard_to_direct"),
                ("relay floor / direct", "ratio_floor_to_direct"),
                ("modelyard / relay floor", "ratio_modelyard_to_floor"),
            )
        ),
        *((f"CPU s, {way}", describe_cpu(result["cpu_seconds"][way]) + " (medians)") for way in WAYS),
        ("version", f"{result['version']['version']} ({result['version']['status']})"),
    ]
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of weights.bin in MiB (default 1024)")
    parser.add_argument(
        "--store", choices=("s3", "local"), default="s3", help="S3 on loopback (moto) or the local folder store"
    )
    parser.add_argument("--chunk-mb", type=int, default=0, help="MODELYARD_S3_MULTIPART_CHUNK_MB for the server")
    parser.add_argument("--concurrency", type=int, default=0, help="MODELYARD_S3_MAX_CONCURRENCY for the server")
    parser.add_argument(
        "--malloc-arena-max", type=int, default=None, help="MODELYARD_MALLOC_ARENA_MAX for the server (0: glibc's)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the three ways, each going first in turn (default 3)"
    )
    parser.add_argument("--output", type=Path, default=None, help="default bench/results/upload[-local].json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, model)")
    args = parser.parse_args(argv)
    if args.output is None:
        args.output = ROOT / "bench" / "results" / ("upload.json" if args.store == "s3" else "upload-local.json")

    return run_in_workdir(
        prefix="modelyard-bench-upload-",
        run=lambda work: run(args, work),
        report=report,
        output=args.output,
        keep=args.keep,
        passed=lambda result: result["rss_growth_bytes"] < RSS_LIMIT_BYTES,
    )


if __name__ == "__main__":
    sys.exit(main())
