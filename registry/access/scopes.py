"""Least privilege for API tokens: the roles a token carries and the models it reaches.

A token names the roles it carries (``ApiToken.roles``; none named: all of its user's) and the
models it reaches as fnmatch patterns on their names (``ApiToken.model_patterns``; none: every
model). Its effective roles are decided at every request, as its roles that its user still holds,
so taking a role from the user takes it from every token of theirs at once (``/v2`` within its
token cache's few seconds). The registry API (:class:`TokenModelScope`), ``/v2`` and gRPC
(``registry.serving.TokenGrant``) answer 403 for a model outside a token's patterns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any

from django.db.models import Q
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from registry.models import ApiToken, Role

# A pattern is a model name (registry.models.NAME_PATTERN's characters) with fnmatch's * ? and [...] in it.
MODEL_PATTERN = re.compile(r"[a-z0-9._\-*?\[\]!]{1,64}")
MAX_MODEL_PATTERNS = 20


def model_patterns_problem(patterns: Sequence[str]) -> str | None:
    """What is wrong with a token's model patterns, or None."""
    if len(patterns) > MAX_MODEL_PATTERNS:
        return f"at most {MAX_MODEL_PATTERNS} model patterns, got {len(patterns)}"
    for pattern in patterns:
        if not isinstance(pattern, str) or not MODEL_PATTERN.fullmatch(pattern):
            return (
                f"bad model pattern {pattern!r}: use a model name, with * ? or [...] as wildcards "
                "(lowercase letters, digits, '.', '_', '-'; at most 64 characters)"
            )
    return None


def model_in_scope(name: str, patterns: Iterable[str]) -> bool:
    """Whether the model ``name`` matches one of ``patterns``; no patterns means every model."""
    patterns = list(patterns)
    return not patterns or any(fnmatchcase(name, pattern) for pattern in patterns)


def describe_patterns(patterns: Iterable[str]) -> str:
    return ", ".join(f"'{pattern}'" for pattern in patterns)


def out_of_scope_message(name: str, patterns: Iterable[str]) -> str:
    return f"this API token is limited to models matching {describe_patterns(patterns)}; '{name}' is not one of them"


def _pattern_regex(pattern: str) -> str:
    """A PostgreSQL regular expression matching what the fnmatch ``pattern`` matches."""
    out, i = ["^"], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[" and (end := pattern.find("]", i + 2 if pattern[i + 1 : i + 2] == "!" else i + 1)) > i:
            body = pattern[i + 1 : end]
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    out.append("$")
    return "".join(out)


def model_scope_q(patterns: Sequence[str], field: str = "name") -> Q:
    """A filter keeping the rows whose model name (``field``) a token's patterns reach; all of them without patterns."""
    if not patterns:
        return Q()
    q = Q(pk__in=[])
    for pattern in patterns:
        q |= Q(**{f"{field}__regex": _pattern_regex(pattern)})
    return q


def token_patterns(request: Any) -> list[str]:
    """The model patterns of the token a request authenticated with; [] for a session or an unlimited token."""
    token = getattr(request, "auth", None)
    return list(token.model_patterns) if isinstance(token, ApiToken) else []


def effective_roles(held: set[str], token: ApiToken) -> set[str]:
    """The roles ``token`` carries now: those it names that its user (holding ``held``) still has.

    An admin holds every role, so an admin's token may carry any of them, and then only those.
    """
    if token.roles is None:
        return set(held)
    named = set(token.roles) & set(Role.values)
    return named if Role.ADMIN in held else named & held


class TokenModelScope(BaseThrottle):
    """Refuses (403) an API request for a model outside its token's model patterns.

    Not a rate limit: DRF runs its throttle classes for every view, after authentication and the
    permissions, which makes this the one place that sees both the token and the model a URL
    names (its ``name`` argument, or what a view's ``scoped_model(kwargs)`` finds, such as the
    model of a promotion). A write refused here is audited as any 403 (``registry.api.errors``).
    """

    def allow_request(self, request: Request, view: Any) -> bool:
        patterns = token_patterns(request)
        if not patterns:
            return True
        kwargs = getattr(view, "kwargs", {}) or {}
        finder = getattr(view, "scoped_model", None)
        name = finder(kwargs) if finder is not None else kwargs.get("name")
        if name is not None and not model_in_scope(name, patterns):
            raise exceptions.PermissionDenied(out_of_scope_message(name, patterns))
        return True

    def wait(self) -> float | None:
        return None
