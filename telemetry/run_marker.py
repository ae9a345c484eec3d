"""A marker per recorder run in its spool directory, so the next start can tell what a kill lost.

`run-<token prefix>.json` is created when a recorder starts, rewritten by its flush thread at
each checkpoint (never by the engine thread), and removed after the final flush. Its process
holds an flock on it, which the kernel drops when the process dies however it dies: a marker that
nobody holds belongs to a run that ended without its final flush (kill -9, the OOM killer, a
crash). The next recorder on the directory claims it (`claim_abandoned`) and reports what it said:

    buffered:  {table: rows} in memory at the last checkpoint, not yet taken by a flush: lost.
    in_flight: {table: rows} a flush had taken and was sending or spooling at that checkpoint:
               stored once, in the spool (replayed by the next start) or lost; which, is not known.

Rows recorded after the last checkpoint are lost too, and no one counts them.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

PREFIX, SUFFIX = "run-", ".json"
# Written in place with one pwrite of at least this size (padded with spaces): a process killed
# mid-write never leaves half a marker, and the inode, hence the lock, stays the same.
MIN_SIZE = 4096


def marker_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{PREFIX}{name}{SUFFIX}"


class RunMarker:
    def __init__(self, directory: Path, name: str):
        self.path = marker_path(directory, name)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._size = MIN_SIZE
        self._last: dict | None = None

    def write(self, state: dict) -> bool:
        """Rewrite the marker unless `state` is what it already says; True when written."""
        if self._fd < 0 or state == self._last:
            return False
        payload = json.dumps(state, separators=(",", ":")).encode()
        self._size = max(self._size, len(payload))
        os.pwrite(self._fd, payload.ljust(self._size), 0)
        self._last = state
        return True

    def remove(self) -> None:
        """The run ended with its final flush: nothing to report."""
        if self._fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def claim_abandoned(directory: Path) -> list[dict]:
    """The markers in `directory` that no living process holds, read and removed (oldest name first).
    A marker that cannot be parsed comes back as {} (its run is still known to have been cut short)."""
    claimed = []
    for path in sorted(Path(directory).glob(f"{PREFIX}*{SUFFIX}")):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its run is alive (this process or another)
                continue
            if os.fstat(fd).st_nlink == 0:  # another recorder claimed it a moment ago
                continue
            raw = os.pread(fd, max(MIN_SIZE, os.fstat(fd).st_size), 0)
            try:
                state = json.loads(raw.decode() or "{}")
            except ValueError:
                state = {}
            claimed.append(state if isinstance(state, dict) else {})
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return claimed
