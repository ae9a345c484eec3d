"""The request journal: every finished request's record reaches the OS before its answer does.

A replica killed (-9, the OOM killer) loses what its recorder holds in memory. With a journal,
`requests` records are appended to a file in the spool directory (one `write()` into the page
cache: it survives the death of the process, no fsync) before they enter the recorder's buffer,
and `infersight serve` sends no byte of a response before everything the engine finished so far
is journaled (engine/serving/server/journal_barrier.py), so a request whose answer a client got is on
disk. The next recorder on the directory turns a dead run's journal into spool files: the
batches that run had formed and not confirmed (written, spooled or dropped) under their own
insert dedup tokens (stored once, whether the dead run's insert arrived or not), the records it
never put in a batch under tokens that run never used.

Who does what:
- the engine thread: `append(record)`, a deque append (nothing else: no lock, no I/O);
- `sync()`, from any thread (the server's event loop before it answers, the recorder's flush
  thread before each cycle and checkpoint): takes every record appended so far, writes them in
  one `write()` (group commit: one call covers every request finished meanwhile), then hands
  them to the recorder's buffer in journal order;
- the flush thread: `formed(k, a, b)` before it sends batch k (records a..b-1, counted from 0 in
  this run), `done(k, b)` once batch k is stored, spooled or dropped; segments whose every
  record is done are deleted, so the journal holds about what the recorder holds in memory.

Files, per run: `journal-<token prefix>-<segment>.jsonl`, segments of ~SEGMENT_BYTES, each
opening with a header (its first record's number, the batch number then, the column names) and
then one JSON line per record (its column values, text redacted as the recorder redacts; lists of
numbers packed as machine arrays in base64: JSON's float repr cost ~2 us a number, ~150 us for a
record's token times) or per batch event. A line cut short by the kill is ignored (its record was not yet journaled, so its
answer was not sent). The journal belongs to the run whose marker (telemetry/run_marker.py)
exists: markers are created before journals and removed after them, so a journal without a
marker is a dead run's.
"""

from __future__ import annotations

import base64
import json
import logging
import operator
import os
import sys
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "journal-", ".jsonl"
SEGMENT_BYTES = 4 << 20
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _segment_path(directory: Path, run: str, index: int) -> Path:
    return directory / f"{PREFIX}{run}-{index:08d}{SUFFIX}"


class RequestJournal:
    def __init__(self, directory: str | os.PathLike, run: str, columns: list[str], redact: Iterable[str],
                 on_journaled: Callable[[list], None], packed: dict[str, str] | None = None,
                 segment_bytes: int = SEGMENT_BYTES):
        """`packed`: {column: array typecode} for the columns that hold lists of numbers ("q", "d")."""
        self.directory, self.run = Path(directory), run
        self.columns = list(columns)
        self.packed = {name: code for name, code in (packed or {}).items() if name in self.columns}
        self._get = operator.attrgetter(*self.columns)
        self._redact = [self.columns.index(name) for name in redact if name in self.columns]
        self._pack = [(self.columns.index(name), code) for name, code in self.packed.items()]
        self._on_journaled = on_journaled
        self._segment_bytes = segment_bytes
        self._pending: deque = deque()
        self.append = self._pending.append  # the engine thread's whole cost
        self._lock = threading.Lock()
        self.journaled = 0  # records written so far (the next record's number)
        self._batch_seq = 0  # the last batch number formed
        self._segments: list[tuple[Path, int]] = []  # (path, its first record's number), oldest first
        self._fd = -1
        self._size = 0
        self._segment_index = 0
        self.broken = False
        self._open_segment()

    def __len__(self) -> int:
        """Records appended and not yet journaled."""
        return len(self._pending)

    def sync(self) -> None:
        """Journal every record appended so far, then hand them to the recorder. Never raises: a
        journal that cannot be written is given up (logged), and the records go on to the recorder."""
        if not self._pending:
            return
        with self._lock:
            records, pop = [], self._pending.popleft
            for _ in range(len(self._pending)):
                records.append(pop())
            if not records:
                return
            if not self.broken:
                lines = []
                for record in records:
                    lines.append(self._line(record))
                if self._write(b"".join(lines)):
                    self.journaled += len(records)
            self._on_journaled(records)

    def formed(self, batch_seq: int, first: int, end: int) -> None:
        """Batch `batch_seq` holds records first..end-1; written before the batch is sent."""
        with self._lock:
            self._batch_seq = max(self._batch_seq, batch_seq)
            self._write(b'{"f":%d,"a":%d,"b":%d}\n' % (batch_seq, first, end))

    def done(self, batch_seq: int, end: int) -> None:
        """Batch `batch_seq` is stored, spooled or dropped, and so is every record before `end`."""
        with self._lock:
            if self._write(b'{"d":%d}\n' % batch_seq) and self._size >= self._segment_bytes:
                self._open_segment()
            while len(self._segments) > 1 and self._segments[1][1] <= end:  # every record of the oldest: done
                path, _ = self._segments.pop(0)
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """The run ended with its final flush: every batch done, nothing to recover."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            for path, _ in self._segments:
                path.unlink(missing_ok=True)
            self._segments = []
            self.broken = True

    # ---------------------------------------------------------------------------------------------

    def _line(self, record) -> bytes:
        try:
            values = list(self._get(record))
            for i in self._redact:
                values[i] = ""
            for i, code in self._pack:
                values[i] = base64.b64encode(array(code, values[i]).tobytes()).decode()
            return b'{"r":%s}\n' % _ENCODE(values).encode()
        except Exception:  # noqa: BLE001 - not a record of the table: the recorder drops and counts it
            return b'{"x":1}\n'  # it keeps its number, so the batches' ranges stay right

    def _open_segment(self) -> None:
        if self.broken:
            return
        path = _segment_path(self.directory, self.run, self._segment_index)
        header = json.dumps({"h": 1, "first": self.journaled, "k": self._batch_seq, "columns": self.columns,
                             "packed": self.packed, "byteorder": sys.byteorder})
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(fd, header.encode() + b"\n")
        except OSError as e:
            return self._give_up(e)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._size = fd, len(header) + 1
        self._segments.append((path, self.journaled))
        self._segment_index += 1

    def _write(self, data: bytes) -> bool:
        if self.broken:
            return False
        try:
            view = memoryview(data)
            while view:  # a regular file takes it whole; a short write (disk full) raises next time
                view = view[os.write(self._fd, view):]
        except OSError as e:
            self._give_up(e)
            return False
        self._size += len(data)
        return True

    def _give_up(self, error: OSError) -> None:
        if not self.broken:
            log.error("recorder: cannot write the request journal in %s (%s): from now on a kill -9 of this "
                      "process loses the requests it holds in memory", self.directory, error)
        self.broken = True


# recovery: what a dead run journaled ---------------------------------------------------------------

@dataclass
class RecoveredRun:
    run: str  # the dead run's token prefix
    journaled: int  # records it journaled in all (the last one's number + 1)
    batches: list[tuple[int, list[dict]]] = field(default_factory=list)  # (batch number, records as {column: value})
    unformed: list[dict] = field(default_factory=list)  # records it never put in a batch
    last_batch: int = 0  # the highest batch number it gave out
    paths: list[Path] = field(default_factory=list)


def abandoned_runs(directory: str | os.PathLike, live_marker: Callable[[str], bool]) -> list[str]:
    """Token prefixes of the journals in `directory` whose run has no marker (`live_marker(run)`: one exists)."""
    runs = {p.name[len(PREFIX):-len(SUFFIX)].rsplit("-", 1)[0] for p in Path(directory).glob(f"{PREFIX}*{SUFFIX}")}
    return sorted(run for run in runs if not live_marker(run))


def read_run(directory: str | os.PathLike, run: str) -> RecoveredRun:
    """What the dead run `run` journaled and did not confirm: its open batches and its unformed records."""
    paths = sorted(Path(directory).glob(f"{PREFIX}{run}-*{SUFFIX}"))
    records: dict[int, dict | None] = {}
    formed: dict[int, tuple[int, int]] = {}
    done: set[int] = set()
    seq = last_batch = 0
    for path in paths:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        columns: list[str] = []
        packed: dict[str, str] = {}
        swap = False
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:  # the line the kill cut short (or the empty one after the last newline)
                continue
            if "h" in entry:
                seq, columns = entry["first"], entry["columns"]
                packed, swap = entry.get("packed", {}), entry.get("byteorder", sys.byteorder) != sys.byteorder
                last_batch = max(last_batch, entry["k"])
            elif "r" in entry:
                record = dict(zip(columns, entry["r"]))
                for name, code in packed.items():
                    record[name] = _unpack(record[name], code, swap)
                records[seq] = record
                seq += 1
            elif "x" in entry:
                records[seq] = None
                seq += 1
            elif "f" in entry:
                formed[entry["f"]] = (entry["a"], entry["b"])
                last_batch = max(last_batch, entry["f"])
            elif "d" in entry:
                done.add(entry["d"])
    out = RecoveredRun(run, seq, last_batch=last_batch, paths=paths)
    covered: set[int] = set()
    for k, (a, b) in sorted(formed.items()):
        covered.update(range(a, b))
        if k not in done:
            out.batches.append((k, [r for s in range(a, b) if (r := records.get(s))]))
    out.unformed = [r for s, r in sorted(records.items()) if s not in covered and r]
    return out


def _unpack(text: str, code: str, swap: bool) -> list:
    values = array(code, base64.b64decode(text))
    if swap:
        values.byteswap()
    return values.tolist()
