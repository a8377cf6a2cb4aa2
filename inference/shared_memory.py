"""Triton's system shared memory extension: tensors passed by offset in regions a same-host client registered.

A client creates a POSIX shared memory object (``tritonclient.utils.shared_memory``), registers a
region of it under a name (``/v2/systemsharedmemory/region/{name}/register``, or gRPC's
``SystemSharedMemoryRegister``), and then names the region, an offset and a byte size in an input's
or a requested output's parameters instead of sending the data: the server reads the input from the
region and writes the output into it, so no tensor crosses the socket.

Regions belong to the client that registered them (its token; every caller shares one scope when
/v2 is public), so two clients' same-named regions never meet and each sees only its own. Each
inference process keeps its own regions, in memory. What is refused, and why:

- a key that is not a POSIX shared memory name (``/name``: no other ``/``, not ``.`` or ``..``), so that
  nothing outside ``/dev/shm`` can be named;
- an object that is missing, a symbolic link (opened with ``O_NOFOLLOW``), not a regular file, smaller
  than the region, or one the server's user may not read and write by the object's permission bits
  (checked even when the server runs as root, whose privilege would open anything: a client must not
  reach another program's shared memory through the server);
- a client past ``MODELYARD_SHARED_MEMORY_MAX_REGIONS`` regions or ``MODELYARD_SHARED_MEMORY_MAX_BYTES``
  mapped bytes, and a name the client has registered already (as Triton refuses it).

Inputs are copied out of the region when the request is decoded, and outputs copied in when the
answer is encoded, each under the region's lock; nothing else ever holds a view of the mapping. So a
region unregistered while a request is in flight is closed at once and safely: the request keeps
the inputs it copied, and its outputs are refused (never written to memory that is gone or reused).
The copy also keeps what the batcher, the response cache and a shadow see fixed while the client
writes its next tensors into the same region. Knows nothing of Django: limits arrive as values.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from inference.errors import InvalidInput, RegionExists, RegionLimit, RegionNotFound

SHM_DIR = Path("/dev/shm")  # where Linux keeps POSIX shared memory objects (shm_open)
NAME_MAX = 255  # the longest file name, so the longest key after its "/"
REGION_NAME_MAX = 256
MAX_INT64 = (1 << 63) - 1
ANONYMOUS = ""  # the one scope of every caller when /v2 is public

# The parameters of an input or a requested output that place it in a region.
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


class Region:
    """One registered region: ``byte_size`` bytes at ``offset`` of the shared memory object ``key``, mapped."""

    __slots__ = ("_lock", "_map", "_start", "byte_size", "closed", "key", "name", "offset")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, start: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._map = mapping
        self._start = start  # where the region begins in the mapping (the map starts at a page boundary)
        self._lock = threading.Lock()
        self.closed = False

    def status(self) -> dict[str, Any]:
        """Triton's status of a region: its name, key, offset and byte size."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> bytearray:
        """A copy of ``size`` bytes at ``offset`` in the region (checked against its size by the caller)."""
        start = self._start + offset
        with self._lock:
            if self.closed:
                raise InvalidInput(f"shared memory region '{self.name}' was unregistered while the request was read")
            with memoryview(self._map) as whole, whole[start : start + size] as part:
                return bytearray(part)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Copy ``data`` to ``offset`` in the region (checked against its size by the caller)."""
        start = self._start + offset
        with self._lock:
            if self.closed:
                raise InvalidInput(
                    f"shared memory region '{self.name}' was unregistered while the request ran; its outputs were "
                    "not written"
                )
            self._map[start : start + len(data)] = data

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self._map.close()


class SharedOutput(NamedTuple):
    """Where a requested output goes: ``byte_size`` bytes at ``offset`` in ``region``."""

    region: Region
    offset: int
    byte_size: int


def _permission_denied(key: str) -> InvalidInput:
    return InvalidInput(
        f"shared memory key '{key}': permission denied: the server's user may not read and write it (make the "
        "object readable and writable by that user)"
    )


def check_key(key: Any) -> str:
    """``key`` when it is a POSIX shared memory name: ``/`` and a file name, so that it names a file of /dev/shm."""
    if (
        not isinstance(key, str)
        or not key.startswith("/")
        or "/" in key[1:]
        or key[1:] in ("", ".", "..")
        or "\0" in key
        or len(key) - 1 > NAME_MAX
    ):
        raise InvalidInput(
            f"shared memory key {key!r} is not a POSIX shared memory name: '/' followed by 1 to {NAME_MAX} "
            "characters, none of them '/' (such as '/input_simple')"
        )
    return key


def _may_read_write(status: os.stat_result) -> bool:
    """Whether the object's permission bits let the server's user read and write it, root or not."""
    if status.st_uid == os.geteuid():
        bits = status.st_mode >> 6
    elif status.st_gid == os.getegid() or status.st_gid in os.getgroups():
        bits = status.st_mode >> 3
    else:
        bits = status.st_mode
    return bits & 0o6 == 0o6


def open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """Map ``byte_size`` bytes at ``offset`` of the shared memory object ``key``, or refuse it saying why."""
    check_key(key)
    path = SHM_DIR / key[1:]
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidInput(
            f"shared memory key '{key}' does not exist: create the object first (tritonclient.utils.shared_memory."
            "create_shared_memory_region), on the server's host"
        ) from None
    except PermissionError:
        raise _permission_denied(key) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidInput(
                f"shared memory key '{key}' is a symbolic link, which the server does not follow"
            ) from None
        if exc.errno == errno.EISDIR:
            raise InvalidInput(f"shared memory key '{key}' is not a regular file") from None
        raise InvalidInput(f"shared memory key '{key}' cannot be opened: {exc.strerror}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise InvalidInput(f"shared memory key '{key}' is not a regular file")
        if not _may_read_write(status):
            raise _permission_denied(key)
        if status.st_size < offset + byte_size:
            raise InvalidInput(
                f"shared memory key '{key}' holds {status.st_size} bytes, fewer than the region's offset {offset} + "
                f"byte_size {byte_size}"
            )
        start = offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(
                fd,
                start + byte_size,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=offset - start,
            )
        except OSError as exc:
            raise InvalidInput(f"shared memory key '{key}' cannot be mapped: {exc.strerror}") from None
    finally:
        os.close(fd)  # the mapping keeps the object
    return Region(name, key, offset, byte_size, mapping, start)


def _size(value: Any, what: str, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT64:
        kind = "a positive" if minimum else "a non-negative"
        raise InvalidInput(f"{what} must be {kind} integer, got {value!r}")
    return value


class SharedMemory:
    """The regions registered in this process, by client (a token's key, or :data:`ANONYMOUS`), then by name."""

    def __init__(self) -> None:
        self._clients: dict[str, dict[str, Region]] = {}
        self._lock = threading.Lock()

    def regions(self, client: str) -> Mapping[str, Region]:
        """The client's regions by name (what its inference requests may name)."""
        return self._clients.get(client) or {}

    def register(
        self, client: str, name: Any, key: Any, offset: Any, byte_size: Any, *, max_regions: int, max_bytes: int
    ) -> Region:
        """Open and map the region ``name`` for ``client``, within its limits; refuse it saying why."""
        if not isinstance(name, str) or not 0 < len(name) <= REGION_NAME_MAX:
            raise InvalidInput(f"a shared memory region's name must be 1 to {REGION_NAME_MAX} characters")
        check_key(key)
        offset = _size(offset, "offset", minimum=0)
        byte_size = _size(byte_size, "byte_size", minimum=1)
        if offset + byte_size > MAX_INT64:
            raise InvalidInput(f"offset {offset} + byte_size {byte_size} is too large")
        with self._lock:
            mine = self._clients.get(client, {})
            if name in mine:  # Triton's words
                raise RegionExists(f"shared memory region '{name}' already in manager: unregister it first")
            if len(mine) >= max_regions:
                raise RegionLimit(
                    f"this client has {len(mine)} shared memory regions registered, the most allowed "
                    f"(MODELYARD_SHARED_MEMORY_MAX_REGIONS={max_regions}); unregister one first"
                )
            mapped = sum(region.byte_size for region in mine.values())
            if mapped + byte_size > max_bytes:
                raise RegionLimit(
                    f"registering {byte_size} bytes would map {mapped + byte_size} bytes for this client, more than "
                    f"MODELYARD_SHARED_MEMORY_MAX_BYTES={max_bytes}"
                )
            region = open_region(name, key, offset, byte_size)  # tmpfs: no disk to wait for
            self._clients.setdefault(client, {})[name] = region
        return region

    def unregister(self, client: str, name: str | None = None) -> None:
        """Close one of the client's regions, or all of them; a name it has not registered is no error (Triton's)."""
        with self._lock:
            mine = self._clients.get(client, {})
            closing = list(mine.values()) if name is None else [r for r in (mine.get(name),) if r is not None]
            for region in closing:
                del mine[region.name]
            if not mine:
                self._clients.pop(client, None)
        for region in closing:
            region.close()

    def status(self, client: str, name: str | None = None) -> list[dict[str, Any]]:
        """Triton's status: each of the client's regions, or the one named (:class:`RegionNotFound` if none)."""
        mine = self.regions(client)
        if name is None:
            return [region.status() for region in mine.values()]
        region = mine.get(name)
        if region is None:  # Triton's words
            raise RegionNotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def close(self) -> None:
        """Unregister every client's regions."""
        with self._lock:
            clients, self._clients = self._clients, {}
        for regions in clients.values():
            for region in regions.values():
                region.close()


def placement(what: str, parameters: Mapping[str, Any], regions: Mapping[str, Region]) -> SharedOutput:
    """Where an input's data or an output's results lie: the region its parameters name, offset and byte size.

    ``what`` names the tensor in messages ("input 'x'"). The span must lie inside the region.
    """
    name = parameters[REGION]
    if not isinstance(name, str):
        raise InvalidInput(f"{what}: {REGION} must be a region's name, got {name!r}")
    if BYTE_SIZE not in parameters:
        raise InvalidInput(f"{what}: {REGION} needs {BYTE_SIZE} too")
    size = _size(parameters[BYTE_SIZE], f"{what}: {BYTE_SIZE}", minimum=0)
    offset = _size(parameters.get(OFFSET, 0), f"{what}: {OFFSET}", minimum=0)
    region = regions.get(name)
    if region is None:
        raise InvalidInput(f"{what}: no shared memory region '{name}' is registered (for this client)")
    if offset + size > region.byte_size:
        raise InvalidInput(
            f"{what}: {OFFSET} {offset} + {BYTE_SIZE} {size} runs past the end of shared memory region '{name}' "
            f"({region.byte_size} bytes)"
        )
    return SharedOutput(region, offset, size)


def write_output(name: str, target: SharedOutput, data: bytes | memoryview) -> dict[str, Any]:
    """Write an output's binary form into its region; the response's parameters for it (Triton's)."""
    if len(data) > target.byte_size:
        raise InvalidInput(
            f"output '{name}' needs {len(data)} bytes, more than its {BYTE_SIZE} {target.byte_size} in shared "
            f"memory region '{target.region.name}'"
        )
    target.region.write(target.offset, data)
    return {REGION: target.region.name, BYTE_SIZE: len(data)}
