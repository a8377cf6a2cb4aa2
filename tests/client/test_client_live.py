"""The Python client against a live server: typed answers, typed refusals carrying the server's words, all pages."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelyard.client import (
    AliasMove,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    Promotion,
    ValidationFailed,
)
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model, multi_io_model, unrunnable_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def people(live: LiveServer) -> tuple[Client, Client]:
    owner = Client(live.url, live.createtoken("olga", "maintainer", "inference", "auditor"))
    approver = Client(live.url, live.createtoken("paul", "approver"))
    return owner, approver


def write(folder: Path, name: str, model: onnx.ModelProto) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def test_push_promote_approve_infer_pull_and_history(live, people, tmp_path):
    owner, approver = people
    subprocess.run([sys.executable, str(ROOT / "scripts" / "example_model.py"), str(tmp_path)], check=True)
    seen: list[tuple[int, int]] = []
    version = owner.push(
        "lin",
        tmp_path / "model.onnx",
        [tmp_path / "model.onnx.data"],
        description="from a pipeline",
        metadata={"run": 7},
        progress=lambda sent, total: seen.append((sent, total)),
    )
    files = (tmp_path / "model.onnx").stat().st_size + (tmp_path / "model.onnx.data").stat().st_size
    assert seen[-1] == (files, files)  # every byte of both files, and not the form around them
    ready = owner.wait_ready("lin", version.version)
    assert (ready.status, ready.metadata, [f.name for f in ready.files]) == (
        "ready",
        {"run": 7},
        ["model.onnx", "model.onnx.data"],
    )
    assert ready.signature["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [m.name for m in owner.list_models()] == ["lin"]

    request = owner.promote("lin", "production", version.version, reason="launch")
    assert isinstance(request, Promotion) and (request.state, request.requested_by) == ("pending", "olga")
    with pytest.raises(Forbidden) as refused:
        owner.approve(request.id)
    assert refused.value.error == "to approve a promotion you need the approver role"
    assert refused.value.status == 403
    approved = approver.approve(request.id, reason="ok", wait=60)
    assert (approved.state, approved.decided_by) == ("approved", "paul")

    [y] = owner.infer("lin", {"x": np.array([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=np.float32)}).values()
    assert y.dtype == np.float32 and y.tolist() == [[4.5, 6.5], [0.5, 0.5]]

    model_path = owner.pull("lin", "production", tmp_path / "pulled")
    assert model_path == tmp_path / "pulled" / "model.onnx"
    assert (tmp_path / "pulled" / "model.onnx.data").read_bytes() == (tmp_path / "model.onnx.data").read_bytes()

    move = owner.promote("lin", "staging", version.version, reason="smoke")
    assert isinstance(move, AliasMove) and (move.from_version, move.to_version, move.kind) == (None, 1, "set")
    assert owner.promote("lin", "staging", version.version) is None  # already there
    [only] = owner.history("lin", "staging")
    assert (only.to_version, only.moved_by, only.reason) == (1, "olga", "smoke")
    now = owner.history("lin", "production", at=datetime.now(UTC))
    assert (now.version, now.alias) == (1, "production")


def test_refusals_carry_the_servers_error_and_detail(live, people, tmp_path):
    owner, _ = people
    first = owner.push("sig", write(tmp_path, "a.onnx", add_model()))
    owner.wait_ready("sig", first.version)
    owner.promote("sig", "staging", first.version)
    second = owner.wait_ready("sig", owner.push("sig", write(tmp_path, "b.onnx", multi_io_model())).version)

    with pytest.raises(Conflict) as breaking:
        owner.promote("sig", "staging", second.version)
    assert breaking.value.status == 409
    assert breaking.value.error.startswith("version 2 is not compatible with version 1 behind 'staging': ")
    assert breaking.value.detail["breaking"]  # the server's list of breaking differences

    with pytest.raises(NotFound) as missing:
        owner.get_version("sig", 99)
    assert (missing.value.status, missing.value.error, missing.value.detail) == (404, "not found", None)

    failed = owner.push("sig", write(tmp_path, "c.onnx", unrunnable_model()))
    with pytest.raises(ValidationFailed) as invalid:
        owner.wait_ready("sig", failed.version)
    assert invalid.value.version == 3 and invalid.value.errors
    assert str(invalid.value).startswith("version 3 of 'sig' failed validation: ")


def test_a_versions_description_and_tags_are_edited_after_its_upload(live, people, tmp_path):
    owner, approver = people
    pushed = owner.push("edits", write(tmp_path, "e.onnx", add_model()), description="first cut")
    assert (pushed.description, pushed.tags) == ("first cut", [])

    edited = owner.update_version("edits", pushed.version, description="epoch 7", tags=["candidate", "run:42"])
    assert (edited.version, edited.description, edited.tags) == (pushed.version, "epoch 7", ["candidate", "run:42"])
    tags_only = owner.update_version("edits", pushed.version, tags=[])  # the description is left as it is
    assert (tags_only.description, tags_only.tags) == ("epoch 7", [])
    assert owner.get_version("edits", pushed.version).description == "epoch 7"
    [event, _] = owner.audit(action="version.update", model="edits")
    assert (event.actor, event.target, event.before, event.after) == (
        "olga",
        f"edits/{pushed.version}",
        {"tags": ["candidate", "run:42"]},
        {"tags": []},
    )
    with pytest.raises(Forbidden) as refused:
        approver.update_version("edits", pushed.version, description="not mine")
    assert refused.value.error == "this action needs the maintainer or admin role"


def test_audit_iterates_every_page(live, people):
    owner, _ = people
    verdict = owner.verify_audit()
    assert verdict.ok
    events = list(owner.audit(page_size=2, order="seq"))
    assert [event.seq for event in events][: verdict.checked] == list(range(1, verdict.checked + 1))
    newest_first = [event.seq for event in owner.audit(page_size=3)]
    assert newest_first == sorted(newest_first, reverse=True) and len(newest_first) >= verdict.checked
    uploads = list(owner.audit(action="version.upload", page_size=1))
    assert uploads and {event.action for event in uploads} == {"version.upload"}
