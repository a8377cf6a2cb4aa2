"""Tensor datatypes: ONNX element types, Open Inference Protocol names and numpy dtypes, in one place.

It imports numpy alone, not ``onnx``: the inference path needs these tables, and importing ``onnx``
(``ml_dtypes``' extension above all) costs an inference process more than a second of its cold start
on a slow CPU. The element type numbers are ``onnx.TensorProto.DataType``'s, fixed by the ONNX
specification (``tests/onnxkit/test_datatypes.py`` compares them with the installed ``onnx``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# ``onnx.TensorProto.DataType``: the element types a served tensor may have, by their ONNX names.
ONNX_ELEMENT_TYPES: dict[str, int] = {
    "FLOAT": 1,
    "UINT8": 2,
    "INT8": 3,
    "UINT16": 4,
    "INT16": 5,
    "INT32": 6,
    "INT64": 7,
    "STRING": 8,
    "BOOL": 9,
    "FLOAT16": 10,
    "DOUBLE": 11,
    "UINT32": 12,
    "UINT64": 13,
    "BFLOAT16": 16,
}

# Open Inference Protocol datatype names for ONNX tensor element types.
ONNX_TO_PROTOCOL: dict[int, str] = {
    ONNX_ELEMENT_TYPES["BOOL"]: "BOOL",
    ONNX_ELEMENT_TYPES["UINT8"]: "UINT8",
    ONNX_ELEMENT_TYPES["UINT16"]: "UINT16",
    ONNX_ELEMENT_TYPES["UINT32"]: "UINT32",
    ONNX_ELEMENT_TYPES["UINT64"]: "UINT64",
    ONNX_ELEMENT_TYPES["INT8"]: "INT8",
    ONNX_ELEMENT_TYPES["INT16"]: "INT16",
    ONNX_ELEMENT_TYPES["INT32"]: "INT32",
    ONNX_ELEMENT_TYPES["INT64"]: "INT64",
    ONNX_ELEMENT_TYPES["FLOAT16"]: "FP16",
    ONNX_ELEMENT_TYPES["FLOAT"]: "FP32",
    ONNX_ELEMENT_TYPES["DOUBLE"]: "FP64",
    ONNX_ELEMENT_TYPES["BFLOAT16"]: "BF16",
    ONNX_ELEMENT_TYPES["STRING"]: "BYTES",
}

# numpy dtypes for the protocol datatypes that numpy and ONNX Runtime exchange (BF16 has none).
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


def numpy_of_ort_type(ort_type: str) -> Any | None:
    """The numpy dtype for an ONNX Runtime type string such as ``tensor(float)``; None if it has none."""
    if not (ort_type.startswith("tensor(") and ort_type.endswith(")")):
        return None
    element = ONNX_ELEMENT_TYPES.get(ort_type[len("tensor(") : -1].upper())
    if element is None:
        return None
    return NUMPY_OF.get(ONNX_TO_PROTOCOL[element])


def random_feeds(session: Any, *, batch: int, other: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for an ONNX Runtime ``session``, for measuring it or comparing two of its variants.

    A dynamic first dimension becomes ``batch`` and any other dynamic one ``other``. Floats are
    standard normal (seeded, so two sessions get the same inputs), integers and booleans ones (valid
    wherever token ids, indices or masks are expected), strings ``"a"``. An input of a type numpy
    has no dtype for raises ``TypeError`` naming it.
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        dtype = numpy_of_ort_type(arg.type)
        if dtype is None:
            raise TypeError(f"input '{arg.name}' has type {arg.type}, which cannot be synthesised")
        shape = [
            dim if isinstance(dim, int) and dim >= 0 else (batch if index == 0 else other)
            for index, dim in enumerate(arg.shape)
        ]
        if dtype is np.object_:
            feeds[arg.name] = np.full(shape, "a", dtype=object)
        elif np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[arg.name] = np.ones(shape, dtype=dtype)
    return feeds


def printable(text: str) -> str:
    """``text`` with control characters escaped, so a hostile name reads plainly (and PostgreSQL stores it)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else f"\\x{ord(char):02x}" for char in text)


def synthetic_inputs(session: Any) -> dict[str, np.ndarray]:
    """Inputs shaped from the signature (dynamic dimensions become 1), filled with ones."""
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        dtype = numpy_of_ort_type(arg.type)
        if dtype is None:
            raise TypeError(f"input '{printable(arg.name)}' has type {arg.type}, which validation cannot synthesise")
        shape = [dim if isinstance(dim, int) and dim >= 0 else 1 for dim in arg.shape]
        if dtype is np.object_:
            feeds[arg.name] = np.full(shape, "a", dtype=object)
        else:
            feeds[arg.name] = np.ones(shape, dtype=dtype)
    return feeds
