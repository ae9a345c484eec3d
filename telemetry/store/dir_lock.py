"""One process per chdb data directory: an exclusive lock file, shared within the process.

chdb (the embedded ClickHouse) must not be opened from two processes on one data directory.
`flock` is released by the kernel when the holder dies, so a crashed sidecar never leaves a
stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import threading

from telemetry.store.errors import StoreLockedError

LOCK_NAME = ".infersight.lock"

_held: dict[str, list] = {}  # real path -> [fd, refcount]
_guard = threading.Lock()


def acquire(path: str) -> None:
    """Lock `path` for this process (re-entrant within the process), or raise StoreLockedError."""
    with _guard:
        if path in _held:
            _held[path][1] += 1
            return
        lock_file = os.path.join(path, LOCK_NAME)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StoreLockedError(
                f"the data directory {path} is in use by {holder}. chdb allows one process per data "
                "directory: write through that process (e.g. the sidecar's HTTP endpoint, "
                "open_store('http://host:port')) or use another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        _held[path] = [fd, 1]


def release(path: str) -> None:
    with _guard:
        entry = _held.get(path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[path]
            os.close(entry[0])  # closing the descriptor drops the flock
