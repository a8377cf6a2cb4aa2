"""Tiny ONNX models built with onnx.helper for the tests (IR version 10 unless a test says otherwise)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10
OPSET = 17


def _model(graph: onnx.GraphProto, *, ir_version: int = IR, opset: int = OPSET, **kwargs: object) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(
        graph, ir_version=ir_version, opset_imports=opsets, producer_name="modelyard-tests", **kwargs
    )


def add_model(*, ir_version: int = IR, opset: int = OPSET, bias: float = 1.0, width: int = 4) -> onnx.ModelProto:
    """y = x + bias, with x of shape [N, width] (N dynamic; another width is a breaking change)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    b = numpy_helper.from_array(np.full([width], bias, dtype=np.float32), "b")
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "add", [x], [y], [b])
    return _model(graph, ir_version=ir_version, opset=opset)


def token_sum_model() -> onnx.ModelProto:
    """MiniLM's inputs (input_ids and attention_mask, int64 [batch, seq]) to one int64 per row: the kept ids' sum."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("total", TensorProto.INT64, ["batch"])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axes"], ["total"], keepdims=0),
    ]
    return _model(helper.make_graph(nodes, "tokens", [ids, mask], [out], [axes]))


def fixed_add_model(*, bias: float = 1.0, rows: int = 2, width: int = 4) -> onnx.ModelProto:
    """y = x + bias with every shape fixed ([rows, width]): no batching; what CUDA graphs can run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])
    b = numpy_helper.from_array(np.full([width], bias, dtype=np.float32), "b")
    return _model(helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "fixed-add", [x], [y], [b]))


def fragile_add_model(*, bias: float = 2.0, width: int = 4, table: int = 64) -> onnx.ModelProto:
    """y = x + bias while every |x| < ``table``; a larger value fails the run (an index out of range).

    The same signature as :func:`add_model`: it validates (standard normal inputs) and serves like
    ``add_model(bias=bias)``, until a client sends large values. A version that "starts failing".
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    values = numpy_helper.from_array(np.full([table], bias, dtype=np.float32), "values")
    nodes = [
        helper.make_node("Cast", ["x"], ["index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["values", "index"], ["gathered"], axis=0),
        helper.make_node("Add", ["x", "gathered"], ["y"]),
    ]
    return _model(helper.make_graph(nodes, "fragile-add", [x], [y], [values]))


def add_model_bytes(**kwargs: object) -> bytes:
    return add_model(**kwargs).SerializeToString()  # type: ignore[arg-type]


def multi_io_model() -> onnx.ModelProto:
    """Two inputs of different types and two outputs: s = a + 1 (int64 [2, 3]), t = Cast(b) (bool [-1])."""
    a = helper.make_tensor_value_info("a", TensorProto.INT64, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.BOOL, ["n"])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2, 3])
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n"])
    one = numpy_helper.from_array(np.array(1, dtype=np.int64), "one")
    nodes = [
        helper.make_node("Add", ["a", "one"], ["s"]),
        helper.make_node("Cast", ["b"], ["t"], to=TensorProto.FLOAT),
    ]
    return _model(helper.make_graph(nodes, "multi", [a, b], [s, t], [one]))


def unknown_op_model(domain: str = "") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("FrobnicateTensor", ["x"], ["y"], domain=domain)], "g", [x], [y])
    model = _model(graph)
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def external_data_model(folder: Path, *, location: str = "weights.bin", size: int = 4) -> Path:
    """y = x + w where w (float32 [size]) lives in an external-data file; returns the .onnx path.

    The location is written verbatim into the model, which lets tests point it anywhere.
    """
    folder.mkdir(parents=True, exist_ok=True)
    weights = np.arange(size, dtype=np.float32)
    (folder / "weights.bin").write_bytes(weights.tobytes())
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[size])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(weights.nbytes))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "ext", [x], [y], [w])
    path = folder / "model.onnx"
    path.write_bytes(_model(graph).SerializeToString())
    return path


def unrunnable_model() -> onnx.ModelProto:
    """Passes onnx.checker and shape inference, but fails when ONNX Runtime runs it.

    The target shape is an input; validation feeds ones, and [1, 1] cannot hold the 6 values of x.
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "bad", [x, shape], [y])
    return _model(graph)


def slow_model(*, size: int = 1024, layers: int = 100) -> onnx.ModelProto:
    """Takes seconds to run once: ``layers`` chained MatMuls of a fixed [size, size] input with one shared weight.

    The weight is filled with 1/size, so on the all-ones synthetic input every value stays 1.0 and the time
    is pure arithmetic: for ONNX Runtime on one thread of the 2-core test machine, 6 s on 2026-12-03, when it
    was at its slowest; long enough for a test to kill the worker mid-run.
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])
    w = numpy_helper.from_array(np.full([size, size], 1.0 / size, dtype=np.float32), "w")
    nodes = []
    previous = "x"
    for index in range(layers):
        output = "y" if index == layers - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [previous, "w"], [output]))
        previous = output
    return _model(helper.make_graph(nodes, "slow", [x], [y], [w]))


# --- Hostile models: tiny files that make validation loop or allocate without bound ------------------------


def endless_loop_model(trip_count: int = 2**62) -> onnx.ModelProto:
    """A ``Loop`` whose body passes its value through, ``trip_count`` times: about 250 bytes that run for ever."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Identity", ["v"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
    )
    trips = numpy_helper.from_array(np.array(trip_count, dtype=np.int64), "trips")
    keep_going = numpy_helper.from_array(np.array(True), "keep_going")
    node = helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body)
    return _model(helper.make_graph([node], "endless", [x], [y], [trips, keep_going]))


def allocation_model(elements: int = 2**27) -> onnx.ModelProto:
    """``ConstantOfShape`` of ``elements`` floats, then ``Add``: about 150 bytes that allocate 8 bytes per element."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])
    shape = numpy_helper.from_array(np.array([elements], dtype=np.int64), "shape")
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["filled"], value=one),
        helper.make_node("Add", ["filled", "x"], ["y"]),
    ]
    return _model(helper.make_graph(nodes, "allocates", [x], [y], [shape]))


def nested_if_model(depth: int) -> onnx.ModelProto:
    """``If`` nodes nested ``depth`` deep, each holding the level below in both branches (2**depth leaves).

    The file grows as 2**depth, and what the checker and ONNX Runtime build from it grows faster.
    """

    def level(d: int) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"o{d}", TensorProto.FLOAT, [1])
        if d == 0:
            return helper.make_graph([helper.make_node("Identity", ["x"], ["o0"])], "leaf", [], [out])
        below = level(d - 1)
        node = helper.make_node("If", ["cond"], [f"o{d}"], then_branch=below, else_branch=below)
        return helper.make_graph([node], f"level{d}", [], [out])

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    below = level(depth - 1)
    node = helper.make_node("If", ["cond"], ["y"], then_branch=below, else_branch=below)
    return _model(helper.make_graph([node], "nested", [x, cond], [y]))


def huge_input_model() -> onnx.ModelProto:
    """Identity on an input of the fixed shape [2**40, 2**40]: synthetic inputs for it cannot exist."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40, 2**40])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**40, 2**40])
    return _model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "huge", [x], [y]))


def string_parsing_model() -> onnx.ModelProto:
    """Like Triton's ``simple_string``: numbers sent as strings, parsed and summed per row.

    text (STRING [N, 2]) -> sum (INT32 [N, 1]). ONNX Runtime's Cast cannot parse ``"a"``, so the
    synthetic test run of validation fails on it; any numeric strings run.
    """
    text = helper.make_tensor_value_info("text", TensorProto.STRING, ["N", 2])
    total = helper.make_tensor_value_info("sum", TensorProto.INT32, ["N", 1])
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("Cast", ["text"], ["numbers"], to=TensorProto.INT32),
        helper.make_node("ReduceSum", ["numbers", "axes"], ["sum"], keepdims=1),
    ]
    return _model(helper.make_graph(nodes, "simple_string", [text], [total], [axes]))


def classifier_model(*, features: int = 64, classes: int = 10, seed: int = 1) -> onnx.ModelProto:
    """scores = x @ W + B: a linear classifier, x of shape [N, features] (N dynamic), scores [N, classes]."""
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.standard_normal((features, classes)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "B")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["scores"])]
    return _model(helper.make_graph(nodes, "classifier", [x], [scores], [weights, bias]))


def mlp_model(*, features: int = 32, hidden: int = 256, outputs: int = 8, seed: int = 2) -> onnx.ModelProto:
    """A two-layer MLP (MatMul, Add, Relu, MatMul, Add) with [N, features] in and [N, outputs] out."""
    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array((rng.standard_normal((features, hidden)) / 4).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) / 4, "B1"),
        numpy_helper.from_array((rng.standard_normal((hidden, outputs)) / 8).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(outputs).astype(np.float32), "B2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", outputs])
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"]),
        helper.make_node("Add", ["h1", "B1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"]),
        helper.make_node("Add", ["h4", "B2"], ["y"]),
    ]
    return _model(helper.make_graph(nodes, "mlp", [x], [y], init))


def masked_model(*, width: int = 8, seed: int = 3) -> onnx.ModelProto:
    """y = (x * Cast(mask, FLOAT)) @ W, as BERT exports cast their attention mask: x float [N, width], mask int64."""
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "W")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    nodes = [
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "m"], ["xm"]),
        helper.make_node("MatMul", ["xm", "W"], ["y"]),
    ]
    return _model(helper.make_graph(nodes, "masked", [x, mask], [y], [weights]))


# --- The batching check: models whose first dimension is dynamic but not a batch ------------------------------


def first_dim_model(kind: str, *, width: int = 4) -> onnx.ModelProto:
    """x FP32 [N, width] -> y, where N is dynamic; ``kind`` says what y does with N.

    ``softmax0``: a softmax over N (not a batch); ``softmax1``: over each row (a batch); ``doubled``: x twice,
    stacked (2N rows); ``one-row``: x reshaped to [1, width], which only a single row fits.
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", width])
    inits = []
    if kind in ("softmax0", "softmax1"):
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=0 if kind == "softmax0" else 1)]
    elif kind == "doubled":
        nodes = [helper.make_node("Concat", ["x", "x"], ["y"], axis=0)]
    elif kind == "one-row":
        # The target shape is put together at run time, so shape inference leaves y's first dimension dynamic.
        inits = [
            numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
            numpy_helper.from_array(np.array([width], dtype=np.int64), "width"),
        ]
        nodes = [
            helper.make_node("Concat", ["one", "width"], ["one_row"], axis=0),
            helper.make_node("Reshape", ["x", "one_row"], ["y"]),
        ]
    else:
        raise ValueError(kind)
    return _model(helper.make_graph(nodes, kind, [x], [y], inits))
