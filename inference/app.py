"""The /v2 data plane: a bare Starlette app in front of the in-memory routing table.

It never queries the database per request. This first cut serves health, readiness and JSON
inference; the full Open Inference Protocol (binary tensors, metadata, batching) builds on it.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import numpy as np
from django.conf import settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inference.auth import TokenCache
from inference.runtime import InferenceRuntime, LoadedVersion, NotLoaded

NUMPY_OF = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
PROTOCOL_OF = {np.dtype(v).str: k for k, v in NUMPY_OF.items() if v is not np.object_}


class InferError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _to_array(spec: dict[str, Any], expected: dict[str, Any]) -> np.ndarray:
    name = spec.get("name")
    datatype = spec.get("datatype")
    shape = spec.get("shape")
    if datatype != expected["datatype"]:
        raise InferError(400, f"input '{name}': expected datatype {expected['datatype']}, got {datatype}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InferError(400, f"input '{name}': shape must be a list of non-negative integers, got {shape!r}")
    want = expected.get("shape")
    if want is not None and (
        len(want) != len(shape) or any(w != -1 and w != s for w, s in zip(want, shape, strict=True))
    ):
        raise InferError(400, f"input '{name}': expected shape {want}, got {shape}")
    try:
        array: np.ndarray = np.asarray(spec.get("data"), dtype=NUMPY_OF[datatype])
    except (TypeError, ValueError) as exc:
        raise InferError(400, f"input '{name}': data does not fit {datatype}: {exc}") from exc
    count = int(np.prod(shape)) if shape else 1
    if array.size != count:
        raise InferError(400, f"input '{name}': shape {shape} needs {count} values, got {array.size}")
    return array.reshape(shape)


def _output(name: str, value: np.ndarray) -> dict[str, Any]:
    datatype = "BYTES" if value.dtype == np.object_ else PROTOCOL_OF.get(value.dtype.str, str(value.dtype))
    data = value.flatten().tolist()
    if datatype == "BYTES":
        data = [v.decode() if isinstance(v, bytes) else v for v in data]
    return {"name": name, "datatype": datatype, "shape": list(value.shape), "data": data}


def build_app(runtime: InferenceRuntime) -> Starlette:
    tokens = TokenCache()

    async def authorised(request: Request) -> bool:
        if settings.INFERENCE_PUBLIC:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw:
            return False
        verdict = tokens.cached(raw.strip())
        if verdict is None:
            verdict = await anyio.to_thread.run_sync(tokens.check, raw.strip())
        return verdict

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": True})

    async def infer(request: Request) -> Response:
        if not await authorised(request):
            return error(401, "a bearer token with the inference role is required")
        model = request.path_params["model"]
        ref = request.path_params.get("version")
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return error(400, f"the request body is not valid JSON: {exc}")
        try:
            return JSONResponse(await _infer(model, ref, body))
        except InferError as exc:
            return error(exc.status, exc.message, exc.headers)

    async def _infer(model: str, ref: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise InferError(400, "the request needs an 'inputs' list")
        for _attempt in range(3):
            loaded = runtime.router.resolve(model, ref)
            if loaded is None:
                raise InferError(
                    404 if model not in runtime.router.table else 503,
                    f"model '{model}'" + (f" version '{ref}'" if ref else "") + " is not served here",
                )
            try:
                loaded.acquire()
            except NotLoaded:
                continue  # swapped out between resolve and acquire: take the new route
            try:
                return await anyio.to_thread.run_sync(_run, loaded, body)
            finally:
                loaded.release()
        raise InferError(503, f"model '{model}' is being reloaded; retry", {"Retry-After": "1"})

    def _run(loaded: LoadedVersion, body: dict[str, Any]) -> dict[str, Any]:
        expected = {spec["name"]: spec for spec in loaded.spec.signature.get("inputs", [])}
        feeds = {}
        for spec in body["inputs"]:
            if not isinstance(spec, dict) or spec.get("name") not in expected:
                raise InferError(400, f"unknown input {spec.get('name') if isinstance(spec, dict) else spec!r}")
            feeds[spec["name"]] = _to_array(spec, expected[spec["name"]])
        missing = sorted(expected.keys() - feeds.keys())
        if missing:
            raise InferError(400, f"missing input(s): {', '.join(missing)}")
        names = [o["name"] for o in loaded.spec.signature.get("outputs", [])]
        wanted = [o.get("name") for o in body.get("outputs") or []] or names
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise InferError(400, f"unknown output(s): {', '.join(map(str, unknown))}")
        try:
            values = loaded.run(feeds, wanted)
        except Exception as exc:  # ONNX Runtime rejected the data
            raise InferError(400, f"inference failed: {exc}") from exc
        response = {
            "model_name": loaded.spec.model,
            "model_version": str(loaded.spec.version),
            "outputs": [_output(n, v) for n, v in zip(wanted, values, strict=True)],
        }
        if "id" in body:
            response["id"] = body["id"]
        return response

    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
    ]
    return Starlette(routes=routes)
