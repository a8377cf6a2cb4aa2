"""The /v2 data plane: the Open Inference Protocol (KServe v2) with Triton's binary tensor extension.

A bare Starlette app in front of the in-memory routing table; it never queries the database
per request. ``{m}`` alone means the ``production`` alias; ``{v}`` is a version number or the
name of a served alias. Each loaded version has its own dynamic batcher.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio
from django.conf import settings
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inference import metrics
from inference.auth import TokenCache, token_key
from inference.batcher import Batcher, Overloaded, RequestTimeout
from inference.protocol import (
    HEADER_LENGTH,
    BodyDecoder,
    BodyLimit,
    ProtocolError,
    body_limit,
    decode_request,
    encode_response,
)
from inference.runtime import InferenceRuntime, LoadedVersion, NotLoaded
from inference.throttle import Throttle, retry_after

logger = logging.getLogger(__name__)

PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "parameters"]
OUT_OF_MEMORY = "the server has not enough memory for this request now; retry later or send a smaller one"


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


def _server_version() -> str:
    try:
        return version("modelyard")
    except PackageNotFoundError:
        return "0"


def can_batch(signature: dict[str, Any]) -> bool:
    """A model batches when every input and output has a dynamic first dimension."""
    specs = signature.get("inputs", []) + signature.get("outputs", [])
    return bool(specs) and all(s.get("shape") and s["shape"][0] == -1 for s in specs)


def error(status: int, message: str, *, retry_after: bool = False, close: bool = False) -> JSONResponse:
    """A JSON error; ``close`` ends the connection after it, for a body that was not read to its end."""
    headers = {"Retry-After": "1"} if retry_after else {}
    if close:
        headers["Connection"] = "close"
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


async def read_body(request: Request, limit: BodyLimit) -> bytearray:
    """The request body, decompressed, never past ``limit``, and ended when the client stalls."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit.bytes:
        raise limit.exceeded("the request body")
    decoder = BodyDecoder(request.headers.get("content-encoding", ""), limit)
    idle = settings.BODY_IDLE_TIMEOUT_SECONDS
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), idle)
        except TimeoutError:
            raise ProtocolError(
                f"no request body bytes arrived for {idle:g} s (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)", 408
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientGone
        decoder.feed(message.get("body", b""))
        if not message.get("more_body", False):
            return decoder.finish()


_TRITON_TYPES = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL"}


def _config_tensor(spec: dict[str, Any], batched: bool) -> dict[str, Any]:
    shape = spec.get("shape") or []
    datatype = spec["datatype"]
    return {
        "name": spec["name"],
        "data_type": _TRITON_TYPES.get(datatype, f"TYPE_{datatype}"),
        "dims": shape[1:] if batched else shape,
    }


def build_app(runtime: InferenceRuntime) -> Starlette:
    tokens = TokenCache()
    batchers: weakref.WeakKeyDictionary[LoadedVersion, Batcher] = weakref.WeakKeyDictionary()
    throttle: Throttle | None = None

    def bearer(request: Request) -> str:
        scheme, _, raw = request.headers.get("authorization", "").partition(" ")
        return raw.strip() if scheme.lower() == "bearer" else ""

    async def token_allowed(request: Request) -> bool:
        """A bearer token with the inference role (admins have every role)."""
        raw = bearer(request)
        if not raw:
            return False
        verdict = tokens.cached(raw)
        if verdict is None:
            verdict = await anyio.to_thread.run_sync(tokens.check, raw)
        return verdict

    async def authorised(request: Request) -> bool:
        return settings.INFERENCE_PUBLIC or await token_allowed(request)

    def throttled(request: Request) -> JSONResponse | None:
        """429 when the client is over ``MODELYARD_V2_RATE``; the setting is read per request, so it can change."""
        nonlocal throttle
        if settings.V2_RATE is None:
            return None
        if throttle is None or throttle.setting != settings.V2_RATE:
            throttle = Throttle(*settings.V2_RATE)
        if settings.INFERENCE_PUBLIC:
            client = "address " + (request.client.host if request.client else "")
        else:
            client = "token " + (token_key(bearer(request)) or "")
        wait = throttle.wait(client)
        if not wait:
            return None
        seconds = retry_after(wait)
        response = error(
            429, f"rate limit of {throttle.describe()} passed (MODELYARD_V2_RATE); retry in {seconds} s", close=True
        )
        response.headers["Retry-After"] = seconds
        return response

    def resolve(request: Request) -> LoadedVersion | JSONResponse:
        model = request.path_params["model"]
        ref = request.path_params.get("version")
        loaded = runtime.router.resolve(model, ref)
        if loaded is not None:
            return loaded
        if model not in runtime.router.table and model not in runtime.known_models():
            return error(404, f"unknown model '{model}'")
        if ref is not None and ref not in runtime.known_refs(model):
            return error(404, f"model '{model}' has no served version or alias '{ref}'")
        what = f"model '{model}'" + (f" version '{ref}'" if ref else "")
        return error(503, f"{what} is not loaded yet", retry_after=True)

    def batcher_for(loaded: LoadedVersion) -> Batcher:
        batcher = batchers.get(loaded)
        if batcher is None:
            spec = loaded.spec
            batcher = Batcher(
                lambda feeds: dict(zip(loaded.output_names, loaded.run(feeds), strict=True)),
                batching=can_batch(spec.signature),
                max_batch_size=spec.max_batch_size,
                max_queue_delay_us=spec.max_queue_delay_us,
                max_queue_size=spec.max_queue_size,
                on_batch=lambda requests, rows: metrics.BATCH_SIZE.labels(spec.model).observe(requests),
            )
            batchers[loaded] = batcher
            # The batcher's closure holds ``loaded``, so the weak key alone would never let go of either:
            # retire both (the batcher's thread and task included) once the version is drained and released.
            loop = asyncio.get_running_loop()

            def retire_soon() -> None:
                if not loop.is_closed():  # a server that already stopped has nothing left to retire
                    loop.call_soon_threadsafe(_retire, loaded)

            loaded.on_close(retire_soon)
        return batcher

    def _retire(loaded: LoadedVersion) -> None:
        batcher = batchers.pop(loaded, None)
        if batcher is not None:
            batcher.close()
        try:
            metrics.QUEUE_DEPTH.remove(loaded.spec.model, str(loaded.spec.version))
        except KeyError:  # never scraped while it served
            pass

    # --- health and metadata --------------------------------------------------------------------

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": "modelyard", "version": _server_version(), "extensions": EXTENSIONS})

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        if runtime.ready:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False}, status_code=503)

    def for_version(handler: Callable[[Request, LoadedVersion], Response]) -> Callable[[Request], Awaitable[Response]]:
        """Check the token and resolve ``{m}[/versions/{v}]`` before a metadata handler runs."""

        async def endpoint(request: Request) -> Response:
            if not await authorised(request):
                return error(401, "a bearer token with the inference role is required")
            found = resolve(request)
            return found if isinstance(found, JSONResponse) else handler(request, found)

        return endpoint

    @for_version
    def model_metadata(request: Request, found: LoadedVersion) -> Response:
        spec = found.spec
        versions = sorted({v.spec.version for v in runtime.router.table.get(spec.model, {}).values()})
        return JSONResponse(
            {
                "name": spec.model,
                "versions": [str(v) for v in versions] if "version" not in request.path_params else [str(spec.version)],
                "platform": PLATFORM,
                "inputs": spec.signature.get("inputs", []),
                "outputs": spec.signature.get("outputs", []),
            }
        )

    @for_version
    def model_ready(request: Request, found: LoadedVersion) -> Response:
        return JSONResponse({"name": found.spec.model, "version": str(found.spec.version), "ready": True})

    @for_version
    def model_config(request: Request, found: LoadedVersion) -> Response:
        spec = found.spec
        batched = can_batch(spec.signature)
        config: dict[str, Any] = {
            "name": spec.model,
            "platform": PLATFORM,
            "backend": "onnxruntime",
            "version_policy": {"specific": {"versions": [spec.version]}},
            "max_batch_size": spec.max_batch_size if batched else 0,
            "input": [_config_tensor(s, batched) for s in spec.signature.get("inputs", [])],
            "output": [_config_tensor(s, batched) for s in spec.signature.get("outputs", [])],
            "instance_group": [{"kind": "KIND_GPU" if "CUDA" in found.provider else "KIND_CPU", "count": 1}],
            "parameters": {"execution_provider": {"string_value": found.provider}},
        }
        if batched:
            config["dynamic_batching"] = {
                "max_queue_delay_microseconds": spec.max_queue_delay_us,
                "default_queue_policy": {"max_queue_size": spec.max_queue_size},
            }
        return JSONResponse(config)

    # --- inference --------------------------------------------------------------------------------

    async def infer(request: Request) -> Response:
        model = request.path_params["model"]
        # Label only models this process serves: names from URLs must not grow the series without bound.
        label = model if model in runtime.router.table else "_unknown"
        with metrics.LATENCY.labels(label).time():
            try:
                response = await _infer(request)
            except MemoryError:
                response = error(503, OUT_OF_MEMORY, retry_after=True)
            except RecursionError:  # e.g. an error message that quotes a deeply nested value
                response = error(400, "the request JSON is nested too deeply")
        metrics.REQUESTS.labels(label, str(response.status_code)).inc()
        return response

    async def _infer(request: Request) -> Response:
        # Everything that can refuse the request does so before its body is read.
        if not await authorised(request):
            return error(401, "a bearer token with the inference role is required", close=True)
        refused = throttled(request)
        if refused is not None:
            return refused
        found = resolve(request)
        if isinstance(found, JSONResponse):
            found.headers["Connection"] = "close"
            return found
        limit = body_limit(found.spec.model, found.spec.signature, settings.V2_MAX_BODY_BYTES)
        try:
            body = await read_body(request, limit)
        except ProtocolError as exc:
            return error(exc.status, exc.message, close=True)
        except ClientGone:
            logger.info("the client of %s disconnected before its request body was complete", request.url.path)
            return Response(status_code=499)
        for _attempt in range(3):
            found = resolve(request)
            if isinstance(found, JSONResponse):
                return found
            try:
                found.acquire()
            except NotLoaded:
                continue  # swapped out between resolve and acquire: take the new route
            try:
                return await _run(request, found, body)
            finally:
                found.release()
        return error(503, "the model is being reloaded; retry", retry_after=True)

    async def _run(request: Request, loaded: LoadedVersion, body: bytearray) -> Response:
        spec = loaded.spec
        try:
            decoded = decode_request(body, request.headers.get(HEADER_LENGTH), spec.signature)
            future = batcher_for(loaded).submit(
                decoded.inputs, priority=decoded.priority, timeout_us=decoded.timeout_us
            )
        except ProtocolError as exc:
            return error(exc.status, exc.message)
        except Overloaded as exc:
            return error(503, f"model '{spec.model}' is overloaded: {exc}", retry_after=True)
        disconnect: asyncio.Future[Any] = asyncio.ensure_future(_client_gone(request))
        try:
            done, _ = await asyncio.wait([future, disconnect], return_when=asyncio.FIRST_COMPLETED)
            if future not in done:
                future.cancel()  # the client went away: drop the request before it runs
                return Response(status_code=499)
            values = future.result()
        except RequestTimeout as exc:
            return error(504, f"{exc} (timeout {decoded.timeout_us} us)")
        except MemoryError:
            return error(503, OUT_OF_MEMORY, retry_after=True)
        except Exception as exc:  # noqa: BLE001 - ORT refused these inputs
            return error(400, f"inference failed: {exc}")
        finally:
            disconnect.cancel()
        payload, headers = encode_response(model=spec.model, version=str(spec.version), request=decoded, values=values)
        return Response(payload, headers=headers)

    async def _client_gone(request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    async def prometheus(request: Request) -> Response:
        if not settings.METRICS_PUBLIC and not await token_allowed(request):
            return error(401, "a bearer token with the inference or admin role is required (MODELYARD_METRICS_PUBLIC)")
        for loaded, batcher in list(batchers.items()):
            metrics.QUEUE_DEPTH.labels(loaded.spec.model, str(loaded.spec.version)).set(batcher.queued)
        payload, content_type = metrics.render()
        return Response(payload, media_type=content_type)

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    routes = [
        Route("/v2", server_metadata),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/metrics", prometheus),
    ]
    for prefix in (model, versioned):
        routes += [
            Route(prefix, model_metadata),
            Route(f"{prefix}/ready", model_ready),
            Route(f"{prefix}/config", model_config),
            Route(f"{prefix}/infer", infer, methods=["POST"]),
        ]
    app = Starlette(routes=routes, exception_handlers={404: _route_error, 405: _route_error})
    app.router.redirect_slashes = (
        False  # routes have no trailing slash; a redirect would lose clients that do not follow
    )
    return app


async def _route_error(request: Request, exc: Exception) -> Response:
    """No route (404) or the wrong method (405): the same JSON error shape as every other answer."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = f"no such endpoint: {request.method} {request.url.path}"
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)
