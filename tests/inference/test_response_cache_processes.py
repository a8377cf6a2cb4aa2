"""The response cache in a real ``modelyard serve`` process: hits flagged, and a swap never answers from v1's entries.

The alias's cache is set through the API; the process takes it on its reconcile pass, like any
other part of the desired state. ``y = x + bias``: the bias of every answer says which version
computed it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tests.support.inference import answered_bias, infer_body
from tests.support.polling import eventually
from tests.support.processes import ServeProcess
from tests.support.prometheus import value
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

INFER = "/v2/models/demo/infer"


def infer(server: ServeProcess, x: np.ndarray) -> tuple[int, Any]:
    return server.request("POST", INFER, infer_body(x))


def cached(body: Any) -> bool | None:
    return (body.get("parameters") or {}).get("cached")


def serves(server: ServeProcess, version: int) -> bool:
    probe = np.full((1, 4), -100.0, dtype=np.float32)  # never repeated below
    status, body = infer(server, probe)
    return status == 200 and body["model_version"] == str(version)


def test_a_served_alias_answers_repeats_from_its_cache_and_never_across_a_swap(owner, approver, admin, start_server):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    response = admin.patch("/api/v1/models/demo/aliases/production", {"cache": {"max_bytes": 65536, "ttl_seconds": 60}})
    assert response.status_code == 200, response.content
    server = start_server("inf-cache")
    eventually(lambda: serves(server, 1), timeout=30, what="v1 never served")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    eventually(lambda: cached(infer(server, x)[1]) is not None, timeout=30, what="the cache setting never arrived")
    status, body = infer(server, x)
    assert status == 200 and cached(body) is True and answered_bias(x, body) == 1.0

    promote(owner, approver, 2)
    eventually(lambda: serves(server, 2), timeout=30, what="v2 never served")
    status, body = infer(server, x)
    assert status == 200 and body["model_version"] == "2"
    assert cached(body) is False and answered_bias(x, body) == 2.0  # computed by v2, not v1's entry
    status, body = infer(server, x)
    assert cached(body) is True and answered_bias(x, body) == 2.0

    # Binary outputs share the entry: only the encoding differs.
    binary = infer_body(x)
    binary["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
    status, raw = server.request("POST", INFER, binary)
    header, _ = json.JSONDecoder().raw_decode(raw)  # the JSON header, then the binary outputs
    assert status == 200 and cached(header) is True and header["outputs"][0]["parameters"]["binary_data_size"] == 32

    status, text = server.request("GET", "/metrics", token=admin.token)
    assert status == 200, text
    assert value(text, "modelyard_response_cache_hits_total", model="demo", version="2") >= 1
    assert value(text, "modelyard_response_cache_misses_total", model="demo", version="2") >= 1
