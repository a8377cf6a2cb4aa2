"""``/healthz`` and ``/readyz`` of the web role, answered before Django for load balancers and Kubernetes probes.

They sit in front of Django (``modelyard/asgi.py``) so that a probe costs no middleware, session,
authentication, throttling or audit row, and so that Django's ``ALLOWED_HOSTS`` check cannot turn a
probe sent to a pod's IP address into a 400.

``/healthz`` says the process answers at all; it touches nothing else, so a database outage never
makes Kubernetes restart healthy web pods. ``/readyz`` checks the database, the artifact storage and
the broker side by side, each within ``MODELYARD_READY_TIMEOUT_SECONDS``, and answers 503 naming the
ones that are down. The answer says only *which* dependency failed: it is public, and the reasons
(host names, addresses, driver messages) go to the log, once per change, not to the caller.

Each check runs in a thread of its own. A check that hangs (a packet-dropping network holds a
connect for minutes) keeps its one thread; later probes wait on that same attempt instead of
starting more, so an outage cannot pile up threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

PATHS = ("/healthz", "/readyz")
OK = "ok"
DOWN = "unreachable"


def check_database() -> None:
    from django.db import DatabaseError, close_old_connections, connection

    # The check thread keeps its connection between probes, within CONN_MAX_AGE, like a request would.
    close_old_connections()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        connection.close()  # the next probe connects afresh
        raise


def check_storage() -> None:
    from storage import get_storage

    get_storage().check()


def check_broker() -> None:
    from kombu import Connection

    url = settings.BROKER_URL
    if not url:
        return  # tasks run in-process: there is no broker to reach
    # Without socket timeouts a broker that accepts the connection but never answers would hold the
    # check's thread for as long as the kernel keeps the socket open. The probe has answered by the
    # time these expire; they only free the thread.
    timeout = settings.READY_TIMEOUT_SECONDS + 1.0
    if url.startswith(("redis://", "rediss://", "unix://")):
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    elif url.startswith(("amqp://", "amqps://", "pyamqp://")):
        options = {"read_timeout": timeout, "write_timeout": timeout}
    else:
        options = {}
    with Connection(url, connect_timeout=timeout, transport_options=options) as conn:
        conn.ensure_connection(max_retries=0)  # one attempt: kombu's retries would outlast the probe


CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "storage": check_storage,
    "broker": check_broker,
}


class Readiness:
    """Runs the checks, one thread per check, and remembers each one's last outcome for the log."""

    def __init__(self, checks: dict[str, Callable[[], None]]) -> None:
        self.checks = checks
        self._executors = {name: ThreadPoolExecutor(1, thread_name_prefix=f"readyz-{name}") for name in checks}
        self._running: dict[str, Future[None]] = {}
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()

    def _future(self, name: str) -> Future[None]:
        with self._lock:
            future = self._running.get(name)
            if future is None or future.done():
                future = self._executors[name].submit(self.checks[name])
                self._running[name] = future
            return future

    async def _one(self, name: str, timeout: float) -> str:
        future = self._future(name)
        try:
            # shield: a timeout must not cancel the attempt that later probes wait on.
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
        except TimeoutError:
            outcome, reason = f"no answer within {timeout:g} s (MODELYARD_READY_TIMEOUT_SECONDS)", "timed out"
        except Exception as exc:  # noqa: BLE001 - any failure of a dependency means not ready
            outcome, reason = DOWN, f"{type(exc).__name__}: {exc}".strip()
        else:
            outcome, reason = OK, ""
        self._log(name, outcome, reason)
        return outcome

    def _log(self, name: str, outcome: str, reason: str) -> None:
        state = f"{outcome} {reason}"
        with self._lock:
            changed, self._last[name] = self._last.get(name, f"{OK} ") != state, state
        if changed and outcome == OK:
            logger.info("readyz: %s is reachable again", name)
        elif changed:
            logger.warning("readyz: %s is %s: %s", name, outcome, reason)

    async def run(self) -> dict[str, str]:
        timeout = settings.READY_TIMEOUT_SECONDS
        outcomes = await asyncio.gather(*(self._one(name, timeout) for name in self.checks))
        return dict(zip(self.checks, outcomes, strict=True))


readiness = Readiness(CHECKS)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body: dict[str, Any]
    method = scope.get("method", "GET")
    if method not in ("GET", "HEAD"):
        status, body = 405, {"error": f"method {method} not allowed; use GET"}
    elif scope["path"] == "/healthz":
        status, body = 200, {"status": "alive"}
    else:
        checks = await readiness.run()
        down = [name for name, outcome in checks.items() if outcome != OK]
        if down:
            status, body = 503, {"error": f"not ready: {', '.join(down)} down", "checks": checks}
        else:
            status, body = 200, {"status": "ready", "checks": checks}
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store"),
    ]
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else payload})
