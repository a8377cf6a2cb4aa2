"""What a started server sets for its own process, through the ASGI lifespan: the garbage collector
(``modelyard/gc_tuning.py``) and glibc's malloc arenas (``modelyard/malloc_arenas.py``).

Each case runs in a child process, as ``modelyard serve`` would run the entry point: the collector's and
the allocator's state are the process's own, and changing this test process's would outlive the test.
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
import asyncio, ctypes, gc, json, threading, weakref

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

# Threads started afterwards, as the runtime's and an upload's are, each allocating while all are alive;
# glibc's malloc_stats() then prints one "Arena N:" block per arena to stderr.
THREADS = 6
barrier = threading.Barrier(THREADS + 1)
held = []
def allocate():
    held.append([bytes(1000) for _ in range(100)])
    barrier.wait()
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(THREADS)]
for thread in threads:
    thread.start()
barrier.wait()
ctypes.CDLL(None).malloc_stats()
barrier.wait()
for thread in threads:
    thread.join()
print(json.dumps({"started": started, "before": before, "after": after, "cycle_freed": alive() is None}))
"""


def run_server(tmp_path: Path, **env_extra: str) -> dict:
    """The child's report, with ``arenas``: how many malloc arenas served the start-up and the six threads."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MODELYARD_", "MALLOC_")) and key != "GLIBC_TUNABLES"
    }
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
    state = json.loads(done.stdout.strip().splitlines()[-1])
    state["arenas"] = sum(line.startswith("Arena ") for line in done.stderr.splitlines())
    return state


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


# --- glibc's malloc arenas ----------------------------------------------------------------------------


def test_a_started_server_shares_two_malloc_arenas_among_the_threads_it_starts(tmp_path):
    state = run_server(tmp_path)
    assert state["started"] == ["lifespan.startup.complete"]
    assert state["arenas"] == 2


def test_the_arena_limit_follows_the_setting(tmp_path):
    assert run_server(tmp_path, MODELYARD_MALLOC_ARENAS="3")["arenas"] == 3


@pytest.mark.parametrize("value", ["0", ""])
def test_zero_leaves_glibcs_own_limit_and_empty_means_the_default(tmp_path, value):
    # glibc's own limit is eight per core: the start-up's arena and one for each of the six threads.
    assert run_server(tmp_path, MODELYARD_MALLOC_ARENAS=value)["arenas"] == (7 if value == "0" else 2)


@pytest.mark.parametrize(
    "environment",
    [{"MALLOC_ARENA_MAX": "4"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}],
    ids=["variable", "tunable"],
)
def test_glibcs_own_setting_in_the_environment_is_left_as_the_operator_set_it(tmp_path, environment):
    assert run_server(tmp_path, **environment)["arenas"] == 4


def test_a_negative_arena_count_stops_the_start_with_the_variable_named(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("MODELYARD_")}
    env.update(
        DJANGO_SETTINGS_MODULE="modelyard.settings",
        MODELYARD_ROLE="web",
        MODELYARD_DATA_DIR=str(tmp_path),
        MODELYARD_MALLOC_ARENAS="-1",
    )
    done = subprocess.run(
        [sys.executable, "-c", "import modelyard.asgi"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 1
    assert "MODELYARD_MALLOC_ARENAS: must be at least 0, got -1" in done.stderr
