"""JSON from clients, refused with a 400 whatever its shape, never a 500.

DRF's JSONParser turns only ``ValueError`` into a parse error, but a body such as ``'[' * 50000``
makes ``json.loads`` raise ``RecursionError``; both parsers here read JSON through
``registry.jsondoc.load_json``, which refuses that and what PostgreSQL cannot store.
"""

from __future__ import annotations

from typing import IO, Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from registry.jsondoc import JSONRefused, load_json


class JSONParser(parsers.JSONParser):
    """The REST API's JSON body parser (``DEFAULT_PARSER_CLASSES``)."""

    def parse(self, stream: IO[Any], media_type: str | None = None, parser_context: Any = None) -> Any:
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        body = stream.read()
        try:
            text = body.decode(encoding)
        except (LookupError, UnicodeError) as exc:  # LookupError: a codec such as rot13 is not a text encoding
            raise ParseError(f"JSON parse error - cannot decode the body as {encoding}: {exc}") from None
        try:
            return load_json(text)
        except JSONRefused as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
