"""Which addresses a webhook delivery may reach (``registry.webhooks.outbound``), including those hidden inside IPv6."""

from __future__ import annotations

import ipaddress

import pytest

from registry.webhooks import outbound

ALLOW = "(set MODELYARD_WEBHOOK_ALLOW_PRIVATE=true to deliver there)"


@pytest.mark.parametrize(
    ("address", "private_allowed", "refusal"),
    [
        ("93.184.216.34", False, None),
        ("2606:2800:220:1:248:1893:25c8:1946", False, None),
        ("127.0.0.1", False, f"127.0.0.1 is a loopback address {ALLOW}"),
        ("127.0.0.1", True, None),
        ("::1", False, f"::1 is a loopback address {ALLOW}"),
        ("10.0.0.7", False, f"10.0.0.7 is a private address {ALLOW}"),
        ("192.168.1.1", True, None),
        ("fd12::1", False, f"fd12::1 is a private address {ALLOW}"),
        ("100.64.0.1", False, f"100.64.0.1 is a private address {ALLOW}"),  # shared (carrier-grade NAT)
        # Never, whatever the setting:
        ("169.254.169.254", True, "169.254.169.254 is a cloud metadata address"),
        ("fd00:ec2::254", True, "fd00:ec2::254 is a cloud metadata address"),
        ("100.100.100.200", True, "100.100.100.200 is a cloud metadata address"),
        ("169.254.10.1", True, "169.254.10.1 is a link-local address"),
        ("fe80::1", True, "fe80::1 is a link-local address"),
        ("0.0.0.0", True, "0.0.0.0 is not a unicast address"),
        ("224.0.0.1", True, "224.0.0.1 is not a unicast address"),
        # An IPv4 address inside IPv6 goes where the IPv4 address goes.
        ("::ffff:169.254.169.254", True, "169.254.169.254 is a cloud metadata address"),
        ("::ffff:127.0.0.1", False, f"127.0.0.1 is a loopback address {ALLOW}"),
        ("64:ff9b::a9fe:a9fe", True, "169.254.169.254 is a cloud metadata address"),  # NAT64
        ("2002:a9fe:a9fe::1", True, "169.254.169.254 is a cloud metadata address"),  # 6to4
    ],
)
def test_address_refusals(address, private_allowed, refusal):
    assert outbound.address_refusal(ipaddress.ip_address(address), allow_private=private_allowed) == refusal


def test_a_refused_url_is_never_connected_to(monkeypatch):
    def no_connection(*args, **kwargs):
        raise AssertionError("connected")

    monkeypatch.setattr(outbound, "_connect", no_connection)
    with pytest.raises(outbound.DeliveryRefused, match=r"^169\.254\.169\.254 is a cloud metadata address$"):
        outbound.post("http://169.254.169.254/latest/meta-data", b"{}", {}, timeout=1, allow_private=True)


def test_https_checks_the_certificate_against_the_host_name(tmp_path):
    """A receiver with a certificate no authority signed is not delivered to: TLS is verified, with SNI."""
    import datetime
    import socket
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[str | None] = []

    def serve_one() -> None:
        conn, _ = listener.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                seen.append(tls.recv(100).decode())
        except (ssl.SSLError, OSError):
            seen.append(None)  # the client refused the handshake

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        with pytest.raises(outbound.DeliveryFailed, match="CERTIFICATE_VERIFY_FAILED"):
            outbound.post(f"https://localhost:{port}/hook", b"{}", {}, timeout=5, allow_private=True)
        thread.join(timeout=10)
    finally:
        listener.close()
    assert seen == [None]  # nothing was sent over the unverified connection


@pytest.mark.parametrize(
    ("address", "private_allowed", "refusal"),
    [
        # Local-use NAT64 (64:ff9b:1::/48), IPv4-compatible (::/96) and SIIT (::ffff:0:0:0/96) carry an
        # IPv4 address too, which Python 3.11's is_global calls global.
        ("64:ff9b:1::a9fe:a9fe", True, "169.254.169.254 is a cloud metadata address"),
        ("64:ff9b:1:a9fe:a9:fe00::", True, "169.254.169.254 is a cloud metadata address"),  # a /48 prefix
        ("64:ff9b:1:ffa9:fe:a9fe::", True, "169.254.169.254 is a cloud metadata address"),  # a /56 prefix
        ("64:ff9b:1:0:a9:fea9:fe00:0", True, "169.254.169.254 is a cloud metadata address"),  # a /64 prefix
        ("64:ff9b:1::7f00:1", False, f"127.0.0.1 is a loopback address {ALLOW}"),
        ("64:ff9b:1::a00:1", False, f"10.0.0.1 is a private address {ALLOW}"),
        ("64:ff9b:1::5db8:d822", False, f"64:ff9b:1::5db8:d822 is a private address {ALLOW}"),  # local use
        ("64:ff9b:1::5db8:d822", True, None),
        ("::a9fe:a9fe", True, "169.254.169.254 is a cloud metadata address"),
        ("::7f00:1", False, f"127.0.0.1 is a loopback address {ALLOW}"),
        ("::a00:1", False, f"10.0.0.1 is a private address {ALLOW}"),
        ("::ffff:0:a9fe:a9fe", True, "169.254.169.254 is a cloud metadata address"),
        ("::ffff:0:7f00:1", False, f"127.0.0.1 is a loopback address {ALLOW}"),
        ("::ffff:0:a00:1", False, f"10.0.0.1 is a private address {ALLOW}"),
        ("::ffff:5db8:d822", False, None),  # a public IPv4 address, mapped
        ("::1", True, None),
        ("::", True, ":: is not a unicast address"),
        ("0.1.2.3", True, "0.1.2.3 is not a unicast address"),
        ("255.255.255.255", True, "255.255.255.255 is not a unicast address"),
        ("198.18.0.1", False, f"198.18.0.1 is a private address {ALLOW}"),
        ("2001:db8::1", False, f"2001:db8::1 is a private address {ALLOW}"),
    ],
)
def test_ipv6_forms_of_refused_ipv4_addresses_are_refused(address, private_allowed, refusal):
    assert outbound.address_refusal(ipaddress.ip_address(address), allow_private=private_allowed) == refusal


@pytest.mark.parametrize(
    ("url", "found"),
    [
        ("http://hooks.example.com/in\r\nX-Injected: 1", "'\\r'"),
        ("http://hooks.example.com/in\nx", "'\\n'"),
        ("http://hooks.example.com/a b", "' '"),
        ("http://hooks.example.com/\x00", "'\\x00'"),
        ("http://hooks.example.com/\x7f", "'\\x7f'"),
        ("http://hooks.example.com/\x85", "'\\x85'"),
    ],
)
def test_urls_with_spaces_or_control_characters_are_refused(url, found):
    assert outbound.url_refusal(url, allow_private=True) == (
        f"the URL must not contain spaces or control characters (found {found})"
    )
