"""Waiting for something to become true without timed assertions: poll until it holds, fail after a timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def eventually(
    condition: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.02, what: Callable[[], object] | str = ""
) -> T:
    """Call ``condition`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"condition not met within {timeout} s: {detail}")
        time.sleep(interval)


def reconcile_until(runtime: Any, condition: Callable[[], T], *, timeout: float = 20.0, what: str = "") -> T:
    """Drive an in-process runtime pass by pass until ``condition`` holds."""

    def step() -> T:
        runtime.reconcile_once()
        return condition()

    return eventually(step, timeout=timeout, what=lambda: f"{what}; fleet row: {runtime.snapshot()}")
