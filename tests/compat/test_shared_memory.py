"""Triton's system shared memory through the real tritonclient (http and grpc) and its ``shared_memory`` utilities.

Regions are created by tritonclient's C library in /dev/shm, registered with the package's server
(``tests/support/v2server.py``), and the answers read back from them are compared with ONNX Runtime run
directly on the uploaded bytes. The flows are those of Triton's example clients: simple_http_shm_client,
simple_grpc_shm_client and reuse_infer_objects_client, on the same ``simple`` model they use.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size, triton_to_np_dtype

from inference.dataplane import CUDA_SHARED_MEMORY, SHARED_MEMORY_OFF
from tests.compat.test_tokens_and_rate import bearer, make_token
from tests.support.v2server import V2Server

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)
SIZE = A.nbytes  # 64


@pytest.fixture(autouse=True)
def turned_on(settings: Any, v2: V2Server) -> Iterator[None]:
    """Shared memory on (the server reads the setting per request); every region unregistered afterwards."""
    settings.SHARED_MEMORY = True
    yield
    settings.SHARED_MEMORY, settings.INFERENCE_PUBLIC = True, True
    assert v2.request("POST", "/v2/systemsharedmemory/unregister").status == 200


class Regions:
    """Regions created with tritonclient's library under keys of this test's own, destroyed afterwards."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.tag = uuid.uuid4().hex[:10]

    def key(self, name: str) -> str:
        return f"/modelyard_test_{self.tag}_{name}"

    def create(self, name: str, byte_size: int) -> tuple[Any, str]:
        key = self.key(name)
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        return handle, key

    def destroy(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.destroy()


@pytest.fixture
def http(v2: V2Server) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(v2.url) as triton:
        yield triton


@pytest.fixture
def grpc(v2: V2Server) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(v2.grpc_url) as triton:
        yield triton


def refused(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def expected(v2: V2Server, a: np.ndarray = A, b: np.ndarray = B) -> dict[str, np.ndarray]:
    return v2.expected("simple", {"INPUT0": a, "INPUT1": b})


def http_inputs(region: str, *, offsets: tuple[int, int] = (0, SIZE)) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    for item, offset in zip(inputs, offsets, strict=True):
        item.set_shared_memory(region, SIZE, offset=offset)
    return inputs


# --- the examples' flows ------------------------------------------------------------------------------------


def test_simple_http_shm_client_flow_matches_onnx_runtime(http, v2, regions):
    """simple_http_shm_client.py: both inputs in one region, both outputs in another, each at an offset."""
    http.unregister_system_shared_memory()
    http.unregister_cuda_shared_memory()
    out_handle, out_key = regions.create("output_data", SIZE * 2)
    http.register_system_shared_memory("output_data", out_key, SIZE * 2)
    in_handle, in_key = regions.create("input_data", SIZE * 2)
    shm.set_shared_memory_region(in_handle, [A])
    shm.set_shared_memory_region(in_handle, [B], offset=SIZE)
    http.register_system_shared_memory("input_data", in_key, SIZE * 2)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", SIZE)
    outputs[1].set_shared_memory("output_data", SIZE, offset=SIZE)

    results = http.infer("simple", http_inputs("input_data"), outputs=outputs)

    want = expected(v2)
    for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
        output = results.get_output(name)
        assert output == {
            "name": name,
            "datatype": "INT32",
            "shape": [1, 16],
            "parameters": {"shared_memory_region": "output_data", "shared_memory_byte_size": SIZE},
        }
        got = shm.get_contents_as_numpy(
            out_handle, triton_to_np_dtype(output["datatype"]), output["shape"], offset=index * SIZE
        )
        np.testing.assert_array_equal(got, want[name])
    assert sorted(http.get_system_shared_memory_status(), key=lambda r: r["name"]) == [
        {"name": "input_data", "key": in_key, "offset": 0, "byte_size": SIZE * 2},
        {"name": "output_data", "key": out_key, "offset": 0, "byte_size": SIZE * 2},
    ]
    http.unregister_system_shared_memory()
    assert http.get_system_shared_memory_status() == []


def test_simple_grpc_shm_client_flow_matches_onnx_runtime(grpc, v2, regions):
    """simple_grpc_shm_client.py: a region per tensor, registered, used, listed and unregistered over gRPC."""
    grpc.unregister_system_shared_memory()
    grpc.unregister_cuda_shared_memory()
    handles = {}
    for name in ("output0_data", "output1_data", "input0_data", "input1_data"):
        handle, key = regions.create(name, SIZE)
        handles[name] = handle
        grpc.register_system_shared_memory(name, key, SIZE)
    shm.set_shared_memory_region(handles["input0_data"], [A])
    shm.set_shared_memory_region(handles["input1_data"], [B])
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input0_data", SIZE)
    inputs[1].set_shared_memory("input1_data", SIZE)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", SIZE)
    outputs[1].set_shared_memory("output1_data", SIZE)

    results = grpc.infer("simple", inputs, outputs=outputs)

    want = expected(v2)
    for name, region in (("OUTPUT0", "output0_data"), ("OUTPUT1", "output1_data")):
        output = results.get_output(name)
        assert output.parameters["shared_memory_region"].string_param == region
        assert output.parameters["shared_memory_byte_size"].int64_param == SIZE
        got = shm.get_contents_as_numpy(handles[region], triton_to_np_dtype(output.datatype), output.shape)
        np.testing.assert_array_equal(got, want[name])
    status = grpc.get_system_shared_memory_status()
    assert sorted(status.regions) == ["input0_data", "input1_data", "output0_data", "output1_data"]
    assert status.regions["input1_data"].key == regions.key("input1_data")
    assert status.regions["input1_data"].byte_size == SIZE
    assert grpc.get_system_shared_memory_status("output0_data").regions["output0_data"].offset == 0
    grpc.unregister_system_shared_memory("output0_data")
    assert sorted(grpc.get_system_shared_memory_status().regions) == ["input0_data", "input1_data", "output1_data"]
    grpc.unregister_system_shared_memory()
    assert not grpc.get_system_shared_memory_status().regions


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_objects_are_reused_with_and_without_shared_memory(protocol, http, grpc, v2, regions):
    """reuse_infer_objects_client.py: the same InferInput and InferRequestedOutput objects, shm, plain, shm again."""
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    handles = {}
    for name in ("output0_data", "output1_data", "input0_data", "input1_data"):
        handles[name], key = regions.create(name, SIZE)
        client.register_system_shared_memory(name, key, SIZE)
    shm.set_shared_memory_region(handles["input0_data"], [A])
    shm.set_shared_memory_region(handles["input1_data"], [B])
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]

    for use_shared_memory in (True, False, True):
        b = B if use_shared_memory else B * 2
        if use_shared_memory:
            inputs[0].set_shared_memory("input0_data", SIZE)
            inputs[1].set_shared_memory("input1_data", SIZE)
            outputs[0].set_shared_memory("output0_data", SIZE)
            outputs[1].set_shared_memory("output1_data", SIZE)
        else:
            inputs[0].set_data_from_numpy(A)
            inputs[1].set_data_from_numpy(b)
            outputs[0].unset_shared_memory()
            outputs[1].unset_shared_memory()
        results = client.infer("simple", inputs, outputs=outputs)
        for name, region in (("OUTPUT0", "output0_data"), ("OUTPUT1", "output1_data")):
            if use_shared_memory:
                output = results.get_output(name)
                if protocol == "grpc":
                    datatype, shape = output.datatype, output.shape
                else:
                    datatype, shape = output["datatype"], output["shape"]
                got = shm.get_contents_as_numpy(handles[region], triton_to_np_dtype(datatype), shape)
            else:
                got = results.as_numpy(name)
            np.testing.assert_array_equal(got, expected(v2, A, b)[name])


def test_an_input_in_shared_memory_beside_one_in_the_request_over_grpc(grpc, v2, regions):
    """tritonclient sends no raw entry for an input in shared memory: the others' entries are theirs, in order."""
    handle, key = regions.create("in0", SIZE)
    shm.set_shared_memory_region(handle, [A])
    grpc.register_system_shared_memory("in0", key, SIZE)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("in0", SIZE)
    inputs[1].set_data_from_numpy(B * 3)
    results = grpc.infer("simple", inputs)
    for name, want in expected(v2, A, B * 3).items():
        np.testing.assert_array_equal(results.as_numpy(name), want)


def test_strings_in_and_out_of_shared_memory(http, v2, regions):
    """BYTES travel as tritonclient's serialize_byte_tensor writes them: each element after its 4-byte length."""
    texts = np.array([b"cat", "\u00e9t\u00e9".encode(), b""], dtype=np.object_)
    serialized = serialize_byte_tensor(texts)  # as simple_http_shm_string_client.py puts strings in a region
    size = serialized_byte_size(serialized)
    in_handle, in_key = regions.create("texts_in", size)
    out_handle, out_key = regions.create("texts_out", 64)
    shm.set_shared_memory_region(in_handle, [serialized])
    http.register_system_shared_memory("texts_in", in_key, size)
    http.register_system_shared_memory("texts_out", out_key, 64)
    item = httpclient.InferInput("x", [3], "BYTES")
    item.set_shared_memory("texts_in", size)
    output = httpclient.InferRequestedOutput("out")
    output.set_shared_memory("texts_out", 64)

    results = http.infer("echo", [item], outputs=[output])

    written = results.get_output("out")["parameters"]["shared_memory_byte_size"]
    assert written == size
    got = shm.get_contents_as_numpy(out_handle, np.object_, [3])
    assert [bytes(v) for v in got] == [bytes(v) for v in texts]


# --- status, unregister, and each client's own regions -------------------------------------------------------


def test_status_of_one_region_and_of_one_not_registered(http, regions):
    _, key = regions.create("one", 100)
    http.register_system_shared_memory("one", key, 36, offset=64)
    assert http.get_system_shared_memory_status("one") == [{"name": "one", "key": key, "offset": 64, "byte_size": 36}]
    error = refused(lambda: http.get_system_shared_memory_status("two"))
    assert (error.status(), error.message()) == ("404", "Unable to find system shared memory region: 'two'")
    http.unregister_system_shared_memory("two")  # nothing to do is no error, as in Triton
    http.unregister_system_shared_memory("one")
    assert http.get_system_shared_memory_status() == []


def test_a_region_at_an_offset_off_the_page_boundary_is_read_and_written_there(http, v2, regions):
    handle, key = regions.create("paged", 8192)
    shm.set_shared_memory_region(handle, [A], offset=5000)
    shm.set_shared_memory_region(handle, [B], offset=5000 + SIZE)
    http.register_system_shared_memory("paged", key, 3 * SIZE, offset=5000)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("paged", SIZE, offset=2 * SIZE)
    http.infer("simple", http_inputs("paged"), outputs=[output])
    got = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=5000 + 2 * SIZE)
    np.testing.assert_array_equal(got, expected(v2)["OUTPUT0"])


def test_two_clients_same_named_regions_do_not_meet(v2, settings, django_db_blocker, regions):
    """Regions are the token's: each client infers from its own 'input', and lists only its own."""
    settings.INFERENCE_PUBLIC = False
    tokens = [make_token(django_db_blocker)[1] for _ in range(2)]
    clients = [httpclient.InferenceServerClient(v2.url) for _ in tokens]
    try:
        for index, (client, token) in enumerate(zip(clients, tokens, strict=True)):
            handle, key = regions.create(f"input{index}", SIZE * 2)
            shm.set_shared_memory_region(handle, [A * (index + 1), B])
            client.register_system_shared_memory("input", key, SIZE * 2, headers=bearer(token))
        for index, (client, token) in enumerate(zip(clients, tokens, strict=True)):
            results = client.infer("simple", http_inputs("input"), headers=bearer(token))
            np.testing.assert_array_equal(results.as_numpy("OUTPUT0"), A * (index + 1) + B)
            status = client.get_system_shared_memory_status(headers=bearer(token))
            assert status == [{"name": "input", "key": regions.key(f"input{index}"), "offset": 0, "byte_size": 128}]
        assert v2.request("GET", "/v2/systemsharedmemory/status").status == 401  # no token, no regions
        for client, token in zip(clients, tokens, strict=True):
            client.unregister_system_shared_memory(headers=bearer(token))
    finally:
        for client in clients:
            client.close()


def test_a_token_without_the_inference_role_is_refused(v2, settings):
    settings.INFERENCE_PUBLIC = False
    response = v2.request("GET", "/v2/systemsharedmemory/status", headers=bearer(v2.viewer_token))
    assert response.status == 403


# --- refusals when registering ------------------------------------------------------------------------------


def test_a_register_request_with_only_its_required_fields_maps_the_region_from_offset_0(v2, http, regions):
    _, key = regions.create("bare", SIZE)
    body = json.dumps({"key": key, "byte_size": SIZE}).encode()  # no offset: it is optional
    response = v2.request("POST", "/v2/systemsharedmemory/region/bare/register", body)
    assert (response.status, response.body) == (200, b"")
    status = http.get_system_shared_memory_status("bare")
    assert status == [{"name": "bare", "key": key, "offset": 0, "byte_size": SIZE}]
    http.unregister_system_shared_memory("bare")


def test_registering_a_name_twice_is_refused(http, grpc, regions):
    _, key = regions.create("twice", SIZE)
    http.register_system_shared_memory("twice", key, SIZE)
    error = refused(lambda: http.register_system_shared_memory("twice", key, SIZE))
    message = "shared memory region 'twice' already in manager: unregister it first"
    assert (error.status(), error.message()) == ("400", message)
    error = refused(lambda: grpc.register_system_shared_memory("twice", key, SIZE))
    assert (error.status(), error.message()) == ("StatusCode.ALREADY_EXISTS", message)


def test_at_most_max_regions_per_client(http, grpc, settings, regions):
    settings.SHARED_MEMORY_MAX_REGIONS = 2
    _, key = regions.create("many", SIZE)
    http.register_system_shared_memory("first", key, SIZE)
    http.register_system_shared_memory("second", key, SIZE)
    message = (
        "this client has 2 shared memory regions registered, the most allowed "
        "(MODELYARD_SHARED_MEMORY_MAX_REGIONS=2); unregister one first"
    )
    error = refused(lambda: http.register_system_shared_memory("third", key, SIZE))
    assert (error.status(), error.message()) == ("400", message)
    error = refused(lambda: grpc.register_system_shared_memory("third", key, SIZE))
    assert (error.status(), error.message()) == ("StatusCode.RESOURCE_EXHAUSTED", message)
    http.unregister_system_shared_memory("first")
    http.register_system_shared_memory("third", key, SIZE)


def test_at_most_max_bytes_per_client(http, settings, regions):
    settings.SHARED_MEMORY_MAX_BYTES = 100
    _, key = regions.create("bytes", SIZE)
    http.register_system_shared_memory("first", key, SIZE)
    error = refused(lambda: http.register_system_shared_memory("second", key, 40))
    assert (error.status(), error.message()) == (
        "400",
        "registering 40 bytes would map 104 bytes for this client, more than MODELYARD_SHARED_MEMORY_MAX_BYTES=100",
    )
    http.register_system_shared_memory("second", key, 36)


@pytest.mark.parametrize("key", ["/../etc/passwd", "noslash", "/", "/..", "/a/b"])
def test_a_key_that_is_not_a_posix_shared_memory_name_is_refused(http, grpc, key):
    message = (
        f"shared memory key {key!r} is not a POSIX shared memory name: '/' followed by 1 to 255 characters, none "
        "of them '/' (such as '/input_simple')"
    )
    error = refused(lambda: http.register_system_shared_memory("bad", key, SIZE))
    assert (error.status(), error.message()) == ("400", message)
    error = refused(lambda: grpc.register_system_shared_memory("bad", key, SIZE))
    assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    assert http.get_system_shared_memory_status() == []


def test_a_key_that_does_not_exist_is_refused(http, regions):
    key = regions.key("never")
    error = refused(lambda: http.register_system_shared_memory("never", key, SIZE))
    assert (error.status(), error.message()) == (
        "400",
        f"shared memory key '{key}' does not exist: create the object first "
        "(tritonclient.utils.shared_memory.create_shared_memory_region), on the server's host",
    )


@pytest.fixture
def shm_path(regions: Regions) -> Iterator[Callable[[str], Path]]:
    """Paths in /dev/shm under this test's keys, removed afterwards whatever they became."""
    made: list[Path] = []

    def path(name: str) -> Path:
        made.append(Path("/dev/shm") / regions.key(name)[1:])
        return made[-1]

    yield path
    for path_made in made:
        if path_made.is_dir() and not path_made.is_symlink():
            path_made.rmdir()
        else:
            path_made.unlink(missing_ok=True)


def test_a_symbolic_link_is_refused(http, regions, shm_path):
    _, target = regions.create("target", SIZE)
    link = shm_path("link")
    link.symlink_to(Path("/dev/shm") / target[1:])
    key = regions.key("link")
    error = refused(lambda: http.register_system_shared_memory("link", key, SIZE))
    assert (error.status(), error.message()) == (
        "400",
        f"shared memory key '{key}' is a symbolic link, which the server does not follow",
    )


def test_what_is_not_a_regular_file_is_refused(http, regions, shm_path):
    os.mkfifo(shm_path("fifo"))
    shm_path("folder").mkdir()
    for name in ("fifo", "folder"):
        key = regions.key(name)
        error = refused(partial(http.register_system_shared_memory, "odd", key, SIZE))
        assert (error.status(), error.message()) == ("400", f"shared memory key '{key}' is not a regular file")


def test_an_object_the_server_may_not_read_and_write_is_refused(http, regions, shm_path):
    """Mode 000: refused by open() for any user but root, and by the permission bits for root too, which the
    server checks itself so that root's privilege never lends a client another program's memory."""
    locked = shm_path("locked")
    locked.write_bytes(b"\0" * SIZE)
    locked.chmod(0)
    key = regions.key("locked")
    error = refused(lambda: http.register_system_shared_memory("locked", key, SIZE))
    assert (error.status(), error.message()) == (
        "400",
        f"shared memory key '{key}': permission denied: the server's user may not read and write it (make the "
        "object readable and writable by that user)",
    )
    locked.chmod(0o400)  # read-only is not enough: outputs are written
    assert refused(lambda: http.register_system_shared_memory("locked", key, SIZE)).message() == error.message()


def test_an_object_smaller_than_the_region_is_refused(http, regions):
    _, key = regions.create("small", SIZE)
    error = refused(lambda: http.register_system_shared_memory("small", key, SIZE, offset=8))
    assert (error.status(), error.message()) == (
        "400",
        f"shared memory key '{key}' holds 64 bytes, fewer than the region's offset 8 + byte_size 64",
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"[]",
            'the register request must be a JSON object such as {"key": "/input_simple", "offset": 0, "byte_size": 64}',
        ),
        (b'{"key": "/k", "byte_size": 0}', "byte_size must be a positive integer, got 0"),
        (b'{"key": "/k", "byte_size": 8, "offset": -1}', "offset must be a non-negative integer, got -1"),
    ],
)
def test_a_malformed_register_request_is_refused(v2, body, message):
    response = v2.request("POST", "/v2/systemsharedmemory/region/r/register", body)
    assert (response.status, response.json()) == (400, {"error": message})


# --- refusals when inferring --------------------------------------------------------------------------------


def test_an_output_larger_than_its_place_in_the_region_is_refused(http, grpc, regions):
    in_handle, in_key = regions.create("ins", SIZE * 2)
    shm.set_shared_memory_region(in_handle, [A, B])
    http.register_system_shared_memory("ins", in_key, SIZE * 2)
    _, out_key = regions.create("outs", SIZE)
    http.register_system_shared_memory("outs", out_key, SIZE)
    message = "output 'OUTPUT0' needs 64 bytes, more than its shared_memory_byte_size 32 in shared memory region 'outs'"
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("outs", 32)
    error = refused(lambda: http.infer("simple", http_inputs("ins"), outputs=[output]))
    assert (error.status(), error.message()) == ("400", message)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("ins", SIZE)
    inputs[1].set_shared_memory("ins", SIZE, offset=SIZE)
    grpc_output = grpcclient.InferRequestedOutput("OUTPUT0")
    grpc_output.set_shared_memory("outs", 32)
    error = refused(lambda: grpc.infer("simple", inputs, outputs=[grpc_output]))
    assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT", message)

    output.set_shared_memory("outs", SIZE, offset=8)  # past the region's end: refused before the model runs
    error = refused(lambda: http.infer("simple", http_inputs("ins"), outputs=[output]))
    assert (error.status(), error.message()) == (
        "400",
        "output 'OUTPUT0': shared_memory_offset 8 + shared_memory_byte_size 64 runs past the end of shared memory "
        "region 'outs' (64 bytes)",
    )


def test_an_input_whose_byte_size_does_not_fit_its_shape_is_refused(http, regions):
    handle, key = regions.create("ins", SIZE * 2)
    shm.set_shared_memory_region(handle, [A, B])
    http.register_system_shared_memory("ins", key, SIZE * 2)
    inputs = http_inputs("ins")
    inputs[1].set_shared_memory("ins", 60, offset=SIZE)
    error = refused(lambda: http.infer("simple", inputs))
    assert (error.status(), error.message()) == (
        "400",
        "input 'INPUT1': shape [1, 16] of INT32 needs 64 bytes, got shared_memory_byte_size 60",
    )


def test_an_input_naming_a_region_not_registered_is_refused(http):
    error = refused(lambda: http.infer("simple", http_inputs("nowhere")))
    assert (error.status(), error.message()) == (
        "400",
        "input 'INPUT0': no shared memory region 'nowhere' is registered (for this client)",
    )


# --- turned off, and CUDA -----------------------------------------------------------------------------------


def test_turned_off_every_call_says_so(http, grpc, v2, settings, regions):
    settings.SHARED_MEMORY = False
    assert "system_shared_memory" not in http.get_server_metadata()["extensions"]
    for call in (
        http.get_system_shared_memory_status,
        lambda: http.register_system_shared_memory("r", "/k", SIZE),
        http.unregister_system_shared_memory,
        lambda: http.infer("simple", http_inputs("r")),
    ):
        error = refused(call)
        assert (error.status(), error.message()) == ("501", SHARED_MEMORY_OFF)
    error = refused(grpc.get_system_shared_memory_status)
    assert (error.status(), error.message()) == ("StatusCode.UNIMPLEMENTED", SHARED_MEMORY_OFF)
    settings.SHARED_MEMORY = True
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]


def test_cuda_shared_memory_is_not_served_but_has_nothing_to_unregister(http, grpc):
    assert http.get_cuda_shared_memory_status() == []
    http.unregister_cuda_shared_memory()  # what Triton's examples do first
    error = refused(lambda: http.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, SIZE))
    assert (error.status(), error.message()) == ("501", CUDA_SHARED_MEMORY)
    assert not grpc.get_cuda_shared_memory_status().regions
    grpc.unregister_cuda_shared_memory()
    error = refused(lambda: grpc.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, SIZE))
    assert (error.status(), error.message()) == ("StatusCode.UNIMPLEMENTED", CUDA_SHARED_MEMORY)
