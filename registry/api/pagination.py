from __future__ import annotations

from typing import Any

from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

from registry.errors import InvalidInput

MAX_PAGE_SIZE = 500


def page_size(request: Request, default: int | None) -> int | None:
    """``?page_size=``: a whole number from 1, capped at :data:`MAX_PAGE_SIZE`; empty or absent, ``default``.

    DRF alone takes ``page_size=abc`` or ``page_size=0`` for the default, so a client's mistake would
    go unnoticed; here it is a 400 that says what was wrong.
    """
    text = request.query_params.get("page_size", "")
    if text == "":
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise InvalidInput(
            f"page_size must be a whole number from 1 to {MAX_PAGE_SIZE}, got {text[:40]!r}", {"field": "page_size"}
        )
    return min(int(text), MAX_PAGE_SIZE)


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M``; responses carry count, next, previous and results.

    A ``page`` or ``page_size`` that is not a whole number from 1 is a 400; a page past the last is a 404.
    """

    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    invalid_page_message = "page {page_number} does not exist ({message})"

    def get_page_size(self, request: Request) -> int | None:
        return page_size(request, self.page_size)

    def get_page_number(self, request: Request, paginator: Any) -> Any:
        text = request.query_params.get(self.page_query_param, "")
        if text == "":
            return 1
        if text in self.last_page_strings:  # ?page=last
            return paginator.num_pages
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise InvalidInput(f"page must be a whole number from 1, got {text[:40]!r}", {"field": "page"})
        return text
