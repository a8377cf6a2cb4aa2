"""The REST API's error body, ``{"error": "...", "detail": ...}``, built in one place.

The DRF exception handler, Django's 404 and 500 handlers, and the ASGI layer's refusals sent
before Django runs (``modelyard/streaming.py``) all answer through these functions, so every
registry error a client sees has the same shape. (``/v2`` answers ``{"error": "..."}``, the Open
Inference Protocol's shape, from its own error table.)
"""

from __future__ import annotations

import json
from typing import Any


def error_body(message: str, detail: Any = None) -> dict[str, Any]:
    """The JSON object of an error answer."""
    return {"error": message, "detail": detail}


def error_body_bytes(message: str, detail: Any = None) -> bytes:
    """The same object encoded, for answers sent without Django (the ASGI layer)."""
    return json.dumps(error_body(message, detail)).encode()
