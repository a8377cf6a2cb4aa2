"""The GPU variant as a user installs it: one ONNX Runtime distribution, CUDA in its providers, and the reasons.

``make check-gpu-wheel`` (part of ``make test``, so CI runs it) makes a fresh venv with
``pip install '.[gpu]'`` and runs this script in it. CI has neither a GPU nor the CUDA libraries
(their pip packages are several GB and are not installed), which is the point: this checks

- ``importlib.metadata`` finds exactly one distribution writing ``onnxruntime``: ``onnxruntime-gpu``;
- ``onnxruntime.get_available_providers()`` lists ``CUDAExecutionProvider`` (it does without a device);
- a session asked for CUDA falls back to the CPU with a note saying why (the libraries do not load, or
  there is no device), and with ``MODELYARD_REQUIRE_GPU`` the same reason fails the load.

Then the Makefile installs the CPU wheel over it, the broken state of issue 14, and runs this again with
``--expect-refusal``: start-up must refuse, naming both distributions and the fix.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import tempfile
from pathlib import Path


def fail(message: str) -> None:
    print(f"check-gpu-wheel: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def setup_django(data_dir: str) -> None:
    for key in [k for k in os.environ if k.startswith("MODELYARD_")]:
        del os.environ[key]
    os.environ.update(DJANGO_SETTINGS_MODULE="modelyard.settings", MODELYARD_DATA_DIR=data_dir)
    import django

    django.setup()


def tiny_model(path: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    b = numpy_helper.from_array(np.ones([4], dtype=np.float32), "b")
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "add", [x], [y], [b])
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def check_one_gpu_wheel(work: Path) -> None:
    from django.conf import settings

    from inference import sessions

    installed = sessions.check_ort_install()
    gpu_version = importlib.metadata.version("onnxruntime-gpu")
    if installed != f"onnxruntime-gpu {gpu_version}":
        fail(f"expected onnxruntime-gpu alone, found {sessions.ort_distributions()}")
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        fail(f"CUDAExecutionProvider is not in get_available_providers(): {providers}")
    print(f"check-gpu-wheel: {installed} is the only ONNX Runtime; providers {providers}")

    model = tiny_model(work / "model.onnx")
    settings.PROVIDERS = ["cuda", "cpu"]
    built = sessions.build_session(model)
    status = sessions.gpu_status()
    print(f"check-gpu-wheel: CUDA asked for: session on {built.provider}; device {sessions.device_description()}")
    if built.provider == "CUDAExecutionProvider":
        return  # a machine with the libraries and a GPU: nothing to explain
    reasons = ("CUDA/cuDNN libraries could not be loaded: ", "no CUDA device: ")
    if not built.note.startswith(reasons) or built.note != status.reason:
        fail(f"the fallback note does not say why CUDA did not load: {built.note!r}")
    print(f"check-gpu-wheel: note: {built.note}")
    settings.REQUIRE_GPU = True
    try:
        sessions.build_session(model)
    except sessions.GpuUnavailable as exc:
        if not str(exc).startswith(status.reason):
            fail(f"MODELYARD_REQUIRE_GPU failed the load with another reason: {exc}")
        print("check-gpu-wheel: MODELYARD_REQUIRE_GPU=true fails the load with the same reason")
    else:
        fail("MODELYARD_REQUIRE_GPU=true loaded the session on the CPU")


def check_refused() -> None:
    from inference import sessions

    try:
        sessions.device_description()  # what an inference process does first
    except sessions.OnnxRuntimeInstallError as exc:
        text = str(exc)
        if "onnxruntime-gpu" not in text or "pip uninstall -y onnxruntime onnxruntime-gpu" not in text:
            fail(f"the refusal does not name both wheels and the fix: {text}")
        print(f"check-gpu-wheel: both wheels installed: start-up refused: {text[:160]}...")
        return
    fail(f"start-up did not refuse two ONNX Runtime distributions: {sessions.ort_distributions()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-refusal", action="store_true", help="the CPU wheel was installed over the GPU one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check-gpu-wheel-") as tmp:
        setup_django(tmp)
        if args.expect_refusal:
            check_refused()
        else:
            check_one_gpu_wheel(Path(tmp))


if __name__ == "__main__":
    main()
