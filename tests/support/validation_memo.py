"""Validation results remembered within a test session, by the sha256 of every file of the bundle.

Each upload validates its files in a fresh sandboxed interpreter (``onnxkit.sandbox``), 0.8 to 1.2 s on a
busy machine. Most tests upload the same few tiny models to reach the behaviour they are about, so the
suite would spend most of its time validating identical bytes. Validation is deterministic in its input:
the files' bytes and names and the limits it runs under. The first validation of each distinct input
still runs for real, in the sandbox; later ones get a copy of its result. A result that a limit cut
short (``validation stopped ...``) depends on how busy the machine was, so it is never remembered.

The results are shared by the processes of one run: the first process (the only one, or the controller of
pytest-xdist's workers) makes a folder and names it in ``MODELYARD_TEST_VALIDATION_MEMO``, which the workers
inherit; a result validated by one worker is a file there (a pickle named by the key's sha256) that the
others read instead of validating the same bytes again.

The servers that tests start as processes of their own (``modelyard serve``) share it too: their
environment names the folder, and ``PYTHONPATH`` a ``sitecustomize`` (``tests/support/memo_site/``) that
puts the memo in front of validation at their start (:func:`in_servers`).

Tests about validation itself opt out with ``@pytest.mark.real_validation`` (tests/conftest.py).
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import onnxkit.validation
from onnxkit.validation import ValidationResult, validate_in_child

# Where ``registry.validation.job`` looks the function up: the one name the memo replaces.
HOOK = "registry.validation.job.validate_in_child"

# The folder of the results this run's processes share.
SHARED = "MODELYARD_TEST_VALIDATION_MEMO"

_remembered: dict[tuple[Any, ...], ValidationResult] = {}
counts = {"validated": 0, "remembered": 0, "shared": 0}


def share_with_workers() -> Path | None:
    """In the run's first process: make the shared folder, named in the environment the workers inherit.

    Returns the folder to remove when the run ends, or None in a worker (the folder is its controller's).
    """
    if os.environ.get(SHARED):
        return None
    folder = Path(tempfile.mkdtemp(prefix="modelyard-validation-memo-"))
    os.environ[SHARED] = str(folder)
    return folder


def stop_sharing(folder: Path) -> None:
    del os.environ[SHARED]
    shutil.rmtree(folder, ignore_errors=True)


# The folder whose sitecustomize.py installs the memo in a server's process.
SITE = Path(__file__).resolve().parent / "memo_site"


def in_servers(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a server process that validates through this run's shared memo (when there is one).

    The folder is named explicitly: the servers' environment otherwise holds no ``MODELYARD_`` variable.
    """
    folder = os.environ.get(SHARED)
    if not folder:
        return env
    path = os.pathsep.join(part for part in (str(SITE), env.get("PYTHONPATH", "")) if part)
    return {**env, SHARED: folder, "PYTHONPATH": path}


def install_in_this_process() -> None:
    """Validation in this process goes through the memo: ``registry.validation.job`` imports the name
    from ``onnxkit.validation`` when it is first imported, after this."""
    onnxkit.validation.validate_in_child = remembered_validate_in_child


def _shared_file(key: tuple[Any, ...]) -> Path | None:
    folder = os.environ.get(SHARED)
    return Path(folder) / f"{hashlib.sha256(repr(key).encode()).hexdigest()}.pickle" if folder else None


def _bundle_digest(model_path: Path, file_names: set[str]) -> tuple[tuple[str, str], ...]:
    folder = model_path.parent
    digests = []
    for name in sorted(file_names | {model_path.name}):
        path = folder / name
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        digests.append((name, digest))
    return tuple(digests)


def _cut_short(result: ValidationResult) -> bool:
    return any(error.startswith(("validation stopped", "validation could not finish")) for error in result.errors)


def remembered_validate_in_child(model_path: Path, file_names: set[str], **limits: Any) -> ValidationResult:
    """``validate_in_child`` with the same arguments, its result remembered by the bundle's sha256s."""
    key = (model_path.name, _bundle_digest(model_path, file_names), tuple(sorted(limits.items())))
    if key in _remembered:
        counts["remembered"] += 1
        return copy.deepcopy(_remembered[key])
    shared = _shared_file(key)
    if shared is not None and shared.exists():
        counts["shared"] += 1
        _remembered[key] = pickle.loads(shared.read_bytes())  # written by a process of this run
        return copy.deepcopy(_remembered[key])
    result = validate_in_child(model_path, file_names, **limits)
    counts["validated"] += 1
    if not _cut_short(result):
        _remembered[key] = copy.deepcopy(result)
        if shared is not None:
            # Whole or not at all: a worker reading it meanwhile finds no file, or this one.
            partial = shared.with_name(f"{shared.name}.{os.getpid()}")
            partial.write_bytes(pickle.dumps(result))
            os.replace(partial, shared)
    return result
