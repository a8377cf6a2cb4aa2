"""glibc's malloc arenas in a server process (``modelyard serve``, every role).

glibc gives the threads of a process malloc arenas of their own, up to eight per core, so that they
do not wait on one lock. Each arena keeps the memory its threads free for their next allocations,
and gives it back to the system only from its top. An upload to S3 passes its bytes through several
threads (the event loop, the multipart parser's thread, the storage write and boto3's part threads)
in chunks of 1 MiB and parts of 8 MiB; with an arena each, every one of them holds its own free
megabytes, and the process's peak is the sum of theirs. Through ``bench/upload.py`` (1 GiB to S3 on
loopback) the server grew by 62 to 78 MB with glibc's default (five runs), and by 54 to 62 MB with two
arenas (ten runs), for the same CPU.

:func:`limit` caps the arenas of this process, and, through ``MALLOC_ARENA_MAX`` in the environment,
those of the processes it starts (``--workers``), which glibc reads as each starts. Two arenas, the
default of ``MODELYARD_MALLOC_ARENA_MAX``, is the usual cap for a Python server; ``0`` leaves glibc's
default. A ``MALLOC_ARENA_MAX`` set by the operator is glibc's own setting and wins: it is left
alone. Elsewhere than on glibc (macOS, musl) nothing changes.

:func:`release_free_memory` gives the pages an arena holds free back to the system. The streamed
multipart uploads (``registry.http``) call it as each ends, when its parts and chunks have just been
freed: the next upload starts from the server's own size instead of on top of the last one's holes.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

logger = logging.getLogger(__name__)

ENVIRONMENT = "MALLOC_ARENA_MAX"  # glibc's own knob, read once as a process starts
M_ARENA_MAX = -8  # mallopt's parameter, from glibc's <malloc.h>


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library this interpreter runs on, if it is glibc (macOS's and musl's have no arenas to tune)."""
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def limit(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas in this process and the processes it starts; True when glibc took it.

    Call it before the process starts threads: an arena that a thread has already is kept.
    """
    if arenas <= 0 or ENVIRONMENT in os.environ:
        return False
    libc = _glibc()
    if libc is None:
        return False
    if libc.mallopt(M_ARENA_MAX, arenas) != 1:
        logger.warning("glibc refused %s=%d; its default number of malloc arenas stays", ENVIRONMENT, arenas)
        return False
    os.environ[ENVIRONMENT] = str(arenas)
    return True


def release_free_memory() -> bool:
    """Give the memory this process's malloc arenas hold free back to the system; True when glibc did.

    glibc's ``malloc_trim(0)``: it returns the free top of every arena and, inside them, every whole
    page no allocation uses. An upload's 8 MiB parts and 1 MiB chunks are freed when it ends, but their
    pages stay with the arenas, and the next upload's blocks do not fit the holes exactly: without this
    the server's RSS crept up by 106 MB over six 1 GiB uploads in a row (``bench/upload.py --rounds 6``),
    and by 65-73 MB with it.
    """
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))
