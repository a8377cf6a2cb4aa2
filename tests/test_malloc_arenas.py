"""glibc's malloc arenas in a server process (``modelyard/malloc_arenas.py``).

Each case runs in a child process: the arenas are the process's own, and a cap set in this test
process would stay for the rest of the suite. The child's threads each allocate 64 KiB blocks (too
large for glibc's per-thread cache, too small to be mapped on their own), so each thread takes an
arena from glibc; ``malloc_info`` then lists the arenas (``<heap nr=...>``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GLIBC = hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
THREADS = 4

CHILD = f"""
import ctypes, json, os, sys, tempfile, threading

from modelyard import malloc_arenas

took = malloc_arenas.limit(int(sys.argv[1])) if sys.argv[1] != "-" else None
barrier = threading.Barrier({THREADS})
held = []

def allocate():
    held.append([bytes(64 * 1024) for _ in range(8)])
    barrier.wait()  # every thread allocates while the others hold theirs

threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()

libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as report:
    stream = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    arenas = open(report.name).read().count("<heap nr=")
print(json.dumps({{"took": took, "arenas": arenas, "environment": os.environ.get("MALLOC_ARENA_MAX")}}))
"""


def child(arenas: str, **env_extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    env.update(env_extra)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, arenas], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


pytestmark = pytest.mark.skipif(not GLIBC, reason="malloc arenas are glibc's")


def test_without_a_cap_each_thread_takes_an_arena_of_its_own():
    state = child("-")
    assert state["arenas"] > 2
    assert state["environment"] is None


@pytest.mark.parametrize("cap", [1, 2])
def test_the_cap_holds_the_threads_to_that_many_arenas_and_passes_to_the_processes_started_after(cap):
    state = child(str(cap))
    assert state["took"] is True
    assert state["arenas"] == cap
    assert state["environment"] == str(cap)  # glibc reads it as each worker process starts


def test_zero_leaves_glibcs_default():
    state = child("0")
    assert state["took"] is False
    assert state["arenas"] > 2
    assert state["environment"] is None


def test_an_operators_malloc_arena_max_wins():
    state = child("1", MALLOC_ARENA_MAX="3")
    assert state["took"] is False
    assert state["environment"] == "3"
    assert 1 < state["arenas"] <= 3  # glibc's own reading of it, not the cap asked for


# 64 blocks of 1 MiB, freed but kept by the arena: no automatic trim (its threshold at 1 GiB) and no block
# mapped on its own (the mmap threshold at 32 MiB), as glibc does for an upload's parts once its dynamic
# thresholds have risen; then the RSS before and after ``release_free_memory``.
FREED = """
import ctypes, json

from modelyard import malloc_arenas

libc = ctypes.CDLL(None)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
assert libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 and libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1

def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

start = rss()
blocks = [b"\x01" * (1 << 20) for _ in range(64)]  # written: bytes(n) would be calloc, untouched
pin = bytes(4096)  # above the blocks: the arena's top stays in use
held = rss()
del blocks
freed = rss()
released = malloc_arenas.release_free_memory()
print(json.dumps({"start": start, "held": held, "freed": freed, "after": rss(), "released": released}))
"""


def test_release_free_memory_gives_an_arenas_free_pages_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", FREED], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    assert state["held"] - state["start"] >= 60 * mib
    assert state["freed"] - state["start"] >= 60 * mib  # freed, but the arena keeps the pages
    assert state["released"] is True
    assert state["after"] - state["start"] < 8 * mib
