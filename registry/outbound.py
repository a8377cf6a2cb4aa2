"""Outbound HTTP for webhooks: one POST to an address the registry may reach, within a deadline, no redirects.

A webhook URL is chosen by an admin, but its host name resolves to whatever its DNS says at the
moment of delivery. Left alone, a delivery could reach the cloud's metadata service (credentials),
or services on the registry's own network that no outsider could. So the name is resolved here, every
address is checked, and the connection is made to the checked address itself: a name that
resolved to a public address for the check cannot resolve to a private one for the connect (DNS
rebinding). HTTPS still verifies the certificate against the host name.

- Never: link-local addresses (169.254/16, fe80::/10), cloud metadata addresses, multicast and
  unspecified ones.
- Only with ``MODELYARD_WEBHOOK_ALLOW_PRIVATE``: loopback and private ranges, and any other address
  that is not globally routable.
- Redirects are not followed (an answer of 3xx is a failed attempt); proxies from the environment
  are not used (they would connect on our behalf, past the check).
- The whole attempt, from connecting to reading the answer's first KiB, ends at the deadline
  (``MODELYARD_WEBHOOK_TIMEOUT_SECONDS``), however slowly the other side drips its bytes.

This module knows nothing of Django: the caller passes the settings.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Metadata services of the clouds, refused even when private addresses are allowed. Most sit in
# 169.254/16 (refused as link-local anyway); these are the ones that do not, and AWS's IPv6 one.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (classic)
    )
)
NAT64 = ipaddress.ip_network("64:ff9b::/96")
ALLOW_PRIVATE_SETTING = "MODELYARD_WEBHOOK_ALLOW_PRIVATE"
TIMEOUT_SETTING = "MODELYARD_WEBHOOK_TIMEOUT_SECONDS"
ANSWER_BYTES = 1024  # of the answer's body, kept for the delivery log


class DeliveryRefused(Exception):
    """The URL or the address it resolves to may not be reached; no connection was made."""


class DeliveryFailed(Exception):
    """The attempt was made and did not get an answer (connection refused, timeout, TLS error)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # at most ANSWER_BYTES of it


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo, NAT64), which is where it really goes."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a delivery may not connect to ``address``, or None when it may."""
    inner = _embedded_ipv4(address)
    if inner is not None:
        return address_refusal(inner, allow_private=allow_private)
    if address in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata address"
    if address.is_link_local:
        return f"{address} is a link-local address"
    if address.is_multicast or address.is_unspecified:
        return f"{address} is not a unicast address"
    if address.is_global or allow_private:
        return None
    kind = "a loopback" if address.is_loopback else "a private"
    return f"{address} is {kind} address (set {ALLOW_PRIVATE_SETTING}=true to deliver there)"


def url_refusal(url: str, *, allow_private: bool) -> str | None:
    """Why ``url`` can never be a webhook's URL, or None. A host name is checked when a delivery resolves it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "the URL must start with http:// or https://"
    if not parts.hostname:
        return "the URL has no host"
    if parts.username is not None or parts.password is not None:
        return "the URL must not carry credentials; the signature authenticates deliveries"
    if port == 0:
        return "the URL's port must not be 0"
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        return None
    return address_refusal(literal, allow_private=allow_private)


def _connect(host: str, port: int, timeout: float, allow_private: bool) -> socket.socket:
    """A TCP connection to the first address of ``host`` that may be reached; the address checked is the one used."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise DeliveryFailed(f"cannot resolve {host}: {exc}") from exc
    refusals: list[str] = []
    last_error: OSError | None = None
    for family, kind, proto, _, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        refusal = address_refusal(address, allow_private=allow_private)
        if refusal is not None:
            refusals.append(refusal)
            continue
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            last_error = exc
            continue
        return sock
    if last_error is not None:
        raise DeliveryFailed(f"cannot connect to {host}:{port}: {last_error}")
    raise DeliveryRefused(f"refused to deliver to {host}: {'; '.join(dict.fromkeys(refusals))}")


class _GuardedHTTPConnection(http.client.HTTPConnection):
    allow_private = False

    def connect(self) -> None:
        self.sock = _connect(self.host, self.port, float(self.timeout or 0) or 10.0, self.allow_private)


class _GuardedHTTPSConnection(http.client.HTTPSConnection):
    allow_private = False

    def connect(self) -> None:
        sock = _connect(self.host, self.port, float(self.timeout or 0) or 10.0, self.allow_private)
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]  # set by HTTPSConnection
        self.sock = context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float, allow_private: bool) -> Answer:
    """POST ``body`` to ``url`` once; raises :class:`DeliveryRefused` or :class:`DeliveryFailed`, else the answer."""
    refusal = url_refusal(url, allow_private=allow_private)
    if refusal is not None:
        raise DeliveryRefused(refusal)
    parts = urlsplit(url)
    host = parts.hostname
    assert host is not None  # url_refusal checked it
    https = parts.scheme == "https"
    connection_class = _GuardedHTTPSConnection if https else _GuardedHTTPConnection
    connection = connection_class(host, parts.port or (443 if https else 80), timeout=timeout)
    connection.allow_private = allow_private
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    expired = threading.Event()

    def cut_off() -> None:
        # Per-operation socket timeouts do not bound a peer that sends a byte every few seconds.
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    deadline = threading.Timer(timeout, cut_off)
    deadline.daemon = True
    deadline.start()
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        answer = Answer(status=response.status, body=response.read(ANSWER_BYTES))
    except DeliveryRefused:
        raise
    except (OSError, http.client.HTTPException, DeliveryFailed) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise DeliveryFailed(f"no answer within {timeout:g} s ({TIMEOUT_SETTING})") from exc
        if isinstance(exc, DeliveryFailed):
            raise
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    finally:
        deadline.cancel()
        connection.close()
    if expired.is_set():
        raise DeliveryFailed(f"no answer within {timeout:g} s ({TIMEOUT_SETTING})")
    return answer
