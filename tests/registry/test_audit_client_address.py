"""The audit log records the address and request id a client cannot forge.

X-Forwarded-For and X-Request-ID count only when the direct peer is one of
``MODELYARD_TRUSTED_PROXIES``; otherwise the peer's address and a request id made by the server.
"""

from __future__ import annotations

import http.client
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from ipaddress import ip_network
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from modelyard.env import env_networks
from modelyard.processes import kill_group
from registry.access.clients import client_address, request_id
from registry.models import AuditEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("one_failure_minute")]  # auth.failed per minute

GENERATED = re.compile(r"[0-9a-f]{32}")


def _denied(person, **headers) -> AuditEvent:
    assert person.post("/api/v1/models", {"name": "x"}, **headers).status_code == 403
    return AuditEvent.objects.filter(action="access.denied").latest("seq")


@pytest.fixture
def behind_proxy(settings):
    settings.TRUSTED_PROXIES = (ip_network("10.0.0.0/8"), ip_network("2001:db8::/32"))


def test_without_trusted_proxies_forwarded_headers_are_ignored(outsider):
    event = _denied(
        outsider, REMOTE_ADDR="198.51.100.20", HTTP_X_FORWARDED_FOR="203.0.113.9", HTTP_X_REQUEST_ID="forged-id"
    )
    assert event.ip == "198.51.100.20"
    assert GENERATED.fullmatch(event.request_id)


def test_untrusted_peer_cannot_pass_forwarded_headers(outsider, behind_proxy):
    event = _denied(
        outsider, REMOTE_ADDR="198.51.100.20", HTTP_X_FORWARDED_FOR="10.0.0.1", HTTP_X_REQUEST_ID="forged-id"
    )
    assert event.ip == "198.51.100.20"
    assert GENERATED.fullmatch(event.request_id)


def test_trusted_proxy_passes_the_rightmost_untrusted_hop_and_its_request_id(outsider, behind_proxy):
    # The client wrote "1.2.3.4" itself; the proxies appended what they saw, from the right.
    event = _denied(
        outsider,
        REMOTE_ADDR="10.0.0.2",
        HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.9, 10.0.0.7",
        HTTP_X_REQUEST_ID="edge-42:abc",
    )
    assert (event.ip, event.request_id) == ("203.0.113.9", "edge-42:abc")


def test_bogus_token_through_a_trusted_proxy_counts_against_the_client(client, behind_proxy):
    headers = {"REMOTE_ADDR": "10.0.0.2", "HTTP_AUTHORIZATION": "Bearer my_feed_x"}
    assert client.get("/api/v1/models", HTTP_X_FORWARDED_FOR="203.0.113.9", **headers).status_code == 401
    assert client.get("/api/v1/models", HTTP_X_FORWARDED_FOR="203.0.113.10", **headers).status_code == 401
    assert sorted(AuditEvent.objects.filter(action="auth.failed").values_list("ip", flat=True)) == [
        "203.0.113.10",
        "203.0.113.9",
    ]


@pytest.mark.parametrize(
    ("forwarded", "client"),
    [
        ("", "10.0.0.2"),  # no header: the proxy itself
        ("10.0.0.9, 10.0.0.8", "10.0.0.9"),  # every hop trusted: the leftmost
        ("203.0.113.9, not-an-address, 10.0.0.7", "10.0.0.7"),  # garbage ends the walk at the last proxy
        ("203.0.113.9:5555", "203.0.113.9"),
        ("[2001:db8::5]:443, [2001:db9::1]:80", "2001:db9::1"),
        ("::ffff:10.0.0.3, 203.0.113.9", "203.0.113.9"),
    ],
)
def test_forwarded_for_is_walked_from_the_right(behind_proxy, forwarded, client):
    assert client_address({"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": forwarded}) == (client, True)


def test_ipv4_mapped_peer_is_trusted_like_its_ipv4_address(behind_proxy):
    meta = {"REMOTE_ADDR": "::ffff:10.0.0.2", "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert client_address(meta) == ("203.0.113.9", True)


@pytest.mark.parametrize("given", ["", "has space", "x" * 65, "nul\x00byte", "<script>", "ünïcode"])
def test_request_id_that_is_not_short_and_plain_is_replaced(given):
    meta = {"HTTP_X_REQUEST_ID": given}
    made = request_id(meta, from_proxy=True)
    assert GENERATED.fullmatch(made)
    assert request_id(meta, from_proxy=True) == made  # one id for every event of a request


def test_trusted_proxies_setting_parses_addresses_and_blocks(monkeypatch):
    monkeypatch.setenv("MODELYARD_TRUSTED_PROXIES", "10.0.0.1, 192.168.0.0/16,2001:db8::/32")
    assert env_networks("MODELYARD_TRUSTED_PROXIES") == (
        ip_network("10.0.0.1/32"),
        ip_network("192.168.0.0/16"),
        ip_network("2001:db8::/32"),
    )
    monkeypatch.setenv("MODELYARD_TRUSTED_PROXIES", "10.0.0.1, proxy.internal")
    with pytest.raises(ImproperlyConfigured, match=r"^MODELYARD_TRUSTED_PROXIES: 'proxy.internal' is not an IP"):
        env_networks("MODELYARD_TRUSTED_PROXIES")


def test_default_is_no_trusted_proxies(settings):
    assert settings.TRUSTED_PROXIES == ()
    assert client_address({"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.9"}) == ("127.0.0.1", False)


# --- Under the real server ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, source: str, headers: dict[str, str]) -> int:
    """GET /api/v1/models from ``source`` (any 127.x address reaches a server on 127.0.0.1)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", "/api/v1/models", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_modelyard_serve_leaves_forwarded_headers_to_the_trusted_proxies_setting(tmp_path: Path):
    """uvicorn itself would believe X-Forwarded-For from 127.0.0.1 and hide the peer that the setting judges."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "modelyard.settings",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),  # this checkout's code, whatever is installed
        "MODELYARD_DATA_DIR": str(tmp_path / "data"),
        "MODELYARD_TRUSTED_PROXIES": "127.0.0.1",
    }
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "modelyard.cli", "serve", "--role", "web", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"modelyard serve did not come up:\n{log.read_text()}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/fleet", timeout=2)
            except urllib.error.HTTPError:
                break  # 401: Django answers
            except OSError:
                time.sleep(0.2)
        spoof = {"Authorization": "Bearer my_feed_x", "X-Forwarded-For": "203.0.113.9", "X-Request-ID": "edge-1"}
        assert _get(port, "127.0.0.2", spoof) == 401  # a client, not the proxy
        proxied = {**spoof, "X-Forwarded-For": "203.0.113.9, 198.51.100.4", "X-Request-ID": "edge-2"}
        assert _get(port, "127.0.0.1", proxied) == 401  # the trusted proxy
    finally:
        kill_group(server)
    with sqlite3.connect(tmp_path / "data" / "modelyard.sqlite3") as db:
        rows = db.execute("SELECT ip, request_id FROM registry_auditevent WHERE action = 'auth.failed' ORDER BY seq")
        (client_ip, client_id), (proxied_ip, proxied_id) = rows.fetchall()
    assert client_ip == "127.0.0.2"
    assert GENERATED.fullmatch(client_id)
    assert (proxied_ip, proxied_id) == ("198.51.100.4", "edge-2")
