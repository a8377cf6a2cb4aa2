"""Every operation of ``/api/schema/``, called with requests schemathesis generates from the schema.

For each operation, schemathesis makes requests the schema allows (query parameters, bodies, forms
with random values), the path pointing at the objects of the required-fields world
(``tests/support/required_world.py``), sent by its admin through Django's WSGI handler. Each answer
must not be a server error, and its status, content type and body must be ones the schema
documents. Generation is deterministic (``derandomize``): the same code sends the same requests, so
a failure reproduces, and a run costs the same every time.

Checks that judge refusals (a request the schema allows answered 400, say) are left out: the API
refuses more than a schema can say (a date range that ends before it starts, a tag with a space),
and says why. Requests the schema forbids (a wrong type, a missing required field, a body in a
content type the operation does not take) are sent too: their answers must be documented refusals,
never a server error. The same run over HTTP, against a server of your own, is in docs/development.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.openapi import api_schema
from tests.support.required_world import MODEL, World, use_world, world_for_module

pytestmark = pytest.mark.django_db  # one worker builds the world once (tests/support/scheduling.py)

# Random requests per operation, besides the cases of schemathesis' coverage phase (edge values of each
# parameter): with those, 1,687 allowed requests in 35 s (30 CPU-s) on this machine's two slow cores.
EXAMPLES = 6
NEGATIVE_EXAMPLES = 4  # and requests the schema forbids
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

schema = schemathesis.openapi.from_dict(api_schema())
schema.config.generation.update(modes=[GenerationMode.POSITIVE], max_examples=EXAMPLES, deterministic=True)
WSGI = get_wsgi_application()


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_for_module(django_db_blocker, tmp_path_factory.mktemp("api-fuzz")) as made:
        yield made


@pytest.fixture(autouse=True)
def _world(world: World, settings: Any, tmp_path: Path) -> Iterator[None]:
    use_world(world, settings, tmp_path)
    # Django closes an old database connection as a request starts and ends, which would end the test's
    # transaction; its test client keeps the connection open the same way.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


def _objects(world: World, path: str) -> dict[str, Any]:
    """The world's objects for the path's parameters, so that requests reach them rather than a 404."""
    ids = {"/promotions/": world.promotion, "/webhooks/": world.webhook, "/derive-jobs/": world.derive_job}
    known: dict[str, Any] = {"name": MODEL, "version": 1, "alias": "staging", "prefix": world.spare_token}
    known["id"] = next((value for part, value in ids.items() if part in path), None)
    return {name: value for name, value in known.items() if value is not None}


def _send(case: Any, world: World) -> Any:
    """Send the case as the world's admin, its path parameters pointing at the world's objects."""
    names = set(case.path_parameters or {})
    aimed = {**(case.path_parameters or {}), **_objects(world, case.path)}
    case.path_parameters = {name: value for name, value in aimed.items() if name in names}
    return case.call(app=WSGI, headers={"Authorization": f"Bearer {world.people['root'].token}"})


# The same requests every run (derandomize), no example database, and no deadline on a loaded machine.
GENERATION = settings(database=None, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@schema.parametrize()
@GENERATION
def test_answers_are_what_the_schema_documents(case: Any, world: World) -> None:
    case.validate_response(_send(case, world), checks=CHECKS)


# Requests the schema does not allow (a wrong type, a required field missing, a value out of range):
# the answer is a documented refusal, never a server error.
negative = schemathesis.openapi.from_dict(api_schema())
negative.config.generation.update(modes=[GenerationMode.NEGATIVE], max_examples=NEGATIVE_EXAMPLES, deterministic=True)
REFUSAL_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]


@negative.parametrize()
@GENERATION
def test_requests_the_schema_forbids_are_refused_as_documented(case: Any, world: World) -> None:
    case.validate_response(_send(case, world), checks=REFUSAL_CHECKS)
