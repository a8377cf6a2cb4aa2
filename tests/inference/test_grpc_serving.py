"""gRPC from real ``modelyard serve`` processes: worker processes sharing its port, its limit, a taken port, a swap.

Each test starts ``python -m modelyard.cli serve --role inference`` on the test database (as
``test_serving_processes.py`` does) with its own HTTP and gRPC ports, and talks to it with the real
``tritonclient.grpc``.
"""

from __future__ import annotations

import glob
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.inference import answered_bias
from tests.support.load import ClientThreads
from tests.support.polling import eventually
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)


def listening_pids(port: int) -> set[int]:
    """The processes holding a listening TCP socket on ``port`` (from /proc: what ``ss -ltnp`` shows)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(fields[9])
    pids = set()
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            pids.add(int(fd.split("/")[2]))
    return pids


def infer(url: str, x: np.ndarray) -> grpcclient.InferResult:
    with grpcclient.InferenceServerClient(url) as client:  # a fresh connection each time
        item = grpcclient.InferInput("x", list(x.shape), "FP32")
        item.set_data_from_numpy(x)
        return client.infer("demo", [item])


def test_every_worker_process_serves_the_grpc_port_and_its_message_limit_holds(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    server = start_server(
        "grpc-workers", args=("--workers", "2"), extra_env={"MODELYARD_GRPC_MAX_MESSAGE_BYTES": "4096"}
    )
    url = f"127.0.0.1:{server.grpc_port}"

    # Both worker processes (not their parent) listen on the one gRPC port, through SO_REUSEPORT.
    workers = eventually(
        lambda: listening_pids(server.grpc_port) if len(listening_pids(server.grpc_port)) == 2 else None
    )
    assert server.process.pid not in workers
    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in workers}
    assert parents == {server.process.pid}

    def every_connection_answers() -> bool:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        try:
            return all(np.array_equal(infer(url, x).as_numpy("y"), x + 1) for _ in range(12))
        except InferenceServerException:
            return False  # a worker that has not loaded the model yet answers UNAVAILABLE

    eventually(every_connection_answers, timeout=60, what="not every worker served demo over gRPC")

    with pytest.raises(InferenceServerException) as caught:
        infer(url, np.ones((512, 4), np.float32))  # 8 KiB
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in caught.value.message() and "vs. 4096)" in caught.value.message()


def test_a_taken_grpc_port_stops_the_start_and_says_so(start_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server("grpc-taken", args=("--grpc-port", str(port)), wait=False)
        assert server.process.wait(timeout=90) != 0
    assert (
        f"gRPC cannot listen on 127.0.0.1:{port} (MODELYARD_GRPC_PORT, modelyard serve --grpc-port): the port is "
        "taken or the address is not this host's; 0 turns gRPC off"
    ) in server.log()


# --- A swap under constant gRPC load ---------------------------------------------------------------------


@dataclass
class Answer:
    client: int
    sent: float
    received: float
    version: str
    bias: float | None
    error: str = ""


class GrpcLoad(ClientThreads):
    """Client threads, each with its own tritonclient.grpc client (one channel), sending requests back to back."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        super().__init__(clients)

    def _run(self, client: int) -> None:
        with grpcclient.InferenceServerClient(self.url) as triton:
            seq = 0
            while not self._stop.is_set():
                seq += 1
                x = (np.arange(8, dtype=np.float32).reshape(2, 4) + client * 1000 + seq).astype(np.float32)
                item = grpcclient.InferInput("x", [2, 4], "FP32")
                item.set_data_from_numpy(x)
                sent = time.monotonic()
                try:
                    result = triton.infer("demo", [item])
                    y = result.as_numpy("y")
                    body = {"outputs": [{"name": "y", "shape": list(y.shape), "data": y.reshape(-1).tolist()}]}
                    answer = Answer(client, sent, time.monotonic(), result.get_response().model_version, None)
                    answer.bias = answered_bias(x, body)
                except Exception as exc:  # noqa: BLE001 - every failure is recorded, and the test fails on it
                    answer = Answer(client, sent, time.monotonic(), "", None, f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self.answers.append(answer)


def test_a_swap_under_grpc_load_fails_no_request_and_never_goes_back(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    server = start_server("grpc-swap")
    url = f"127.0.0.1:{server.grpc_port}"
    eventually(lambda: infer(url, np.ones((1, 4), np.float32)).get_response().model_version == "1", timeout=30)

    clients = 4
    with GrpcLoad(url, clients) as load:
        eventually(lambda: all(load.count(c, "1") >= 20 for c in range(clients)), timeout=60)
        promote(owner, approver, 2)
        eventually(lambda: all(load.count(c, "2") >= 20 for c in range(clients)), timeout=60, what="v2 not served")
    answers = load.answers

    failed = [a for a in answers if a.error]
    assert failed == [], f"{len(failed)} of {len(answers)} requests failed, e.g. {failed[:3]}"
    assert {(a.version, a.bias) for a in answers} == {("1", 1.0), ("2", 2.0)}
    for client in range(clients):
        versions = [a.version for a in answers if a.client == client]
        switch = versions.index("2")
        assert set(versions[:switch]) == {"1"} and set(versions[switch:]) == {"2"}, f"client {client} went back"
