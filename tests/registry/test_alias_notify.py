"""Alias moves notify listeners after commit (PostgreSQL NOTIFY, Redis pub/sub, in-process),
and concurrent moves of one alias serialise into an ordered history."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from registry import notify, promotions
from registry.audit.chain import Actor
from registry.models import Alias, AliasMove, RegisteredModel
from tests.support.onnx_models import add_model_bytes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model_with_versions(owner):
    assert owner.post("/api/v1/models", {"name": "demo"}).status_code == 201
    for bias in (1.0, 2.0, 3.0):
        assert owner.upload("demo", [("m.onnx", add_model_bytes(bias=bias))]).status_code == 201
    user = get_user_model().objects.get(username="owner")
    return RegisteredModel.objects.get(name="demo"), Actor(user=user)


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_alias_move_notifies_listeners_after_commit(model_with_versions, settings, backend):
    model, actor = model_with_versions
    if backend == "redis":
        settings.BROKER_URL = "redis://127.0.0.1:6379/14"
    assert notify._backend() == backend
    in_process = notify._LocalListener()  # what the embedded default (SQLite, one process) uses
    with notify.listen() as listener:
        assert listener.wait(0.2) == []
        promotions.alias_set(model=model, alias_name="staging", version_number=2, actor=actor)
        messages = listener.wait(5)
    expected = [{"model": "demo", "alias": "staging", "version": 2, "served": False}]
    assert messages == expected
    assert in_process.wait(1) == expected


def test_no_notification_when_the_transaction_rolls_back(model_with_versions):
    model, actor = model_with_versions
    with notify.listen() as listener:
        with pytest.raises(Exception, match="only a ready version"):
            from registry.models import ModelVersion

            ModelVersion.objects.filter(version=3).update(status="failed")
            promotions.alias_set(model=model, alias_name="staging", version_number=3, actor=actor)
        assert listener.wait(0.5) == []


def test_concurrent_moves_of_one_alias_are_ordered(model_with_versions):
    model, actor = model_with_versions
    assert connection.vendor == "postgresql"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def move(version: int) -> None:
        try:
            barrier.wait()
            promotions.alias_set(model=model, alias_name="staging", version_number=version, actor=actor)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=move, args=(v,)) for v in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    moves = list(AliasMove.objects.filter(alias__name="staging").order_by("moved_at", "id"))
    assert len(moves) == 2
    assert moves[0].from_version is None
    assert moves[1].from_version_id == moves[0].to_version_id
    assert {m.to_version.version for m in moves} == {1, 2}
    assert Alias.objects.get(name="staging").version_id == moves[1].to_version_id
    assert moves[0].moved_at <= moves[1].moved_at
