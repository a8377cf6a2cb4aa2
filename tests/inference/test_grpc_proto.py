"""The .proto, the committed generated modules and tritonclient's own compiled files agree, field by field.

The .proto was written from the published protocol, so this is what makes "tritonclient.grpc works
unchanged" checkable without a server: every message, field number, type and RPC declared here is
the one tritonclient's ``service_pb2`` holds. The committed ``grpc_service_pb2.py`` must also be what
``scripts/generate_grpc.py`` makes of the .proto today, or someone edited one and not the other.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2

from inference.grpc import grpc_service_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
PROTO = "inference/grpc/grpc_service.proto"


def messages(container: Any) -> Iterator[Any]:
    for message in container.message_types_by_name.values():
        yield message
        yield from nested(message)


def nested(message: Any) -> Iterator[Any]:
    for inner in message.nested_types:
        yield inner
        yield from nested(inner)


def field_shape(field: Any) -> tuple[Any, ...]:
    return (
        field.number,
        field.type,
        field.is_repeated,
        field.message_type.full_name if field.message_type else None,
        field.enum_type.full_name if field.enum_type else None,
    )


def test_every_message_and_field_is_tritons():
    theirs = service_pb2.DESCRIPTOR.pool
    ours = list(messages(pb.DESCRIPTOR))
    assert len(ours) > 40
    for message in ours:
        triton = theirs.FindMessageTypeByName(message.full_name)
        for field in message.fields:
            assert field.name in triton.fields_by_name, f"{message.full_name}.{field.name} is not Triton's"
            assert field_shape(field) == field_shape(triton.fields_by_name[field.name]), (
                f"{message.full_name}.{field.name}"
            )
        for enum in message.enum_types:
            triton_enum = theirs.FindEnumTypeByName(enum.full_name)
            assert {v.name: v.number for v in enum.values}.items() <= {
                v.name: v.number for v in triton_enum.values
            }.items()
    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        assert {v.name: v.number for v in enum.values} == {
            v.name: v.number for v in theirs.FindEnumTypeByName(enum.full_name).values
        }


def test_every_rpc_is_tritons_and_the_ones_served_are_all_there():
    ours = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = service_pb2.DESCRIPTOR.pool.FindServiceByName("inference.GRPCInferenceService")
    assert ours.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        triton = theirs.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name) == (
            triton.input_type.full_name,
            triton.output_type.full_name,
        )
        assert (method.client_streaming, method.server_streaming) == (triton.client_streaming, triton.server_streaming)
    assert sorted(m.name for m in ours.methods) == sorted(
        [
            "ServerLive",
            "ServerReady",
            "ModelReady",
            "ServerMetadata",
            "ModelMetadata",
            "ModelConfig",
            "ModelInfer",
            "ModelStreamInfer",
            "ModelStatistics",
            "RepositoryIndex",
            "RepositoryModelLoad",
            "RepositoryModelUnload",
            "SystemSharedMemoryStatus",
            "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister",
            "CudaSharedMemoryStatus",
            "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister",
        ]
    )


def test_the_committed_modules_are_generated_from_the_proto(tmp_path: Path):
    """protoc's descriptor of the .proto today equals the one the committed grpc_service_pb2.py carries."""
    out = tmp_path / "descriptor.pb"
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"--descriptor_set_out={out}", PROTO],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    [compiled] = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    committed = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(committed)
    assert without_json_names(committed) == without_json_names(compiled), (
        "inference/grpc/grpc_service_pb2.py is stale: run scripts/generate_grpc.py"
    )
    # The one change scripts/generate_grpc.py makes to protoc's output.
    assert "_POOL = _descriptor_pool.DescriptorPool()" in (ROOT / "inference/grpc/grpc_service_pb2.py").read_text()


def without_json_names(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """protoc records each field's JSON name, which CopyToProto leaves out; neither is on the wire."""
    file = descriptor_pb2.FileDescriptorProto.FromString(file.SerializeToString())

    def clear(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            field.ClearField("json_name")
        for inner in message.nested_type:
            clear(inner)

    for message in file.message_type:
        clear(message)
    return file
