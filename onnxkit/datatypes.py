"""Tensor datatypes: ONNX element types, Open Inference Protocol names and numpy dtypes, in one place."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

# Open Inference Protocol datatype names for ONNX tensor element types.
ONNX_TO_PROTOCOL: dict[int, str] = {
    TensorProto.BOOL: "BOOL",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.FLOAT16: "FP16",
    TensorProto.FLOAT: "FP32",
    TensorProto.DOUBLE: "FP64",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.STRING: "BYTES",
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
    try:
        element = TensorProto.DataType.Value(ort_type[len("tensor(") : -1].upper())
    except ValueError:
        return None
    return NUMPY_OF.get(ONNX_TO_PROTOCOL.get(element, ""))


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
