"""Retention rules through the Python client against a live server: set, read, preview (the saved rule and one
not saved), clear, and the server's refusals.

The server is ``modelyard serve`` on the embedded default (SQLite): versions are aged by moving their
``created_at`` back in its database, as the days would.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import onnx
import pytest

from modelyard.client import (
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    RetentionAction,
    RetentionPlan,
    RetentionRule,
)
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model


@pytest.fixture(scope="module")
def people(live: LiveServer) -> tuple[Client, Client, Client]:
    """A maintainer, an admin and a viewer."""
    return (
        Client(live.url, live.createtoken("rita", "maintainer")),
        Client(live.url, live.createtoken("ralph", "admin")),
        Client(live.url, live.createtoken("vic", "viewer")),
    )


def three_versions(owner: Client, name: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for number, bias in ((1, 1.0), (2, 2.0), (3, 3.0)):
        path = folder / f"v{number}.onnx"
        onnx.save(add_model(bias=bias), path)
        assert owner.wait_ready(name, owner.push(name, path).version).version == number


def age(live: LiveServer, name: str, days: int, *numbers: int) -> None:
    """Move the versions' creation ``days`` back in the server's database."""
    marks = ",".join("?" * len(numbers))
    with sqlite3.connect(live.folder / "data" / "modelyard.sqlite3") as db:
        db.execute(
            f"UPDATE registry_modelversion SET created_at = datetime(created_at, '-{days} days') "
            f"WHERE version IN ({marks}) AND model_id = (SELECT id FROM registry_registeredmodel WHERE name = ?)",
            (*numbers, name),
        )


def test_set_read_preview_and_clear_a_rule(live, people, tmp_path):
    owner, admin, viewer = people
    three_versions(owner, "tidy", tmp_path)
    assert owner.retention("tidy") is None

    rule = owner.retention_set("tidy", keep_last=1, keep_days=30)

    assert isinstance(rule, RetentionRule)
    assert (rule.keep_last, rule.keep_days, rule.then) == (1, 30, "archive")
    assert viewer.retention("tidy") == rule
    assert owner.get_model("tidy").raw["retention"] == {"keep_last": 1, "keep_days": 30, "then": "archive"}

    fresh = viewer.retention_preview("tidy")  # every version was made just now: nothing to do
    assert isinstance(fresh, RetentionPlan)
    assert (fresh.model, fresh.rule, fresh.actions, fresh.kept) == ("tidy", rule, [], [])
    assert fresh.as_of

    age(live, "tidy", 40, 1, 2)
    admin.request("POST", "/api/v1/models/tidy/versions/1/hold", json_body={"reason": "audit"})
    plan = viewer.retention_preview("tidy")
    assert [(a.version, a.action) for a in plan.actions] == [(2, "archive")]
    assert plan.actions[0].why.startswith("not among the newest version, created ")
    (kept,) = plan.kept
    assert isinstance(kept, RetentionAction)
    assert (kept.version, kept.action) == (1, "keep")
    assert kept.why.startswith("it is under legal hold (by ralph since ") and kept.why.endswith(": audit)")

    # Another rule, tried and not saved.
    tried = viewer.retention_preview("tidy", keep_last=3, keep_days=30)
    assert (tried.rule.keep_last, tried.actions, tried.kept) == (3, [], [])
    assert owner.retention("tidy") == rule

    owner.retention_clear("tidy")
    assert owner.retention("tidy") is None
    with pytest.raises(Conflict) as none:
        viewer.retention_preview("tidy")
    assert none.value.error == "model 'tidy' has no retention rule; set one, or send a rule to preview"


def test_the_server_refuses_a_bad_rule_and_the_wrong_role(live, people, tmp_path):
    owner, admin, viewer = people
    three_versions(owner, "strict", tmp_path)

    with pytest.raises(BadRequest) as bad:
        owner.retention_set("strict", keep_last=0, keep_days=30)
    assert (bad.value.error, bad.value.detail) == (
        "keep_last must be a whole number from 1 to 10000",
        {"field": "keep_last"},
    )
    with pytest.raises(BadRequest) as bad:
        owner.retention_set("strict", keep_last=1, keep_days=30, then="shred")
    assert bad.value.error == 'then must be "archive" or "delete"'
    with pytest.raises(BadRequest) as bad:
        viewer.retention_preview("strict", keep_last=5)
    assert bad.value.error == "a retention rule needs keep_days"
    with pytest.raises(Forbidden) as denied:
        viewer.retention_set("strict", keep_last=1, keep_days=30)
    assert denied.value.error == "setting a model's retention rule needs the maintainer or admin role"
    with pytest.raises(Forbidden) as denied:
        owner.retention_set("strict", keep_last=1, keep_days=30, then="delete")
    assert denied.value.error == "a retention rule that deletes versions needs the admin role"
    assert owner.retention("strict") is None

    assert admin.retention_set("strict", keep_last=1, keep_days=30, then="delete").then == "delete"
    with pytest.raises(NotFound):
        owner.retention("nothing-here")
