"""Write the README quick tour's model: ``model.onnx`` and its weights in ``model.onnx.data`` (external data).

y = x @ W + 0.5, with x of shape [N, 4] and W summing the even and the odd columns: for
x = [[1, 2, 3, 4]], y = [[4.5, 6.5]]. The weights live in a separate file, as those of any
model over 2 GB must, so that pushing and pulling a model of several files can be tried on a small one.

    python scripts/example_model.py [FOLDER]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    weights = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "example",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(np.float32(0.5), "b")],
    )
    return helper.make_model(
        graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)], producer_name="modelyard-example"
    )


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx.data").unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        build(),
        folder / "model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    print(f"Wrote {folder / 'model.onnx'} and {folder / 'model.onnx.data'} (y = x @ W + 0.5, x: FP32 [N, 4])")


if __name__ == "__main__":
    main()
