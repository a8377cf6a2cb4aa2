"""The ``/v2`` wire format on the client's side: numpy arrays in and out as Triton binary tensors.

A request is a JSON header (inputs with their datatype and shape, and ``binary_data_size``)
followed by each input's raw bytes; its length goes in ``Inference-Header-Content-Length``. The
server answers the same way when every output is asked for as binary. BYTES elements are each
a 4-byte little-endian length and the bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"

# Open Inference Protocol datatypes and their numpy dtypes (BYTES are object arrays of bytes or str).
NUMPY_OF: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
_DATATYPE_OF = {np.dtype(v).str: k for k, v in NUMPY_OF.items() if v is not np.object_}


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    found = _DATATYPE_OF.get(array.dtype.newbyteorder("<").str if array.dtype.byteorder == ">" else array.dtype.str)
    if found is None:
        raise TypeError(f"numpy dtype {array.dtype} has no Open Inference Protocol datatype")
    return found


def _bytes_elements(array: np.ndarray) -> bytes:
    out = bytearray()
    for value in array.reshape(-1):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        out += struct.pack("<I", len(raw)) + raw
    return bytes(out)


def _raw(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return _bytes_elements(array)
    return np.ascontiguousarray(array, dtype=np.dtype(NUMPY_OF[datatype]).newbyteorder("<")).tobytes()


def encode_request(inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> tuple[bytes, int]:
    """The body of an infer request and the length of its JSON header; every output is asked for as binary."""
    header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
    blobs = []
    for name, value in inputs.items():
        array = np.asarray(value)
        datatype = datatype_of(array)
        blob = _raw(array, datatype)
        header["inputs"].append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    if outputs:
        header["outputs"] = [{"name": name, "parameters": {"binary_data": True}} for name in outputs]
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


def _from_bytes_elements(raw: bytes, count: int) -> np.ndarray:
    values: list[bytes] = []
    offset = 0
    while offset < len(raw) and len(values) < count:
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        values.append(raw[offset : offset + length])
        offset += length
    return np.array(values, dtype=np.object_)


def decode_response(body: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    """Each output of an infer answer as an array, by name (JSON ``data`` or binary, whichever the server sent)."""
    split = int(header_length) if header_length else len(body)
    header = json.loads(body[:split])
    offset = split
    outputs: dict[str, np.ndarray] = {}
    for item in header.get("outputs", []):
        datatype, shape = item["datatype"], [int(d) for d in item["shape"]]
        count = int(np.prod(shape)) if shape else 1
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = body[offset : offset + int(size)]
            offset += int(size)
            if datatype == "BYTES":
                array = _from_bytes_elements(raw, count)
            else:
                array = np.frombuffer(raw, dtype=np.dtype(NUMPY_OF[datatype]).newbyteorder("<")).copy()
        elif datatype == "BYTES":
            array = np.array([str(v).encode() for v in item["data"]], dtype=np.object_)
        else:
            array = np.array(item["data"], dtype=NUMPY_OF[datatype])
        outputs[item["name"]] = array.reshape(shape)
    return outputs
