"""Every API error is JSON ``{"error": "...", "detail": ...}`` with a 4xx or 5xx status.

Domain errors (``registry.errors``) carry no HTTP: ``registry.http.STATUS`` is the one table that
gives each its status, for the REST API here and for the UI views (``registry.ui.views``). DRF's own
exceptions (validation, authentication, throttling) keep the status DRF gives them, and the limits
hit while a body is read get theirs in ``registry.http.body_refusal``. Every body is built by
``modelyard.error_body``. Refused tokens and refused writes are audited (``registry.access.refusals``).
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from modelyard.error_body import error_body
from registry.access.refusals import audit_access_denied, audit_token_rejected
from registry.http import body_refusal, domain_error_response

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
