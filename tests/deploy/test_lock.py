"""The lock (requirements/*.txt) that `make install`, CI and the Dockerfile install: it must still satisfy
pyproject.toml, pin every package with hashes, and keep one version of each package across its files.

`make lock` regenerates it with uv; these tests catch a pyproject.toml edited without `make lock`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import cast

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Which extras each lock file resolves (the Makefile's `lock` target); every lock holds the core dependencies.
LOCKS = {"cpu": ["cpu"], "gpu": ["gpu"], "test": ["test"], "bench": ["bench"], "docs": ["docs"]}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def pins(name: str) -> dict[str, list[tuple[str, str | None]]]:
    """{package: [(version, marker)]} for one lock file; a universal lock may pin a package once per platform."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    lines = (LOCK / f"{name}.txt").read_text().splitlines()
    for index, line in enumerate(lines):
        match = PIN.match(line)
        if match:
            package, version, marker = match.groups()
            found.setdefault(canonicalize_name(package), []).append((version, marker))
            assert lines[index + 1].strip().startswith("--hash=sha256:"), f"{name}.txt: {package} has no hash"
    return found


def requirements_of(extras: list[str]) -> list[Requirement]:
    listed = list(PROJECT["dependencies"])
    for extra in extras:
        listed += PROJECT["optional-dependencies"][extra]
    return [Requirement(text) for text in listed]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_lock_satisfies_what_pyproject_asks_for(lock):
    pinned = pins(lock)
    # Environment is a TypedDict of str values, which mypy will not take as the Mapping that evaluate() asks for.
    environment = cast(dict[str, str], default_environment())
    linux = environment | {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"}
    for requirement in requirements_of(LOCKS[lock]):
        if requirement.marker is not None and not requirement.marker.evaluate(linux):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"requirements/{lock}.txt lacks {requirement}: run `make lock`"
        for version, _marker in pinned[name]:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"requirements/{lock}.txt pins {name}=={version}, outside pyproject.toml's {requirement}: "
                "run `make lock`"
            )


def test_every_lock_pins_a_package_at_the_cpu_locks_version():
    """The GPU, test, bench and docs locks are resolved against the CPU lock, so one venv never mixes versions."""
    cpu = pins("cpu")
    for lock in ("gpu", "test", "bench", "docs"):
        for name, versions in pins(lock).items():
            if name in cpu:
                assert {v for v, _ in versions} <= {v for v, _ in cpu[name]}, f"{lock}.txt: {name} {versions}"


def test_exactly_one_onnx_runtime_wheel_in_each_runtime_lock():
    assert "onnxruntime" in pins("cpu") and "onnxruntime-gpu" not in pins("cpu")
    assert "onnxruntime-gpu" in pins("gpu") and "onnxruntime" not in pins("gpu")
    # The test, bench and docs locks go on top of either runtime lock, so they bring neither wheel.
    for lock in ("test", "bench", "docs"):
        assert not {"onnxruntime", "onnxruntime-gpu"} & set(pins(lock)), lock


def test_protobuf_stays_on_the_major_version_the_grpc_modules_were_generated_with():
    generated = (ROOT / "inference" / "grpc" / "grpc_service_pb2.py").read_text()
    major = re.search(r"# Protobuf Python Version: (\d+)\.", generated)
    assert major, "grpc_service_pb2.py names the protobuf version it was generated with"
    for lock in LOCKS:
        for version, _ in pins(lock).get("protobuf", []):
            assert version.split(".")[0] == major.group(1), f"{lock}.txt: protobuf {version}"
