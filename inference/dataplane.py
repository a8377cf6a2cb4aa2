"""The data plane of the Open Inference Protocol, with no transport in it.

``DataPlane`` answers what a protocol asks (server and model metadata, readiness, model
configuration, inference) from the runtime's in-memory routing table, never the database per
request. It takes decoded requests and returns plain results; when it cannot answer it raises an
error of ``inference.errors``. The REST endpoints of ``inference/app.py`` are a few lines each
around it (decode, call, encode), and a gRPC server calls the same methods.

What a transport must refuse before it reads an inference request's body is here too, in one
place: :meth:`DataPlane.admit` checks the token, the rate limit and the route, sets the body limit,
and counts the request's outcome in the metrics (:class:`Admission`), so that every transport
refuses the same way, in the same order, and is counted under the same labels. So are Triton's
extensions that both transports serve: statistics (counted per loaded version,
``inference/statistics.py``), classification (``inference/classification.py``), the model
repository's index, and system shared memory when it is turned on (``inference/shared_memory.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn, TypeVar

import anyio
import numpy as np
from django.conf import settings

from inference import metrics
from inference.auth import TokenCache, token_key
from inference.batcher import CLASS_HIGH, CLASS_LOW, CLASS_NAMES, CLASS_NORMAL
from inference.classification import classify
from inference.errors import (
    ClientGone,
    Forbidden,
    InferenceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    Overloaded,
    RateLimited,
    RegionNotFound,
    RepositoryReadOnly,
    RequestTimeout,
    Unauthorised,
    Unsupported,
    outcome_status,
    run_failure,
)
from inference.loaded import LoadedVersion, NotLoaded
from inference.protocol import BodyLimit, InferRequest, InferResult
from inference.runtime import InferenceRuntime
from inference.sessions import GPU_PROVIDERS
from inference.shared_memory import ANONYMOUS, Region, SharedMemory
from inference.text import TEXT_INPUT
from inference.throttle import Throttle, retry_after
from registry.serving import REFUSED_GRANT, InferenceAccess, TokenGrant

PLATFORM = "onnxruntime_onnx"
# Only what is served: the repository extension's index answers, its load and unload refuse (models
# are loaded by promotion), and there is no CUDA shared memory, sequence batching, tracing or logging.
# System shared memory is added when it is turned on (MODELYARD_SHARED_MEMORY).
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
]
NEEDS_TOKEN = "a bearer token with the inference role is required"
NEEDS_ROLE = (
    "inference needs the inference or admin role, and this token carries neither (a token carries the roles it "
    "names that its user holds): create one with `modelyard createtoken USER --only-role inference`"
)
SHARED_MEMORY_OFF = (
    "system shared memory is turned off on this server: it serves /v2/systemsharedmemory and tensors in shared "
    "memory regions only with MODELYARD_SHARED_MEMORY=true"
)
CUDA_SHARED_MEMORY = (
    "CUDA shared memory is not served by Modelyard: pass tensors in the request, or in system shared memory "
    "(/v2/systemsharedmemory, with MODELYARD_SHARED_MEMORY=true)"
)
OUT_OF_MEMORY = "the server has not enough memory for this request now; retry later or send a smaller one"
RELOADING = "the model is being reloaded; retry"
# The repository index's states, as Triton names them, for each load state of the fleet report.
REPOSITORY_STATES = {"ready": "READY", "loading": "LOADING", "failed": "UNAVAILABLE", "draining": "UNLOADING"}
TOKEN_CLASSES = CLASS_NAMES[CLASS_HIGH : CLASS_LOW + 1]  # a token's priority classes, as the batcher names them
ATTEMPTS = 3  # routes taken in turn when a version is swapped out between resolving and acquiring it

_TRITON_TYPES = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL"}

Call = TypeVar("Call")  # what a transport hands :meth:`DataPlane.admit`: an HTTP request, a gRPC call's context


class Admission:
    """An inference request let in before its body was read: the version it routes to, its body limit and
    its priority class (the token's; the transport copies it to the decoded request's ``klass``).

    It counts the request once, when the transport knows how it ended (:meth:`answered`), under that
    version's labels and the time since :meth:`DataPlane.admit` began.
    """

    __slots__ = ("body_limit", "draw", "klass", "loaded", "started")

    def __init__(
        self,
        loaded: LoadedVersion,
        body_limit: BodyLimit,
        started: float,
        draw: float | None = None,
        klass: int = CLASS_NORMAL,
    ) -> None:
        self.loaded = loaded
        self.body_limit = body_limit
        self.started = started
        self.draw = draw  # where the request falls in a rollout's split of its alias (None: no split)
        self.klass = klass  # inference.batcher.CLASS_*: normal without a token (/v2 public)

    def answered(self, status: int) -> None:
        """Count the request as answered with the HTTP ``status`` (a gRPC call: the status of its outcome over REST)."""
        self.loaded.metrics.answered(status, time.perf_counter() - self.started)


def _server_version() -> str:
    try:
        return version("modelyard")
    except PackageNotFoundError:
        return "0"


def _config_tensor(spec: dict[str, Any], batched: bool) -> dict[str, Any]:
    shape = spec.get("shape") or []
    datatype = spec["datatype"]
    return {
        "name": spec["name"],
        "data_type": _TRITON_TYPES.get(datatype, f"TYPE_{datatype}"),
        "dims": shape[1:] if batched else shape,
    }


def served_inputs(signature: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's inputs, then ``text`` (BYTES) when the version has a tokenizer: what a client may send."""
    inputs = list(signature.get("inputs", []))
    text = signature.get("text")
    if text is not None:
        inputs.append({"name": text["name"], "datatype": text["datatype"], "shape": text["shape"]})
    return inputs


def _judge(grant: TokenGrant, model: str | None = None) -> None:
    """:class:`Unauthorised` for a refused token; :class:`Forbidden` for a valid one without the inference
    role, or limited to models other than ``model``."""
    access = grant.on(model)
    if access is InferenceAccess.REFUSED:
        raise Unauthorised(NEEDS_TOKEN)
    if access is InferenceAccess.NO_ROLE:
        raise Forbidden(NEEDS_ROLE)
    if access is InferenceAccess.NO_MODEL and model is not None:
        raise Forbidden(grant.refusal(model))


def priority_class(grant: TokenGrant) -> int:
    """The batcher's class (``inference.batcher.CLASS_*``) for a token's priority class (high, normal, low).

    Anything else, ``job`` included (the class of asynchronous jobs' chunks, never a token's), is normal.
    """
    if grant.priority in TOKEN_CLASSES:
        return CLASS_NAMES.index(grant.priority)
    return CLASS_NORMAL


def routing_draw(key: str) -> float:
    """Where a request falls in [0, 1) for a rollout's split: fixed by its routing key, random without one.

    The same key always draws the same number, so a client that sends one stays on one version while
    the split holds, and stays on the candidate as its share grows.
    """
    if not key:
        return random.random()
    digest = hashlib.blake2b(key.encode(errors="surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _discard(awaitable: Coroutine[Any, Any, object] | None) -> None:
    if awaitable is not None:
        awaitable.close()  # never started: close it, so that it is not reported as never awaited


class DataPlane:
    """Server and model endpoints of the Open Inference Protocol over one :class:`InferenceRuntime`."""

    def __init__(self, runtime: InferenceRuntime, *, tokens: TokenCache | None = None) -> None:
        self.runtime = runtime
        self.tokens = tokens if tokens is not None else TokenCache()
        self._throttle: Throttle | None = None
        self.shared_memory = SharedMemory()  # this process's registered regions, by client
        runtime.shadows.attach(self._shadow_run)

    # --- refusals before a request body is read ----------------------------------------------------

    async def token_grant(self, token: str) -> TokenGrant:
        """What a bearer token may do here, on which models; cached, see ``inference.auth``."""
        if not token:
            return REFUSED_GRANT
        grant = self.tokens.cached_grant(token)
        if grant is None:
            grant = await anyio.to_thread.run_sync(self.tokens.check_grant, token)
        return grant

    async def token_access(self, token: str, model: str | None = None) -> InferenceAccess:
        """What a bearer token may do here (on ``model``, when named); cached, see ``inference.auth``."""
        return (await self.token_grant(token)).on(model)

    async def token_allowed(self, token: str) -> bool:
        """Whether a bearer token has the inference role (admins have every role)."""
        return await self.token_access(token) is InferenceAccess.ALLOWED

    @property
    def needs_token(self) -> bool:
        """False when /v2 is public (``MODELYARD_INFERENCE_PUBLIC``): then a transport need not read the token."""
        return not settings.INFERENCE_PUBLIC

    async def authorise(self, token: str, model: str | None = None) -> TokenGrant | None:
        """Unless /v2 is public: :class:`Unauthorised` without a valid token, :class:`Forbidden` without the role
        or for a ``model`` outside the token's patterns. Returns the token's grant (None when /v2 is public),
        which a list of models (the repository index, statistics) filters by."""
        if settings.INFERENCE_PUBLIC:
            return None
        grant = await self.token_grant(token)
        _judge(grant, model)
        return grant

    async def admit(
        self,
        model: str,
        ref: str | None,
        call: Call,
        *,
        token: Callable[[Call], str],
        address: Callable[[Call], str],
        routing_key: Callable[[Call], str] | None = None,
    ) -> Admission:
        """Let an inference request for ``model``/``ref`` in, or refuse it, before anything of its body is read.

        In this order: the token (:meth:`authorise`; ``token(call)`` reads it, only when /v2 is not
        public), the rate limit (:meth:`throttle`; ``address(call)`` is the client's address, read
        only when a limit is set), the route (:meth:`resolve`), and the body limit (:meth:`body_limit`).
        A refusal raises its domain error and is counted at once, under the model's name when this
        process serves it, else ``_unknown`` (labels stay bounded); an admitted request is counted
        by the transport through :meth:`Admission.answered`. Running out of memory is refused as
        :class:`OutOfMemory`.
        """
        started = time.perf_counter()
        klass = CLASS_NORMAL
        try:
            if settings.INFERENCE_PUBLIC:
                raw = ""
            else:
                raw = token(call)
                # The verdict of a token seen in the last seconds is in memory: no thread, no await.
                grant = self.tokens.cached_grant(raw) if raw else REFUSED_GRANT
                if grant is None:
                    grant = await anyio.to_thread.run_sync(self.tokens.check_grant, raw)
                _judge(grant, model)
                klass = priority_class(grant)
            if settings.V2_RATE is not None:  # the address costs a parse; only a rate limit needs it
                self.throttle(token=raw, address=address(call))
            draw = None
            if self.runtime.router.split(model, ref) is not None:  # read the key only where it matters
                draw = routing_draw(routing_key(call) if routing_key is not None else "")
            loaded = self.resolve(model, ref, draw)
            return Admission(loaded, self.body_limit(loaded), started, draw, klass)
        except MemoryError:
            refusal = OutOfMemory(OUT_OF_MEMORY)
            self._refused(model, refusal, started)
            raise refusal from None
        except BaseException as exc:
            self._refused(model, exc, started)
            raise

    def _refused(self, model: str, exc: BaseException, started: float) -> None:
        metrics.unrouted(self.metrics_model(model)).answered(outcome_status(exc), time.perf_counter() - started)

    def throttle(self, *, token: str, address: str) -> None:
        """Take one request from the client's bucket (``MODELYARD_V2_RATE``, read per request so it can change).

        The client is its token, or its address when /v2 is public. Raises :class:`RateLimited`.
        """
        rate = settings.V2_RATE
        if rate is None:
            return
        if self._throttle is None or self._throttle.setting != rate:
            self._throttle = Throttle(*rate)
        client = "address " + address if settings.INFERENCE_PUBLIC else "token " + (token_key(token) or "")
        wait = self._throttle.wait(client)
        if wait:
            seconds = retry_after(wait)
            raise RateLimited(
                f"rate limit of {self._throttle.describe()} passed (MODELYARD_V2_RATE); retry in {seconds} s",
                retry_after=int(seconds),
            )

    def resolve(self, model: str, ref: str | None = None, draw: float | None = None) -> LoadedVersion:
        """The loaded version that ``model`` (its production alias) or ``model``/``ref`` routes to now.

        ``ref`` is a version number or the name of a served alias; ``draw`` places an inference request
        in a rollout's split (:func:`routing_draw`). Raises :class:`ModelNotFound` for what this process
        is not meant to serve, :class:`ModelNotReady` for what it has not loaded.
        """
        loaded = self.runtime.router.resolve(model, ref, draw)
        if loaded is not None:
            return loaded
        runtime = self.runtime
        # Triton's words: its clients test that the message starts with "Request for unknown model".
        if model not in runtime.router.table and model not in runtime.known_models():
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        if ref is not None and ref not in runtime.known_refs(model):
            raise ModelNotFound(
                f"Request for unknown model: '{model}' version {ref} is not found: model '{model}' has no served "
                f"version or alias '{ref}'"
            )
        what = f"model '{model}'" + (f" version '{ref}'" if ref else "")
        raise ModelNotReady(f"{what} is not loaded yet")

    def body_limit(self, loaded: LoadedVersion) -> BodyLimit:
        """The most bytes a request body for ``loaded`` may have (``MODELYARD_V2_MAX_BODY_BYTES`` or less)."""
        return loaded.body_limit(settings.V2_MAX_BODY_BYTES)

    def serves(self, model: str) -> bool:
        """Whether this process routes ``model`` now."""
        return model in self.runtime.router.table

    def metrics_model(self, model: str) -> str:
        """``model`` when this process routes it or is meant to, else ``_unknown``: URLs must not grow the series."""
        runtime = self.runtime
        return model if model in runtime.router.table or model in runtime.known_models() else metrics.UNKNOWN_MODEL

    # --- server ----------------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        extensions = sorted([*EXTENSIONS, "system_shared_memory"]) if settings.SHARED_MEMORY else EXTENSIONS
        return {"name": "modelyard", "version": _server_version(), "extensions": extensions}

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """True once the runtime has read the desired state and loaded (or tried) each version of it."""
        return self.runtime.ready

    # --- models ----------------------------------------------------------------------------------

    def model_metadata(self, model: str, ref: str | None = None) -> dict[str, Any]:
        spec = self.resolve(model, ref).spec
        if ref is None:
            served = {v.spec.version for v in self.runtime.router.table.get(spec.model, {}).values()}
            versions = [str(v) for v in sorted(served)]
        else:
            versions = [str(spec.version)]
        return {
            "name": spec.model,
            "versions": versions,
            "platform": PLATFORM,
            "inputs": served_inputs(spec.signature),
            "outputs": spec.signature.get("outputs", []),
        }

    def model_ready(self, model: str, ref: str | None = None) -> dict[str, Any]:
        """Ready when it resolves; otherwise :meth:`resolve` raises why not."""
        loaded = self.resolve(model, ref)
        return {"name": loaded.spec.model, "version": loaded.version_label, "ready": True}

    def model_config(self, model: str, ref: str | None = None) -> dict[str, Any]:
        """Triton's model configuration (the ``model_configuration`` extension)."""
        loaded = self.resolve(model, ref)
        spec = loaded.spec
        batched = loaded.batching
        config: dict[str, Any] = {
            "name": spec.model,
            "platform": PLATFORM,
            "backend": "onnxruntime",
            "version_policy": {"specific": {"versions": [spec.version]}},
            "max_batch_size": spec.max_batch_size if batched else 0,
            "input": [_config_tensor(s, batched) for s in spec.signature.get("inputs", [])],
            "output": [_config_tensor(s, batched) for s in spec.signature.get("outputs", [])],
            "instance_group": [
                {"kind": "KIND_GPU" if loaded.provider in GPU_PROVIDERS else "KIND_CPU", "count": loaded.instances}
            ],
            "parameters": {"execution_provider": {"string_value": loaded.provider}},
        }
        if batched:
            config["dynamic_batching"] = {
                "max_queue_delay_microseconds": spec.max_queue_delay_us,
                "default_queue_policy": {"max_queue_size": spec.max_queue_size},
            }
        return config

    def statistics(
        self, model: str | None = None, ref: str | None = None, *, within: TokenGrant | None = None
    ) -> dict[str, Any]:
        """Triton's statistics: every loaded version, every version of ``model``, or the one ``model``/``ref`` names.

        ``within``: the caller's token grant; all versions are only those of the models it covers.
        """
        if model is None:
            chosen = [v for v in self.runtime.loaded.values() if within is None or within.covers(v.spec.model)]
        elif ref is not None:
            chosen = [self.resolve(model, ref)]
        else:
            chosen = [v for v in self.runtime.loaded.values() if v.spec.model == model]
            if not chosen:
                self.resolve(model)  # says why: an unknown model (404), or one not loaded yet (503)
        chosen.sort(key=lambda v: (v.spec.model, v.spec.version))
        return {"model_stats": [v.stats.as_json(v.spec.model, v.version_label) for v in chosen]}

    def repository_index(self, *, ready_only: bool = False, within: TokenGrant | None = None) -> list[dict[str, str]]:
        """Every version this process serves, loads or failed to load, with Triton's state names.

        ``within``: the caller's token grant; a token limited to some models sees only those.
        """
        index = []
        for row in self.runtime.snapshot():
            if within is not None and not within.covers(row.model):
                continue
            state = REPOSITORY_STATES.get(row.state.value, "UNAVAILABLE")
            if ready_only and state != "READY":
                continue
            index.append({"name": row.model, "version": str(row.version), "state": state, "reason": row.error})
        return index

    def repository_control(self, model: str, action: str) -> NoReturn:
        """``load`` and ``unload`` are the registry's: always :class:`RepositoryReadOnly`, saying where to go."""
        raise RepositoryReadOnly(
            f"models are not {action}ed on request: they are loaded by promotion in the registry. Point a served "
            f"alias at a ready version (PUT /api/v1/models/{model}/aliases/production, approved by a second person), "
            f"or stop serving it (PATCH /api/v1/models/{model}/aliases/<alias> with served false)"
        )

    # --- shared memory -----------------------------------------------------------------------------

    def _shared_client(self, token: str) -> str:
        """The caller's scope of regions: its token's key, or the one anonymous scope when /v2 is public.

        Raises :class:`Unsupported` when system shared memory is turned off.
        """
        if not settings.SHARED_MEMORY:
            raise Unsupported(SHARED_MEMORY_OFF)
        if settings.INFERENCE_PUBLIC:
            return ANONYMOUS
        return token_key(token) or ANONYMOUS  # a caller that got this far has a well-formed token

    def client_regions(self, token: str) -> Mapping[str, Region]:
        """The regions the caller with ``token`` registered, which its inference requests may name."""
        return self.shared_memory.regions(self._shared_client(token))

    def shared_memory_status(self, token: str, name: str | None = None) -> list[dict[str, Any]]:
        """Triton's system shared memory status: the caller's regions, or its one region ``name``."""
        return self.shared_memory.status(self._shared_client(token), name)

    def shared_memory_register(self, token: str, name: Any, key: Any, offset: Any, byte_size: Any) -> None:
        """Map a region for the caller, within ``MODELYARD_SHARED_MEMORY_MAX_REGIONS`` and ``_MAX_BYTES``."""
        self.shared_memory.register(
            self._shared_client(token),
            name,
            key,
            offset,
            byte_size,
            max_regions=settings.SHARED_MEMORY_MAX_REGIONS,
            max_bytes=settings.SHARED_MEMORY_MAX_BYTES,
        )

    def shared_memory_unregister(self, token: str, name: str | None = None) -> None:
        """Unmap the caller's region ``name``, or all its regions."""
        self.shared_memory.unregister(self._shared_client(token), name)

    def cuda_shared_memory(self, action: str, name: str | None = None) -> list[dict[str, Any]]:
        """CUDA shared memory is not served: no region is ever registered, so the status lists none and
        unregistering does nothing (clients, Triton's examples among them, unregister before they start);
        registering is :class:`Unsupported`."""
        if action == "register":
            raise Unsupported(CUDA_SHARED_MEMORY)
        if action == "status" and name is not None:
            raise RegionNotFound(f"Unable to find cuda shared memory region: '{name}': {CUDA_SHARED_MEMORY}")
        return []

    def queue_depths(self) -> Iterator[tuple[LoadedVersion, int]]:
        """Requests waiting per loaded version, for versions that have taken requests and still serve."""
        for loaded in list(self.runtime.loaded.values()):
            batcher = loaded.batcher
            if batcher.started and not batcher.closed:
                yield loaded, batcher.queued

    # --- inference -------------------------------------------------------------------------------

    async def infer(
        self,
        model: str,
        ref: str | None,
        request: InferRequest,
        *,
        client_gone: Coroutine[Any, Any, object] | None = None,
        draw: float | None = None,
    ) -> InferResult:
        """Run one decoded request on the version ``model``/``ref`` routes to now, through its batcher.

        The route is taken again here (the body may have taken a while to arrive), and the version
        is held until its outputs are back so that a swap drains it only afterwards. ``request``
        must have been decoded against that version's signature; if a swap brought another
        signature meanwhile, the client is asked to retry. ``client_gone`` completes when the
        client goes away: the request is then dropped before it runs (:class:`ClientGone`).
        """
        try:
            for _attempt in range(ATTEMPTS):
                loaded = self.resolve(model, ref, draw)
                spec = loaded.spec
                if spec.signature is not request.signature and spec.signature != request.signature:
                    raise ModelNotReady(f"model '{spec.model}' changed to version {spec.version} meanwhile; retry")
                cache = self.runtime.responses.lookup(model, ref)
                key = ""
                lookup_ns = 0
                if cache is not None:
                    looked_up = time.monotonic_ns()
                    # Keyed by this version's digests: an entry of the version the alias served before never matches.
                    key = self.runtime.responses.key(spec, request.inputs)
                    counts = self.runtime.responses.counts(spec, loaded.version_label)
                    hit = await cache.store.get(key)
                    if hit is not None:
                        counts.hit()  # answered without the batcher or the session
                        loaded.stats.cache_hit(looked_up)
                        if ref is None or not ref.isdigit():
                            metrics.alias_answered(model, ref, loaded.version_label)
                        return self._result(loaded, request, dict(hit), cached=True)
                    counts.miss()
                    lookup_ns = time.monotonic_ns() - looked_up
                try:
                    loaded.acquire()
                except NotLoaded:
                    continue  # swapped out between resolve and acquire: take the new route
                started = time.monotonic_ns()
                try:
                    values = await self._run(loaded, request, client_gone)
                    if cache is not None:  # while the version is held: a released version writes nothing
                        inserting = time.monotonic_ns()
                        await cache.store.put(key, values, counts)
                        loaded.stats.cache_miss(lookup_ns + time.monotonic_ns() - inserting)
                except ClientGone:
                    raise
                except InferenceError as exc:
                    loaded.stats.request_failed(started)
                    if ref is None or not ref.isdigit():
                        metrics.alias_answered(model, ref, loaded.version_label)
                    self._mirror(model, ref, loaded, request, None, started, f"{type(exc).__name__}: {exc}")
                    raise
                finally:
                    client_gone = None  # consumed by _run
                    loaded.release()
                loaded.stats.request_done(started)
                if ref is None or not ref.isdigit():
                    metrics.alias_answered(model, ref, loaded.version_label)
                self._mirror(model, ref, loaded, request, values, started)
                return self._result(loaded, request, values, cached=None if cache is None else False)
            raise ModelNotReady(RELOADING)
        finally:
            _discard(client_gone)

    @staticmethod
    def _result(
        loaded: LoadedVersion, request: InferRequest, values: dict[str, np.ndarray], *, cached: bool | None
    ) -> InferResult:
        """The answer, with the outputs the request wants classified (after the cache: entries hold raw outputs)."""
        for name, count in request.classification.items():
            values[name] = classify(values[name], count, loaded.labels, batched=loaded.batching)
        return InferResult(loaded.spec.model, loaded.version_label, values, cached)

    def _mirror(
        self,
        model: str,
        ref: str | None,
        loaded: LoadedVersion,
        request: InferRequest,
        values: dict[str, np.ndarray] | None,
        started_ns: int,
        error: str = "",
    ) -> None:
        """Offer the request to the alias's shadow, if it has one (``inference/shadow.py``); costs a lookup if not."""
        shadow = self.runtime.router.shadow(model, ref)
        if shadow is None or shadow.candidate is loaded:
            return
        seconds = (time.monotonic_ns() - started_ns) / 1e9
        self.runtime.shadows.offer(shadow, loaded, request, None if values is None else dict(values), seconds, error)

    async def _shadow_run(self, loaded: LoadedVersion, request: InferRequest, priority: int) -> dict[str, np.ndarray]:
        """Run a mirrored request on the shadow's candidate: the same path, behind the candidate's own requests
        (the lowest class a token has, whatever the mirrored request's, at the shadow's priority within it)."""
        mirrored = dataclasses.replace(request, priority=priority, timeout_us=None, klass=CLASS_LOW)
        return await self._run(loaded, mirrored, None)

    async def _run(
        self,
        loaded: LoadedVersion,
        request: InferRequest,
        client_gone: Coroutine[Any, Any, object] | None,
    ) -> dict[str, np.ndarray]:
        """Tokenise a ``text`` request (``inference/text.py``), then run it and hand back its outputs."""
        text = request.inputs.get(TEXT_INPUT) if "text" in request.signature else None
        if text is None:
            return await self._submit(loaded, request.inputs, request, client_gone)
        encoder = loaded.text
        try:
            if encoder is None:  # a signature with text always loads its tokenizer; never trust that blindly
                raise InvalidInput(f"model '{loaded.spec.model}' version {loaded.spec.version} takes no text")
            encoded = await encoder.encode_async(text)
        except BaseException:
            _discard(client_gone)
            raise
        values = await self._submit(loaded, encoded.feeds, request, client_gone)
        return encoder.unpad(values, encoded)

    async def _submit(
        self,
        loaded: LoadedVersion,
        feeds: dict[str, np.ndarray],
        request: InferRequest,
        client_gone: Coroutine[Any, Any, object] | None,
    ) -> dict[str, np.ndarray]:
        """Submit to the version's batcher and wait for the outputs, or for the client to go away."""
        try:
            future = loaded.batcher.submit(
                feeds, priority=request.priority, timeout_us=request.timeout_us, klass=request.klass
            )
        except Overloaded as exc:
            _discard(client_gone)
            raise Overloaded(f"model '{loaded.spec.model}' is overloaded: {exc}") from None
        queued = loaded.batcher.queued
        loaded.metrics.queue_depth(queued)
        loaded.traffic.watch(future)  # requests/s, latency and errors for the fleet page
        try:
            if client_gone is None or not queued:
                # Nothing waits: the request started at once (or there is nothing to watch). A batch that
                # runs is not stopped when its client leaves, so watching for that would only cost time.
                _discard(client_gone)
                return await future
            # The client going away cancels the request (the batcher drops it before it runs).
            disconnect: asyncio.Future[Any] = asyncio.ensure_future(client_gone)
            disconnect.add_done_callback(lambda _: future.cancel())
            try:
                return await future
            except asyncio.CancelledError:
                if not disconnect.done() or disconnect.cancelled():
                    raise  # this task itself was cancelled, not the request
            finally:
                disconnect.cancel()
        except RequestTimeout as exc:
            raise RequestTimeout(f"{exc} (timeout {request.timeout_us} us)") from None
        except InferenceError:
            raise  # the batcher's own (the model was unloaded)
        except Exception as exc:  # ONNX Runtime failed: the input, the memory or the device
            raise run_failure(exc, OUT_OF_MEMORY) from exc
        raise ClientGone("the client went away before its answer was ready")
