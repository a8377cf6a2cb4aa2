"""JSON from clients, refused whatever its shape, never a crash: the limits every JSON document here gets.

``json.loads`` raises ``RecursionError`` on a body such as ``'[' * 50000``, and a document nested
just shallowly enough to parse can still exhaust the stack later (``json.dumps`` in a serializer,
the audit hash), so the nesting depth is capped well below Python's recursion limit
(``MODELYARD_MAX_JSON_DEPTH``). NUL characters are refused too: PostgreSQL stores them neither in
text nor in jsonb, and no field here needs one. Every JSON document the registry reads (an API
request body, JSON inside form fields, an upload's metadata from any caller) goes through
:func:`load_json` or :func:`check_json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings


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


def check_json(value: Any) -> None:
    """Refuse a value built in Python (not parsed) that JSON cannot hold, or that breaks the same limits."""
    _check(value, settings.MAX_JSON_DEPTH)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise JSONRefused(str(exc)) from None


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
