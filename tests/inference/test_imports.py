"""The seam between the planes: ``inference/`` imports from ``registry`` only ``registry.serving``.

From the rest of the project it imports only the ground floor (``onnxkit``), ``storage``, the
Prometheus exposition (``modelyard.metrics``) and the signature checks (``modelyard.provenance``); and
its wire format loads without Django settings.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import inference

ALLOWED = "registry.serving"


def registry_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a ``registry`` module in the file, at any depth (function bodies too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "registry"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "registry":  # from registry import serving, models
                found += [(node.lineno, f"registry.{alias.name}") for alias in node.names]
            elif node.module.split(".")[0] == "registry":
                found.append((node.lineno, node.module))
    return found


def test_inference_imports_only_registry_serving():
    folder = Path(inference.__file__).parent
    files = sorted(folder.glob("**/*.py"))
    assert folder / "runtime.py" in files
    wrong = [
        f"{path.relative_to(folder.parent)}:{line} imports {module}"
        for path in files
        for line, module in registry_imports(path)
        if module != ALLOWED
    ]
    assert wrong == []
    # The rule has something to hold: the runtime does cross the seam.
    assert (folder / "runtime.py", ALLOWED) in {(p, m) for p in files for _, m in registry_imports(p)}


def test_the_rule_sees_every_form_of_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import registry.models\n"
        "from registry import serving, notify\n"
        "from registry.auth import split_token\n"
        "def later():\n"
        "    from registry.validation import synthetic_inputs\n"
        "from . import registry\n"
    )
    assert registry_imports(sample) == [
        (1, "registry.models"),
        (2, "registry.serving"),
        (2, "registry.notify"),
        (3, "registry.auth"),
        (5, "registry.validation"),
    ]


# What ``inference`` may import from the project besides itself: a module is allowed when it is one of
# these or inside one of these.
ALLOWED_FROM_PROJECT = (
    "inference",
    "registry.serving",
    "onnxkit",
    "storage",
    "modelyard.metrics",
    "modelyard.provenance",
    "modelyard.tls",  # the checked certificate files the gRPC server listens with (standard library only)
)
PROJECT = ("inference", "registry", "onnxkit", "storage", "modelyard", "bench", "scripts", "tests")


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a project module, at any depth; ``from pkg import name`` is ``pkg.name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] in PROJECT]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PROJECT:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _allowed(module: str) -> bool:
    return any(module == allowed or module.startswith(f"{allowed}.") for allowed in ALLOWED_FROM_PROJECT)


def test_inference_imports_from_the_project_only_the_seam_onnxkit_storage_and_metrics():
    folder = Path(inference.__file__).parent
    files = sorted(folder.glob("**/*.py"))
    found = {(path, module) for path in files for _, module in project_imports(path)}
    wrong = [
        f"{path.relative_to(folder.parent)}:{line} imports {module}"
        for path in files
        for line, module in project_imports(path)
        if not _allowed(module)
    ]
    assert wrong == []
    # The rule has something to hold: the walker sees each allowed part used, and refuses its neighbours.
    assert not _allowed("registry.models") and not _allowed("modelyard.settings") and not _allowed("storagex")
    assert (folder / "app.py", "registry.serving") in found
    assert (folder / "protocol.py", "onnxkit.datatypes.NUMPY_OF") in found
    assert (folder / "cache.py", "storage.get_storage") in found
    assert (folder / "metrics.py", "modelyard.metrics") in found
    assert (folder / "verify.py", "modelyard.provenance.verify_bundle") in found


def test_the_wire_format_and_the_batcher_import_without_django_settings():
    code = (
        "import sys\n"
        "import inference.protocol, inference.batcher, inference.grpc.codec\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'registry', 'storage', 'modelyard'))\n"
        "print(loaded)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    root = Path(inference.__file__).parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # nothing of Django, the registry's ORM, storage or the settings


# What an inference process must not import before it serves: none of it is needed to load and run a
# version, and on the slow 2-core machine they cost its cold start 1.6 s (onnx, above all ml_dtypes'
# extension), 1.1 s (model_signing, which only signing needs) and 0.3 s (drf-spectacular's schema).
HEAVY_FOR_INFERENCE = ("onnx", "ml_dtypes", "model_signing", "sigstore", "drf_spectacular.plumbing")


def test_an_inference_process_starts_without_onnx_model_signing_or_the_schema(tmp_path):
    code = (
        "import sys\n"
        "import modelyard.asgi\n"
        "assert modelyard.asgi.runtime is not None\n"
        f"print(sorted(m for m in {HEAVY_FOR_INFERENCE!r} if m in sys.modules))\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("MODELYARD_")}
    env.update(
        DJANGO_SETTINGS_MODULE="modelyard.settings",
        MODELYARD_ROLE="inference",
        MODELYARD_DATA_DIR=str(tmp_path),
        MODELYARD_GRPC_PORT="0",
    )
    root = Path(inference.__file__).parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # The rule has something to hold: the web role's schema does import drf-spectacular's plumbing.
    env["MODELYARD_ROLE"] = "web"
    code = "import sys\nimport modelyard.asgi, modelyard.urls\nprint('drf_spectacular.plumbing' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_the_element_types_are_onnx_s():
    import onnx

    from onnxkit.datatypes import ONNX_ELEMENT_TYPES, numpy_of_ort_type

    assert {name: onnx.TensorProto.DataType.Value(name) for name in ONNX_ELEMENT_TYPES} == ONNX_ELEMENT_TYPES
    assert numpy_of_ort_type("tensor(float)") is np.float32
    assert numpy_of_ort_type("tensor(int64)") is np.int64
    assert numpy_of_ort_type("tensor(string)") is np.object_
    assert numpy_of_ort_type("tensor(bfloat16)") is None  # no numpy dtype
    assert numpy_of_ort_type("tensor(float8e4m3fn)") is None
    assert numpy_of_ort_type("seq(tensor(float))") is None
