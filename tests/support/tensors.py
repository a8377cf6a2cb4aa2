"""Tensors for the client tests: values that use each datatype's range, and comparing what came back."""

from __future__ import annotations

import numpy as np
from tritonclient.utils import triton_to_np_dtype


def as_bytes(array: np.ndarray) -> np.ndarray:
    """ORT returns string tensors as ``str``; binary BYTES outputs arrive as ``bytes``."""
    if array.dtype != np.object_:
        return array
    out = np.empty(array.shape, dtype=object)
    out.flat[:] = [v.encode() if isinstance(v, str) else v for v in array.flat]
    return out


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(as_bytes(actual), as_bytes(expected))


def sample(datatype: str, rows: int, seed: int = 0) -> np.ndarray:
    """Values that use the type's range: negatives, large unsigned numbers, fractions, non-ASCII text."""
    rng = np.random.default_rng(seed)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=(rows, 3)).astype(bool)
    if datatype == "BYTES":
        words = ["", "a", "naïve", "日本語", "emoji 🚀", "tab\tand\nnewline", "x" * 300, "0"]
        out = np.empty((rows, 3), dtype=object)
        out.flat[:] = [words[int(i)] for i in rng.integers(0, len(words), size=rows * 3)]
        return out
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind == "f":
        return (rng.standard_normal((rows, 3)) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(rows, 3), dtype=dtype, endpoint=True)
