"""How many arenas glibc's allocator keeps in a server process (``modelyard serve``, every role).

glibc gives each thread that allocates an arena of its own, up to eight per core, and memory a thread
frees goes back to its arena, where only that arena's later allocations reuse it. An upload passes its
bytes through several threads (uvicorn's event loop, the multipart parser's thread, boto3's part
threads), so the 8 MiB parts they free pile up in several arenas: a 1 GiB upload to S3 grew the
registry by 69-73 MB and stored at 0.84-0.85x of boto3's own ``upload_file``. With two arenas the
same bytes are reused: 62.7-63.8 MB and 0.98-0.99x (``bench/upload.py``, bench/RESULTS.md).

:func:`limit_for_serving`, called once the server has started (before the runtime starts its threads
and before any upload), sets glibc's ``M_ARENA_MAX`` through ``mallopt``. glibc applies it to the arenas
it creates from then on, so threads started later share at most that many. ``MODELYARD_MALLOC_ARENAS=0``
leaves glibc's own limit; glibc's ``MALLOC_ARENA_MAX`` or ``glibc.malloc.arena_max`` in the environment
is the operator's choice and is left alone; on a C library other than glibc nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import os

from django.conf import settings

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8  # <malloc.h>: mallopt's parameter for the most arenas


def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc, else ``None`` (musl, macOS)."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # the name is unknown outside glibc
        return None
    if not version:
        return None
    return ctypes.CDLL(None)


def operator_choice() -> str | None:
    """The arena limit the environment already gives glibc, if any."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return f"MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']}"
    for tunable in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        if tunable.startswith("glibc.malloc.arena_max="):
            return f"GLIBC_TUNABLES {tunable}"
    return None


def limit_for_serving() -> int | None:
    """Limit the arenas to ``MODELYARD_MALLOC_ARENAS``; return the limit set, or ``None`` where none was."""
    count = settings.MALLOC_ARENAS
    if count == 0:
        return None
    choice = operator_choice()
    if choice is not None:
        logger.info("glibc's arenas are left as %s sets them", choice)
        return None
    libc = glibc()
    if libc is None:
        return None
    if libc.mallopt(M_ARENA_MAX, count) != 1:  # glibc answers 1 on success
        logger.warning("glibc refused M_ARENA_MAX=%d; its arenas are left as they are", count)
        return None
    return count
