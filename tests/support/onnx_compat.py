"""ONNX models for the protocol compatibility tests, built with onnx.helper (IR version 10, opset 17)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10
OPSET = 17

# Every Open Inference Protocol datatype that ONNX Runtime supports, with its ONNX element type.
DATATYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, ir_version=IR, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelyard-compat"
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def all_datatypes_model(leave_out: tuple[str, ...] = ()) -> onnx.ModelProto:
    """One input ``in_<type>`` and one output ``out_<type>`` of shape [N, 3] per datatype (but those left out).

    Each row is reversed (a negative-step Slice), so every output differs from its input; numbers
    are then doubled (``Add(r, r)``, wrapping like the integer type does), booleans negated, and
    strings passed through reversed.
    """
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "starts"),
        numpy_helper.from_array(np.array([-(2**62)], np.int64), "ends"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], np.int64), "steps"),
    ]
    nodes, inputs, outputs = [], [], []
    for datatype, elem in DATATYPES.items():
        if datatype in leave_out:
            continue
        name = datatype.lower()
        inputs.append(helper.make_tensor_value_info(f"in_{name}", elem, ["N", 3]))
        outputs.append(helper.make_tensor_value_info(f"out_{name}", elem, ["N", 3]))
        reversed_ = f"reversed_{name}"
        nodes.append(helper.make_node("Slice", [f"in_{name}", "starts", "ends", "axes", "steps"], [reversed_]))
        if datatype == "BOOL":
            nodes.append(helper.make_node("Not", [reversed_], [f"out_{name}"]))
        elif datatype == "BYTES":
            nodes.append(helper.make_node("Identity", [reversed_], [f"out_{name}"]))
        else:
            nodes.append(helper.make_node("Add", [reversed_, reversed_], [f"out_{name}"]))
    return _model(helper.make_graph(nodes, "all_datatypes", inputs, outputs, inits))


def multi_io_dynamic_model() -> onnx.ModelProto:
    """Three inputs and four outputs with dynamic dimensions; batches on N.

    a FP32 [N, M], b INT64 [N, 2], text BYTES [N]  ->
    a_plus_one FP32 [N, M] = a + 1, a_positive BOOL [N, M] = a > 0,
    b_sum INT64 [N, 1] = sum of b's row, text_out BYTES [N] = text.
    """
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", "M"])
    b = helper.make_tensor_value_info("b", TensorProto.INT64, ["N", 2])
    text = helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])
    outputs = [
        helper.make_tensor_value_info("a_plus_one", TensorProto.FLOAT, ["N", "M"]),
        helper.make_tensor_value_info("a_positive", TensorProto.BOOL, ["N", "M"]),
        helper.make_tensor_value_info("b_sum", TensorProto.INT64, ["N", 1]),
        helper.make_tensor_value_info("text_out", TensorProto.STRING, ["N"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.float32), "one"),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Add", ["a", "one"], ["a_plus_one"]),
        helper.make_node("Greater", ["a", "zero"], ["a_positive"]),
        helper.make_node("ReduceSum", ["b", "axis1"], ["b_sum"], keepdims=1),
        helper.make_node("Identity", ["text"], ["text_out"]),
    ]
    return _model(helper.make_graph(nodes, "multi_io_dynamic", [a, b, text], outputs, inits))


def add_model(bias: float, rows: int | str = "N") -> onnx.ModelProto:
    """y = x + bias, x FP32 [N, 4] (or [rows, 4]: every dimension fixed)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 4])
    b = numpy_helper.from_array(np.full([4], bias, dtype=np.float32), "b")
    return _model(helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "add", [x], [y], [b]))


def simple_model() -> onnx.ModelProto:
    """Triton's ``simple``, of its example clients: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16]) for name in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16]) for name in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    return _model(helper.make_graph(nodes, "simple", inputs, outputs))


def fixed_shape_model() -> onnx.ModelProto:
    """No batch dimension: s = a + 1 (INT64 [2, 3]) and t = Cast(b) (BOOL [n] -> FP32 [n])."""
    a = helper.make_tensor_value_info("a", TensorProto.INT64, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.BOOL, ["n"])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2, 3])
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n"])
    one = numpy_helper.from_array(np.array(1, dtype=np.int64), "one")
    nodes = [helper.make_node("Add", ["a", "one"], ["s"]), helper.make_node("Cast", ["b"], ["t"], to=TensorProto.FLOAT)]
    return _model(helper.make_graph(nodes, "fixed", [a, b], [s, t], [one]))


def identity_model(name: str, elem: int, rows: int | str = "N", width: int | None = None) -> onnx.ModelProto:
    """``out`` = ``x``: FP32 scores [N, width] to classify, or one BYTES element per row ([N]) to echo."""
    shape: list[int | str] = [rows] if width is None else [rows, width]
    x = helper.make_tensor_value_info("x", elem, shape)
    out = helper.make_tensor_value_info("out", elem, shape)
    return _model(helper.make_graph([helper.make_node("Identity", ["x"], ["out"])], name, [x], [out]))


def normalised_model() -> onnx.ModelProto:
    """``y`` = softmax of ``x`` FP32 [N, 4] over its first dimension: N is not a batch, so requests must not merge."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    return _model(helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=0)], "normalised", [x], [y]))


# Triton's qa "nobatch" add/sub models of L0_infer_variable: the datatypes of INPUT0/INPUT1, OUTPUT0 and
# OUTPUT1 (f: FP32, i: INT32, l: INT64), and the shape each case sends (every dimension dynamic).
NOBATCH_CASES: dict[str, tuple[str, str, str, tuple[int, ...]]] = {
    "fff": ("FP32", "FP32", "FP32", (16,)),
    "fii": ("FP32", "INT32", "INT32", (2, 8)),
    "fll": ("FP32", "INT64", "INT64", (8, 4)),
    "fil": ("FP32", "INT32", "INT64", (2, 8, 2)),
    "ffi": ("FP32", "FP32", "INT32", (16,)),
    "iii": ("INT32", "INT32", "INT32", (2, 8)),
    "iif": ("INT32", "INT32", "FP32", (2, 8, 2)),
}
_TRITON_NAMES = {"FP32": "float32", "INT32": "int32", "INT64": "int64"}


def nobatch_name(case: str) -> str:
    """Triton's name for the case's model, e.g. ``onnx_nobatch_float32_int32_int64``."""
    inputs, out0, out1, _ = NOBATCH_CASES[case]
    return "onnx_nobatch_" + "_".join(_TRITON_NAMES[t] for t in (inputs, out0, out1))


def add_sub_model(case: str) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, cast to their datatypes; every dimension dynamic."""
    inputs, out0, out1, shape = NOBATCH_CASES[case]
    dims = [f"d{axis}" for axis in range(len(shape))]
    ins = [helper.make_tensor_value_info(name, DATATYPES[inputs], dims) for name in ("INPUT0", "INPUT1")]
    outs = [
        helper.make_tensor_value_info("OUTPUT0", DATATYPES[out0], dims),
        helper.make_tensor_value_info("OUTPUT1", DATATYPES[out1], dims),
    ]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["sum"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=DATATYPES[out0]),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=DATATYPES[out1]),
    ]
    return _model(helper.make_graph(nodes, nobatch_name(case), ins, outs))
