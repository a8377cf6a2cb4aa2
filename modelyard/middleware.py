"""A NUL byte in a URL is served as U+FFFD, so that no query and no audit insert fails on it.

PostgreSQL can neither store nor compare text that holds NUL: a model name or a filter taken from
``/api/v1/models/a%00b`` or ``?q=%00`` made the query fail with a 500, and a refused request's
audit insert failed with it, losing both the 401/403 and its audit event. U+FFFD is what Django
already puts in place of URL bytes it cannot decode. No name may contain it, so lookups find
nothing (404) and filters match nothing, while authentication, permissions and the audit trail
treat the request like any other.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, QueryDict

NUL = "\x00"
REPLACEMENT = "\ufffd"
ENCODED_REPLACEMENT = "%EF%BF%BD"


class ReplaceNulInURL:
    """First in MIDDLEWARE, before anything reads the path or the query.

    The raw ``META["PATH_INFO"]`` is left alone (WSGI keeps it as latin-1 bytes); Django routes
    and everything here records ``request.path`` and ``request.path_info``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if NUL in request.path:
            request.path = request.path.replace(NUL, REPLACEMENT)
            request.path_info = request.path_info.replace(NUL, REPLACEMENT)
        query = request.META.get("QUERY_STRING", "")
        if "%00" in query or NUL in query:
            query = query.replace("%00", ENCODED_REPLACEMENT).replace(NUL, ENCODED_REPLACEMENT)
            request.META["QUERY_STRING"] = query
            request.GET = QueryDict(query, encoding=request.encoding)
        return self.get_response(request)
