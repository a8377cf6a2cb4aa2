"""A fleet across hosts: a registry host and three inference hosts, each a network namespace of its own.

The hosts hang off one bridge (in a namespace of its own, so the machine's firewall never sees the
traffic), each through a veth pair; the test process joins the bridge too. The registry host runs a
private PostgreSQL, moto's S3 server and ``modelyard serve --role web``; each inference host runs
``modelyard serve --role inference`` and reaches the registry only over its veth. Cutting a host's link
is ``ip link set <its veth> down`` on the bridge side: the host itself notices nothing but silence.

It needs root and ``ip`` (CI runs as root) and is skipped, saying why, where namespaces cannot be made.
It takes about 25 s (the cut host must miss 3 heartbeats of 5 s), under the ~30 s that would make it ``slow``.
Namespaces, links and processes are removed at the end whether the test passed or not.
"""

from __future__ import annotations

import glob
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import requests

from modelyard.processes import kill_group
from tests.support.inference import answered_bias, infer_body
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import eventually
from tests.support.processes import ServeProcess, free_port
from tests.support.servers import Api, PrivatePostgres, createtoken, inference_env, is_ready, token_of

HEARTBEAT = 5.0  # seconds; offline means 3 missed beats, and never less than 15 s
INFER = "/v2/models/demo/versions/staging/infer"
# A host cut off from the database notices within seconds (its query fails instead of waiting on TCP's
# retransmissions for minutes) and reconnects as soon as the link is back: the README recommends these.
DB_OPTIONS = "connect_timeout=2&tcp_user_timeout=3000"


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def namespaces_unavailable() -> str:
    """Why this machine cannot make network namespaces, or '' when it can."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"modelyard-probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe)
    return ""


@dataclass
class Host:
    name: str
    netns: str
    address: str
    port: str  # its veth's end on the bridge


class Network:
    """A bridge in a namespace of its own; each host is a namespace wired to it; this process on a third link."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.switch = f"modelyard-{self.tag}-switch"
        self.uplink = f"my{self.tag}"  # in this process's namespace, so unique here
        self.subnet = self._free_subnet()
        self.hosts: list[Host] = []
        self._namespaces: list[str] = []
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink", "netns", self.switch)
        self._plug("uplink")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")

    @staticmethod
    def _free_subnet() -> str:
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
        for _ in range(100):
            subnet = f"10.{random.randint(64, 250)}.{random.randint(0, 255)}"
            if f"{subnet}." not in routes:
                return subnet
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _plug(self, port: str) -> None:
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")

    def add_host(self, name: str, number: int) -> Host:
        host = Host(name, f"modelyard-{self.tag}-{name}", f"{self.subnet}.{number}", f"p-{name}")
        self._add_namespace(host.netns)
        _ip("-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        self._plug(host.port)
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        self.hosts.append(host)
        return host

    def cut(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def destroy(self) -> None:
        """Kill whatever still runs in the namespaces, then delete them and the uplink; never raises."""
        for name in reversed(self._namespaces):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True)


def in_namespace(host: Host) -> list[str]:
    return ["ip", "netns", "exec", host.netns]


def request_inside(host: Host, server: ServeProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One HTTP request made from inside ``host``'s namespace (which its cut link does not cut off from itself)."""
    script = (
        "import http.client, json, sys\n"
        "host, port, method, path, body = sys.argv[1:]\n"
        "conn = http.client.HTTPConnection(host, int(port), timeout=20)\n"
        "conn.request(method, path, body or None, {'Content-Type': 'application/json'})\n"
        "response = conn.getresponse()\n"
        "print(response.status)\n"
        "print(response.read().decode())\n"
    )
    argv = [*in_namespace(host), sys.executable, "-c", script]
    argv += [server.host, str(server.port), method, path, "" if body is None else json.dumps(body)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    return int(status), json.loads(text) if text.strip().startswith("{") else text


def served_version(answer: tuple[int, Any], x: np.ndarray) -> int | None:
    """The version that answered (checked against its bias), or None if the request failed."""
    status, body = answer
    if status != 200:
        return None
    version = int(body["model_version"])
    assert answered_bias(x, body, (1.0, 2.0, 3.0)) == float(version), body
    return version


X = np.arange(8, dtype=np.float32).reshape(2, 4)


def serves(server: ServeProcess, version: int) -> bool:
    try:
        return served_version(server.request("POST", INFER, infer_body(X), timeout=5), X) == version
    except OSError:
        return False


def serves_inside(host: Host, server: ServeProcess, version: int) -> bool:
    return served_version(request_inside(host, server, "POST", INFER, infer_body(X)), X) == version


@pytest.fixture
def network() -> Iterator[Network]:
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    net = Network()
    try:
        yield net
    finally:
        net.destroy()


@pytest.fixture
def postgres_bindir() -> Path:
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bindirs or not (Path(bindirs[-1]) / "initdb").exists():
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    if shutil.which("runuser") is None:
        pytest.skip("running as root needs runuser to start PostgreSQL as the postgres user")
    return Path(bindirs[-1])


def test_a_fleet_across_hosts_converges_marks_a_cut_host_offline_and_takes_it_back(
    network: Network, postgres_bindir: Path, tmp_path: Path
):
    registry = network.add_host("registry", 1)
    hosts = [network.add_host(f"inf{i}", 10 + i) for i in (1, 2, 3)]
    started: list[subprocess.Popen[Any]] = []
    servers: list[ServeProcess] = []
    database = PrivatePostgres(postgres_bindir, host=registry.address, netns=registry.netns)
    try:
        # --- The registry host: PostgreSQL, S3 and the web role, all on its address ---------------------------
        with (database.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {network.subnet}.0/24 trust\n")
        database.start()
        database_url = f"{database.url}?{DB_OPTIONS}"
        s3_port = free_port()
        with (tmp_path / "s3.log").open("wb") as log:
            moto = subprocess.Popen(
                [
                    *in_namespace(registry),
                    sys.executable,
                    "-m",
                    "moto.server",
                    "-H",
                    registry.address,
                    "-p",
                    str(s3_port),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(moto)
        s3_endpoint = f"http://{registry.address}:{s3_port}"
        aws = {"AWS_ACCESS_KEY_ID": "fleet", "AWS_SECRET_ACCESS_KEY": "fleet", "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = boto3.session.Session().client(
            "s3",
            endpoint_url=s3_endpoint,
            region_name="us-east-1",
            aws_access_key_id="fleet",
            aws_secret_access_key="fleet",
        )
        eventually(lambda: _create_bucket(s3), timeout=60, interval=0.2, what=lambda: (tmp_path / "s3.log").read_text())

        def env(name: str) -> dict[str, str]:
            values = inference_env(name, tmp_path / f"{name}-data", database_url, tmp_path / "unused")
            values.update(
                aws,
                MODELYARD_STORAGE_URL="s3://fleet/artifacts",
                MODELYARD_S3_ENDPOINT_URL=s3_endpoint,
                MODELYARD_S3_ADDRESSING_STYLE="path",
                MODELYARD_FLEET_HEARTBEAT_SECONDS=str(HEARTBEAT),
                MODELYARD_SECRET_KEY="one-key-for-the-whole-fleet",
            )
            return values

        web = ServeProcess(
            "web",
            "web",
            env("web"),
            tmp_path / "web.log",
            args=("--migrate",),
            host=registry.address,
            netns=registry.netns,
        )
        servers.append(web)
        web.wait_ready(timeout=120)
        admin = Api(web, token_of(createtoken(env("cli"), "alice", "admin")))

        # --- Three versions of y = x + bias; bias = version number ---------------------------------------------
        assert admin.call("POST", "/models", json={"name": "demo"}).status_code == 201
        for bias in (1.0, 2.0, 3.0):
            upload = admin.call(
                "POST", "/models/demo/versions", files=[("file", ("m.onnx", add_model_bytes(bias=bias)))]
            )
            assert upload.status_code == 201, upload.text
            eventually(partial(is_ready, admin, upload.json()["version"]), timeout=60, what="never validated")
        assert admin.call("PUT", "/models/demo/aliases/staging", json={"version": 1}).status_code == 200
        assert admin.call("PATCH", "/models/demo/aliases/staging", json={"served": True}).status_code == 200

        # --- Three inference hosts ------------------------------------------------------------------------------
        for host in hosts:
            log_path = tmp_path / f"{host.name}.log"
            servers.append(
                ServeProcess(host.name, "inference", env(host.name), log_path, host=host.address, netns=host.netns)
            )
        inference = dict(zip((h.name for h in hosts), servers[1:], strict=True))
        for server in inference.values():
            server.wait_ready(timeout=120)

        def fleet() -> dict[str, dict[str, Any]]:
            return {w["worker_id"]: w for w in admin.call("GET", "/fleet").json()}

        eventually(lambda: all(fleet().get(h.name, {}).get("online") for h in hosts), timeout=60, what=fleet)

        # A promotion with ?wait= returns once all three serve it.
        moved = promote_and_wait(admin, 2)
        assert moved.status_code == 200, moved.text
        assert moved.json()["version"] == 2
        for server in inference.values():
            assert serves(server, 2), server.name
        pids = {name: w["pid"] for name, w in fleet().items()}

        # --- Cut inf3 off --------------------------------------------------------------------------------------
        cut, cut_server = hosts[2], inference["inf3"]
        network.cut(cut)
        assert not serves(cut_server, 2), "the link is cut, yet inf3 answers from outside"
        # It goes on serving its loaded version to whoever still reaches it: here, its own namespace.
        for _ in range(5):
            assert serves_inside(cut, cut_server, 2)
        # The fleet marks it offline within 3 heartbeats (the eventually's slack is for a slow machine only).
        eventually(lambda: fleet()["inf3"]["online"] is False, timeout=3 * HEARTBEAT + 15, interval=0.5, what=fleet)
        assert fleet()["inf1"]["online"] and fleet()["inf2"]["online"]

        # A new promotion: inf1 and inf2 take it, and ?wait= names inf3 as lagging behind on version 2.
        moved = promote_and_wait(admin, 3)
        assert moved.status_code == 504, moved.text
        body = moved.json()
        assert body["error"] == "1 inference worker(s) did not serve version 3 within 60 s; the alias has moved"
        [laggard] = body["detail"]["laggards"]
        assert (laggard["worker_id"], laggard["serving"], laggard["state"]) == ("inf3", 2, "offline")
        assert laggard["error"].startswith("no heartbeat since ")
        assert serves(inference["inf1"], 3) and serves(inference["inf2"], 3)
        assert serves_inside(cut, cut_server, 2)

        # --- Restore the link: inf3 converges to version 3 without a restart ----------------------------------
        network.restore(cut)
        eventually(partial(serves, cut_server, 3), timeout=60, interval=0.5, what=cut_server.log)
        eventually(
            lambda: (
                fleet()["inf3"]["online"]
                and [(r["version"], r["state"]) for r in fleet()["inf3"]["loaded"]] == [(3, "ready")]
            ),
            timeout=30,
            what=fleet,
        )
        assert cut_server.process.poll() is None
        assert fleet()["inf3"]["pid"] == pids["inf3"]
        assert "database unreachable" in cut_server.log()  # it did lose the registry meanwhile
        again = promote_and_wait(admin, 3)
        assert again.status_code == 200, again.text
    finally:
        for server in servers:
            server.kill()
        for process in started:
            kill_group(process)
        database.destroy()


def promote_and_wait(admin: Api, version: int) -> requests.Response:
    """Move the served alias ``staging`` with ``?wait=60``, once: its 504 is an answer, not a reason to retry."""
    return admin.session.put(f"{admin.base}/models/demo/aliases/staging?wait=60", json={"version": version}, timeout=90)


def _create_bucket(client: Any) -> bool:
    try:
        client.create_bucket(Bucket="fleet")
    except Exception:  # noqa: BLE001 - the server is still starting
        return False
    return True
