"""Who a request comes from, as far as a client cannot forge it: the address, the request id, safe text.

The address is the direct peer's unless that peer is a trusted proxy (``MODELYARD_TRUSTED_PROXIES``);
X-Request-ID is taken only from such a proxy; NUL characters (which PostgreSQL cannot store) are
replaced and lengths capped. The audit log, the API throttles and the login lockout all count and
record callers through these functions, so they agree on who a caller is; :func:`actor_from_request`
is the audit log's :class:`~registry.audit.chain.Actor` for a request.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from typing import Any

from django.conf import settings

from registry.audit.chain import Actor

# A request id a trusted proxy may pass on: short, and nothing that needs escaping anywhere.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,64}")
# Where the request id made for a request is kept, so that every event of the request shares it.
REQUEST_ID_KEY = "modelyard.request_id"


def clean_text(value: str, limit: int) -> str:
    """A client's string as recorded: NUL, which PostgreSQL cannot store, becomes U+FFFD; at most ``limit`` long."""
    return value.replace("\x00", "\ufffd")[:limit]


def client_address(meta: dict[str, Any]) -> tuple[str, bool]:
    """The client's address, and whether the request came through a trusted proxy.

    X-Forwarded-For is read only when the direct peer is a trusted proxy, and from the right: each
    trusted proxy appended the address it was talking to, so the first hop that is not a trusted
    proxy is the client, and whatever a client wrote further left is never reached. A hop that is
    not an address ends the walk at the last proxy that passed it on.
    """
    remote = str(meta.get("REMOTE_ADDR") or "")
    peer = _address(remote)
    if peer is None or not _trusted(peer):
        return clean_text(remote, 64), False
    client = peer
    for hop in reversed(str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",")):
        address = _address(hop)
        if address is None:
            break
        client = address
        if not _trusted(address):
            break
    return str(client), True


def request_id(meta: dict[str, Any], *, from_proxy: bool) -> str:
    """X-Request-ID when a trusted proxy sent a plain one of at most 64 characters; otherwise one made here."""
    given = str(meta.get("HTTP_X_REQUEST_ID", ""))
    if from_proxy and REQUEST_ID.fullmatch(given):
        return given
    made: str = meta.setdefault(REQUEST_ID_KEY, uuid.uuid4().hex)
    return made


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("["):  # [2001:db8::1]:443
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # 192.0.2.1:443
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1, and matches 10.0.0.0/8
    return address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(address in network for network in settings.TRUSTED_PROXIES)


def actor_from_request(request: Any) -> Actor:
    meta = request.META
    ip, from_proxy = client_address(meta)
    auth = getattr(request, "auth", None)
    user = getattr(request, "user", None)
    user = user if getattr(user, "is_authenticated", False) else None
    return Actor(
        user=user,
        token_id=getattr(auth, "pk", None),
        ip=ip,
        user_agent=clean_text(meta.get("HTTP_USER_AGENT", ""), 512),
        request_id=request_id(meta, from_proxy=from_proxy),
        label="anonymous",
    )
