"""What can go wrong with one inference request, in words, with no transport in them.

The data plane, the codec and the batcher raise these; each transport maps them to its own
answer in one table (``inference/app.py`` to HTTP statuses; the gRPC server to status codes).
A message is safe to show the client and names what was wrong, and the limit where one was hit.
"""

from __future__ import annotations


class InferenceError(Exception):
    """A request the data plane refuses or could not answer; ``message`` is for the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorised(InferenceError):
    """No token with the role the request needs."""


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
