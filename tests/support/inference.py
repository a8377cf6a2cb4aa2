"""Helpers for the inference tests: inputs with known outputs, holding session builds, and driving the /v2 app."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def sample(rows: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


class BuildGate:
    """Holds ONNX Runtime session builds of chosen bundles (by sha256) until :meth:`open` is called.

    It wraps the real ``build_session``: what is built is real, only when is decided by the test.
    """

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.entered: list[str] = []
        self._open = threading.Event()

    def hold(self, sha256: str) -> None:
        self.held.add(sha256)

    def open(self) -> None:
        self._open.set()

    def waiting(self, sha256: str) -> bool:
        return sha256 in self.entered and not self._open.is_set()

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def gated(path: Path, **options: Any) -> Any:
            sha = path.parent.name
            self.entered.append(sha)
            if sha in self.held:
                assert self._open.wait(60), "the build gate was never opened"
            return real(path, **options)

        return gated


def infer_body(x: np.ndarray, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def answered_bias(x: np.ndarray, response: dict[str, Any], biases: tuple[float, ...] = (1.0, 2.0, 3.0)) -> float:
    """The one bias of ``biases`` for which every output value is exactly ``x + bias``; fails if there is none."""
    [output] = response["outputs"]
    assert output["name"] == "y" and output["shape"] == list(x.shape), response
    y = np.asarray(output["data"], dtype=np.float32).reshape(x.shape)
    matches = [bias for bias in biases if np.array_equal(y, x + np.float32(bias))]
    assert len(matches) == 1, f"the outputs are not wholly one version's: x={x.tolist()} response={response}"
    return matches[0]


# --- The /v2 app in this process ----------------------------------------------------------------------


class AsgiLoop:
    """An event loop in a thread of its own, as uvicorn runs it, for driving the /v2 Starlette app directly."""

    def __init__(self) -> None:
        import asyncio

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-asgi-loop", daemon=True)
        self._thread.start()

    def request(self, app: Any, method: str, path: str, body: Any = None, *, token: str = "") -> tuple[int, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        future = self._asyncio.run_coroutine_threadsafe(self._call(app, method, path, raw, token), self.loop)
        status, payload = future.result(timeout=30)
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload

    async def _call(self, app: Any, method: str, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
        }
        delivered = False
        finished = self._asyncio.Event()
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await app(scope, receive, send)
        finally:
            finished.set()
        return status, b"".join(chunks)

    def close(self) -> None:
        """Cancel what still runs on the loop (a batcher's task, say), then stop and close it."""

        async def cancel_all() -> None:
            current = self._asyncio.current_task()
            tasks = [task for task in self._asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await self._asyncio.gather(*tasks, return_exceptions=True)

        self._asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
