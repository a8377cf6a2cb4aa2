"""The garbage collector of a started server (``modelyard/gc_tuning.py``), through the ASGI lifespan.

Each case runs in a child process, as ``modelyard serve`` would run the entry point: the collector's
state is the process's own, and freezing this test process's objects would outlive the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The lifespan as uvicorn drives it, then what the collector does with the objects start-up made and
# with a reference cycle made afterwards (a request's, a released version's).
SERVER = """
import asyncio, gc, json, weakref

import modelyard.asgi

before = {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}

async def lifespan(kind):
    sent = []
    messages = [{"type": f"lifespan.{kind}"}]
    async def receive():
        return messages.pop(0) if messages else await asyncio.sleep(3600)
    async def send(message):
        sent.append(message["type"])
    try:
        await asyncio.wait_for(modelyard.asgi.application({"type": "lifespan"}, receive, send), 1)
    except TimeoutError:
        pass  # the startup waits for the next message; the shutdown returns
    return sent

started = asyncio.run(lifespan("startup"))
after = {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}

class Node:
    pass

cycle = Node()
cycle.self = cycle
alive = weakref.ref(cycle)
del cycle
gc.collect()
print(json.dumps({"started": started, "before": before, "after": after, "cycle_freed": alive() is None}))
"""


def run_server(tmp_path: Path, **env_extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MODELYARD_")}
    env.update(
        DJANGO_SETTINGS_MODULE="modelyard.settings",
        MODELYARD_ROLE="web",
        MODELYARD_DATA_DIR=str(tmp_path),
        **env_extra,
    )
    done = subprocess.run(
        [sys.executable, "-c", SERVER], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_started_server_freezes_its_start_up_objects_and_collects_the_oldest_generation_less_often(tmp_path):
    state = run_server(tmp_path)
    assert state["started"] == ["lifespan.startup.complete"]
    assert state["before"]["frozen"] == 0
    # Django, DRF and the rest: tens of thousands of objects never scanned again.
    assert state["after"]["frozen"] > 20_000
    young, middle, _ = state["before"]["threshold"]
    assert state["after"]["threshold"] == [young, middle, 100]
    # What the server makes afterwards is collected as before.
    assert state["cycle_freed"] is True


@pytest.mark.parametrize("value", ["false", "0"])
def test_gc_tuning_off_leaves_the_collector_as_python_sets_it(tmp_path, value):
    state = run_server(tmp_path, MODELYARD_GC_TUNING=value)
    assert state["started"] == ["lifespan.startup.complete"]
    assert state["after"] == state["before"]
    assert state["after"]["frozen"] == 0
    assert state["cycle_freed"] is True
