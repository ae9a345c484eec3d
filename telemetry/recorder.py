"""The recorder: the engine-side writer of telemetry records.

An EngineObserver whose hooks only append a record's values (one tuple) to an in-memory buffer
under a short lock; a background thread turns them into columns and Arrow batches (each with its
own insert deduplication token, fixed when the batch is formed) and writes them to the store. When the
store cannot be reached, batches go to a bounded disk spool and are replayed, under their
original tokens, once it is back: a batch is never stored twice, and never silently lost:

    stats() -> {table: {"written": stored (directly or by replay), "spooled": put in the spool,
                        "replayed": stored from the spool (also counted in written),
                        "dropped": lost (buffer or spool full, data the store refuses)}}

After `close()` with the store up, every row appended is in `written` or `dropped`.

Redaction has one owner, here: the engine's request records always carry the prompt and output
text; `store_text` (False unless the operator allows it: `infersight serve --store-text`) decides
whether it reaches the store. Without it the text columns are written empty, before a batch is
formed, so no text reaches the store nor the disk spool. The hashes are always kept.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa

from telemetry.contract.hooks import EngineObserver
from telemetry.columnar import columns_to_arrow
from telemetry.contract.records import RECORD_TYPES, ReplicaRecord, RequestRecord, StepRecord
from telemetry.schema.columns import arrow_schema
from telemetry.spool import Spool
from telemetry.store import Store, StoreError, is_remote, open_store

log = logging.getLogger(__name__)

COUNTERS = ("written", "spooled", "replayed", "dropped")
# Each flush costs the recorder's thread a fixed ~2 ms per table written (Arrow conversion, one HTTP
# insert), CPU that holds the GIL the engine thread needs: every 2 s keeps that under 0.3% of a core
# (telemetry/benchmarks/flush_cost.py) while the dashboards stay a few seconds behind at most.
DEFAULT_FLUSH_INTERVAL = 2.0
TEXT_COLUMNS = ("prompt_text", "output_text")  # of `requests`: written empty unless store_text


class ColumnBuffer:
    """One table's pending rows. The engine thread only appends each record's values as one
    tuple (a C-level attrgetter, which also rejects a malformed record); the flusher thread
    turns the rows into columns."""

    def __init__(self, table: str):
        self.table = table
        self.names = [f.name for f in arrow_schema(table)]
        self._get = operator.attrgetter(*self.names)
        self._reset()

    def _reset(self) -> None:
        self._rows: list[tuple] = []
        self.rows = 0

    def append(self, record) -> None:
        self._rows.append(self._get(record))
        self.rows += 1

    def take(self) -> tuple[list[tuple], int]:
        """The pending rows (as value tuples), leaving the buffer empty."""
        taken, rows = self._rows, self.rows
        self._reset()
        return taken, rows

    def to_columns(self, rows: list[tuple]) -> dict[str, list]:
        """Rows from `take()` as column name -> values (on the flusher thread)."""
        if len(self.names) == 1:  # attrgetter of one name gives the value, not a tuple
            return {self.names[0]: list(rows)}
        columns = zip(*rows) if rows else [()] * len(self.names)
        return {name: list(values) for name, values in zip(self.names, columns)}


def default_spool_dir(replica_id: str) -> Path:
    """A fresh directory per recorder: nothing spooled by another run is replayed into this store.
    Pass `spool_dir` explicitly (e.g. per replica under the fleet's state directory) for a spool
    that survives a restart and is replayed by the next process."""
    prefix = f"infersight-spool-{re.sub(r'[^A-Za-z0-9_.-]', '_', replica_id or 'replica')[:64]}-"
    return Path(tempfile.mkdtemp(prefix=prefix))


class Recorder(EngineObserver):
    enabled = True

    def __init__(self, target_or_store, replica_id: str, flush_interval: float = DEFAULT_FLUSH_INTERVAL,
                 max_batch_rows: int = 5_000, max_buffer_rows: int = 50_000,
                 spool_dir: str | os.PathLike | None = None, spool_max_bytes: int = 256 << 20,
                 store_text: bool = False, max_backoff: float = 10.0):
        self.replica_id = replica_id
        self.flush_interval, self.max_batch_rows, self.max_buffer_rows = flush_interval, max_batch_rows, max_buffer_rows
        self.store_text = store_text
        self._own_spool_dir = spool_dir is None
        self.spool = Spool(spool_dir or default_spool_dir(replica_id), spool_max_bytes)
        self._target = target_or_store
        self._store: Store | None = None
        self._owns_store = not isinstance(target_or_store, Store)
        if isinstance(target_or_store, Store):
            self._store = target_or_store
        elif not is_remote(target_or_store):
            self._store = self._open_store()  # embedded: a wrong or locked directory fails now, clearly

        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", replica_id)[:64]
        self._token_prefix = f"{safe_id}.{uuid.uuid4().hex[:12]}"
        self._batch_seq = 0
        self._lock = threading.Lock()  # buffers and counters
        self._flush_lock = threading.Lock()  # one flush cycle at a time (thread, flush(), close())
        self._buffers = {table: ColumnBuffer(table) for table in RECORD_TYPES}
        self._stats = {table: dict.fromkeys(COUNTERS, 0) for table in RECORD_TYPES}
        self.failures = 0  # exceptions swallowed in hooks
        self._closed = False
        self._retry_at = 0.0  # store considered down until then
        self._backoff, self._max_backoff = 0.5, max_backoff
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"infersight-recorder-{safe_id}", daemon=True)
        self._thread.start()

    # engine hooks: append only -----------------------------------------------------------------

    def on_replica_start(self, record: ReplicaRecord) -> None:
        self._append("replicas", record)

    def on_step(self, record: StepRecord) -> None:
        self._append("steps", record)

    def on_request_finished(self, record: RequestRecord) -> None:
        self._append("requests", record)

    def record(self, table: str, record) -> None:
        """Record any other row (eval runs and items, findings, profiles ...)."""
        if table not in self._buffers:
            raise ValueError(f"unknown table {table!r}; tables: {sorted(self._buffers)}")
        self._append(table, record)

    def _append(self, table: str, record) -> None:
        try:
            with self._lock:
                buffer = self._buffers[table]
                if self._closed or buffer.rows >= self.max_buffer_rows:
                    self._stats[table]["dropped"] += 1
                    return
                buffer.append(record)
                full = buffer.rows >= self.max_batch_rows
            if full:
                self._wake.set()
        except Exception:  # never into the engine (a malformed record: counted, logged once)
            self.failures += 1
            with self._lock:
                self._stats[table]["dropped"] += 1
            if self.failures == 1:
                log.exception("recorder: cannot buffer a %s record (further failures only counted)", table)

    # public controls ---------------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {table: dict(counts) for table, counts in self._stats.items()}

    def pending_rows(self) -> int:
        """Rows buffered in memory, not yet written, spooled or dropped."""
        with self._lock:
            return sum(b.rows for b in self._buffers.values())

    def flush(self) -> None:
        """Write (or spool) everything buffered so far; replay the spool unless the store is known down."""
        with self._flush_lock:
            self._cycle()

    def close(self) -> None:
        """Flush and stop. Idempotent; later records are dropped (and counted)."""
        if self._closed:
            return
        self._wake.set()
        with self._flush_lock:
            with self._lock:
                self._closed = True
            self._cycle(final=True)
        self._thread.join(timeout=5)
        if self._own_spool_dir and not self.spool.files():
            shutil.rmtree(self.spool.directory, ignore_errors=True)
        if self._owns_store and self._store is not None:
            try:
                self._store.close()
            except Exception:
                log.exception("recorder: closing the store failed")
            self._store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # the background thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._closed:
                return
            try:
                with self._flush_lock:
                    if not self._closed:
                        self._cycle()
            except Exception:  # keep the thread alive whatever happens
                log.exception("recorder: flush cycle failed")

    def _cycle(self, final: bool = False) -> None:
        with self._lock:
            taken = [(table, *buffer.take()) for table, buffer in self._buffers.items() if buffer.rows]
        for table, row_tuples, rows in taken:
            columns = self._columns(table, row_tuples)
            for start in range(0, rows, self.max_batch_rows):
                part = {name: values[start:start + self.max_batch_rows] for name, values in columns.items()}
                part_rows = min(self.max_batch_rows, rows - start)
                try:
                    data = self._to_arrow(table, part)
                    self._batch_seq += 1  # the token is fixed here, with the batch: replays reuse it
                    self._deliver(table, data, f"{self._token_prefix}.{table}.{self._batch_seq}", data.num_rows)
                except Exception:  # whatever went wrong, the rows are accounted for
                    log.exception("recorder: %d %s rows lost", part_rows, table)
                    self._count(table, "dropped", part_rows)
        # replay when the store is not known down (and once more at close, whatever the backoff says)
        if self.spool.size_bytes and (final or time.monotonic() >= self._retry_at):
            self._replay()

    def _columns(self, table: str, row_tuples: list[tuple]) -> dict[str, list]:
        columns = self._buffers[table].to_columns(row_tuples)
        if table == "requests" and not self.store_text:  # the redaction switch
            for name in TEXT_COLUMNS:
                columns[name] = [""] * len(row_tuples)
        return columns

    def _to_arrow(self, table: str, columns: dict[str, list]) -> pa.Table:
        """The batch as Arrow; rows that cannot be converted (e.g. a negative count) are dropped, counted."""
        try:
            return columns_to_arrow(table, columns)
        except ValueError as e:
            n = len(next(iter(columns.values())))
            good = []
            for i in range(n):
                try:
                    columns_to_arrow(table, {k: v[i:i + 1] for k, v in columns.items()})
                    good.append(i)
                except ValueError:
                    pass
            log.error("recorder: dropped %d malformed %s rows: %s", n - len(good), table, e)
            self._count(table, "dropped", n - len(good))
            return columns_to_arrow(table, {k: [v[i] for i in good] for k, v in columns.items()})

    def _deliver(self, table: str, data: pa.Table, token: str, rows: int) -> None:
        if rows == 0:
            return
        if time.monotonic() < self._retry_at:  # store down: straight to the spool
            return self._to_spool(table, data, token, rows)
        try:
            self._insert(table, data, token)
        except Exception as e:
            if isinstance(e, StoreError) and not e.permanent:
                self._mark_down(e)
                return self._to_spool(table, data, token, rows)
            log.error("recorder: the store refused %d %s rows (dropped): %s", rows, table, e)
            return self._count(table, "dropped", rows)
        self._mark_up()
        self._count(table, "written", rows)

    def _insert(self, table: str, data: pa.Table, token: str) -> None:
        self._get_store().insert_arrow(table, data, dedup_token=token)

    def _to_spool(self, table: str, data: pa.Table, token: str, rows: int) -> None:
        try:
            stored = self.spool.put(table, data, token)
        except Exception as e:  # disk full, permissions ...: the rows are dropped, counted
            log.error("recorder: cannot write the spool (%s)", e)
            stored = False
        self._count(table, "spooled" if stored else "dropped", rows)

    def _replay(self) -> None:
        for path in self.spool.files():
            try:
                batch = self.spool.read(path)
            except (OSError, pa.ArrowException, KeyError) as e:
                log.error("recorder: unreadable spool file %s moved aside: %s", path, e)
                self.spool.quarantine(path)
                continue
            rows = batch.data.num_rows
            try:
                self._insert(batch.table, batch.data, batch.dedup_token)
            except Exception as e:
                if isinstance(e, StoreError) and not e.permanent:
                    self._mark_down(e)
                    return
                log.error("recorder: the store refused %d spooled %s rows (dropped): %s", rows, batch.table, e)
                self._count(batch.table, "dropped", rows)
            else:
                self._mark_up()
                self._count(batch.table, "replayed", rows)
                self._count(batch.table, "written", rows)
            self.spool.remove(path)

    # store state ---------------------------------------------------------------------------------

    def _open_store(self) -> Store:
        if is_remote(self._target):  # short timeouts: a hung endpoint must not stall the flusher for long
            return open_store(self._target, connect_timeout=2, send_receive_timeout=30)
        store = open_store(self._target)
        from telemetry.schema import migrate
        migrate(store)  # embedded: this process owns the schema too
        return store

    def _get_store(self) -> Store:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def _mark_down(self, error: Exception) -> None:
        if self._retry_at == 0.0:
            log.warning("recorder: store unavailable (%s); spooling to %s", error, self.spool.directory)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def _mark_up(self) -> None:
        if self._retry_at:
            log.info("recorder: store reachable again")
        self._retry_at, self._backoff = 0.0, 0.5

    def _count(self, table: str, counter: str, rows: int) -> None:
        with self._lock:
            self._stats.setdefault(table, dict.fromkeys(COUNTERS, 0))[counter] += rows
