"""Validation through real Celery worker processes on Redis: end to end, a worker killed mid-task, idempotency.

The workers run ``modelyard.cli.worker`` (what ``modelyard worker`` runs) in processes of their own. They share
the test database and artifact folder with the test, so every row they need must be committed (hence
``transaction=True``). Each test gets its own workers and Redis database; the workers are SIGKILLed at the end.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from modelyard.processes import kill_group
from registry import queueing, tasks
from registry.models import AuditEvent, ModelVersion, VersionStatus
from storage import get_storage
from tests.support.onnx_models import (
    add_model_bytes,
    endless_loop_model,
    external_data_model,
    slow_model,
    unknown_op_model,
)

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_DB = int(os.environ.get("MODELYARD_TEST_REDIS_DB", "11"))
BROKER_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
VISIBILITY_TIMEOUT = 5  # seconds before Redis hands an unacknowledged message to another worker
HEARTBEAT_SECONDS = 0.5
STALE_SECONDS = 3.0
ADD_SIGNATURE = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}


# --- Fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def redis_db() -> Iterator[None]:
    """An empty Redis database for the broker, emptied again afterwards."""
    import redis

    client = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.skip(f"these tests need Redis at {BROKER_URL}: {exc}")
    client.flushdb()
    yield
    client.flushdb()
    client.close()


def _reset_producer_pool(app: Any) -> None:
    """Close connections made for the previous broker, so the next send uses the current configuration."""
    from kombu import pools

    pools.reset()  # closes the pools and forgets them; kombu would otherwise hand back the closed ones
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


@pytest.fixture
def send_tasks_to() -> Iterator[Callable[[str], None]]:
    """Make this process send tasks to a broker URL instead of running them in-process; restored afterwards."""
    from modelyard.celery import app

    keys = ("task_always_eager", "broker_url", "broker_transport_options")
    saved = {key: app.conf[key] for key in keys}

    def point(url: str) -> None:
        _reset_producer_pool(app)
        app.conf.update(
            task_always_eager=False,
            broker_url=url,
            broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
        )

    yield point
    _reset_producer_pool(app)
    app.conf.update(saved)


@pytest.fixture
def celery_on_redis(redis_db: None, send_tasks_to: Callable[[str], None]) -> None:
    """Make this process send tasks to the Redis broker instead of running them in-process."""
    send_tasks_to(BROKER_URL)


class Worker:
    """One ``modelyard worker`` process (solo pool), in a process group of its own."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        argv = [sys.executable, "-m", "modelyard.cli", "worker", "--pool", "solo", "--concurrency", "1"]
        argv += ["--hostname", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with {self.process.returncode}:\n{self.log()}")
            if f"{self.name}@" in self.log() and " ready." in self.log():
                return
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name} not ready after {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL the whole process group: no warm shutdown, no acknowledgement, no requeue."""
        kill_group(self.process)


@pytest.fixture
def start_worker(celery_on_redis: None, tmp_path: Path) -> Iterator[Callable[[str], Worker]]:
    """Start real worker processes on the test's database, artifact folder and broker; kill them all at the end."""
    # Django types a DATABASES entry's values Any; modelyard.settings infers them as object from its helper.
    database: dict[str, Any] = django_settings.DATABASES["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql", "worker tests need the PostgreSQL test database"
    credentials = quote(database["USER"] or "postgres")
    if database.get("PASSWORD"):
        credentials += ":" + quote(database["PASSWORD"])
    database_url = (
        f"postgres://{credentials}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MODELYARD_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="modelyard.settings",
        MODELYARD_DATABASE_URL=database_url,
        MODELYARD_BROKER_URL=BROKER_URL,
        MODELYARD_DATA_DIR=str(tmp_path / "worker-data"),
        MODELYARD_WORK_DIR=str(tmp_path / "worker-work"),
        MODELYARD_STORAGE_URL=Path(django_settings.STORAGE.path).as_uri(),
        MODELYARD_BROKER_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
        MODELYARD_VALIDATION_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
        MODELYARD_VALIDATION_STALE_SECONDS=str(STALE_SECONDS),
        MODELYARD_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    workers: list[Worker] = []

    def start(name: str) -> Worker:
        worker = Worker(name, env, tmp_path / f"{name}.log")
        workers.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in workers:
        worker.kill()


# --- Helpers ----------------------------------------------------------------------------------------


def wait_for_status(
    version_id: int, statuses: set[str], *, timeout: float, workers: tuple[Worker, ...] = ()
) -> ModelVersion:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        version = ModelVersion.objects.get(pk=version_id)
        if version.status in statuses:
            return version
        time.sleep(0.02)
    logs = "\n".join(f"--- {worker.name} ---\n{worker.log()}" for worker in workers)
    raise AssertionError(f"version {version_id} is {version.status}, not {statuses}, after {timeout} s\n{logs}")


def upload(person: Any, model: str, name: str, data: bytes) -> ModelVersion:
    response = person.upload(model, [(name, data)])
    assert response.status_code == 201, response.content
    return ModelVersion.objects.get(model__name=model, version=response.json()["version"])


def validate_events(version: ModelVersion) -> list[AuditEvent]:
    target = f"{version.model.name}/{version.version}"
    return list(AuditEvent.objects.filter(action="version.validate", target=target))


# --- Tests ------------------------------------------------------------------------------------------


def test_worker_validates_uploads_end_to_end(owner, registered, start_worker):
    worker = start_worker("w1")

    response = owner.upload(registered, [("model.onnx", add_model_bytes())])
    assert response.status_code == 201, response.content
    # The worker may have claimed it already by the time the answer is written.
    assert response.json()["status"] in {"pending", "validating"}
    version = ModelVersion.objects.get(model__name=registered, version=response.json()["version"])
    version = wait_for_status(version.pk, {"ready", "failed"}, timeout=30, workers=(worker,))
    assert version.status == VersionStatus.READY, version.errors
    assert version.signature == ADD_SIGNATURE
    assert version.errors == []
    assert version.validation_attempts == 1
    body = owner.get(f"/api/v1/models/{registered}/versions/1").json()
    assert body["status"] == "ready"
    assert body["signature"] == ADD_SIGNATURE
    [event] = validate_events(version)
    assert event.after["status"] == "ready"

    bad = upload(owner, registered, "bad.onnx", unknown_op_model().SerializeToString())
    bad = wait_for_status(bad.pk, {"ready", "failed"}, timeout=30, workers=(worker,))
    assert bad.status == VersionStatus.FAILED
    assert len(bad.errors) == 1
    assert bad.errors[0].startswith("onnx.checker rejected the model: "), bad.errors
    assert "FrobnicateTensor" in bad.errors[0]
    [event] = validate_events(bad)
    assert event.after == {"status": "failed", "errors": bad.errors}


def test_validation_survives_a_worker_killed_mid_task(owner, registered, start_worker):
    first = start_worker("w1")
    version = upload(owner, registered, "slow.onnx", slow_model().SerializeToString())
    version = wait_for_status(version.pk, {"validating", "ready", "failed"}, timeout=30, workers=(first,))
    assert version.status == VersionStatus.VALIDATING, "the slow model validated before the worker could be killed"

    first.kill()
    time.sleep(0.5)
    version.refresh_from_db()
    assert version.status == VersionStatus.VALIDATING
    assert validate_events(version) == []

    second = start_worker("w2")
    # The message comes back once the visibility timeout has passed; the claim is taken over because the
    # first worker's heartbeat has gone stale. The bound is generous: on a slow, loaded CI machine the second
    # worker's run of the model alone has taken more than 45 s.
    version = wait_for_status(version.pk, {"ready", "failed"}, timeout=180, workers=(first, second))
    assert version.status == VersionStatus.READY, version.errors
    assert version.validation_attempts == 2
    assert version.signature == {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1024, 1024]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1024, 1024]}],
    }
    assert len(validate_events(version)) == 1
    assert "validate_version" in second.log()


def test_a_task_delivered_twice_validates_once(owner, registered, monkeypatch):
    monkeypatch.setattr(queueing, "validation_enqueue", lambda version_id: None)
    version = upload(owner, registered, "model.onnx", add_model_bytes())
    assert version.status == VersionStatus.PENDING

    assert tasks.validate_version(version.pk) == "done"
    assert tasks.validate_version(version.pk) == "skipped"

    version.refresh_from_db()
    assert version.status == VersionStatus.READY
    assert version.signature == ADD_SIGNATURE
    assert version.validation_attempts == 1
    assert len(validate_events(version)) == 1


def test_requeue_stuck_picks_lost_validations_only(owner, registered, monkeypatch, settings):
    queued: list[int] = []
    monkeypatch.setattr(queueing, "validation_enqueue", queued.append)
    monkeypatch.setattr(queueing, "validation_requeue", queued.append)
    settings.VALIDATION_STALE_SECONDS = STALE_SECONDS
    now = timezone.now()
    long_ago = now - timedelta(minutes=30)

    biases = iter(range(100))  # other bytes each time: the same bytes again would be refused as a duplicate

    def make(status: str, *, created_at: Any = None, heartbeat_at: Any = None) -> ModelVersion:
        version = upload(owner, registered, "model.onnx", add_model_bytes(bias=float(next(biases))))
        ModelVersion.objects.filter(pk=version.pk).update(
            status=status, created_at=created_at or now, validation_heartbeat_at=heartbeat_at
        )
        return version

    stale_validating = make(VersionStatus.VALIDATING, created_at=long_ago, heartbeat_at=now - timedelta(seconds=10))
    make(VersionStatus.VALIDATING, created_at=long_ago, heartbeat_at=now)
    old_pending = make(VersionStatus.PENDING, created_at=long_ago)
    make(VersionStatus.PENDING, created_at=now - timedelta(minutes=1))
    make(VersionStatus.READY, created_at=long_ago)
    make(VersionStatus.FAILED, created_at=long_ago)
    queued.clear()

    requeued = tasks.sweep_stuck_versions()

    assert sorted(requeued) == sorted([stale_validating.pk, old_pending.pk])
    assert sorted(queued) == sorted(requeued)

    # What was re-queued now validates: the stale claim is taken over, the old pending one is claimed.
    for version_id in requeued:
        assert tasks.validate_version(version_id) == "done"
    for version in (stale_validating, old_pending):
        version.refresh_from_db()
        assert version.status == VersionStatus.READY
        assert len(validate_events(version)) == 1


def test_a_version_whose_attempts_are_spent_ends_failed_instead_of_being_claimed_again(
    owner, registered, monkeypatch, settings
):
    requeued: list[int] = []
    monkeypatch.setattr(queueing, "validation_enqueue", lambda version_id: None)
    monkeypatch.setattr(queueing, "validation_requeue", requeued.append)
    settings.VALIDATION_STALE_SECONDS = STALE_SECONDS
    version = upload(owner, registered, "model.onnx", add_model_bytes())
    # Every delivery so far claimed it and then lost its worker (a poison model, say, that got the
    # worker killed), leaving it validating with a stale heartbeat. Redelivery and the sweep bring it back.
    ModelVersion.objects.filter(pk=version.pk).update(
        status=VersionStatus.VALIDATING,
        validation_attempts=tasks.MAX_VALIDATION_ATTEMPTS,
        validation_heartbeat_at=timezone.now() - timedelta(seconds=10),
    )
    assert tasks.sweep_stuck_versions() == [version.pk]

    assert tasks.validate_version(version.pk) == "skipped"

    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    assert version.errors == [
        "validation gave up after 5 attempts: the last one never finished, because the process validating it "
        "was lost (killed, or restarted)"
    ]
    assert version.validation_attempts == 5
    [event] = validate_events(version)
    assert event.after == {"status": "failed", "errors": version.errors}
    requeued.clear()
    assert tasks.sweep_stuck_versions(pending_older_than_seconds=0) == []
    assert tasks.validate_version(version.pk) == "skipped"
    assert len(validate_events(version)) == 1


def _nul_location_files(folder: Path) -> list[tuple[str, bytes]]:
    path = external_data_model(folder, location="weights\x00.bin")
    return [("model.onnx", path.read_bytes()), ("weights.bin", (folder / "weights.bin").read_bytes())]


# The endless loop's time limit is short, yet long enough for the child to start and load the model on a
# busy machine (the failure names the step the limit stopped); the other case keeps the default limit.
@pytest.mark.parametrize(
    ("files", "timeout", "error"),
    [
        (
            _nul_location_files,
            None,
            "tensor 'w' stores its data in 'weights\\x00.bin', a name with control characters; "
            "no uploaded file can have that name",
        ),
        (
            lambda folder: [("loop.onnx", endless_loop_model().SerializeToString())],
            6,
            "validation stopped after 6 s (MODELYARD_VALIDATION_TIMEOUT_SECONDS) while running the model once in "
            "ONNX Runtime",
        ),
    ],
    ids=["nul-byte-in-location", "endless-loop"],
)
def test_a_hostile_model_fails_on_its_first_delivery_and_is_not_retried(
    owner, registered, monkeypatch, settings, tmp_path, files, timeout, error
):
    monkeypatch.setattr(queueing, "validation_enqueue", lambda version_id: None)
    if timeout is not None:
        settings.VALIDATION_TIMEOUT_SECONDS = timeout
    response = owner.upload(registered, files(tmp_path / "m"))
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get()
    assert version.status == VersionStatus.PENDING

    assert tasks.validate_version(version.pk) == "done"

    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    assert version.errors == [error]
    assert version.validation_attempts == 1
    assert tasks.validate_version(version.pk) == "skipped"
    assert len(validate_events(version)) == 1


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_upload_with_the_broker_down_answers_201_keeps_its_files_and_is_swept_later(
    owner, registered, redis_db, send_tasks_to, caplog
):
    send_tasks_to(f"redis://127.0.0.1:{_closed_port()}/0")
    data = add_model_bytes()

    response = owner.upload(registered, [("model.onnx", data)])

    assert response.status_code == 201, response.content
    assert response.json()["status"] == "pending"
    version = ModelVersion.objects.get()
    assert version.status == VersionStatus.PENDING
    [item] = version.files.all()
    with get_storage().open(item.storage_key) as stream:
        assert stream.read() == data
    assert f"could not queue or run the validation of version {version.pk}" in caplog.text

    # The broker is back; once the version has waited long enough, the sweep queues it.
    send_tasks_to(BROKER_URL)
    ModelVersion.objects.filter(pk=version.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    assert tasks.sweep_stuck_versions() == [version.pk]

    import redis

    client = redis.Redis.from_url(BROKER_URL)
    [raw] = client.lrange("celery", 0, -1)
    client.close()
    message = json.loads(raw)
    assert message["headers"]["task"] == "registry.tasks.validate_version"
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [version.pk]


def test_worker_command_line_passes_options_to_celery():
    from modelyard.cli import parse_args

    args = parse_args(["worker", "--pool", "solo", "--concurrency", "1"])
    assert args.celery_args == ["--pool", "solo", "--concurrency", "1"]
    with pytest.raises(SystemExit):
        parse_args(["serve", "--pool", "solo"])
