"""Data migrations: rows written by an earlier release read as this one writes them."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("registry", "0013_batching_check")]
AFTER = [("registry", "0014_readable_errors")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture(autouse=True)
def _back_to_the_latest_migrations() -> Any:
    """The tests after these on this worker expect every migration applied, the newest included."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_messages_stored_with_escaped_line_breaks_get_their_line_breaks_back() -> None:
    old = migrate(BEFORE)
    user = old.get_model("auth", "User").objects.create(username="ada")
    model = old.get_model("registry", "RegisteredModel").objects.create(name="m", created_by=user)
    version = old.get_model("registry", "ModelVersion").objects.create(
        model=model,
        version=1,
        status="failed",
        created_by=user,
        size_bytes=0,
        errors=[
            "onnx.checker rejected the model: No Op registered for Frob\\x0a\\x0a==> Context: Bad node spec",
            "a name with a tab\\x09 stays escaped",
        ],
        warnings=["ONNX Runtime warned:\\x0d\\x0a  line two  "],
    )
    untouched = old.get_model("registry", "ModelVersion").objects.create(
        model=model, version=2, status="ready", created_by=user, size_bytes=0
    )

    new = migrate(AFTER)

    ModelVersion = new.get_model("registry", "ModelVersion")
    version = ModelVersion.objects.get(pk=version.pk)
    assert version.errors == [
        "onnx.checker rejected the model: No Op registered for Frob\n==> Context: Bad node spec",
        "a name with a tab\\x09 stays escaped",
    ]
    assert version.warnings == ["ONNX Runtime warned:\n  line two"]
    assert (ModelVersion.objects.get(pk=untouched.pk).errors, ModelVersion.objects.get(pk=untouched.pk).warnings) == (
        [],
        [],
    )
