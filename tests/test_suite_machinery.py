"""The suite's own machinery (tests/support/): the validation memo, the xdist groups, the migrated database, and the
fork server of the ``modelyard`` commands."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import pytest

from modelyard.client import Client, Version
from onnxkit.validation import ValidationResult
from tests.support import scheduling, validation_memo
from tests.support.embedded import copy_migrated_database, embedded_env, modelyard, start_live_server
from tests.support.forkserver import fork_server
from tests.support.onnx_models import add_model_bytes, endless_loop_model

LIMITS = {"timeout_seconds": 60, "memory_mb": 2048, "tokenizer_max_bytes": 64 * 2**20}


@pytest.fixture
def memo(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """An empty memo, shared through an empty folder, with fresh counts: this test sees only its own validations."""
    monkeypatch.setattr(validation_memo, "_remembered", {})
    monkeypatch.setenv(validation_memo.SHARED, str(tmp_path_factory.mktemp("shared-memo")))
    counts = {"validated": 0, "remembered": 0, "shared": 0}
    monkeypatch.setattr(validation_memo, "counts", counts)
    return counts


def bundle(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


def test_the_memo_validates_each_distinct_bundle_for_real_once(memo, tmp_path):
    first = validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "a", "model.onnx", add_model_bytes()), {"model.onnx"}, **LIMITS
    )
    # The same bytes in another folder: remembered, and an equal result that is a copy, not the same object.
    again = validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "b", "model.onnx", add_model_bytes()), {"model.onnx"}, **LIMITS
    )
    assert first.ok and again == first and again is not first
    assert memo == {"validated": 1, "remembered": 1, "shared": 0}
    again.errors.append("changed by a caller")
    assert (
        validation_memo.remembered_validate_in_child(
            bundle(tmp_path / "c", "model.onnx", add_model_bytes()), {"model.onnx"}, **LIMITS
        ).errors
        == []
    )

    # Other bytes, another name or other limits are another validation.
    validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "d", "model.onnx", add_model_bytes(bias=2.0)), {"model.onnx"}, **LIMITS
    )
    validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "e", "renamed.onnx", add_model_bytes()), {"renamed.onnx"}, **LIMITS
    )
    validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "f", "model.onnx", add_model_bytes()), {"model.onnx"}, **(LIMITS | {"memory_mb": 1024})
    )
    assert memo == {"validated": 4, "remembered": 2, "shared": 0}


def test_another_process_of_the_run_reads_a_result_instead_of_validating_again(memo, tmp_path, monkeypatch):
    first = validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "a", "model.onnx", add_model_bytes()), {"model.onnx"}, **LIMITS
    )
    (shared,) = Path(os.environ[validation_memo.SHARED]).iterdir()
    assert shared.suffix == ".pickle"

    monkeypatch.setattr(validation_memo, "_remembered", {})  # as in another worker: only the folder is common
    again = validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "b", "model.onnx", add_model_bytes()), {"model.onnx"}, **LIMITS
    )
    assert again == first and first.ok
    assert memo == {"validated": 1, "remembered": 0, "shared": 1}
    validation_memo.remembered_validate_in_child(
        bundle(tmp_path / "c", "model.onnx", add_model_bytes()), {"model.onnx"}, **LIMITS
    )
    assert memo == {"validated": 1, "remembered": 1, "shared": 1}


def test_server_processes_validate_through_the_shared_memo(memo, tmp_path):
    """A ``modelyard serve`` that a test starts writes its validation to the run's folder; another reads it back."""
    shared = Path(os.environ[validation_memo.SHARED])
    model = tmp_path / "model.onnx"
    model.write_bytes(add_model_bytes(bias=5.0))

    def push_to_a_new_server(folder: Path) -> Version:
        live = start_live_server(folder)
        try:
            client = Client(live.url, live.createtoken("max", "maintainer"))
            return client.wait_ready("summer", client.push("summer", model).version)
        finally:
            live.server.stop()

    first = push_to_a_new_server(tmp_path / "first")
    assert first.status == "ready" and first.warnings == []
    (written,) = shared.iterdir()  # the server validated for real, and its result is here

    # Mark the remembered result: another server given the same bytes reads it rather than validating.
    result = pickle.loads(written.read_bytes())
    result.warnings.append("read from the shared memo")
    written.write_bytes(pickle.dumps(result))
    second = push_to_a_new_server(tmp_path / "second")
    assert (second.status, second.warnings) == ("ready", ["read from the shared memo"])
    assert [path.name for path in shared.iterdir()] == [written.name]
    assert memo == {"validated": 0, "remembered": 0, "shared": 0}  # all of it in the servers' processes


def test_a_server_process_has_no_memo_when_the_run_shares_none(monkeypatch):
    env = {"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere"}
    assert validation_memo.in_servers(env)[validation_memo.SHARED] == os.environ[validation_memo.SHARED]
    assert validation_memo.in_servers(env)["PYTHONPATH"] == f"{validation_memo.SITE}{os.pathsep}/elsewhere"
    monkeypatch.delenv(validation_memo.SHARED)
    assert validation_memo.in_servers(env) == env


def test_the_first_process_of_a_run_makes_the_shared_folder_and_removes_it(monkeypatch):
    monkeypatch.delenv(validation_memo.SHARED)
    folder = validation_memo.share_with_workers()
    assert folder is not None and folder.is_dir() and os.environ[validation_memo.SHARED] == str(folder)
    assert validation_memo.share_with_workers() is None  # a worker: the variable is set
    validation_memo.stop_sharing(folder)
    assert not folder.exists() and validation_memo.SHARED not in os.environ


def test_a_result_that_a_limit_cut_short_is_not_remembered(memo, tmp_path):
    loop = endless_loop_model().SerializeToString()
    limits = LIMITS | {"timeout_seconds": 3}
    for folder in ("a", "b"):
        result = validation_memo.remembered_validate_in_child(
            bundle(tmp_path / folder, "loop.onnx", loop), {"loop.onnx"}, **limits
        )
        assert result.errors[0].startswith("validation stopped after 3 s")
    assert memo == {"validated": 2, "remembered": 0, "shared": 0}
    assert list(Path(os.environ[validation_memo.SHARED]).iterdir()) == []


def test_only_a_cut_short_result_counts_as_cut_short():
    assert validation_memo._cut_short(ValidationResult(errors=["validation could not finish: x"]))
    assert not validation_memo._cut_short(ValidationResult(errors=["onnx.checker rejected the model: x"]))


def test_tests_that_share_something_outside_the_process_get_one_group():
    assert scheduling.group_of("tests/registry/test_celery_worker.py::test_x") == "broker"
    assert scheduling.group_of("tests/test_health.py::test_x[redis]") == "broker"
    assert scheduling.group_of("tests/compat/test_demo.py::test_x") == "compat"
    assert scheduling.group_of("tests/cli/test_user_commands.py::test_x") == "tests/cli/test_user_commands.py"
    assert scheduling.group_of("tests/registry/test_models_api.py::test_x") is None


def test_every_grouped_path_exists():
    root = Path(__file__).resolve().parent.parent
    assert [prefix for prefix in scheduling.GROUPS if not (root / prefix).exists()] == []


def test_groups_lost_on_the_way_to_the_scheduler_stop_the_run(pytestconfig, monkeypatch):
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    monkeypatch.setattr(pytestconfig.option, "loadgroup", True, raising=False)
    kept = [Item("tests/compat/test_demo.py::test_x@compat"), Item("tests/test_docs.py::test_y")]
    scheduling.check_groups_arrived(pytestconfig, kept)  # type: ignore[arg-type]  # only nodeid is read
    with pytest.raises(pytest.UsageError, match=r"lost the xdist_group of 1 tests \(first: tests/compat/test_demo"):
        scheduling.check_groups_arrived(pytestconfig, [Item("tests/compat/test_demo.py::test_x")])  # type: ignore[list-item]


def test_slow_tests_come_first_then_the_grouped_ones(request):
    order = [item.nodeid for item in request.session.items]
    slow = [i for i, item in enumerate(request.session.items) if item.get_closest_marker("slow")]
    grouped = [i for i, nodeid in enumerate(order) if scheduling.group_of(nodeid)]
    placed = set(slow) | set(grouped)
    rest = [i for i in range(len(order)) if i not in placed]
    assert rest, "this test itself is neither slow nor grouped"
    assert max(slow, default=-1) < min(rest) and max(grouped, default=-1) < min(rest)


def test_a_copied_migrated_database_has_nothing_left_to_apply_and_an_empty_folder_has(tmp_path):
    copy_migrated_database(tmp_path / "copy")
    copied = modelyard(embedded_env(tmp_path / "copy"), "manage", "migrate", "--check")
    assert copied.returncode == 0, copied.stdout + copied.stderr

    empty = modelyard(embedded_env(tmp_path / "empty"), "manage", "migrate", "--check")
    assert empty.returncode == 1, empty.stdout + empty.stderr


SHELL = """import os, sys
print(os.getcwd(), os.environ["GREETING"], sys.argv)
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


def test_a_forked_command_has_its_own_arguments_environment_folder_streams_and_exit_status(tmp_path):
    """Django's shell runs the script on its standard input, and prints what the command was given."""
    env = embedded_env(tmp_path / "data", GREETING="hello")
    (tmp_path / "work").mkdir()

    done = modelyard(env, "manage", "shell", "--no-imports", stdin=SHELL, cwd=tmp_path / "work")

    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines()[-1] == f"{tmp_path / 'work'} hello ['modelyard', 'manage', 'shell', '--no-imports']"
    assert done.stderr == "to stderr\n"
    assert "GREETING" not in os.environ and os.getcwd() != str(tmp_path / "work")


def test_a_forked_commands_uncaught_exception_and_its_timeout(tmp_path):
    env = embedded_env(tmp_path / "data")

    failed = modelyard(env, "manage", "shell", "--no-imports", stdin="raise ValueError('boom')\n")
    assert failed.returncode == 1
    assert failed.stderr.endswith("ValueError: boom\n")

    first = fork_server()
    with pytest.raises(subprocess.TimeoutExpired):
        first.run(
            ["manage", "shell", "--no-imports"], env=env, cwd=None, stdin="import time; time.sleep(60)", timeout=3
        )
    assert first.process.poll() is not None  # the server went with the command
    again = modelyard(env, "--help")
    assert again.returncode == 0 and again.stdout.startswith("usage: modelyard")
    assert fork_server() is not first
