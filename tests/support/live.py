"""A live ``modelyard serve --role all --workers 2`` on the test database, for the observability tests.

Models are registered through the real services (as ``tests/support/v2server.py`` does) and
committed, so the server's processes see them; the fixture that uses this flushes the database
afterwards. ``demo`` serves v1 (v2 is ready for a swap); ``broken`` is promoted but its artifact is
changed in storage before the server starts, so it never loads: its requests answer 503.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.conf import settings as django_settings
from prometheus_client.mmap_dict import MmapedDict

from registry import promotions
from registry.audit.chain import Actor
from registry.models import PRODUCTION, FileRole, ModelFile, RegisteredModel, Role
from registry.serving import fleet_list
from tests.support.inference import infer_body
from tests.support.onnx_models import add_model, add_model_bytes
from tests.support.polling import eventually
from tests.support.processes import ServeProcess, subprocess_database_url
from tests.support.servers import inference_env
from tests.support.v2server import ServedModel, make_actor, register

WORKERS = 2


@dataclass
class LiveServer:
    server: ServeProcess
    inference_token: str  # may scrape /metrics and call /v2
    maintainer_token: str  # may upload
    owner: Actor
    approver: Actor

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    def infer(self, model: str) -> int:
        """One request on a fresh connection (so the kernel may hand it to either worker); its status."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        body = json.dumps(infer_body(np.arange(8, dtype=np.float32).reshape(2, 4)))
        try:
            conn.request(
                "POST",
                f"/v2/models/{model}/infer",
                body,
                {"Content-Type": "application/json", "Authorization": f"Bearer {self.inference_token}"},
            )
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def workers(self) -> list[int]:
        """The pids of the server's worker processes (uvicorn spawns them; the parent supervises)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == self.server.process.pid and b"spawn_main" in cmdline:
                found.append(int(entry.name))
        return sorted(found)

    def metrics_folder(self, pid: int) -> Path:
        environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        [value] = [item.split(b"=", 1)[1] for item in environ if item.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
        return Path(value.decode())

    def requests_counted_by(self, pid: int, **labels: str) -> float:
        """The requests one worker process has counted in its own file (not the scrape's sum)."""
        path = self.metrics_folder(pid) / f"counter_{pid}.db"
        if not path.exists():
            return 0.0
        total = 0.0
        for key, value, _timestamp, _offset in MmapedDict.read_all_values_from_file(str(path)):
            _metric, name, found, _help = json.loads(key)
            if name == "modelyard_inference_requests_total" and all(found.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def kill_worker(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def wait_serving(self, model: str, version: int, timeout: float = 60) -> None:
        """Until every worker process reports ``model`` ``version`` ready on production (and ``broken`` tried)."""

        def serving() -> bool:
            pids = self.workers()
            rows = {w.pid: w.loaded for w in fleet_list(online_only=True)}
            return len(pids) == WORKERS and all(
                any(r.model == model and r.version == version and PRODUCTION in r.aliases for r in rows.get(pid, ()))
                and any(r.model == "broken" and r.attempts > 0 for r in rows.get(pid, ()))
                for pid in pids
            )

        eventually(serving, timeout=timeout, interval=0.2, what=lambda: f"fleet: {fleet_list()}\n{self.server.log()}")


def start_live_server(tmp: Path, *, redis_url: str) -> LiveServer:
    owner, _ = make_actor("live-owner", Role.MAINTAINER)
    approver, _ = make_actor("live-approver", Role.APPROVER)
    admin, _ = make_actor("live-admin", Role.ADMIN)
    _, inference_token = make_actor("live-scraper", Role.INFERENCE)
    _, maintainer_token = make_actor("live-uploader", Role.MAINTAINER)
    register(
        ServedModel("demo", [add_model(bias=1.0), add_model(bias=2.0)]), owner=owner, approver=approver, admin=admin
    )
    register(ServedModel("broken", [add_model(bias=5.0)]), owner=owner, approver=approver, admin=admin)
    key = ModelFile.objects.get(version__model__name="broken", role=FileRole.MODEL).storage_key
    # Changed in the bucket after validation: every load refuses its bytes (a verify failure, counted).
    Path(django_settings.STORAGE.path, *key.split("/")).write_bytes(add_model_bytes(bias=6.0))

    env = inference_env("live", tmp / "data", subprocess_database_url(), Path(django_settings.STORAGE.path))
    del env["MODELYARD_WORKER_ID"]  # each worker process its own fleet member
    env["MODELYARD_BROKER_URL"] = redis_url  # the Celery queue's length is exported; nothing consumes it
    server = ServeProcess("live", "all", env, tmp / "serve.log", args=("--workers", str(WORKERS)))
    try:
        # A busy CI machine (four test workers on two cores) has needed more than a minute here.
        server.wait_ready(timeout=180)
        live = LiveServer(server, inference_token, maintainer_token, owner, approver)
        live.wait_serving("demo", 1, timeout=180)
    except BaseException:
        # Never leave its workers behind: they would go on beating into this database, and every later
        # fleet test on this test worker would count them.
        server.kill()
        raise
    return live


def promote(live: LiveServer, model: str, version: int) -> None:
    target = RegisteredModel.objects.get(name=model)
    outcome = promotions.alias_set(
        model=target, alias_name=PRODUCTION, version_number=version, actor=live.owner, reason="test"
    )
    assert outcome.promotion is not None
    promotions.promotion_approve(promotion_id=outcome.promotion.pk, actor=live.approver, reason="ok")
