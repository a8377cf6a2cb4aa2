"""Hostile models: validation stops at its time and memory limits, and the serving process never grows.

Validation runs in a child process (``onnxkit/sandbox.py``). Each test sets a small limit
and uploads a tiny model that would loop or allocate without one; the version must end ``failed``
with an error naming the limit, while the upload itself answers 201 and keeps its files.

The upload tests that reach validation run with ``transaction=True``: the upload's on-commit
callback then runs inside the request, as it does in the embedded server, so whatever validation
raises would reach the response.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from onnxkit.validation import validate_in_child
from registry.models import AuditEvent, ModelVersion, VersionStatus
from storage import get_storage
from tests.support.onnx_models import (
    add_model_bytes,
    allocation_model,
    endless_loop_model,
    external_data_model,
    huge_input_model,
    nested_if_model,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.real_validation]  # validation itself: no memo

MEMORY = "MODELYARD_VALIDATION_MEMORY_MB"
TIMEOUT = "MODELYARD_VALIDATION_TIMEOUT_SECONDS"


def upload(person, model: str, files: list[tuple[str, bytes]]) -> ModelVersion:
    response = person.upload(model, files)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(model__name=model, version=response.json()["version"])
    assert response.json()["status"] == version.status  # validated inline in the embedded default
    return version


def stored_bytes(version: ModelVersion) -> dict[str, bytes]:
    storage = get_storage()
    files = {}
    for item in version.files.all():
        with storage.open(item.storage_key) as stream:
            files[item.name] = stream.read()
    return files


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def test_a_loop_that_never_ends_fails_naming_the_time_limit(owner, registered, settings):
    # Short, yet long enough for the child to start and load the model on a busy machine: the error names the step.
    settings.VALIDATION_TIMEOUT_SECONDS = 6

    version = upload(owner, registered, [("loop.onnx", endless_loop_model().SerializeToString())])

    assert version.status == VersionStatus.FAILED
    assert version.errors == [f"validation stopped after 6 s ({TIMEOUT}) while running the model once in ONNX Runtime"]
    assert version.validation_attempts == 1
    [event] = AuditEvent.objects.filter(action="version.validate")
    assert event.after == {"status": "failed", "errors": version.errors}


def test_an_allocation_bomb_fails_naming_the_memory_limit(owner, registered, settings):
    settings.VALIDATION_MEMORY_MB = 512

    # 183 bytes asking for 2**27 floats twice over: 1 GiB.
    version = upload(owner, registered, [("bomb.onnx", allocation_model(2**27).SerializeToString())])

    assert version.status == VersionStatus.FAILED
    assert version.errors == [
        f"validation stopped: it needed more than 512 MB of memory ({MEMORY}) "
        "while running the model once in ONNX Runtime"
    ]


def test_nested_ifs_fail_naming_the_memory_limit(owner, registered, settings):
    settings.VALIDATION_MEMORY_MB = 256

    # 12 levels (0.5 MB) need about 400 MB to check and load; the 20 levels took 23 GB.
    version = upload(owner, registered, [("nested.onnx", nested_if_model(12).SerializeToString())])

    assert version.status == VersionStatus.FAILED
    assert len(version.errors) == 1
    assert version.errors[0].startswith(f"validation stopped: it needed more than 256 MB of memory ({MEMORY}) while ")


def test_the_small_memory_limit_still_validates_an_ordinary_model(owner, registered, settings):
    settings.VALIDATION_MEMORY_MB = 256

    version = upload(owner, registered, [("add.onnx", add_model_bytes())])

    assert version.status == VersionStatus.READY, version.errors


def test_the_serving_process_does_not_grow_when_a_model_allocates(owner, registered, settings):
    settings.VALIDATION_MEMORY_MB = 4096
    model = allocation_model(2**26).SerializeToString()  # 256 MiB filled, 256 MiB more for the sum
    Path("/proc/self/clear_refs").write_text("5")  # resets this process's peak RSS (VmHWM) to its current RSS
    before = _status_kb("VmRSS")

    version = upload(owner, registered, [("big.onnx", model)])

    grown_mb = (_status_kb("VmHWM") - before) / 1024
    assert version.status == VersionStatus.READY, version.errors
    assert version.signature["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2**26]}]
    assert grown_mb < 100, f"the test process grew by {grown_mb:.0f} MB while validating"


def test_a_fixed_input_shape_too_large_to_allocate_fails_readably(owner, registered):
    version = upload(owner, registered, [("huge.onnx", huge_input_model().SerializeToString())])

    assert version.status == VersionStatus.FAILED
    assert version.errors == [
        "the test run needs 4,194,304.0 EiB for its synthetic inputs (input 'x' has the shape "
        f"[1099511627776, 1099511627776]), more than the 4096 MB validation may use ({MEMORY})"
    ]


def test_a_nul_byte_in_an_external_data_location_fails_readably_and_keeps_the_files(owner, registered, tmp_path):
    path = external_data_model(tmp_path / "m", location="weights\x00.bin")
    files = [("model.onnx", path.read_bytes()), ("weights.bin", (tmp_path / "m" / "weights.bin").read_bytes())]

    response = owner.upload(registered, files)

    assert response.status_code == 201, response.content
    assert response.json()["status"] == "failed"
    assert response.json()["errors"] == [
        "tensor 'w' stores its data in 'weights\\x00.bin', a name with control characters; "
        "no uploaded file can have that name"
    ]
    version = ModelVersion.objects.get()
    assert stored_bytes(version) == dict(files)


def test_nul_bytes_in_model_names_fail_readably(owner, registered):
    # PostgreSQL cannot store a NUL byte in JSON; such names must not make recording the outcome fail.
    x = helper.make_tensor_value_info("x\x00", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x\x00"], ["y"])], "nul", [x], [y])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    model.producer_name = "evil\x00tool"

    version = upload(owner, registered, [("nul.onnx", model.SerializeToString())])

    assert version.status == VersionStatus.FAILED
    assert version.errors == ["input 'x\\x00' has a NUL byte in its name"]
    assert version.producer == {"name": "evil\\x00tool", "version": ""}


def test_a_memory_limit_too_small_to_start_validation_names_the_limit(tmp_path):
    path = tmp_path / "add.onnx"
    path.write_bytes(add_model_bytes())

    result = validate_in_child(path, {"add.onnx"}, timeout_seconds=30, memory_mb=64)

    assert result.errors == [f"validation stopped: it needed more than 64 MB of memory ({MEMORY}) while starting"]
