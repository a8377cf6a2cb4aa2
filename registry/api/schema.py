"""What the OpenAPI schema (``/api/schema/``) says about signing in: a bearer token, or a browser session.

drf-spectacular knows DRF's session authentication; the bearer token is ours, so it is described here
(imported by ``modelyard/urls.py``, beside the schema's views, and not at start: drf-spectacular
costs 0.3 s of a cold start that a process serving no schema, an inference one, need not pay).
``AddressCount`` accepts no credentials (it only counts requests that bring none), so the schema
leaves it out (``AUTHENTICATION_WHITELIST`` in the settings).
"""

from __future__ import annotations

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
