"""What can go wrong with one inference request, in words, and the HTTP status of each.

The data plane, the codec and the batcher raise these; each transport maps them to its own
answer in one table: :data:`HTTP_STATUS` here (the /v2 REST endpoints answer with it, and the
metrics of both transports count every outcome by it), ``STATUS`` in ``inference/grpc/server.py``
for gRPC's status codes. A message is safe to show the client and names what was wrong, and the
limit where one was hit.
"""

from __future__ import annotations

import asyncio


class InferenceError(Exception):
    """A request the data plane refuses or could not answer; ``message`` is for the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorised(InferenceError):
    """No valid token: none sent, or one that is unknown, revoked or expired."""


class Forbidden(InferenceError):
    """A valid token whose user lacks the role the request needs."""


class RateLimited(InferenceError):
    """The client is over ``MODELYARD_V2_RATE``; it may try again after ``retry_after`` whole seconds."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotFound(InferenceError):
    """No such model, or no such served version or alias of it."""


class ModelNotReady(InferenceError):
    """The model is meant to be served but is not loaded (yet, or any more while it is reloaded); retry."""


class InvalidInput(InferenceError):
    """The request itself is wrong: its JSON, its tensors, its parameters, its encoding."""


class BodyTooLarge(InferenceError):
    """The request body, raw or decompressed, is over its limit."""


class UnsupportedEncoding(InferenceError):
    """The request body is compressed in a way the server does not read."""


class BodyTimeout(InferenceError):
    """The client stopped sending its request body."""


class ClientGone(InferenceError):
    """The client went away before its answer was ready; nobody is left to tell."""


class Overloaded(InferenceError):
    """The model's queue is full; retry later."""


class RequestTimeout(InferenceError):
    """The request waited past its own timeout before it could run."""


class OutOfMemory(InferenceError):
    """The server has not enough memory for this request now; retry later or send a smaller one."""


class InferenceFailed(InferenceError):
    """ONNX Runtime refused the inputs."""


class DeviceFailed(InferenceError):
    """The device or ONNX Runtime itself failed while running the request (a lost GPU, a CUDA error), not the input."""


class RepositoryReadOnly(InferenceError):
    """Models are loaded and unloaded by promotion in the registry, never through the protocol's repository calls."""


class Unsupported(InferenceError):
    """A protocol extension this server does not serve (CUDA shared memory), or one turned off here."""


class RegionNotFound(InferenceError):
    """No shared memory region of that name is registered for the caller."""


class RegionExists(InferenceError):
    """A shared memory region of that name is registered for the caller already (Triton refuses it too)."""


class RegionLimit(InferenceError):
    """Registering the region would pass the caller's limit of regions or mapped bytes."""


# How ONNX Runtime words a failure that is not the request's fault, lowercased. Out of memory (the
# device's or the host's) is worth a retry; the others mean the device or the runtime broke.
_OUT_OF_MEMORY_WORDS = (
    "out of memory",
    "failed to allocate memory",
    "alloc_failed",
    "bad_alloc",
    "cudaerrormemoryallocation",
)
_DEVICE_WORDS = (
    "cuda failure",
    "cuda error",
    "cudaerror",
    "cublas failure",
    "cublas_status",
    "cudnn failure",
    "cudnn_status",
    "cufft failure",
    "curand failure",
    "tensorrt",
    ": ep_fail :",
    "illegal memory access",
    "unspecified launch failure",
    "device lost",
    "hip failure",
    "hiperror",
)


# ONNX Runtime's own exception types for a failed device or execution provider.
_DEVICE_EXCEPTIONS = {"EPFail", "DeviceReset", "EngineError"}


def runtime_detail(exc: BaseException) -> str:
    """ONNX Runtime's message without its status prefix and the host details after ``; GPU=``."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if text.startswith("[ONNXRuntimeError]"):
        text = text.split(" : ", 3)[-1]
    return text.split(" ; GPU=")[0][:500]


def run_failure(exc: BaseException, out_of_memory: str) -> InferenceError:
    """What an exception from running the model means: no memory now (retry), a failed device, or bad input.

    ``out_of_memory`` is the message of :class:`OutOfMemory`. Everything that is not recognisably the
    device or the memory is the request's fault, as ONNX Runtime refuses inputs in many words.
    """
    if isinstance(exc, MemoryError):
        return OutOfMemory(out_of_memory)
    lowered = str(exc).lower()
    if any(words in lowered for words in _OUT_OF_MEMORY_WORDS):
        return OutOfMemory(f"{out_of_memory} (ONNX Runtime: {runtime_detail(exc)})")
    if type(exc).__name__ in _DEVICE_EXCEPTIONS or any(words in lowered for words in _DEVICE_WORDS):
        return DeviceFailed(
            f"the device failed while running the model, not because of the request: {runtime_detail(exc)}"
        )
    return InferenceFailed(f"inference failed: {exc}")


# Each domain error's HTTP status, and whether the answer says when to retry (Retry-After).
HTTP_STATUS: dict[type[InferenceError], tuple[int, bool]] = {
    InvalidInput: (400, False),
    InferenceFailed: (400, False),
    RepositoryReadOnly: (400, False),
    RegionExists: (400, False),
    RegionLimit: (400, False),
    Unauthorised: (401, False),
    Forbidden: (403, False),
    ModelNotFound: (404, False),
    RegionNotFound: (404, False),
    BodyTimeout: (408, False),
    BodyTooLarge: (413, False),
    UnsupportedEncoding: (415, False),
    RateLimited: (429, True),
    ClientGone: (499, False),
    ModelNotReady: (503, True),
    Overloaded: (503, True),
    OutOfMemory: (503, True),
    DeviceFailed: (500, False),
    Unsupported: (501, False),  # Triton's "unsupported" is 501 too
    RequestTimeout: (504, False),
}


def http_status(exc: InferenceError) -> tuple[int, bool]:
    """The domain error's HTTP status and whether to say when to retry (its nearest class in :data:`HTTP_STATUS`)."""
    return next(HTTP_STATUS[cls] for cls in type(exc).__mro__ if cls in HTTP_STATUS)


def outcome_status(exc: BaseException) -> int:
    """The HTTP status a request that ended in ``exc`` is counted under, whatever its transport.

    A domain error's own; a cancelled call is a client that went away (HTTP's 499); anything else
    is the server's failure (500).
    """
    if isinstance(exc, InferenceError):
        return http_status(exc)[0]
    if isinstance(exc, asyncio.CancelledError):
        return 499
    return 500
