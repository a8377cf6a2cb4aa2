"""Regenerate the gRPC modules of ``inference/grpc/`` from ``inference/grpc/grpc_service.proto`` (needs grpcio-tools).

    .venv/bin/python scripts/generate_grpc.py

Writes ``grpc_service_pb2.py`` (messages), ``grpc_service_pb2.pyi`` (their types, for mypy) and
``grpc_service_pb2_grpc.py`` (the servicer and the stub), and commits nothing itself: commit them
with the .proto. One change is made to protoc's output: the messages are built in a descriptor pool
of their own instead of protobuf's default one, because ``tritonclient.grpc`` registers Triton's own
files, which declare the same ``inference.*`` names, in the default pool, and a process that imports
both (the tests do; so may a user's) would otherwise fail with "duplicate symbol".
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "inference/grpc/grpc_service.proto"
MESSAGES = ROOT / "inference" / "grpc" / "grpc_service_pb2.py"
DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
OWN_POOL = (
    "# A pool of its own: tritonclient.grpc puts Triton's files, with the same names, in the default one.\n"
    "_POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = _POOL.AddSerializedFile("
)


def main() -> int:
    from grpc_tools import protoc

    argv = ["protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--pyi_out={ROOT}", f"--grpc_python_out={ROOT}"]
    if protoc.main([*argv, str(ROOT / PROTO)]) != 0:
        print(f"protoc failed on {PROTO}", file=sys.stderr)
        return 1
    text = MESSAGES.read_text()
    if text.count(DEFAULT_POOL) != 1:
        print(f"{MESSAGES.name}: protoc's output changed; no single '{DEFAULT_POOL}' to replace", file=sys.stderr)
        return 1
    MESSAGES.write_text(text.replace(DEFAULT_POOL, OWN_POOL))
    print(f"generated {MESSAGES.parent.relative_to(ROOT)}/grpc_service_pb2{{.py,.pyi,_grpc.py}} from {PROTO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
