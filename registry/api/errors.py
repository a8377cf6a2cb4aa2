"""Every API error is JSON ``{"error": "...", "detail": ...}`` with a 4xx or 5xx status.

Domain errors (``registry.errors``) carry no HTTP: :data:`STATUS` is the one table that gives each
its status, for the REST API here and for the UI views (``registry.ui_views``). DRF's own
exceptions (validation, authentication, throttling) keep the status DRF gives them, and the limits
hit while a body is read get theirs in :func:`body_refusal`. Every body is built by
``modelyard.error_body``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from modelyard.error_body import error_body
from modelyard.streaming import BodyIdleTimeout, BodyTooLarge
from registry import errors
from registry.audit import audit_access_denied, audit_token_rejected
from storage import StorageError

# Looked up along the exception's class hierarchy, so a subclass answers as its nearest listed base.
STATUS: dict[type[Exception], int] = {
    errors.InvalidInput: 400,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.StorageDown: 503,
    StorageError: 503,  # a storage failure outside an upload (a download, say)
}

_MESSAGES: dict[type[Exception], str] = {
    exceptions.NotAuthenticated: "authentication required: send 'Authorization: Bearer <token>'",
    exceptions.AuthenticationFailed: "invalid or revoked API token",
}


def status_for(exc: Exception) -> int | None:
    """The status :data:`STATUS` gives ``exc``, or None if it is not a domain or storage error."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return None


def domain_error_response(exc: Exception) -> Response | None:
    """The answer to a domain or storage error; None for any other exception."""
    status = status_for(exc)
    if status is None:
        return None
    if isinstance(exc, errors.RegistryError):
        return Response(error_body(exc.message, exc.detail), status=status)
    return Response(error_body(f"artifact storage is unavailable: {exc}"), status=status)


def _closing(exc: errors.RegistryError) -> Response:
    """A domain error's answer that closes the connection, for a refusal that leaves the body unread."""
    response = domain_error_response(exc)
    assert response is not None  # every domain error has a status (tests/test_architecture.py)
    response["Connection"] = "close"
    return response


def _summarise(detail: Any) -> str:
    if isinstance(detail, dict):
        parts = []
        for field, value in detail.items():
            text = _summarise(value)
            parts.append(text if field in {"non_field_errors", "detail"} else f"{field}: {text}")
        return "; ".join(parts)
    if isinstance(detail, list):
        return " ".join(_summarise(item) for item in detail)
    return str(detail)


def body_refusal(exc: Exception) -> Response | None:
    """Limits hit while the request body was read; the connection closes after an unread body."""
    close = {"Connection": "close"}
    if isinstance(exc, BodyTooLarge):
        return Response(error_body(str(exc), {"limit": exc.limit, "setting": exc.setting}), 413, headers=close)
    if isinstance(exc, BodyIdleTimeout):
        return Response(error_body(str(exc), {"seconds": exc.seconds}), 408, headers=close)
    if isinstance(exc, TooManyFilesSent):  # Django counted the parts; worded as the upload service words it
        return _closing(errors.TooManyFiles(settings.DATA_UPLOAD_MAX_NUMBER_FILES))
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        message = f"too many form fields: a request may have at most {limit}"
        return Response(error_body(message, {"limit": limit}), 400, headers=close)
    if isinstance(exc, RequestDataTooBig):
        return _closing(errors.FormTooLarge(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
    if isinstance(exc, RequestAborted):
        # Nobody is left to answer, and streaming.py already logged the disconnect in one line.
        response = Response(error_body("the client disconnected"), 400)
        response._has_been_logged = True  # type: ignore[attr-defined]  # Django's flag: no "Bad Request" warning
        return response
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = domain_error_response(exc)
    if response is not None:
        set_rollback()  # as DRF does for the errors it handles
    else:
        response = body_refusal(exc) or _drf_error_response(exc, context)
    if response is None:
        return None
    _audit_refusal(exc, response, context.get("request"))
    return response


def _drf_error_response(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's own exceptions, with DRF's status and headers (Retry-After, WWW-Authenticate) and our body."""
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body(_summarise(exc.detail), exc.detail)
    elif isinstance(exc, exceptions.Throttled):
        response.data = error_body(_summarise(exc.detail), {"retry_after": getattr(exc, "wait", None)})
    elif isinstance(exc, Http404 | exceptions.NotFound):
        response.data = error_body(str(getattr(exc, "detail", "")) or "not found")
    else:
        response.data = error_body(_MESSAGES.get(type(exc)) or _summarise(getattr(exc, "detail", str(exc))))
    return response


def _audit_refusal(exc: Exception, response: Response, request: Any) -> None:
    """Rejected tokens and refused writes leave an audit event; a refused read does not."""
    if request is None:
        return
    if isinstance(exc, exceptions.AuthenticationFailed):
        audit_token_rejected(request=request, reason=response.data["error"])
    elif response.status_code == 403 and request.method not in SAFE_METHODS:
        audit_access_denied(request=request, reason=response.data["error"])


def json_404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("not found", request.path), status=404)


def json_500(request: HttpRequest) -> JsonResponse:
    return JsonResponse(error_body("internal server error"), status=500)
