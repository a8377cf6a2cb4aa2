"""Shared memory regions without a server: inputs are copies, and a region unregistered mid-request is never written.

Real POSIX shared memory objects in /dev/shm, mapped by ``inference.shared_memory``, decoded and encoded by
``inference.protocol`` as the /v2 endpoint does (``tests/compat/test_shared_memory.py`` runs the clients).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.errors import InvalidInput, RegionNotFound
from inference.protocol import decode_request, encode_response
from inference.shared_memory import SharedMemory

SIGNATURE = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}
LIMITS = {"max_regions": 4, "max_bytes": 1 << 20}


@pytest.fixture
def shm_object() -> Iterator[tuple[str, Path]]:
    """A 4 KiB shared memory object of this test's own: its key and its file."""
    key = f"/modelyard_unit_{uuid.uuid4().hex[:12]}"
    path = Path("/dev/shm") / key[1:]
    path.write_bytes(bytes(4096))
    path.chmod(0o600)
    yield key, path
    path.unlink(missing_ok=True)


def body(region: str, *, output: bool = True) -> bytes:
    item: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": [1, 4]}
    item["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": 16}
    request: dict[str, object] = {"inputs": [item]}
    if output:
        request["outputs"] = [
            {
                "name": "y",
                "parameters": {
                    "shared_memory_region": region,
                    "shared_memory_byte_size": 16,
                    "shared_memory_offset": 16,
                },
            }
        ]
    return json.dumps(request).encode()


def test_inputs_are_copied_out_so_the_client_may_reuse_the_region_at_once(shm_object):
    key, path = shm_object
    memory = SharedMemory()
    memory.register("c", "r", key, 0, 64, **LIMITS)
    path.write_bytes(np.arange(4, dtype="<f4").tobytes() + bytes(4080))
    decoded = decode_request(body("r", output=False), None, SIGNATURE, regions=lambda: memory.regions("c"))
    path.write_bytes(bytes(4096))  # the client writes its next tensor
    np.testing.assert_array_equal(decoded.inputs["x"], np.arange(4, dtype=np.float32).reshape(1, 4))
    assert decoded.inputs["x"].flags.writeable  # as a binary tensor from the body is
    memory.close()


def test_outputs_are_written_into_the_region_and_answered_without_data(shm_object):
    key, path = shm_object
    memory = SharedMemory()
    memory.register("c", "r", key, 0, 64, **LIMITS)
    decoded = decode_request(body("r"), None, SIGNATURE, regions=lambda: memory.regions("c"))
    payload, headers = encode_response(
        model="m", version="1", request=decoded, values={"y": np.full((1, 4), 2.5, np.float32)}
    )
    assert json.loads(payload)["outputs"] == [
        {
            "name": "y",
            "datatype": "FP32",
            "shape": [1, 4],
            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16},
        }
    ]
    assert headers == {"content-type": "application/json"}
    np.testing.assert_array_equal(np.frombuffer(path.read_bytes()[16:32], "<f4"), [2.5] * 4)
    memory.close()


def test_a_region_unregistered_while_its_request_runs_is_closed_at_once_and_never_written(shm_object):
    """The safe choice: the request's inputs are its own; its outputs are refused, not written to a closed map."""
    key, path = shm_object
    memory = SharedMemory()
    memory.register("c", "r", key, 0, 64, **LIMITS)
    decoded = decode_request(body("r"), None, SIGNATURE, regions=lambda: memory.regions("c"))
    memory.unregister("c", "r")  # while "the model runs"
    memory.register("c", "r", key, 0, 64, **LIMITS)  # even a new region of the same name is not the request's
    with pytest.raises(InvalidInput) as caught:
        encode_response(model="m", version="1", request=decoded, values={"y": np.ones((1, 4), np.float32)})
    assert caught.value.message == (
        "shared memory region 'r' was unregistered while the request ran; its outputs were not written"
    )
    assert path.read_bytes() == bytes(4096)
    memory.close()


def test_each_client_sees_only_its_own_regions(shm_object):
    key, _ = shm_object
    memory = SharedMemory()
    memory.register("a", "r", key, 0, 64, **LIMITS)
    memory.register("b", "r", key, 64, 32, **LIMITS)
    assert memory.status("a") == [{"name": "r", "key": key, "offset": 0, "byte_size": 64}]
    assert memory.status("b", "r") == [{"name": "r", "key": key, "offset": 64, "byte_size": 32}]
    memory.unregister("a")
    assert memory.status("a") == []
    with pytest.raises(RegionNotFound):
        memory.status("a", "r")
    assert len(memory.status("b")) == 1
    memory.close()
    assert memory.status("b") == []


def test_a_request_that_no_transport_gave_regions_is_refused():
    """Asynchronous jobs and sample inputs decode without a caller's regions."""
    with pytest.raises(InvalidInput) as caught:
        decode_request(body("r", output=False), None, SIGNATURE)
    assert caught.value.message == (
        "input 'x': shared memory regions are for /v2 and gRPC inference requests, not this one"
    )
