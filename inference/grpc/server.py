"""The gRPC server: ``inference.GRPCInferenceService`` over the same :class:`DataPlane` as the /v2 REST endpoints.

Each RPC decodes its message (``inference.grpc.codec``), calls the data plane and encodes the
answer; every refusal is a domain error of ``inference.errors``, turned into a status code by the
one table below (as ``inference.errors.HTTP_STATUS`` turns them into HTTP statuses). An inference
call is let in by :meth:`DataPlane.admit`, as a /v2 request is, and counted in the same metrics.
It runs with ``grpc.aio`` on the event loop that serves /v2, so both transports share each
version's batcher.

- The bearer token travels as ``authorization`` metadata (``Bearer <token>``), checked as /v2 checks it.
- A message larger than ``MODELYARD_GRPC_MAX_MESSAGE_BYTES`` is refused by gRPC itself with
  ``RESOURCE_EXHAUSTED`` ("Received message larger than max"), before it reaches the servicer.
- A client's deadline bounds its request's time in the batcher's queue (``DEADLINE_EXCEEDED``), and
  a call the client cancels is dropped from the queue.
- ``ModelStreamInfer`` runs up to ``MODELYARD_GRPC_STREAM_CONCURRENCY`` requests of one stream at
  once and answers each as it completes, a request holding its place until its answer is written (so
  a client that does not read is held back); a refused request answers with ``error_message`` and
  the stream goes on.
- Retryable refusals carry ``retry-after`` trailing metadata (seconds), as REST's ``Retry-After``.
- A message that does not parse is ``INVALID_ARGUMENT`` (in a stream, an ``error_message``) with one
  INFO log line, after the token check (``add_to_server``, ``inference.grpc.codec.Malformed``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from django.conf import settings

from inference.dataplane import OUT_OF_MEMORY, DataPlane
from inference.errors import (
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    DeviceFailed,
    Forbidden,
    InferenceError,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    Overloaded,
    RateLimited,
    RegionExists,
    RegionLimit,
    RegionNotFound,
    RepositoryReadOnly,
    RequestTimeout,
    Unauthorised,
    Unsupported,
    UnsupportedEncoding,
    outcome_status,
)
from inference.grpc import grpc_service_pb2 as pb
from inference.grpc import grpc_service_pb2_grpc as pb_grpc
from inference.grpc.codec import Malformed, decode_infer_request, encode_infer_response, message_from_json, parser
from modelyard.tls import ServerTLS
from registry import serving

__all__ = ["STATUS", "GrpcServer", "GrpcUnavailable", "InferenceServicer", "add_to_server", "status_for"]

logger = logging.getLogger(__name__)

# Each domain error's status code, and whether the answer says when to retry (retry-after metadata).
STATUS: dict[type[InferenceError], tuple[grpc.StatusCode, bool]] = {
    InvalidInput: (grpc.StatusCode.INVALID_ARGUMENT, False),
    InferenceFailed: (grpc.StatusCode.INVALID_ARGUMENT, False),
    UnsupportedEncoding: (grpc.StatusCode.INVALID_ARGUMENT, False),
    RepositoryReadOnly: (grpc.StatusCode.FAILED_PRECONDITION, False),
    Unsupported: (grpc.StatusCode.UNIMPLEMENTED, False),
    RegionExists: (grpc.StatusCode.ALREADY_EXISTS, False),
    RegionLimit: (grpc.StatusCode.RESOURCE_EXHAUSTED, False),
    RegionNotFound: (grpc.StatusCode.NOT_FOUND, False),
    Unauthorised: (grpc.StatusCode.UNAUTHENTICATED, False),
    Forbidden: (grpc.StatusCode.PERMISSION_DENIED, False),
    ModelNotFound: (grpc.StatusCode.NOT_FOUND, False),
    BodyTooLarge: (grpc.StatusCode.RESOURCE_EXHAUSTED, False),
    RateLimited: (grpc.StatusCode.RESOURCE_EXHAUSTED, True),
    ClientGone: (grpc.StatusCode.CANCELLED, False),
    ModelNotReady: (grpc.StatusCode.UNAVAILABLE, True),
    Overloaded: (grpc.StatusCode.UNAVAILABLE, True),
    OutOfMemory: (grpc.StatusCode.UNAVAILABLE, True),
    DeviceFailed: (grpc.StatusCode.INTERNAL, False),
    BodyTimeout: (grpc.StatusCode.DEADLINE_EXCEEDED, False),
    RequestTimeout: (grpc.StatusCode.DEADLINE_EXCEEDED, False),
}


def status_for(exc: InferenceError) -> tuple[grpc.StatusCode, bool]:
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


class GrpcUnavailable(RuntimeError):
    """The gRPC server could not start (its port is taken, or its address is not this host's)."""


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for item in context.invocation_metadata() or ():
        if item.key == key:
            value = item.value
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return ""


def _peer_address(context: grpc.aio.ServicerContext) -> str:
    """``ipv4:10.0.0.7:51234`` or ``ipv6:[::1]:51234`` -> the address alone."""
    peer = context.peer() or ""
    address = peer.split(":", 1)[1] if ":" in peer else peer
    address = address.rsplit(":", 1)[0] if ":" in address else address
    return address.strip("[]")


def _bearer(context: grpc.aio.ServicerContext) -> str:
    """The call's bearer token (``authorization`` metadata), or ""."""
    return serving.bearer_token(_metadata(context, "authorization")) or ""


def _client_address(context: grpc.aio.ServicerContext) -> str:
    """The client's address: the peer's, or the one a trusted proxy forwarded (``serving.caller_address``)."""
    return serving.caller_address(_peer_address(context), _metadata(context, "x-forwarded-for"))


def _routing_key(context: grpc.aio.ServicerContext) -> str:
    """The ``modelyard-routing-key`` metadata: calls with the same key land on the same side of a rollout."""
    return _metadata(context, "modelyard-routing-key")


Rpc = Callable[[Any, Any], Awaitable[Any]]
OPEN_RPCS = frozenset({"ServerLive", "ServerReady", "ServerMetadata"})  # health and server metadata need no token


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The RPCs of ``inference.GRPCInferenceService``, a few lines each around the data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def checked(self, name: str) -> Rpc:
        """The unary RPC ``name``, which refuses a :class:`Malformed` request before it runs."""
        rpc: Rpc = getattr(self, name)

        async def checked_rpc(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Malformed):
                await self._refuse_malformed(name, request, context)
            return await rpc(request, context)

        return checked_rpc

    async def _refuse_malformed(self, name: str, request: Malformed, context: grpc.aio.ServicerContext) -> NoReturn:
        """The token first, as for any request (a stranger's garbage is refused without a log line); then one line."""
        try:
            if name not in OPEN_RPCS:
                await self._authorise(context)
        except InferenceError as exc:
            await self._refuse(context, exc)
        logger.info("gRPC %s from %s: %s", name, context.peer(), request.message)
        await self._refuse(context, InvalidInput(request.message))

    async def _refuse(self, context: grpc.aio.ServicerContext, exc: InferenceError) -> NoReturn:
        code, retry = status_for(exc)
        if retry:
            seconds = str(exc.retry_after) if isinstance(exc, RateLimited) else "1"
            context.set_trailing_metadata((("retry-after", seconds),))
        await context.abort(code, exc.message)  # raises grpc.aio.AbortError, which ends the call
        raise AssertionError("context.abort() returned")

    async def _authorise(
        self, context: grpc.aio.ServicerContext, model: str | None = None
    ) -> serving.TokenGrant | None:
        """The token's verdict (on ``model``, when named): PERMISSION_DENIED for a valid token without the
        role or the model, UNAUTHENTICATED only without a valid one."""
        return await self.plane.authorise(_bearer(context) if self.plane.needs_token else "", model)

    # --- server --------------------------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        metadata = self.plane.server_metadata()
        return pb.ServerMetadataResponse(
            name=metadata["name"], version=metadata["version"], extensions=metadata["extensions"]
        )

    # --- models --------------------------------------------------------------------------------

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:
            await self._authorise(context, request.name)
            self.plane.model_ready(request.name, request.version or None)
        except (ModelNotFound, ModelNotReady):
            return pb.ModelReadyResponse(ready=False)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        try:
            await self._authorise(context, request.name)
            metadata = self.plane.model_metadata(request.name, request.version or None)
        except InferenceError as exc:
            await self._refuse(context, exc)
        tensors = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=metadata["name"],
            versions=metadata["versions"],
            platform=metadata["platform"],
            inputs=[
                tensors(name=t["name"], datatype=t["datatype"], shape=t.get("shape") or []) for t in metadata["inputs"]
            ],
            outputs=[
                tensors(name=t["name"], datatype=t["datatype"], shape=t.get("shape") or []) for t in metadata["outputs"]
            ],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        try:
            await self._authorise(context, request.name)
            config = self.plane.model_config(request.name, request.version or None)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.ModelConfigResponse(config=message_from_json(config, pb.ModelConfig()))

    # --- inference -----------------------------------------------------------------------------

    async def _infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """One inference call, admitted and counted by the data plane as /v2 requests are over HTTP.

        The ``status`` label is the HTTP status the same outcome has over REST (200, or the error's
        ``inference.errors.HTTP_STATUS``; a cancelled call 499), so one query covers both transports.
        """
        plane = self.plane
        model, ref = request.model_name, request.model_version or None
        admitted = await plane.admit(
            model, ref, context, token=_bearer, address=_client_address, routing_key=_routing_key
        )
        status = 200
        try:
            try:
                decoded = decode_infer_request(
                    request,
                    admitted.loaded.spec.signature,
                    regions=lambda: plane.client_regions(_bearer(context)),  # asked only when a tensor names one
                )
            except MemoryError:
                raise OutOfMemory(OUT_OF_MEMORY) from None
            decoded.klass = admitted.klass  # the token's priority class, ahead of the request's priority
            remaining = context.time_remaining()
            if remaining is not None:  # nobody waits past the client's deadline: neither need the queue
                deadline_us = max(1, int(remaining * 1e6))
                decoded.timeout_us = min(decoded.timeout_us or deadline_us, deadline_us)
            result = await plane.infer(model, ref, decoded, draw=admitted.draw)
            return encode_infer_response(result, decoded)
        except BaseException as exc:
            status = outcome_status(exc)
            raise
        finally:
            admitted.answered(status)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        try:
            return await self._infer(request, context)
        except InferenceError as exc:
            await self._refuse(context, exc)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Up to ``MODELYARD_GRPC_STREAM_CONCURRENCY`` requests at once, each answered as it completes.

        A request holds its place until its answer is written, not only until it is computed: a
        client that does not read its answers stops the stream taking requests (HTTP/2 flow control
        then holds the client back), so the answers held per stream are bounded by the setting.
        """
        try:
            await self._authorise(context)
        except InferenceError as exc:
            await self._refuse(context, exc)
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(settings.GRPC_STREAM_CONCURRENCY)

        async def one(request: pb.ModelInferRequest | Malformed) -> None:
            try:
                if isinstance(request, Malformed):  # answered in the stream, which goes on
                    logger.info("gRPC ModelStreamInfer from %s: %s", context.peer(), request.message)
                    raise InvalidInput(request.message)
                answer = pb.ModelStreamInferResponse(infer_response=await self._infer(request, context))
            except InferenceError as exc:
                answer = pb.ModelStreamInferResponse(
                    error_message=exc.message,
                    infer_response=pb.ModelInferResponse(id="" if isinstance(request, Malformed) else request.id),
                )
            except BaseException:
                slots.release()  # no answer will be written for it
                raise
            answers.put_nowait(answer)  # its place is freed once the answer is written, below

        async def read() -> None:
            running: set[asyncio.Task[None]] = set()
            try:
                async for request in request_iterator:
                    await slots.acquire()  # at most so many computing or waiting to be written
                    task = asyncio.ensure_future(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.gather(*running)
            finally:
                for task in running:
                    task.cancel()
                answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer  # returns once gRPC has taken it, which waits for the client's flow control
                slots.release()
            await reader  # raises what broke the reading, if anything
        finally:
            reader.cancel()

    # --- extensions ----------------------------------------------------------------------------

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        try:
            grant = await self._authorise(context, request.name or None)
            statistics = self.plane.statistics(request.name or None, request.version or None, within=grant)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return message_from_json(statistics, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        try:
            grant = await self._authorise(context)
        except InferenceError as exc:
            await self._refuse(context, exc)
        models = self.plane.repository_index(ready_only=request.ready, within=grant)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**item) for item in models])

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        try:
            await self._authorise(context, request.model_name)
            self.plane.repository_control(request.model_name, "load")
        except InferenceError as exc:
            await self._refuse(context, exc)

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        try:
            await self._authorise(context, request.model_name)
            self.plane.repository_control(request.model_name, "unload")
        except InferenceError as exc:
            await self._refuse(context, exc)

    # --- shared memory -----------------------------------------------------------------------------

    async def _token(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's token once it is judged (the key of its shared memory regions); "" when /v2 is public."""
        token = _bearer(context) if self.plane.needs_token else ""
        await self.plane.authorise(token)
        return token

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        try:
            regions = self.plane.shared_memory_status(await self._token(context), request.name or None)
        except InferenceError as exc:
            await self._refuse(context, exc)
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: status(**r) for r in regions})

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        try:
            token = await self._token(context)
            self.plane.shared_memory_register(token, request.name, request.key, request.offset, request.byte_size)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        try:
            self.plane.shared_memory_unregister(await self._token(context), request.name or None)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        try:
            await self._token(context)
            self.plane.cuda_shared_memory("status", request.name or None)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        try:
            await self._token(context)
            self.plane.cuda_shared_memory("register", request.name)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        try:
            await self._token(context)
            self.plane.cuda_shared_memory("unregister", request.name or None)
        except InferenceError as exc:
            await self._refuse(context, exc)
        return pb.CudaSharedMemoryUnregisterResponse()


class GrpcServer:
    """``grpc.aio`` serving :class:`InferenceServicer` on one address; started and stopped on the serving loop.

    ``reuse_port``: bind with SO_REUSEPORT, so that every worker process of one ``modelyard serve
    --workers N`` serves the port and the kernel spreads connections among them. Without it the
    port is this process's alone, and a port already taken stops the start instead of sharing it.
    ``tls``: serve over TLS with ``modelyard serve``'s certificate, requiring client certificates when it names CAs.
    """

    def __init__(
        self,
        plane: DataPlane,
        *,
        host: str,
        port: int,
        reuse_port: bool,
        max_message_bytes: int,
        tls: ServerTLS | None = None,
    ) -> None:
        self.plane = plane
        self.tls = tls
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.reuse_port = reuse_port
        self.max_message_bytes = max_message_bytes
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen and serve; returns the port (the one the system chose for port 0). Raises :class:`GrpcUnavailable`."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1 if self.reuse_port else 0),
            ]
        )
        add_to_server(InferenceServicer(self.plane), server)
        try:
            if self.tls is None:
                port = server.add_insecure_port(self.address)
            else:
                credentials = grpc.ssl_server_credentials(
                    [(self.tls.private_key, self.tls.certificate_chain)],
                    root_certificates=self.tls.client_ca,
                    require_client_auth=self.tls.client_certificates_required,
                )
                port = server.add_secure_port(self.address, credentials)
        except RuntimeError:
            port = 0
        if not port:
            raise GrpcUnavailable(
                f"gRPC cannot listen on {self.address} (MODELYARD_GRPC_PORT, modelyard serve --grpc-port): "
                "the port is taken or the address is not this host's; 0 turns gRPC off"
            )
        await server.start()
        self._server, self.port = server, port
        logger.info(
            "gRPC (inference.GRPCInferenceService)%s on %s",
            "" if self.tls is None else " over TLS",
            self.address.rsplit(":", 1)[0] + f":{port}",
        )
        return port

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking calls; calls in flight get ``grace`` seconds to finish."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer`` as the generated ``add_GRPCInferenceServiceServicer_to_server`` would, but with
    request deserializers that never raise: a message that does not parse reaches the servicer as
    :class:`Malformed` (a unary RPC refuses it in :meth:`InferenceServicer.checked`, the stream answers it).
    """
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in service.methods:
        parse = parser(getattr(pb, method.input_type.name))
        serialize = getattr(pb, method.output_type.name).SerializeToString
        if method.client_streaming and method.server_streaming:
            stream = getattr(servicer, method.name)
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(stream, parse, serialize)
        elif not method.client_streaming and not method.server_streaming:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(servicer.checked(method.name), parse, serialize)
        else:
            raise TypeError(f"{method.full_name}: only unary and bidirectional-stream RPCs are served")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
