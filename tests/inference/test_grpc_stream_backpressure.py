"""A ``ModelStreamInfer`` client that never reads its answers cannot grow a real server without bound.

Each answer holds its request's place (``MODELYARD_GRPC_STREAM_CONCURRENCY``) until it is written, so
a stream whose answers are not read stops taking requests, and HTTP/2 flow control holds the client
back. Measured on a real ``modelyard serve`` process: its resident memory while a client pushes
hundreds of 256 KiB requests and reads nothing, then every answer once it reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inference.grpc import grpc_service_pb2 as pb
from inference.grpc import grpc_service_pb2_grpc as pb_grpc
from tests.support.polling import eventually
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 16384  # x FP32 [16384, 4]: 256 KiB a request, and as much an answer
SENT = 1000  # 250 MiB of requests; answers held for them grew the server by as much again (150 MiB for 600)
CONCURRENCY = 4
MiB = 1024 * 1024


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def x_of(index: int) -> np.ndarray:
    return np.full((ROWS, 4), index, dtype=np.float32)


def request(index: int) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="demo", id=str(index), raw_input_contents=[x_of(index).tobytes()])
    message.inputs.add(name="x", datatype="FP32", shape=[ROWS, 4])
    return message


class Pusher:
    """The client's side: a request iterator gRPC takes from as fast as the server lets it."""

    def __init__(self) -> None:
        self.taken = 0
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[pb.ModelInferRequest]:
        for index in range(SENT):
            yield request(index)
            with self.lock:
                self.taken += 1

    def count(self) -> int:
        with self.lock:
            return self.taken


def test_a_stream_whose_answers_are_never_read_holds_the_server_to_its_concurrency(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0])
    promote(owner, approver, 1)
    server = start_server("stream-unread", extra_env={"MODELYARD_GRPC_STREAM_CONCURRENCY": str(CONCURRENCY)})
    url = f"127.0.0.1:{server.grpc_port}"

    def served() -> bool:  # also the warm-up: the server has handled requests of this size before it is measured
        with grpcclient.InferenceServerClient(url) as client:
            item = grpcclient.InferInput("x", [ROWS, 4], "FP32")
            item.set_data_from_numpy(x_of(7))
            try:
                return all(np.array_equal(client.infer("demo", [item]).as_numpy("y"), x_of(7) + 1) for _ in range(8))
            except Exception:  # noqa: BLE001 - not loaded yet
                return False

    eventually(served, timeout=60, what="demo was not served over gRPC")
    before = resident_bytes(server.process.pid)

    pusher = Pusher()
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(url, options=options) as channel:
        answers = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(pusher), timeout=300)
        # Read nothing; watch the server while the client pushes. It stops when every request is
        # taken, or when the count has stood still for 3 s: then flow control holds the client.
        peak, last, still_since = before, -1, time.monotonic()
        while pusher.count() < SENT and time.monotonic() - still_since < 3:
            time.sleep(0.25)
            peak = max(peak, resident_bytes(server.process.pid))
            if pusher.count() != last:
                last, still_since = pusher.count(), time.monotonic()
        peak = max(peak, resident_bytes(server.process.pid))
        held_back_at = pusher.count()

        # Now read: every answer arrives, each the right one, and the client sends the rest meanwhile.
        got = {}
        for answer in answers:
            assert answer.error_message == "", answer.error_message
            y = np.frombuffer(answer.infer_response.raw_output_contents[0], dtype=np.float32)
            got[answer.infer_response.id] = y
            if len(got) == SENT:
                break
        answers.cancel()

    growth = peak - before
    # Held: the stream's places (4 x 256 KiB twice) and what HTTP/2 buffers (8-27 MiB measured here).
    assert growth < 96 * MiB, f"the server grew by {growth / MiB:.0f} MiB while nobody read its answers"
    assert held_back_at < SENT, "the server took every request although nobody read its answers"
    assert sorted(got, key=int) == [str(i) for i in range(SENT)]
    for index in range(SENT):
        assert np.array_equal(got[str(index)], x_of(index).reshape(-1) + 1)
