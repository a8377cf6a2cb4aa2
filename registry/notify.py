"""Notifications that inference processes wait on: alias changes, and inference job chunks ready to take.

Redis pub/sub when the broker is Redis, PostgreSQL LISTEN/NOTIFY otherwise, and an in-process
condition for the embedded SQLite default (where web and inference share one process).
A notification only says "look again": listeners re-read the desired state from the database,
so a lost message costs at most one polling interval.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from django.conf import settings
from django.db import connection

CHANNEL = "modelyard_alias_changes"

_local = threading.Condition()
_local_log: list[tuple[int, dict[str, Any]]] = []
_local_seq = 0


def _backend() -> str:
    broker = settings.BROKER_URL or ""
    if broker.startswith(("redis://", "rediss://", "unix://")):
        return "redis"
    if connection.vendor == "postgresql":
        return "postgres"
    return "local"


def publish(payload: dict[str, Any]) -> None:
    """Send one notification now; call it from ``transaction.on_commit``."""
    global _local_seq
    data = json.dumps(payload, sort_keys=True)
    backend = _backend()
    if backend == "redis":
        import redis

        client = redis.Redis.from_url(settings.BROKER_URL or "")
        try:
            client.publish(CHANNEL, data)
        finally:
            client.close()
    elif backend == "postgres":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, data])
    with _local:  # same-process listeners are always told, whatever the backend
        _local_seq += 1
        _local_log.append((_local_seq, payload))
        del _local_log[:-100]
        _local.notify_all()


class Listener(Protocol):
    def wait(self, timeout: float) -> list[dict[str, Any]]:
        """Block until notifications arrive or ``timeout`` passes; return what arrived."""


class _LocalListener:
    def __init__(self) -> None:
        with _local:
            self._seen = _local_seq

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        with _local:
            _local.wait_for(lambda: _local_seq > self._seen, timeout=timeout)
            fresh = [payload for seq, payload in _local_log if seq > self._seen]
            self._seen = _local_seq
        return fresh


class _RedisListener:
    def __init__(self) -> None:
        import redis

        self._client = redis.Redis.from_url(settings.BROKER_URL or "")
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(CHANNEL)
        # Wait for the subscription to be confirmed so nothing published after this is missed.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not self._pubsub.subscribed:
            self._pubsub.get_message(timeout=0.1)

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            message = self._pubsub.get_message(timeout=max(0.0, remaining) if not messages else 0.0)
            if message is None:
                if messages or remaining <= 0:
                    return messages
                continue
            if message.get("type") == "message":
                messages.append(json.loads(message["data"]))

    def close(self) -> None:
        self._pubsub.close()
        self._client.close()


class _PostgresListener:
    def __init__(self) -> None:
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        self._conn = psycopg.connect(**params, autocommit=True)
        self._conn.execute(f'LISTEN "{CHANNEL}"')

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        messages = []
        for note in self._conn.notifies(timeout=timeout, stop_after=1):
            messages.append(json.loads(note.payload))
        # Drain whatever else is already queued without waiting again.
        for note in self._conn.notifies(timeout=0.01):
            messages.append(json.loads(note.payload))
        return messages

    def close(self) -> None:
        self._conn.close()


@contextmanager
def listen() -> Iterator[Listener]:
    """Subscribe to alias changes for the duration of the block."""
    backend = _backend()
    listener: Any = (
        _RedisListener() if backend == "redis" else _PostgresListener() if backend == "postgres" else _LocalListener()
    )
    try:
        yield listener
    finally:
        if hasattr(listener, "close"):
            listener.close()
