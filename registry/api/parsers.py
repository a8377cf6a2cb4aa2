"""JSON from clients, refused with a 400 whatever its shape, never a 500.

DRF's JSONParser turns only ``ValueError`` into a parse error, but a body such as ``'[' * 50000``
makes ``json.loads`` raise ``RecursionError``. A document nested just shallowly enough to parse
can still exhaust the stack later (``json.dumps`` in a serializer, the audit hash), so the nesting
depth is capped well below Python's recursion limit (``MODELYARD_MAX_JSON_DEPTH``). NUL characters
are refused too: PostgreSQL stores them neither in text nor in jsonb, and no field here needs one.
Every JSON document the API reads, the request body and JSON inside form fields, goes through
:func:`load_json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import parsers, serializers
from rest_framework.exceptions import ParseError


class JSONRefused(ValueError):
    """A JSON document that is malformed, nested too deeply or holds a NUL character."""


def _refuse_constant(name: str) -> Any:
    raise JSONRefused(f"{name} is not valid JSON")


def load_json(text: str | bytes) -> Any:
    limit = settings.MAX_JSON_DEPTH
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise JSONRefused(f"nested deeper than {limit} levels (MODELYARD_MAX_JSON_DEPTH)") from None
    except ValueError as exc:  # also UnicodeDecodeError
        raise JSONRefused(str(exc)) from None
    _check(value, limit)
    return value


def _check(value: Any, limit: int) -> None:
    """Walk the document without recursion; the stack holds one iterator per open level, so at most ``limit``."""
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        for item in stack[-1]:
            if isinstance(item, str):
                if "\x00" in item:
                    raise JSONRefused("strings may not contain NUL (\\u0000)")
            elif isinstance(item, list | dict):
                if len(stack) > limit:
                    raise JSONRefused(f"nested deeper than {limit} levels (MODELYARD_MAX_JSON_DEPTH)")
                if isinstance(item, Mapping):
                    if any("\x00" in key for key in item):
                        raise JSONRefused("keys may not contain NUL (\\u0000)")
                    stack.append(iter(item.values()))
                else:
                    stack.append(iter(item))
                break
        else:
            stack.pop()


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


class JSONDocumentField(serializers.JSONField):
    """A JSON value; sent as a form field (a string), it is parsed with the same limits as a JSON body."""

    def to_internal_value(self, data: Any) -> Any:
        if getattr(data, "is_json_string", False):
            try:
                return load_json(data)
            except JSONRefused as exc:
                raise serializers.ValidationError(f"not valid JSON: {exc}") from None
        return super().to_internal_value(data)
