"""The protocol datatype of each output array, as the REST and gRPC answers name it."""

from __future__ import annotations

import numpy as np

from inference import protocol


def test_output_datatypes_by_dtype_and_strings_of_any_length():
    arrays = {
        "FP32": np.zeros(2, np.float32),
        "INT64": np.zeros(2, ">i8"),  # big-endian: the same protocol datatype
        "FP16": np.zeros(2, np.float16),
        "BOOL": np.zeros(2, bool),
        "complex64": np.zeros(2, np.complex64),  # no protocol name: numpy's
    }
    for datatype, array in arrays.items():
        assert (protocol.output_datatype(array), protocol.output_datatype(array)) == (datatype, datatype)
    remembered = len(protocol._DATATYPE_OF_DTYPE)
    for length in range(1, 50):  # every length of string is a dtype of its own; none is remembered
        assert protocol.output_datatype(np.array(["x" * length])) == "BYTES"
        assert protocol.output_datatype(np.array([b"x" * length])) == "BYTES"
    assert protocol.output_datatype(np.array(["x"], dtype=object)) == "BYTES"
    assert len(protocol._DATATYPE_OF_DTYPE) == remembered
