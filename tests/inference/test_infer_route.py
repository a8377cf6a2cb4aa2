"""``POST .../infer`` goes straight to its endpoint; every other request goes through the /v2 router.

:func:`inference.app.infer_route` must take exactly the paths the router's two infer routes take, with the
same parameters (checked against Starlette's own matching), and the app must answer them as before: the
outputs of a real version (against ONNX Runtime run directly), its refusals, and, through the router, the
405 of another method and the 404 of a path no route takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from starlette.applications import Starlette
from starlette.routing import Match, Route

from inference.app import build_app, infer_route
from tests.support.onnx_models import mlp_model

MODEL = mlp_model().SerializeToString()

PATHS = [
    "/v2/models/demo/infer",
    "/v2/models/demo/versions/2/infer",
    "/v2/models/demo/versions/production/infer",
    "/v2/models/stats/infer",
    "/v2/models/my.model-1/versions/10/infer",
    "/v2/models/infer",
    "/v2/models//infer",
    "/v2/models/demo/versions//infer",
    "/v2/models//versions/2/infer",
    "/v2/models/demo/versions/2/x/infer",
    "/v2/models/demo/x/2/infer",
    "/v2/models/a/b/infer",
    "/v2/models/demo/infer/",
    "/v2/models/demo/inference",
    "/v2/models/demo",
    "/v2/models/demo/ready",
    "/v2/repository/index",
    "/v2/infer",
]


def router_params(path: str) -> dict[str, str] | None:
    """The parameters Starlette's infer routes give ``path`` for a POST, or None when neither takes it."""

    async def endpoint(request: Any) -> None:
        raise AssertionError("never called")

    for template in ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"):
        match, child = Route(template, endpoint, methods=["POST"]).matches(
            {"type": "http", "method": "POST", "path": path, "root_path": ""}
        )
        if match == Match.FULL:
            return dict(child["path_params"])
    return None


@pytest.mark.parametrize("path", PATHS)
def test_the_direct_path_takes_what_the_router_takes(path):
    assert infer_route(path) == router_params(path)


def test_the_cases_are_both_taken_and_refused():
    taken = [path for path in PATHS if infer_route(path) is not None]
    assert infer_route("/v2/models/demo/versions/2/infer") == {"model": "demo", "version": "2"}
    assert 0 < len(taken) < len(PATHS)


@pytest.mark.django_db(transaction=True)
def test_infer_answers_without_the_router_and_the_rest_is_routed(served_mlp, asgi_loop, monkeypatch):
    routed: list[str] = []
    through_router = Starlette.__call__

    async def counting(self: Starlette, scope: Any, receive: Any, send: Any) -> None:
        routed.append(f"{scope['method']} {scope['path']}")
        await through_router(self, scope, receive, send)

    monkeypatch.setattr(Starlette, "__call__", counting)
    runtime, _ = served_mlp
    app = build_app(runtime)
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 32], "data": x.ravel().tolist()}]}
    [expected] = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"]).run(None, {"x": x})

    for path in ("/v2/models/demo/infer", "/v2/models/demo/versions/1/infer"):
        status, answer = asgi_loop.request(app, "POST", path, body)
        assert (status, answer["model_name"], answer["model_version"]) == (200, "demo", "1"), answer
        [output] = answer["outputs"]
        assert (output["name"], output["shape"]) == ("y", [2, 8])
        np.testing.assert_allclose(np.asarray(output["data"], np.float32).reshape(2, 8), expected, rtol=1e-5, atol=1e-6)
    assert asgi_loop.request(app, "POST", "/v2/models/nope/infer", body) == (
        404,
        {"error": "Request for unknown model: 'nope' is not found"},
    )
    status, answer = asgi_loop.request(app, "POST", "/v2/models/demo/infer", {"inputs": []})
    assert (status, answer) == (400, {"error": "the request needs a non-empty 'inputs' list"})
    assert routed == []  # none of these went through the router

    assert asgi_loop.request(app, "GET", "/v2/models/demo/infer") == (
        405,
        {"error": "GET is not allowed on /v2/models/demo/infer"},
    )
    assert asgi_loop.request(app, "POST", "/v2/models/demo/versions//infer", body) == (
        404,
        {"error": "no such endpoint: POST /v2/models/demo/versions//infer"},
    )
    ready = {"name": "demo", "version": "1", "ready": True}
    assert asgi_loop.request(app, "GET", "/v2/models/demo/ready") == (200, ready)
    assert routed == [
        "GET /v2/models/demo/infer",
        "POST /v2/models/demo/versions//infer",
        "GET /v2/models/demo/ready",
    ]
