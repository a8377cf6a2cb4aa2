"""Error pages: HTML under ``/ui/`` and ``/accounts/``, JSON everywhere else.

A person in the web UI who follows a stale link, sends a GET to a form's address, or posts a form
that expired gets a page in the UI's frame, with the navigation their roles allow and a way back,
instead of a JSON body or the browser's own bare 405. The REST API keeps its JSON bodies
(``modelyard.error_body``), whatever the path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string

from modelyard.error_body import error_body
from registry.http import json_404, json_500

logger = logging.getLogger(__name__)

UI_PREFIXES = ("/ui/", "/accounts/")

TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Not found",
    405: "Wrong method",
    500: "Something went wrong",
}


def is_ui(request: HttpRequest) -> bool:
    return request.path.startswith(UI_PREFIXES) or request.path == "/ui"


def error_page(request: HttpRequest, status: int, message: str, *, title: str = "") -> HttpResponse:
    """An error in the UI's frame: the status, what happened, and where to go from here."""
    context = {"status": status, "title": title or TITLES.get(status, "Error"), "message": message}
    return render(request, "modelyard/ui/error.html", context, status=status)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``."""
    if not is_ui(request):
        return json_404(request, exception)
    return error_page(request, 404, f"There is nothing at {request.path}. It may have been renamed, or never existed.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler403``, for Django's own PermissionDenied (the UI's views refuse with their own message)."""
    message = str(exception) if exception is not None and str(exception) else "You may not do this."
    if not is_ui(request):
        return JsonResponse(error_body(message), status=403)
    return error_page(request, 403, message)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: rendered without the request's context, which may be what failed."""
    if not is_ui(request):
        return json_500(request)
    context = {"status": 500, "title": TITLES[500], "message": "The server failed to answer. It has been logged."}
    return HttpResponse(render_to_string("modelyard/ui/error.html", context), status=500)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a form that came from another site, or one that expired since it was shown."""
    message = (
        "This form could not be accepted: it came from another site, or it expired (for example after you "
        f"signed in again). Go back, reload the page and send it again. ({reason})"
    )
    if not is_ui(request):
        return JsonResponse(error_body(f"CSRF check failed: {reason}"), status=403)
    return error_page(request, 403, message, title="Form expired")


class UiErrorPages:
    """Turns the bare 405 of a POST-only address (``require_POST``, ``LogoutView``) into the UI's 405 page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        bare = isinstance(response, HttpResponse) and not response.content
        if response.status_code != 405 or not is_ui(request) or not bare:
            return response
        allowed = response.get("Allow", "")
        message = f"{request.path} does not answer {request.method}"
        message += f"; it takes {allowed}." if allowed else "."
        if "POST" in allowed:
            message += " It is where a form sends what you enter: use the form on its page."
        page = error_page(request, 405, message)
        if allowed:
            page["Allow"] = allowed
        return page
