"""The seam between the planes: ``inference/`` imports from ``registry`` only ``registry.serving``.

And the request path's codecs and batcher stand without it: they import with no Django at all.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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


HOT_PATH = ("inference.protocol", "inference.batcher", "inference.grpc.codec")


def test_the_hot_path_imports_without_django_settings():
    # A fresh interpreter with no settings module: the wire codecs and the batcher import, and load no Django.
    environment = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    script = (
        f"import sys, {', '.join(HOT_PATH)}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'registry', 'modelyard', 'storage'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(inference.__file__).parent.parent,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
