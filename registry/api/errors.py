"""Every API error is JSON ``{"error": "...", "detail": ...}`` with a 4xx or 5xx status."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from modelyard.streaming import BodyIdleTimeout, BodyTooLarge
from registry.audit import audit_access_denied, audit_token_rejected
from registry.errors import ApiError
from storage import StorageError

_MESSAGES: dict[type[Exception], str] = {
    exceptions.NotAuthenticated: "authentication required: send 'Authorization: Bearer <token>'",
    exceptions.AuthenticationFailed: "invalid or revoked API token",
}


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


def _body_refusal(exc: Exception) -> Response | None:
    """Limits hit while the request body was read; the connection closes after an unread body."""
    close = {"Connection": "close"}
    if isinstance(exc, BodyTooLarge):
        return Response({"error": str(exc), "detail": {"limit": exc.limit, "setting": exc.setting}}, 413, headers=close)
    if isinstance(exc, BodyIdleTimeout):
        return Response({"error": str(exc), "detail": {"seconds": exc.seconds}}, 408, headers=close)
    if isinstance(exc, TooManyFilesSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
        message = f"too many files: an upload may have at most {limit} (MODELYARD_MAX_UPLOAD_FILES)"
        return Response({"error": message, "detail": {"limit": limit}}, 400, headers=close)
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        message = f"too many form fields: a request may have at most {limit}"
        return Response({"error": message, "detail": {"limit": limit}}, 400, headers=close)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        message = f"the form fields are larger than the limit of {limit} bytes (MODELYARD_MAX_FORM_BYTES)"
        return Response({"error": message, "detail": {"limit": limit}}, 413, headers=close)
    if isinstance(exc, RequestAborted):
        # Nobody is left to answer, and streaming.py already logged the disconnect in one line.
        response = Response({"error": "the client disconnected", "detail": None}, 400)
        response._has_been_logged = True  # type: ignore[attr-defined]  # Django's flag: no "Bad Request" warning
        return response
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, StorageError):
        return Response({"error": f"artifact storage is unavailable: {exc}", "detail": None}, status=503)
    refusal = _body_refusal(exc)
    if refusal is not None:
        return refusal
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        response.data = {"error": exc.message, "detail": exc.extra}
    elif isinstance(exc, exceptions.ValidationError):
        response.data = {"error": _summarise(exc.detail), "detail": exc.detail}
    elif isinstance(exc, exceptions.Throttled):
        response.data = {"error": _summarise(exc.detail), "detail": {"retry_after": getattr(exc, "wait", None)}}
    elif isinstance(exc, Http404 | exceptions.NotFound):
        response.data = {"error": str(getattr(exc, "detail", "")) or "not found", "detail": None}
    else:
        message = _MESSAGES.get(type(exc)) or _summarise(getattr(exc, "detail", str(exc)))
        response.data = {"error": message, "detail": None}
    _audit_refusal(exc, response, context.get("request"))
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
    return JsonResponse({"error": "not found", "detail": request.path}, status=404)


def json_500(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"error": "internal server error", "detail": None}, status=500)
