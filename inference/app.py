"""The /v2 REST endpoints: the Open Inference Protocol (KServe v2) with Triton's extensions.

Binary tensors (and the raw binary request), model configuration, statistics, classification, the
model repository's index and system shared memory (when turned on); ``inference/grpc/`` serves the
same data plane over gRPC.

A bare Starlette app over :class:`inference.dataplane.DataPlane`, behind one direct path: ``POST
.../infer``, the request nearly every client sends, goes straight to its endpoint without the router and
Starlette's middleware (:func:`infer_route`); everything else is routed. Each endpoint decodes the HTTP
request, calls the data plane and encodes its answer; every refusal is a domain error of
``inference.errors``, turned into a status by its one table (``inference.errors.HTTP_STATUS``). An
inference request is let in (or refused) by :meth:`DataPlane.admit` before its body is read, and
counted in the metrics through the :class:`Admission` it returns. ``{m}`` alone means the
``production`` alias; ``{v}`` is a version number or the name of a served alias.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from inference import metrics
from inference.dataplane import OUT_OF_MEMORY, Admission, DataPlane
from inference.errors import (
    BodyTimeout,
    ClientGone,
    InferenceError,
    InvalidInput,
    OutOfMemory,
    RateLimited,
    Unauthorised,
    http_status,
)
from inference.protocol import (
    HEADER_LENGTH,
    NESTED_TOO_DEEPLY,
    BodyDecoder,
    BodyLimit,
    decode_request,
    encode_response,
)
from inference.runtime import InferenceRuntime
from modelyard import metrics as exposition
from registry import serving

__all__ = ["OUT_OF_MEMORY", "build_app", "error_response", "infer_route", "read_body"]

logger = logging.getLogger(__name__)

METRICS_NEEDS_TOKEN = exposition.NEEDS_TOKEN  # the web role's /metrics says the same


def error_response(exc: InferenceError, *, close: bool = False) -> Response:
    """The answer to a domain error: ``{"error": message}`` with its status.

    ``close`` ends the connection after it, for a request whose body was not read to its end. A
    client that went away gets a bare 499 (nobody reads it; the status is for the logs and metrics).
    """
    status, retry = http_status(exc)
    if status == 499:
        return Response(status_code=499)
    headers = {}
    if retry:
        headers["Retry-After"] = str(exc.retry_after) if isinstance(exc, RateLimited) else "1"
    if close:
        headers["Connection"] = "close"
    return JSONResponse({"error": exc.message}, status_code=status, headers=headers or None)


def bearer(request: Request) -> str:
    """The request's bearer token, or ""."""
    return serving.bearer_token(request.headers.get("authorization", "")) or ""


def client_address(request: Request) -> str:
    """The client's address: the peer's, or the one a trusted proxy forwarded (``serving.caller_address``)."""
    client = request.scope.get("client")  # not request.client, which builds an object on every call
    return serving.caller_address(client[0] if client else "", request.headers.get("x-forwarded-for", ""))


ROUTING_KEY_HEADER = "modelyard-routing-key"


def routing_key(request: Request) -> str:
    """The ``Modelyard-Routing-Key`` header: requests with the same key land on the same side of a rollout."""
    return request.headers.get(ROUTING_KEY_HEADER, "")


async def read_body(request: Request, limit: BodyLimit) -> bytearray:
    """The request body, decompressed, never past ``limit``, and ended when the client stalls."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit.bytes:
        raise limit.exceeded("the request body")
    decoder = BodyDecoder(request.headers.get("content-encoding", ""), limit)
    idle = settings.BODY_IDLE_TIMEOUT_SECONDS
    while True:
        try:
            async with asyncio.timeout(idle):  # a timer, not the task that wait_for would make for each read
                message = await request.receive()
        except TimeoutError:
            raise BodyTimeout(
                f"no request body bytes arrived for {idle:g} s (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)"
            ) from None
        if message["type"] == "http.disconnect":
            logger.info("the client of %s disconnected before its request body was complete", request.url.path)
            raise ClientGone("the client disconnected before its request body was complete")
        decoder.feed(message.get("body", b""))
        if not message.get("more_body", False):
            return decoder.finish()


async def _client_gone(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


_MODEL_PREFIXES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
# The infer routes' own patterns, compiled as Starlette compiles the routes below (string parameters).
_INFER_PATTERNS = tuple(compile_path(f"{prefix}/infer")[0] for prefix in _MODEL_PREFIXES)


def infer_route(path: str) -> dict[str, str] | None:
    """The path parameters of ``/v2/models/{model}[/versions/{version}]/infer``, as the router would give them;
    None for any other path."""
    for pattern in _INFER_PATTERNS:
        match = pattern.match(path)
        if match is not None:
            return match.groupdict()
    return None


def build_app(runtime: InferenceRuntime, *, plane: DataPlane | None = None) -> ASGIApp:
    plane = plane or DataPlane(runtime)

    # --- server --------------------------------------------------------------------------------

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(plane.server_metadata())

    async def live(request: Request) -> Response:
        return JSONResponse({"live": plane.live()})

    async def ready(request: Request) -> Response:
        is_ready = plane.ready()
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    # --- models --------------------------------------------------------------------------------

    def model_endpoint(answer: Callable[[str, str | None], dict[str, Any]]) -> Callable[[Request], Awaitable[Response]]:
        """Check the token, then answer for ``{m}[/versions/{v}]`` with one data plane call."""

        async def endpoint(request: Request) -> Response:
            try:
                model = request.path_params["model"]
                await plane.authorise(bearer(request) if plane.needs_token else "", model)
                return JSONResponse(answer(model, request.path_params.get("version")))
            except InferenceError as exc:
                return error_response(exc)

        return endpoint

    # --- inference -----------------------------------------------------------------------------

    async def infer(request: Request) -> Response:
        params = request.path_params
        model, ref = params["model"], params.get("version")
        try:  # everything that can refuse the request does so before its body is read
            admitted = await plane.admit(
                model, ref, request, token=bearer, address=client_address, routing_key=routing_key
            )
        except InferenceError as exc:
            return error_response(exc, close=True)  # counted by the admission
        try:
            response = await _answer(request, model, ref, admitted)
        except MemoryError:
            response = error_response(OutOfMemory(OUT_OF_MEMORY))
        except RecursionError:  # e.g. an error message that quotes a deeply nested value
            response = error_response(InvalidInput(NESTED_TOO_DEEPLY))
        admitted.answered(response.status_code)
        return response

    async def _answer(request: Request, model: str, ref: str | None, admitted: Admission) -> Response:
        try:
            body = await read_body(request, admitted.body_limit)
        except InferenceError as exc:
            return error_response(exc, close=True)
        try:
            spec = admitted.loaded.spec
            decoded = decode_request(
                body,
                request.headers.get(HEADER_LENGTH),
                spec.signature,
                model=spec.model,
                regions=lambda: plane.client_regions(bearer(request)),  # asked only by a request that names one
            )
            decoded.klass = admitted.klass
            result = await plane.infer(model, ref, decoded, client_gone=_client_gone(request), draw=admitted.draw)
            payload, headers = encode_response(  # may write outputs to shared memory, which may refuse
                model=result.model, version=result.version, request=decoded, values=result.outputs, cached=result.cached
            )
        except InferenceError as exc:
            return error_response(exc)
        return Response(payload, headers=headers)

    # --- extensions ----------------------------------------------------------------------------

    async def statistics(request: Request) -> Response:
        try:
            model = request.path_params.get("model")
            grant = await plane.authorise(bearer(request) if plane.needs_token else "", model)
            return JSONResponse(plane.statistics(model, request.path_params.get("version"), within=grant))
        except InferenceError as exc:
            return error_response(exc)

    async def repository_index(request: Request) -> Response:
        try:
            grant = await plane.authorise(bearer(request) if plane.needs_token else "")
            limit = BodyLimit(settings.MAX_REQUEST_BODY_BYTES, "MODELYARD_MAX_REQUEST_BODY_BYTES")
            body = await read_body(request, limit)
            ready = _ready_only(bytes(body))
            return JSONResponse(plane.repository_index(ready_only=ready, within=grant))
        except InferenceError as exc:
            return error_response(exc)

    def repository_control(action: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                model = request.path_params["model"]
                await plane.authorise(bearer(request) if plane.needs_token else "", model)
                plane.repository_control(model, action)
            except InferenceError as exc:
                return error_response(exc)

        return endpoint

    def shared_memory(action: str) -> Callable[[Request], Awaitable[Response]]:
        """Triton's system shared memory: the caller's regions' ``status``, ``register`` and ``unregister``."""

        async def endpoint(request: Request) -> Response:
            try:
                token = bearer(request) if plane.needs_token else ""
                await plane.authorise(token)
                name = request.path_params.get("name")
                if action == "status":
                    return JSONResponse(plane.shared_memory_status(token, name))
                if action == "register":
                    limit = BodyLimit(settings.MAX_REQUEST_BODY_BYTES, "MODELYARD_MAX_REQUEST_BODY_BYTES")
                    key, offset, byte_size = _register_request(bytes(await read_body(request, limit)))
                    plane.shared_memory_register(token, name, key, offset, byte_size)
                else:
                    plane.shared_memory_unregister(token, name)
                return Response()
            except InferenceError as exc:
                return error_response(exc)

        return endpoint

    def cuda_shared_memory(action: str) -> Callable[[Request], Awaitable[Response]]:
        """CUDA shared memory is not served: no regions, nothing to unregister, and registering refused."""

        async def endpoint(request: Request) -> Response:
            try:
                await plane.authorise(bearer(request) if plane.needs_token else "")
                regions = plane.cuda_shared_memory(action, request.path_params.get("name"))
            except InferenceError as exc:
                return error_response(exc)
            return JSONResponse(regions) if action == "status" else Response()

        return endpoint

    # --- metrics -------------------------------------------------------------------------------

    async def prometheus(request: Request) -> Response:
        if not settings.METRICS_PUBLIC and not await plane.token_allowed(bearer(request)):
            return error_response(Unauthorised(METRICS_NEEDS_TOKEN))
        for loaded, queued in plane.queue_depths():  # this process's own, fresh; the others' as they last set them
            loaded.metrics.queue_depth(queued)
        metrics.class_queue_depths(runtime.queued_by_class())
        payload, content_type = await asyncio.to_thread(metrics.render)
        return Response(payload, media_type=content_type)

    model_metadata = model_endpoint(plane.model_metadata)
    model_ready = model_endpoint(plane.model_ready)
    model_config = model_endpoint(plane.model_config)
    # POST .../infer never reaches the router (``app`` below): these routes answer its other methods, 405.
    routes = [Route(f"{prefix}/infer", infer, methods=["POST"]) for prefix in _MODEL_PREFIXES]
    routes += [
        Route("/v2", server_metadata),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/metrics", prometheus),
        # Before /v2/models/{model}, which would take "stats" for a model's name.
        Route("/v2/models/stats", statistics),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", repository_control("load"), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", repository_control("unload"), methods=["POST"]),
    ]
    for kind, endpoint in (("systemsharedmemory", shared_memory), ("cudasharedmemory", cuda_shared_memory)):
        routes += [
            Route(f"/v2/{kind}/status", endpoint("status")),
            Route(f"/v2/{kind}/region/{{name}}/status", endpoint("status")),
            Route(f"/v2/{kind}/region/{{name}}/register", endpoint("register"), methods=["POST"]),
            Route(f"/v2/{kind}/unregister", endpoint("unregister"), methods=["POST"]),
            Route(f"/v2/{kind}/region/{{name}}/unregister", endpoint("unregister"), methods=["POST"]),
        ]
    for prefix in _MODEL_PREFIXES:
        routes += [
            Route(prefix, model_metadata),
            Route(f"{prefix}/ready", model_ready),
            Route(f"{prefix}/config", model_config),
            Route(f"{prefix}/stats", statistics),
        ]
    routed = Starlette(routes=routes, exception_handlers={404: _route_error, 405: _route_error})
    # Routes have no trailing slash; a redirect would lose clients that do not follow it.
    routed.router.redirect_slashes = False

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        """``POST .../infer`` straight to :func:`infer`; everything else (lifespan included) to the router.

        The router and Starlette's two middlewares cost a single client's request about 0.04 ms of the event
        loop (``docs/development/benchmarks.md``) and add nothing to it: :func:`infer` answers every domain
        error itself, and an exception it does not expect reaches uvicorn, which logs it and answers 500 as
        Starlette's error middleware would.
        """
        if scope["type"] == "http" and scope["method"] == "POST":
            params = infer_route(scope["path"])
            if params is not None:
                scope["path_params"] = params
                response = await infer(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await routed(scope, receive, send)

    return app


def _ready_only(body: bytes) -> bool:
    """The repository index request's ``{"ready": true}`` (an empty body asks for everything)."""
    if not body.strip():
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidInput('the repository index request must be a JSON object, such as {"ready": true}') from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("ready", False), bool):
        raise InvalidInput("the repository index request must be a JSON object whose 'ready' is true or false")
    return bool(parsed.get("ready", False))


def _register_request(body: bytes) -> tuple[Any, Any, Any]:
    """The key, offset and byte size of a system shared memory register request (checked by the data plane)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict) or "key" not in parsed or "byte_size" not in parsed:
        raise InvalidInput(
            'the register request must be a JSON object such as {"key": "/input_simple", "offset": 0, "byte_size": 64}'
        )
    return parsed["key"], parsed.get("offset", 0), parsed["byte_size"]


async def _route_error(request: Request, exc: Exception) -> Response:
    """No route (404) or the wrong method (405): the same JSON error shape as every other answer."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = f"no such endpoint: {request.method} {request.url.path}"
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)
