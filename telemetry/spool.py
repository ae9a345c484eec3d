"""A bounded disk spool of Arrow batches, for when the store cannot be reached.

Each batch is one Arrow IPC file (zstd-compressed) carrying its table and its insert
deduplication token in the schema metadata, so a replay, even by a later process, sends the
batch under the token it was formed with: a batch the store did receive before the failure is
recognised and not stored twice. Files appear atomically (write, then rename).

The same directory holds the request journal (telemetry/journal.py): what a killed replica had
journaled and not confirmed becomes spool files at the next start, under its batches' tokens.

A replica's spool outlives the process only in a directory that the next start uses again:
`replica_spool_dir` (what `infersight serve` uses unless told `--spool-dir`), or one per replica
under a fleet's run directory.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from telemetry.batch_token import safe_replica_id

if TYPE_CHECKING:  # imported where a batch is written or read: a replica without a store never needs
    import pyarrow as pa  # pyarrow (~50 MB of RSS), yet asks for its spool directory at every start

log = logging.getLogger(__name__)

SUFFIX = ".arrow"


def replica_spool_dir(replica_id: str) -> Path:
    """The replica's stable spool directory: `$XDG_STATE_HOME/infersight/spool/<replica id>`
    (`~/.local/state/...` without XDG_STATE_HOME), the same at every start of that replica."""
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state_home) / "infersight" / "spool" / safe_replica_id(replica_id)


@dataclass(frozen=True)
class SpooledBatch:
    path: Path
    table: str
    dedup_token: str
    data: pa.Table


class Spool:
    def __init__(self, directory: str | os.PathLike, max_bytes: int = 256 << 20):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._seq = itertools.count()
        for stale in self.directory.glob("*.tmp"):  # a write cut short by a crash: never renamed, never counted
            stale.unlink(missing_ok=True)
        self.size_bytes = sum(p.stat().st_size for p in self.files())

    def files(self) -> list[Path]:
        """Spooled batches, oldest first."""
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    def put(self, table: str, data: pa.Table, dedup_token: str, force: bool = False) -> bool:
        """Spool a batch; False (nothing written) when it would not fit under max_bytes, unless
        `force` (rows already on disk in this directory, moved here: the request journal's)."""
        import pyarrow as pa

        schema = data.schema.with_metadata({"table": table, "dedup_token": dedup_token})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
            writer.write_table(data.replace_schema_metadata(schema.metadata))
        payload = sink.getvalue()
        if self.size_bytes + payload.size > self.max_bytes and not force:
            return False
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}-{table}"
        tmp = self.directory / f"{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(payload)
        tmp.rename(self.directory / f"{name}{SUFFIX}")
        self.size_bytes += payload.size
        return True

    def read(self, path: Path) -> SpooledBatch:
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            data = pa.ipc.open_file(source).read_all()
        meta = {k.decode(): v.decode() for k, v in (data.schema.metadata or {}).items()}
        if not meta.get("dedup_token"):  # without its token a replay could store the batch twice
            raise KeyError(f"{path.name}: no dedup_token in its metadata")
        return SpooledBatch(path, meta["table"], meta["dedup_token"], data.replace_schema_metadata(None))

    def remove(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:  # another recorder sharing the directory replayed it first
            return
        self.size_bytes = max(0, self.size_bytes - size)

    def quarantine(self, path: Path) -> None:
        """Move an unreadable file aside (kept for a person to look at, no longer counted)."""
        bad = self.directory / "unreadable"
        bad.mkdir(exist_ok=True)
        try:
            size = path.stat().st_size
            path.rename(bad / path.name)
            self.size_bytes = max(0, self.size_bytes - size)
        except FileNotFoundError:
            pass
