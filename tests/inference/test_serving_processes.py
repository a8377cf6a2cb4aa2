"""Real ``modelyard serve`` processes: swaps under load, several processes on one database, a database outage.

The inference processes run ``python -m modelyard.cli serve --role inference`` against the test database
(or, for the outage, a PostgreSQL server this test starts and stops itself) and the test's artifact folder.
Their reconcile loops wake on PostgreSQL NOTIFY and poll every 0.5 s. Everything is killed at the end.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from registry.models import InferenceWorker
from tests.support.inference import answered_bias, infer_body
from tests.support.load import ClientThreads
from tests.support.onnx_models import add_model_bytes
from tests.support.polling import eventually
from tests.support.processes import ServeProcess
from tests.support.registry import artifact_path, create_model, promote, set_alias, set_served, upload_versions
from tests.support.servers import Api, PrivatePostgres, createtoken, inference_env, is_ready, token_of

INFER = "/v2/models/demo/infer"
STAGING = "/v2/models/demo/versions/staging/infer"


def infer(server: ServeProcess, x: np.ndarray, path: str = INFER) -> tuple[int, Any]:
    return server.request("POST", path, infer_body(x))


def serves(server: ServeProcess, version: int, path: str = INFER) -> bool:
    """True when ``server`` answers ``path`` with ``version`` (whose bias is its number)."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    status, body = infer(server, x, path)
    if status != 200:
        return False
    return body["model_version"] == str(version) and answered_bias(x, body) == float(version)


def serves_both(server: ServeProcess, version: int) -> bool:
    return serves(server, version) and serves(server, version, STAGING)


def fleet_rows(worker_id: str) -> list[dict[str, Any]]:
    worker = InferenceWorker.objects.filter(worker_id=worker_id).first()
    return worker.loaded if worker else []


# --- A swap under constant load -----------------------------------------------------------------------


@dataclass
class Answer:
    client: int
    sent: float
    received: float
    status: int
    version: str
    bias: float | None
    error: str = ""


class LoadClients(ClientThreads):
    """Client threads, each on one keep-alive connection, sending /v2 infer requests back to back."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        super().__init__(clients)

    def _run(self, client: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        seq = 0
        while not self._stop.is_set():
            seq += 1
            # Integer-valued inputs, different for each request: x + bias is exact in float32.
            x = (np.arange(8, dtype=np.float32).reshape(2, 4) + client * 1000 + seq).astype(np.float32)
            sent = time.monotonic()
            try:
                conn.request("POST", INFER, json.dumps(infer_body(x)), {"Content-Type": "application/json"})
                response = conn.getresponse()
                raw = response.read()
                received = time.monotonic()
                if response.status == 200:
                    body = json.loads(raw)
                    answer = Answer(client, sent, received, 200, body["model_version"], answered_bias(x, body))
                else:
                    answer = Answer(client, sent, received, response.status, "", None, raw.decode(errors="replace"))
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, and the test fails on it
                answer = Answer(client, sent, time.monotonic(), 0, "", None, f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            with self._lock:
                self.answers.append(answer)
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_swap_under_load_fails_no_request_and_never_mixes_or_goes_back(owner, approver, start_server):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    server = start_server("inf-swap")
    eventually(lambda: serves(server, 1), timeout=30, what="v1 never served")

    clients = 4
    with LoadClients(server.port, clients) as load:
        eventually(lambda: all(load.count(c, "1") >= 20 for c in range(clients)), timeout=60)
        promote(owner, approver, 2)
        eventually(lambda: all(load.count(c, "2") >= 20 for c in range(clients)), timeout=60, what="v2 not served")
    answers = load.answers

    failed = [a for a in answers if a.status != 200]
    assert failed == [], f"{len(failed)} of {len(answers)} requests failed, e.g. {failed[:3]}"
    # Every response is wholly one version's: its outputs are x + that version's bias.
    assert {(a.version, a.bias) for a in answers} == {("1", 1.0), ("2", 2.0)}
    for client in range(clients):
        versions = [a.version for a in answers if a.client == client]
        switch = versions.index("2")
        assert set(versions[:switch]) == {"1"} and set(versions[switch:]) == {"2"}, f"client {client} went back"
    # Across clients too: once any v2 answer was received, every request sent afterwards got v2.
    first_v2 = min(a.received for a in answers if a.version == "2")
    assert all(a.version == "2" for a in answers if a.sent > first_v2)

    # v1 is released: the fleet row lists v2 alone.
    only_v2 = [(2, ["production"], "ready")]
    eventually(
        lambda: [(r["version"], r["aliases"], r["state"]) for r in fleet_rows("inf-swap")] == only_v2,
        what=lambda: f"fleet row: {fleet_rows('inf-swap')}",
    )


# --- Several processes on one database ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_several_processes_converge_and_put_wait_reports_laggards(
    owner, approver, admin, start_server, tmp_path, settings
):
    create_model(owner)
    _, _, v3 = upload_versions(owner, [1.0, 2.0, 3.0])
    promote(owner, approver, 1)
    assert set_alias(owner, "staging", 1).status_code == 200
    set_served(admin, "staging", True)
    # Process b reads a mirror of the artifact folder in which v3's bytes are corrupt (another valid model).
    mirror = tmp_path / "mirror"
    shutil.copytree(settings.STORAGE.path, mirror)
    corrupt = mirror / artifact_path(v3).relative_to(settings.STORAGE.path)
    corrupt.write_bytes(add_model_bytes(bias=9.0))

    a = start_server("inf-a", wait=False)
    b = start_server("inf-b", storage=mirror, wait=False)
    for server in (a, b):
        server.wait_ready()
        eventually(partial(serves_both, server, 1), timeout=30, what=f"{server.name} never served v1")

    # A promotion reaches both processes.
    promote(owner, approver, 2)
    for server in (a, b):
        eventually(partial(serves, server, 2), timeout=30, what=f"{server.name} never served production v2")

    # ?wait= answers 200 only once every live process serves the new version.
    response = set_alias(owner, "staging", 2, wait=20)
    assert response.status_code == 200, response.content
    assert response.json()["version"] == 2
    for server in (a, b):
        assert serves(server, 2, STAGING), server.name
        rows = {r["version"]: r for r in fleet_rows(server.name)}
        assert rows[2]["aliases"] == ["production", "staging"]

    # b cannot load v3: the alias moves, the PUT answers 504 and names b; b keeps serving v2.
    response = set_alias(owner, "staging", 3, wait=2)
    assert response.status_code == 504, response.content
    body = response.json()
    assert body["error"].endswith("within 2 s; the alias has moved")
    assert body["detail"]["alias"]["version"] == 3
    assert "inf-b" in [lag["worker_id"] for lag in body["detail"]["laggards"]]

    eventually(lambda: serves(a, 3, STAGING), timeout=30, what="a never served staging v3")
    eventually(
        lambda: any(r["version"] == 3 and r["state"] == "failed" for r in fleet_rows("inf-b")),
        what=lambda: f"b: {fleet_rows('inf-b')}",
    )

    def laggard_failed() -> dict[str, Any] | None:
        # b retries the load with backoff, reporting "loading" meanwhile: ask until a report says "failed".
        response = set_alias(owner, "staging", 3, wait=1)
        assert response.status_code == 504
        [laggard] = response.json()["detail"]["laggards"]
        assert (laggard["worker_id"], laggard["serving"]) == ("inf-b", 2)
        return laggard if laggard["state"] == "failed" else None

    laggard = eventually(laggard_failed, timeout=30, what="b's report never said failed")
    assert laggard["error"].startswith("HashMismatch: sha256 mismatch for model.onnx"), laggard
    assert serves(b, 2, STAGING)
    assert serves(a, 2) and serves(b, 2)


# --- The database goes down -----------------------------------------------------------------------------


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bindirs or not (Path(bindirs[-1]) / "initdb").exists():
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root needs runuser to start PostgreSQL as the postgres user")
    server = PrivatePostgres(Path(bindirs[-1]))
    try:
        server.start()
        yield server
    finally:
        server.destroy()


def test_inference_keeps_serving_while_the_database_is_down(private_postgres, start_server, tmp_path):
    storage = tmp_path / "pg-artifacts"
    web = start_server("web", role="web", storage=storage, database_url=private_postgres.url, args=("--migrate",))
    env = inference_env("cli", tmp_path / "cli-data", private_postgres.url, storage)
    pending = [createtoken(env, "alice", "maintainer"), createtoken(env, "bob", "approver")]
    alice, bob = (Api(web, token_of(p)) for p in pending)
    inf = start_server("inf-pg", storage=storage, database_url=private_postgres.url)

    assert alice.call("POST", "/models", json={"name": "demo"}).status_code == 201
    for bias in (1.0, 2.0):
        upload = alice.call("POST", "/models/demo/versions", files=[("file", ("m.onnx", add_model_bytes(bias=bias)))])
        assert upload.status_code == 201, upload.text
        number = upload.json()["version"]
        eventually(partial(is_ready, alice, number), what=f"version {number} never validated")

    def promote_over_http(version: int) -> None:
        request = alice.call("PUT", "/models/demo/aliases/production", json={"version": version})
        assert request.status_code == 202, request.text
        approved = bob.call("POST", f"/promotions/{request.json()['id']}/approve", json={})
        assert approved.status_code == 200, approved.text

    promote_over_http(1)
    eventually(lambda: serves(inf, 1), timeout=30, what=lambda: f"v1 never served:\n{inf.log()}")

    private_postgres.stop()
    # The loop notices the outage (the log says so), and /v2 goes on answering from memory.
    eventually(lambda: "database unreachable" in inf.log(), timeout=30, what=lambda: inf.log())
    answered = 0
    outage_ends = time.monotonic() + 3  # several reconcile passes (every 0.5 s) and heartbeats fail meanwhile
    while time.monotonic() < outage_ends or answered < 20:
        x = np.full((2, 4), answered, dtype=np.float32)
        status, body = infer(inf, x)
        assert status == 200, body
        assert (body["model_version"], answered_bias(x, body)) == ("1", 1.0)
        answered += 1
    assert inf.request("GET", "/v2/health/ready")[0] == 200
    assert inf.request("GET", "/v2/models/demo/ready")[0] == 200
    assert inf.process.poll() is None

    # The database comes back: the loop recovers and picks up a new promotion.
    private_postgres.start()
    promote_over_http(2)
    eventually(lambda: serves(inf, 2), timeout=60, what=lambda: f"v2 never served after the outage:\n{inf.log()}")

    def reported() -> bool:
        workers = {w["worker_id"]: w for w in alice.call("GET", "/fleet").json()}
        worker = workers.get("inf-pg")
        return bool(
            worker
            and worker["online"]
            and worker["errors"] == []
            and [(r["version"], r["state"]) for r in worker["loaded"]] == [(2, "ready")]
        )

    eventually(reported, timeout=30, what="the fleet never showed inf-pg serving v2 again")
