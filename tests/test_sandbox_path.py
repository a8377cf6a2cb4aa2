"""The sandboxed child (``onnxkit/sandbox.py``) imports from its parent's PYTHONPATH folders.

The child starts with ``python -E``, which drops ``PYTHONPATH``. A server whose packages come from a
``PYTHONPATH`` folder (a ``pip install --target`` folder, such as an ONNX Runtime GPU build laid over an
image's CPU one) must still validate, derive and benchmark with those same packages, so the child is
given those folders explicitly, after the project root, and still none of the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from onnxkit.sandbox import ChildLimits, run_in_child

ROOT = Path(__file__).resolve().parents[1]

LIMITS = ChildLimits(
    timeout_seconds=60,
    memory_mb=0,
    timeout_setting="T",
    memory_setting="M",
    what="probe",
)

PROBE = """
import os


def where(request, on_step):
    on_step("probing")
    return {"file": __file__, "secret": os.environ.get("PROBE_SECRET"), "echo": request["echo"]}
"""


def test_a_module_only_on_the_parents_pythonpath_is_imported_by_the_child(tmp_path):
    site = tmp_path / "target-site"
    site.mkdir()
    (site / "modelyard_probe_module.py").write_text(PROBE)
    # A parent started as a server is: its PYTHONPATH names the folder, and a secret is in its environment.
    parent = (
        "import json, sys\n"
        "from onnxkit.sandbox import ChildLimits, run_in_child\n"
        "limits = ChildLimits(timeout_seconds=60, memory_mb=0, timeout_setting='T', memory_setting='M', what='probe')\n"
        "outcome = run_in_child('modelyard_probe_module:where', {'echo': 7}, limits)\n"
        "print(json.dumps({'reply': outcome.reply, 'error': outcome.error}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELYARD_", "DJANGO_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["PROBE_SECRET"] = "not for the child"
    done = subprocess.run(
        [sys.executable, "-c", parent], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] == ""
    assert result["reply"] == {"file": str(site / "modelyard_probe_module.py"), "secret": None, "echo": 7}


def test_the_project_root_comes_first_on_the_childs_path(tmp_path, monkeypatch):
    # A PYTHONPATH folder that holds a package named like one of the project's must not shadow it.
    shadow = tmp_path / "shadow"
    (shadow / "onnxkit").mkdir(parents=True)
    (shadow / "onnxkit" / "__init__.py").write_text("raise ImportError('the shadowing onnxkit was imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    outcome = run_in_child("os.path:basename", {}, LIMITS)  # any entry: the child must start at all
    # basename({}) raises inside the function, after the child imported onnxkit.sandbox from the project.
    assert outcome.reply is None
    assert outcome.failure is not None and outcome.failure.kind == "error"
    assert outcome.failure.step == ""
    assert "the shadowing onnxkit" not in outcome.error
    assert outcome.error.startswith("the probe failed while starting: TypeError")


def test_a_folder_only_on_the_parents_sys_path_is_not_the_childs(tmp_path, monkeypatch):
    # What the parent put on sys.path at run time (its working directory, say) stays the parent's.
    (tmp_path / "modelyard_probe_only_here.py").write_text("def where(request, on_step):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    outcome = run_in_child("modelyard_probe_only_here:where", {}, LIMITS)
    assert outcome.error == (
        "the probe failed while starting: ModuleNotFoundError: No module named 'modelyard_probe_only_here'"
    )
