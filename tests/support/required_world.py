"""The registry state the required-fields tests start from, made once per module through the API and the UI.

``tests/registry/test_required_fields_api.py`` and ``..._ui.py`` send every endpoint and every form
with only its required fields; each needs something to act on: a model with two validated
versions, an alias that can roll back, a pending promotion, a webhook, a derive job, a spare token,
a user who never signed in and a link for them to set a password. ``world_for_module`` makes it
in the module's transaction (``tests/support/module_db.py``) and artifact folder, so each test
runs in a savepoint of it and nothing is made twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client, override_settings

from modelyard.env import StorageConfig
from storage import get_storage
from tests.support.module_db import kept_for_module
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, login_person, make_person

MODEL = "demo"
# Never called: what a webhook would send is queued after a commit that never comes.
HOOK_URL = "http://127.0.0.1:9/hook"
NEWCOMER = "newbie"  # a viewer who never signed in, with no password yet
LINK = re.compile(r"/accounts/reset/[^/\"'<\s]+/[^/\"'<\s]+/")


@dataclass
class World:
    """What the module made, by name: people, and the ids the tests address.

    - mia, a maintainer with a password, owns ``demo`` (description "a demo model", tag "t1", batching
      off, max batch size 8): version 1 (description "first", tag "v1tag")
      and version 2, both ready; 'staging' (unprotected) moved to 1 then 2, so it can roll back;
    - mia asked to put version 1 on the protected 'production' (``promotion``), for ada, an approver;
    - root, an admin, registered an inactive webhook for 'alias.moved' of demo;
    - mia asked for a derive job of version 1 (queued, never run) and made a spare token;
    - newbie never signed in; ``password_link`` is the set-password link root made for them.
    """

    people: dict[str, Person]
    promotion: int
    webhook: int
    derive_job: int
    spare_token: str
    password_link: str
    storage: Path

    def read(self, path: str) -> Any:
        """GET from the API as the admin, who may read everything."""
        response = self.people["root"].get(path)
        assert response.status_code == 200, (path, response.status_code, response.content[:500])
        return response.json()

    def status_of(self, path: str) -> int:
        return int(self.people["root"].get(path).status_code)


def ok(response: Any, status: int) -> Any:
    assert response.status_code == status, (response.status_code, response.content[:500])
    return response.json() if response.get("Content-Type") == "application/json" else response


def session(username: str, **kwargs: Any) -> Client:
    """A signed-in browser session of ``username`` (``enforce_csrf_checks=True`` to be checked as a browser is)."""
    client = Client(**kwargs)
    client.force_login(get_user_model().objects.get(username=username))
    return client


def put(person: Person, path: str, data: Any) -> Any:
    return person.client.put(
        path, json.dumps(data), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {person.token}"
    )


def _upload(person: Person, bias: float) -> int:
    number = ok(person.upload(MODEL, [("model.onnx", add_model_bytes(bias=bias))]), 201)["version"]
    version = ok(person.get(f"/api/v1/models/{MODEL}/versions/{number}"), 200)  # validated as the upload committed
    assert version["status"] == "ready", version["errors"]
    return int(number)


def build_world(storage: Path) -> World:
    mia = login_person("mia", "maintainer")  # with PASSWORD, so she can sign in and change it
    ada = make_person("ada", "approver")
    root = make_person("root", "admin")
    make_person(NEWCOMER, "viewer")
    ok(mia.post("/api/v1/models", {"name": MODEL, "description": "a demo model", "tags": ["t1"]}), 201)
    ok(mia.patch(f"/api/v1/models/{MODEL}", {"batching": "off", "max_batch_size": 8}), 200)
    assert [_upload(mia, 1.0), _upload(mia, 2.0)] == [1, 2]
    ok(mia.patch(f"/api/v1/models/{MODEL}/versions/1", {"description": "first", "tags": ["v1tag"]}), 200)
    for number in (1, 2):
        ok(put(mia, f"/api/v1/models/{MODEL}/aliases/staging", {"version": number}), 200)
    promotion = ok(put(mia, f"/api/v1/models/{MODEL}/aliases/production", {"version": 1}), 202)
    hook = {"url": HOOK_URL, "events": ["alias.moved"], "model": MODEL, "active": False}
    hook = ok(root.post("/api/v1/webhooks", hook), 201)
    job = ok(mia.post(f"/api/v1/models/{MODEL}/versions/1/derive", {"recipe": "ort-optimized"}), 202)
    spare = ok(session("mia").post("/api/v1/tokens", {"name": "spare"}, content_type="application/json"), 201)
    page = ok(session("root").post(f"/ui/users/{NEWCOMER}/password-link"), 200)
    link = LINK.search(page.content.decode())
    assert link is not None, page.content[:2000]
    return World(
        people={"mia": mia, "ada": ada, "root": root},
        promotion=promotion["id"],
        webhook=hook["id"],
        derive_job=job["id"],
        spare_token=spare["prefix"],
        password_link=link.group(0),
        storage=storage,
    )


@contextmanager
def world_for_module(django_db_blocker: Any, folder: Path) -> Iterator[World]:
    """The world, made in ``folder`` and the module's transaction; undone when the block ends."""
    storage = folder / "artifacts"
    with (
        override_settings(
            STORAGE=StorageConfig(kind="file", path=str(storage)),
            VALIDATION_WORK_DIR=str(folder / "work"),
            WEBHOOK_ALLOW_PRIVATE=True,  # the webhook's loopback address
        ),
        kept_for_module(django_db_blocker),
    ):
        get_storage.cache_clear()
        cache.clear()
        try:
            with django_db_blocker.unblock():
                world = build_world(storage)
            yield world
        finally:
            get_storage.cache_clear()


def use_world(world: World, settings: Any, tmp_path: Path) -> None:
    """In a test: read the module's artifacts, whatever folder the suite's own fixtures gave the test."""
    settings.STORAGE = StorageConfig(kind="file", path=str(world.storage))
    settings.VALIDATION_WORK_DIR = str(tmp_path / "work")
    settings.WEBHOOK_ALLOW_PRIVATE = True
    get_storage.cache_clear()
    cache.clear()  # rate counters
