"""What the OpenAPI schema (``/api/schema/``) says besides the views: how to sign in, and the error answers.

Signing in: a bearer token, or a browser session.

drf-spectacular knows DRF's session authentication; the bearer token is ours, so it is described here
(imported by ``modelyard/urls.py``, beside the schema's views, and not at start: drf-spectacular
costs 0.3 s of a cold start that a process serving no schema, an inference one, need not pay).
``AddressCount`` accepts no credentials (it only counts requests that bring none), so the schema
leaves it out (``AUTHENTICATION_WHITELIST`` in the settings).

Error answers: :func:`document_errors`, a postprocessing hook (``SPECTACULAR_SETTINGS``), gives every
operation the refusals it may answer with, in their one shape (``modelyard.error_body``).
"""

from __future__ import annotations

import copy
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "registry.access.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        scheme = build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")
        scheme["description"] = "An API token: `modelyard createtoken USER`, or Tokens in the web UI."
        return scheme


ERROR_COMPONENT = "Error"
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every refusal of the registry API: a message for the person who sent the request, and "
    "optional structured data (a limit, the offending field).",
    "properties": {
        "error": {"type": "string", "description": "what was refused and why"},
        "detail": {"nullable": True, "description": "null, or structured data: the fields' messages, a limit"},
    },
    "required": ["error", "detail"],
}
# What any operation may answer (``registry.http.STATUS`` and DRF's own refusals): bad input, including a
# query parameter or a page; no or a bad token; a role or scope that does not reach; a name that does not
# exist or a page past the last; the rate limit.
EVERY_OPERATION = {
    400: "Bad input: a field, a query parameter, a page or page_size, malformed JSON",
    401: "No credentials, or a token that is unknown, revoked or expired",
    403: "The caller's roles or token scope do not allow this",
    404: "No such model, version, alias or object, or a page past the last",
    429: "Rate limit (MODELYARD_API_RATE_USER, MODELYARD_API_RATE_ANON); Retry-After says when to retry",
}
# And what an operation that changes something may answer besides.
CHANGES = {
    408: "The client stalled while sending the body (MODELYARD_BODY_IDLE_TIMEOUT_SECONDS)",
    409: "The change conflicts with the current state (a protected alias, a pending promotion, a name taken)",
    413: "The body is larger than its limit (MODELYARD_MAX_REQUEST_BODY_BYTES, MODELYARD_MAX_UPLOAD_BYTES)",
    415: "The body's Content-Type is not one the operation takes (its requestBody lists them)",
}


def document_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation documents the error answers it may give, all
    of them ``{"error": "...", "detail": ...}`` (``modelyard.error_body``), unless it documents them itself."""
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = copy.deepcopy(ERROR_SCHEMA)
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}}}
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            statuses = dict(EVERY_OPERATION)
            if method in ("post", "put", "patch", "delete"):
                statuses.update(CHANGES)
            responses = operation.setdefault("responses", {})
            for status, description in sorted(statuses.items()):
                responses.setdefault(str(status), {"description": description})
            for status, response in responses.items():
                if int(status) >= 400 and not response.get("content"):  # one the view documents without a body
                    response["content"] = content
    return result
