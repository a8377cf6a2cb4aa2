"""Client threads that send requests back to back while a test changes the server under them."""

from __future__ import annotations

import threading
from typing import Any, Self


class ClientThreads:
    """``clients`` threads, each running ``_run(index)`` until the ``with`` block ends; answers in ``answers``.

    A subclass sends with its own transport and appends records with ``client`` and ``version``.
    """

    def __init__(self, clients: int) -> None:
        self.answers: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def count(self, client: int, version: str) -> int:
        """Answers that ``client`` got from ``version`` so far."""
        with self._lock:
            return sum(1 for a in self.answers if a.client == client and a.version == version)

    def _run(self, client: int) -> None:
        raise NotImplementedError
