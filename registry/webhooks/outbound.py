"""Outbound HTTP for webhooks: one POST to an address the registry may reach, within a deadline, no redirects.

A webhook URL is chosen by an admin, but its host name resolves to whatever its DNS says at the
moment of delivery. Left alone, a delivery could reach the cloud's metadata service (credentials),
or services on the registry's own network that no outsider could. So the name is resolved here, every
address is checked, and the connection is made to the checked address itself: a name that
resolved to a public address for the check cannot resolve to a private one for the connect (DNS
rebinding). HTTPS still verifies the certificate against the host name.

- Never: link-local addresses (169.254/16, fe80::/10), cloud metadata addresses, multicast, broadcast
  and unspecified ones (0/8, ::).
- Only with ``MODELYARD_WEBHOOK_ALLOW_PRIVATE``: loopback and private ranges, and every other range
  that IANA's special-purpose registries mark as not globally reachable. The tables are this
  module's own, not the interpreter's ``is_global`` (which differs between Python releases, and
  calls ``::ffff:0:a9fe:a9fe`` global).
- An IPv6 address that carries an IPv4 address (mapped ``::ffff:0:0/96``, SIIT ``::ffff:0:0:0/96``,
  compatible ``::/96``, NAT64 ``64:ff9b::/96`` and the local-use ``64:ff9b:1::/48``, 6to4, Teredo) is
  refused when the IPv4 address would be: that is where the packets end up. Inside the local-use
  prefix the operator's prefix length is unknown, so each place RFC 6052 allows for it is checked.
- The URL itself: http or https, a host, no credentials, no spaces or control characters (a CR or
  LF would otherwise reach the request line).
- Redirects are not followed (an answer of 3xx is a failed attempt); proxies from the environment
  are not used (they would connect on our behalf, past the check).
- The whole attempt, from connecting to reading the answer's status line, ends at the deadline
  (``MODELYARD_WEBHOOK_TIMEOUT_SECONDS``), however slowly the other side drips its bytes. Only the
  status line is kept: a receiver's body could echo secrets, or say anything at all.

This module knows nothing of Django: the caller passes the settings.
"""

from __future__ import annotations

import http.client
import ipaddress
import re
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
ALLOW_PRIVATE_SETTING = "MODELYARD_WEBHOOK_ALLOW_PRIVATE"
TIMEOUT_SETTING = "MODELYARD_WEBHOOK_TIMEOUT_SECONDS"
REASON_CHARS = 64  # of the answer's reason phrase, kept for the delivery log (never its body)


def _networks(*texts: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(text) for text in texts)


# What a delivery may never reach, whatever the setting, and why. (IANA's IPv4 and IPv6 special-purpose
# address registries, with the multicast and link-local blocks.)
NEVER = (
    (_networks("169.254.0.0/16", "fe80::/10"), "a link-local address"),
    (_networks("0.0.0.0/8", "255.255.255.255/32", "224.0.0.0/4", "::/128", "ff00::/8"), "not a unicast address"),
)
LOOPBACK = _networks("127.0.0.0/8", "::1/128")
# Not globally reachable: only with MODELYARD_WEBHOOK_ALLOW_PRIVATE. Conservative where the registry
# makes exceptions inside a block (192.0.0.0/24, 2001::/23): the whole block is refused.
PRIVATE = _networks(
    "10.0.0.0/8",
    "100.64.0.0/10",  # shared address space (carrier-grade NAT)
    "172.16.0.0/12",
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
    "192.168.0.0/16",
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "240.0.0.0/4",  # reserved
    "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation
    "100::/64",  # discard-only
    "2001::/23",  # IETF protocol assignments
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "5f00::/16",  # segment routing SIDs
    "fc00::/7",  # unique local
    "fec0::/10",  # site-local (deprecated)
)
# IPv6 prefixes whose last 32 bits are an IPv4 address, which is where a connection really goes.
LAST_32_BITS = _networks(
    "::ffff:0:0/96",  # IPv4-mapped
    "::ffff:0:0:0/96",  # IPv4-translated (SIIT)
    "::/96",  # IPv4-compatible (deprecated); :: and ::1 are not, and are checked as themselves
    "64:ff9b::/96",  # NAT64, well-known prefix
)
# The local-use NAT64 prefix: the operator picks a prefix length inside it, and RFC 6052 places the
# IPv4 address differently for each, around the reserved octet (bits 64-71).
LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
# Where the IPv4 address sits, [(first bit, bits)...], for the RFC 6052 prefix lengths /48, /56 and /64.
LOCAL_NAT64_LAYOUTS = (
    ((48, 16), (72, 16)),
    ((56, 8), (72, 24)),
    ((72, 32),),
)


class DeliveryRefused(Exception):
    """The URL or the address it resolves to may not be reached; no connection was made."""


class DeliveryFailed(Exception):
    """The attempt was made and did not get an answer (connection refused, timeout, TLS error)."""


@dataclass(frozen=True)
class Answer:
    """The receiver's status line; its body is never kept (it could echo what it should not)."""

    status: int
    reason: str  # the reason phrase, printable ASCII, at most REASON_CHARS


def _bits(value: int, first: int, count: int) -> int:
    """``count`` bits of a 128-bit ``value`` from bit ``first``, counted from the left."""
    return (value >> (128 - first - count)) & ((1 << count) - 1)


def _embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address may carry (mapped, SIIT, compatible, NAT64, 6to4, Teredo)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    value = int(address)
    if any(address in network for network in LAST_32_BITS):
        return [] if value <= 1 else [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address in LOCAL_NAT64:
        found = []
        for pieces in LOCAL_NAT64_LAYOUTS:
            # A layout fits only with its reserved octet and its suffix (after the IPv4 address) zero.
            end = pieces[-1][0] + pieces[-1][1]
            if _bits(value, 64, 8) or _bits(value, end, 128 - end):
                continue
            v4 = 0
            for first, count in pieces:
                v4 = (v4 << count) | _bits(value, first, count)
            found.append(ipaddress.IPv4Address(v4))
        # The /96 layout always fits; its 0.0.0.0 means "a shorter layout", which was checked above.
        if value & 0xFFFFFFFF or not found:
            found.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
        return found
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return [address.teredo[1]]
    return []


def address_refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a delivery may not connect to ``address``, or None when it may.

    An IPv6 address carrying an IPv4 address is refused with the IPv4 address's reason.
    """
    if address in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata address"
    for networks, what in NEVER:
        if any(address in network for network in networks):
            return f"{address} is {what}"
    for inner in _embedded_ipv4(address):
        refusal = address_refusal(inner, allow_private=allow_private)
        if refusal is not None:
            return refusal
    if allow_private:
        return None
    if any(address in network for network in LOOPBACK):
        return f"{address} is a loopback address (set {ALLOW_PRIVATE_SETTING}=true to deliver there)"
    if any(address in network for network in PRIVATE):
        return f"{address} is a private address (set {ALLOW_PRIVATE_SETTING}=true to deliver there)"
    return None


# Refused anywhere in a URL: a space or a control character (C0, DEL, C1) could split the request line.
_UNSAFE_CHARACTER = re.compile(r"[\x00-\x20\x7f-\x9f]")


def url_refusal(url: str, *, allow_private: bool) -> str | None:
    """Why ``url`` can never be a webhook's URL, or None. A host name is checked when a delivery resolves it."""
    unsafe = _UNSAFE_CHARACTER.search(url)
    if unsafe is not None:
        return f"the URL must not contain spaces or control characters (found {unsafe.group()!r})"
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


def _printable(text: str) -> str:
    return "".join(char for char in text if " " <= char <= "~").strip()


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
        answer = Answer(status=response.status, reason=_printable(response.reason or "")[:REASON_CHARS])
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
