"""What the client raises: the server's refusals as typed exceptions carrying its ``error`` and ``detail``."""

from __future__ import annotations

from typing import Any


class ModelyardError(Exception):
    """Every error the client raises."""


class ConfigError(ModelyardError):
    """No server to talk to, or a saved profile that cannot be used."""


class ConnectionFailed(ModelyardError):
    """The server could not be reached, or stopped answering."""


class ApiError(ModelyardError):
    """The server refused a request: its status, its ``error`` message and its ``detail``."""

    status = 0

    def __init__(self, error: str, detail: Any = None, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(error)
        self.error = error
        self.detail = detail
        if status is not None:
            self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.error


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class PayloadTooLarge(ApiError):
    status = 413


class RateLimited(ApiError):
    status = 429


class ServerError(ApiError):
    status = 500


class Unavailable(ServerError):
    """503: storage down, or (on /v2) a model not loaded yet or a full queue; ``retry_after`` says when to retry."""

    status = 503


class GatewayTimeout(ServerError):
    """504: a wait ran out (``detail["laggards"]`` names the inference processes that did not serve the version)."""

    status = 504


_BY_STATUS: dict[int, type[ApiError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        RateLimited,
        ServerError,
        Unavailable,
        GatewayTimeout,
    )
}


def api_error(status: int, error: str, detail: Any = None, *, retry_after: float | None = None) -> ApiError:
    """The exception for an answer with this status."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(error, detail, status=status, retry_after=retry_after)


class ValidationFailed(ModelyardError):
    """A pushed version ended ``failed``; ``errors`` says why, as the server wrote it."""

    def __init__(self, model: str, version: int, errors: list[str]):
        super().__init__(f"version {version} of '{model}' failed validation: {'; '.join(errors) or 'no reason given'}")
        self.model = model
        self.version = version
        self.errors = errors


class ChecksumMismatch(ModelyardError):
    """A downloaded file's sha256 differs from the one the registry recorded; the file was not kept."""


class WaitTimeout(ModelyardError):
    """Something the client was waiting for did not happen in time."""
