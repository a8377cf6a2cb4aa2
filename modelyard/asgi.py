"""The ASGI entry point.

``/v2`` and ``/metrics`` go to the bare Starlette data plane before Django's ASGI handler,
which would cost more per request than the model itself; the web role's probes, ``/healthz`` and
``/readyz``, go to ``modelyard.health``, and its ``/metrics`` (the registry's) to
``modelyard.metrics``; everything else goes to Django. The process role
(``MODELYARD_ROLE``: all, web or inference) decides which halves exist, and the lifespan events
start and stop the inference runtime's reconcile loop and the gRPC server (``inference/grpc/``,
on ``MODELYARD_GRPC_PORT`` unless it is 0), which serves the same data plane on this event loop.
"""

from __future__ import annotations

import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402  (after Django is set up)

from modelyard import gc_tuning, health  # noqa: E402
from modelyard import metrics as exposition  # noqa: E402

django_app: Any = None
if settings.ROLE != "inference":  # an inference process answers only /v2 and /metrics: no Django handler,
    # whose middleware (the registry's error pages, DRF) costs it 0.4 s of its cold start on a slow CPU
    from modelyard.streaming import StreamingASGIHandler

    django_app = StreamingASGIHandler()

runtime: Any = None
data_plane: Any = None
grpc_server: Any = None
if settings.ROLE in ("all", "inference"):
    from inference.app import build_app
    from inference.dataplane import DataPlane
    from inference.runtime import InferenceRuntime

    runtime = InferenceRuntime()
    plane = DataPlane(runtime)
    data_plane = build_app(runtime, plane=plane)  # its /metrics has the data plane's metrics and the GPU readings
    if settings.GRPC_PORT:
        from inference.grpc.server import GrpcServer
        from modelyard import tls

        grpc_server = GrpcServer(
            plane,
            host=settings.GRPC_HOST,
            port=settings.GRPC_PORT,
            reuse_port=settings.GRPC_REUSE_PORT,
            max_message_bytes=settings.GRPC_MAX_MESSAGE_BYTES,
            # The files `modelyard serve` checked before it started this process (HTTPS is uvicorn's).
            tls=tls.server_tls(
                settings.SSL_CERTFILE or None,
                settings.SSL_KEYFILE or None,
                settings.SSL_CA_CERTS or None,
                names=(tls.CERTFILE[1], tls.KEYFILE[1], tls.CA_CERTS[1]),
            ),
        )
web_metrics: Any = None
if settings.ROLE in ("all", "web"):
    from registry import metrics as registry_metrics

    exposition.add_collector(registry_metrics.DATABASE)  # the registry's state, read at scrape time
    web_metrics = registry_metrics.app


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # First: what exists now lives as long as the process; the runtime's threads make versions next.
            gc_tuning.tune_for_serving()
            if grpc_server is not None:
                from inference.grpc.server import GrpcUnavailable

                try:
                    await grpc_server.start()
                except GrpcUnavailable as exc:  # the server exits, saying why
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
            if runtime is not None:
                runtime.start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if grpc_server is not None:  # first, while the runtime still serves the calls in flight
                await grpc_server.stop(settings.DRAIN_TIMEOUT_SECONDS)
            if runtime is not None:
                runtime.stop()
            exposition.process_exit()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    path = scope.get("path", "")
    if path in health.PATHS and settings.ROLE != "inference" and scope["type"] == "http":
        await health.app(scope, receive, send)
    elif data_plane is not None and (path == "/v2" or path.startswith("/v2/") or path == "/metrics"):
        await data_plane(scope, receive, send)
    elif path == "/metrics" and web_metrics is not None and scope["type"] == "http":
        await web_metrics(scope, receive, send)  # the web role's: the registry's metrics
    elif settings.ROLE != "inference":  # django_app is None only in an inference process
        await django_app(scope, receive, send)
    else:
        body = b'{"error": "this process serves only /v2 (role inference)"}'
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
