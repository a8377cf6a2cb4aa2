"""The real /v2 data plane on a loopback port, serving models registered through the real services.

The ``v2`` fixture (tests/compat/conftest.py) builds one :class:`V2Server` for the whole package:
models are uploaded (``version_upload``) and validated in-process, promoted to ``production`` by a
maintainer and approved by an approver (and one served ``canary`` alias is made by an admin),
loaded by an :class:`InferenceRuntime` and served by uvicorn in a background thread, with the gRPC
server on uvicorn's event loop (as ``modelyard/asgi.py`` runs it) over the same data plane.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnxruntime as ort
from django.db import connection
from onnx import TensorProto

from inference.grpc.server import GrpcServer
from inference.loaded import LoadedVersion
from inference.runtime import InferenceRuntime
from registry import promotions, services
from registry.access import services as access
from registry.audit.chain import Actor
from registry.models import PRODUCTION, VersionStatus
from registry.uploads import LocalUpload, version_upload
from tests.support import onnx_compat
from tests.support.onnx_models import string_parsing_model

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServedModel:
    """A model the fixture registers: its versions in upload order, where its aliases point, its settings."""

    name: str
    versions: list[onnx.ModelProto]
    production: int = 1
    served_aliases: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    extras: tuple[tuple[str, bytes], ...] = ()  # files uploaded with each version, after the model


LABELS = ("cat", "dog", "fox", "owl", "yak")
MODELS = [
    ServedModel("dtypes", [onnx_compat.all_datatypes_model()]),
    ServedModel("multi", [onnx_compat.multi_io_dynamic_model()]),
    ServedModel("fixed", [onnx_compat.fixed_shape_model()]),
    ServedModel("adder", [onnx_compat.add_model(1.0), onnx_compat.add_model(2.0)], served_aliases={"canary": 2}),
    # A long queue delay makes merging of concurrent requests certain rather than likely.
    ServedModel("batchy", [onnx_compat.add_model(0.5)], settings={"max_queue_delay_us": 50_000, "max_batch_size": 64}),
    ServedModel("gated", [onnx_compat.add_model(3.0)], settings={"max_queue_size": 1}),
    # Every input has a fixed shape: its body limit is what those inputs can need, not the global one.
    ServedModel("pinned", [onnx_compat.add_model(1.0, rows=2)]),
    # Every datatype that has typed contents in gRPC (all but FP16).
    ServedModel("typed", [onnx_compat.all_datatypes_model(leave_out=("FP16",))]),
    # Scores to classify, with labels for its classes; and one BYTES element per row, for a raw binary request.
    ServedModel(
        "scores",
        [onnx_compat.identity_model("scores", TensorProto.FLOAT, width=len(LABELS))],
        extras=(("labels.txt", "\n".join(LABELS).encode() + b"\n"),),
    ),
    ServedModel("echo", [onnx_compat.identity_model("echo", TensorProto.STRING)]),
    # Triton's example clients (simple_http_infer_client.py and the others) run against this one.
    ServedModel("simple", [onnx_compat.simple_model()]),
    # Numbers as strings (Triton's simple_string): validation's synthetic "a" cannot run it, so it has a warning.
    ServedModel("strings", [string_parsing_model()]),
    # A batch that fills for a whole second: a request waiting in it counts against the queue of one.
    ServedModel(
        "slowfill",
        [onnx_compat.add_model(4.0)],
        settings={"max_queue_delay_us": 1_000_000, "max_queue_size": 1, "max_batch_size": 8},
    ),
    # A softmax over the first dimension, which is therefore no batch: validation finds that merging would change
    # its answers. The queue delay would make merging certain, as for "batchy".
    ServedModel("normalised", [onnx_compat.normalised_model()], settings={"max_queue_delay_us": 50_000}),
    # Triton's L0_infer_variable nobatch models: add/sub with every dimension dynamic and max_batch_size 0.
    *(
        ServedModel(onnx_compat.nobatch_name(case), [onnx_compat.add_sub_model(case)], settings={"max_batch_size": 0})
        for case in onnx_compat.NOBATCH_CASES
    ),
]


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class V2Server:
    """The running server, the runtime behind it, and what was registered."""

    port: int
    grpc_port: int
    runtime: InferenceRuntime
    model_bytes: dict[tuple[str, int], bytes]
    inference_token: str
    viewer_token: str
    _sessions: dict[tuple[str, int], ort.InferenceSession] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """What tritonclient takes: host:port, no scheme."""
        return f"{HOST}:{self.port}"

    @property
    def grpc_url(self) -> str:
        """What tritonclient.grpc takes."""
        return f"{HOST}:{self.grpc_port}"

    def reference(self, model: str, version: int = 1) -> ort.InferenceSession:
        """ONNX Runtime on the very bytes that were uploaded, to compare the server with."""
        key = (model, version)
        if key not in self._sessions:
            self._sessions[key] = ort.InferenceSession(self.model_bytes[key], providers=["CPUExecutionProvider"])
        return self._sessions[key]

    def expected(self, model: str, feeds: dict[str, Any], version: int = 1) -> dict[str, Any]:
        """Every output of the model, by name, from ONNX Runtime run directly."""
        session = self.reference(model, version)
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True))

    def loaded(self, model: str, ref: str | None = None) -> LoadedVersion:
        found = self.runtime.router.resolve(model, ref)
        assert found is not None, f"{model} {ref} is not loaded"
        return found

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Response:
        """One raw HTTP request on a fresh connection (nothing added that the caller did not ask for)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return Response(
                status=response.status, headers={k.lower(): v for k, v in response.getheaders()}, body=response.read()
            )
        finally:
            conn.close()

    def metrics(self) -> str:
        response = self.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.inference_token}"})
        assert response.status == 200
        return response.body.decode()


def with_grpc(app: Any, grpc_server: GrpcServer) -> Any:
    """``app`` with a lifespan that starts and stops ``grpc_server`` on the server's loop, as modelyard.asgi does."""

    async def served(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await grpc_server.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await grpc_server.stop(0)
                await send({"type": "lifespan.shutdown.complete"})
                return

    return served


def register(served: ServedModel, *, owner: Actor, approver: Actor, admin: Actor) -> dict[tuple[str, int], bytes]:
    model = services.model_create(name=served.name, description="compat test model", actor=owner)
    if served.settings:
        model = services.model_update(model=model, actor=admin, **served.settings)
    stored: dict[tuple[str, int], bytes] = {}
    for proto in served.versions:
        data = proto.SerializeToString()
        # Outside any transaction: validated in-process as soon as the version is committed.
        upload = LocalUpload([("model.onnx", data), *served.extras])
        version = version_upload(model=model, source=upload, actor=owner)
        version.refresh_from_db()
        assert version.status == VersionStatus.READY, version.errors
        stored[(model.name, version.version)] = data
    outcome = promotions.alias_set(
        model=model, alias_name=PRODUCTION, version_number=served.production, actor=owner, reason="compat"
    )
    assert outcome.promotion is not None  # production is protected: a second person approves
    promotions.promotion_approve(promotion_id=outcome.promotion.pk, actor=approver, reason="looks good")
    for alias, number in served.served_aliases.items():
        promotions.alias_update_flags(model=model, alias_name=alias, actor=admin, served=True)
        promotions.alias_set(model=model, alias_name=alias, version_number=number, actor=owner)
    return stored


def make_actor(username: str, *roles: str) -> tuple[Actor, str]:
    token, raw = access.token_create(username=username, create_user=True, roles=list(roles))
    return Actor(user=token.user, label=username), raw


def wait_loaded(runtime: InferenceRuntime, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runtime.reconcile_once()
        if runtime.status.failures:
            raise AssertionError(f"loading failed: {runtime.status.failures}")
        if len(runtime.loaded) == expected and not runtime.status.loading:
            return
        time.sleep(0.05)
    raise AssertionError(f"only {len(runtime.loaded)} of {expected} versions loaded in {timeout}s")


def terminate_stray_backends() -> None:
    """Close PostgreSQL sessions that server threads opened (token checks run in worker threads).

    The test database cannot be flushed or dropped while they stay open. Only sessions of this
    test database, other than our own, are ended.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
