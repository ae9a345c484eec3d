"""The recorder: the engine-side writer of telemetry records.

An EngineObserver whose hooks only append a record's values (one tuple) to an in-memory buffer
under a short lock; a background thread turns them into columns and Arrow batches and writes them
to the store. Each batch gets an insert deduplication token from its identity when it is formed
(telemetry/batch_token.py: replica, run start, table, batch number), never from its bytes, and
keeps it: a batch sent again, by a retry, a spool replay in this or the next process, or encoded
anew, is stored once. When the store cannot be reached, batches go to a bounded disk spool and
are replayed, under their tokens, once it is back. Nothing is silently lost:

    stats() -> {table: {"written": stored (directly or by replay), "spooled": put in the spool,
                        "replayed": stored from the spool (also counted in written),
                        "dropped": lost (buffer or spool full, data the store refuses, and what a
                                   previous run in the same spool directory is known to have lost)}}

After `close()` with the store up, every row appended is in `written` or `dropped`. Drops are
also logged (a line at most every DROP_LOG_INTERVAL seconds, from the flush thread).

A process killed without its final flush loses what it held in memory (up to a flush interval of
rows), except what its request journal holds. The flush thread keeps a marker in the spool
directory (telemetry/run_marker.py) with the rows buffered at its last checkpoint; the next
recorder on that directory logs the abandoned run and counts those rows as dropped. Rows recorded
after that checkpoint are lost uncounted (about `checkpoint_interval` seconds of them; more if a
slow flush was under way): the engine thread never touches disk.

With `journal=True` (what `infersight serve` uses) `requests` records go through a journal in the
spool directory (telemetry/journal.py) before they reach the buffer: `sync_journal()` writes every
record appended so far (one write() into the page cache: it survives kill -9, not a machine
crash), and the server calls it before any byte of a response leaves, so every answered request
is on disk. The next start turns a dead run's journal into spool files (its unconfirmed batches
under their own tokens: stored once) and counts as dropped exactly the records the engine had
handed over by the last checkpoint and the journal never got (requests no client was answered).
Steps and the other tables keep the marker's accounting above.

Redaction has one owner, here: the engine's request records always carry the prompt and output
text; `store_text` (False unless the operator allows it: `infersight serve --store-text`) decides
whether it reaches the store. Without it the text columns are written empty, before a batch is
formed, so no text reaches the store nor the disk spool. The hashes are always kept.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import pyarrow as pa

from telemetry.batch_token import batch_token, run_prefix, safe_replica_id, unique_run_start_us
from telemetry.contract.hooks import EngineObserver
from telemetry.columnar import as_one_batch, columns_to_arrow
from telemetry.contract.records import RECORD_TYPES, ReplicaRecord, RequestRecord, StepRecord
from telemetry.journal import RequestJournal, abandoned_runs, read_run
from telemetry.run_marker import RunMarker, claim_abandoned, marker_path
from telemetry.schema.columns import arrow_schema
from telemetry.spool import Spool
from telemetry.store import Store, StoreError, is_remote, open_store

log = logging.getLogger(__name__)

COUNTERS = ("written", "spooled", "replayed", "dropped")
# Each flush costs the recorder's thread a fixed ~2 ms per table written (Arrow conversion, one HTTP
# insert), CPU that holds the GIL the engine thread needs: every 2 s keeps that under 0.3% of a core
# (telemetry/benchmarks/flush_cost.py) while the dashboards stay a few seconds behind at most.
DEFAULT_FLUSH_INTERVAL = 2.0
# How far behind the marker may be: what a kill loses uncounted. A checkpoint is one pwrite of a
# few hundred bytes, and only when the counts changed.
DEFAULT_CHECKPOINT_INTERVAL = 0.5
DROP_LOG_INTERVAL = 30.0
# of `requests`: written empty unless store_text (an upstream's error body may quote the request)
TEXT_COLUMNS = ("prompt_text", "output_text", "upstream_error_body")
_REQUEST_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestRecord))


def _number_lists(table: str) -> dict[str, str]:
    """{column: array typecode} of the table's list-of-number columns (int64 or float64: every value
    the Arrow conversion takes fits, and comes back the same)."""
    out = {}
    for f in arrow_schema(table):
        if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type):
            out[f.name] = "q"
        elif pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type):
            out[f.name] = "d"
    return out


def _row_counts(counts) -> dict[str, int]:
    """{table: rows} from a marker, keeping only known tables and positive whole counts."""
    if not isinstance(counts, dict):
        return {}
    return {t: n for t, n in counts.items() if t in RECORD_TYPES and isinstance(n, int) and n > 0}


class ColumnBuffer:
    """One table's pending records. The engine thread only appends the record to a deque (atomic:
    no lock, ~1 us where the lock and a value tuple cost ~9 us in situ, once per step); the flusher
    thread takes them and reads their values into columns (a C-level attrgetter, which also rejects a
    malformed record: dropped there, counted)."""

    def __init__(self, table: str):
        self.table = table
        self.names = [f.name for f in arrow_schema(table)]
        self._get = operator.attrgetter(*self.names)
        self._records: deque = deque()
        self.append = self._records.append  # the engine thread's whole cost
        self.extend = self._records.extend

    @property
    def rows(self) -> int:
        return len(self._records)

    def take(self) -> list:
        """The pending records, leaving the buffer empty (appends racing with it stay for the next take)."""
        records, pop = [], self._records.popleft
        for _ in range(len(self._records)):
            records.append(pop())
        return records

    def to_columns(self, records: list) -> tuple[dict[str, list], int]:
        """Records from `take()` as (column name -> values, records that could not be read)."""
        try:
            rows = list(map(self._get, records))
            bad = 0
        except Exception:  # noqa: BLE001 - a malformed record: read the others one by one
            rows = []
            for record in records:
                try:
                    rows.append(self._get(record))
                except Exception:  # noqa: BLE001
                    pass
            bad = len(records) - len(rows)
        if len(self.names) == 1:  # attrgetter of one name gives the value, not a tuple
            return {self.names[0]: rows}, bad
        columns = zip(*rows) if rows else [()] * len(self.names)
        return {name: list(values) for name, values in zip(self.names, columns)}, bad


def default_spool_dir(replica_id: str) -> Path:
    """A fresh directory per recorder: nothing spooled by another run is replayed into this store.
    Pass `spool_dir` explicitly (e.g. per replica under the fleet's state directory) for a spool
    that survives a restart and is replayed by the next process."""
    return Path(tempfile.mkdtemp(prefix=f"infersight-spool-{safe_replica_id(replica_id)}-"))


class Recorder(EngineObserver):
    enabled = True

    def __init__(self, target_or_store, replica_id: str, flush_interval: float = DEFAULT_FLUSH_INTERVAL,
                 max_batch_rows: int = 5_000, max_buffer_rows: int = 50_000,
                 spool_dir: str | os.PathLike | None = None, spool_max_bytes: int = 256 << 20,
                 store_text: bool = False, max_backoff: float = 10.0,
                 checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL, journal: bool = False):
        self.replica_id = replica_id
        self.flush_interval, self.max_batch_rows, self.max_buffer_rows = flush_interval, max_batch_rows, max_buffer_rows
        self.checkpoint_interval = min(checkpoint_interval, flush_interval)
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

        self.run_start_us = unique_run_start_us()
        self._token_prefix = run_prefix(replica_id, self.run_start_us)
        self._batch_seq = dict.fromkeys(RECORD_TYPES, 0)  # per table: the last batch number given out
        self._in_flight: dict[str, int] = {}  # rows a flush has taken and not yet written, spooled or dropped
        self._lock = threading.Lock()  # buffers and counters
        self._flush_lock = threading.Lock()  # one flush cycle (or checkpoint) at a time
        self._buffers = {table: ColumnBuffer(table) for table in RECORD_TYPES}
        self._stats = {table: dict.fromkeys(COUNTERS, 0) for table in RECORD_TYPES}
        self.failures = 0  # exceptions swallowed in hooks
        self._closed = False
        self._retry_at = 0.0  # store considered down until then
        self._backoff, self._max_backoff = 0.5, max_backoff
        self._spool_full_logged = False
        self._drops_logged, self._drops_logged_at = 0, float("-inf")
        self._journal: RequestJournal | None = None
        self._requests_taken = 0  # journaled requests records the flush thread has taken (the next one's number)

        self.abandoned_runs = self._account_abandoned_runs()  # before this run's own marker exists
        self._marker = self._open_marker()
        if journal:  # after the marker: a journal without one is a dead run's
            self._journal = self._open_journal()
        self._checkpoint()
        self._wake = threading.Event()
        if spooled := self.spool.files():
            log.info("recorder: %d spooled batches (%d bytes) in %s, from an earlier run: replaying them once the "
                     "store is reachable", len(spooled), self.spool.size_bytes, self.spool.directory)
            self._wake.set()  # replay now rather than after the first interval
        self._thread = threading.Thread(target=self._run, name=f"infersight-recorder-{safe_replica_id(replica_id)}",
                                        daemon=True)
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
        # lock-free (ColumnBuffer, RequestJournal): a record racing with close() is counted by close's last check
        buffer = self._buffers[table]
        journal = self._journal if table == "requests" else None
        rows = buffer.rows if journal is None else buffer.rows + len(journal)
        if self._closed or rows >= self.max_buffer_rows:
            self._count(table, "dropped", 1)
            return
        (buffer.append if journal is None else journal.append)(record)
        if rows + 1 >= self.max_batch_rows:
            self._wake.set()

    # public controls ---------------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {table: dict(counts) for table, counts in self._stats.items()}

    def pending_rows(self) -> int:
        """Rows buffered in memory, not yet written, spooled or dropped."""
        with self._lock:
            return sum(b.rows for b in self._buffers.values()) + (len(self._journal) if self._journal else 0)

    def sync_journal(self) -> None:
        """Journal every request record appended so far (group commit; a no-op without a journal or
        with nothing new). What `infersight serve` calls before any byte of a response leaves."""
        journal = self._journal
        if journal is not None:
            journal.sync()

    def batch_token(self, table: str, seq: int) -> str:
        """The dedup token of this run's `seq`-th batch of `table` (what a replay of it carries)."""
        return batch_token(self._token_prefix, table, seq)

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
            for table, buffer in self._buffers.items():  # appended while closing: counted, never lost silently
                if buffer.rows:
                    self._count(table, "dropped", len(buffer.take()))
            if self._journal is not None:  # every batch is done: nothing to recover
                if len(self._journal):  # appended after the final cycle's sync: counted, never lost silently
                    self._count("requests", "dropped", len(self._journal))
                self._journal.close()
            self._report_drops(force=True)
            if self._marker is not None:  # the final flush is done: nothing of this run to report
                self._marker.remove()
        self._thread.join(timeout=5)
        if self.spool.files():
            log.warning("recorder: %d batches (%d bytes) stay spooled in %s; the next start with this spool "
                        "directory replays them", len(self.spool.files()), self.spool.size_bytes, self.spool.directory)
        elif self._own_spool_dir:
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
        next_flush = time.monotonic() + self.flush_interval
        while not self._closed:
            woken = self._wake.wait(max(0.0, min(self.checkpoint_interval, next_flush - time.monotonic())))
            self._wake.clear()
            if self._closed:
                return
            try:
                with self._flush_lock:
                    if self._closed:
                        return
                    if woken or time.monotonic() >= next_flush:
                        self._cycle()
                        next_flush = time.monotonic() + self.flush_interval
                    else:
                        self._checkpoint()
                    self._report_drops()
            except Exception:  # keep the thread alive whatever happens
                log.exception("recorder: flush cycle failed")

    def _cycle(self, final: bool = False) -> None:
        if self._journal is not None:
            self._journal.sync()
        with self._lock:
            taken = [(table, buffer.take()) for table, buffer in self._buffers.items() if buffer.rows]
            self._in_flight = {table: len(records) for table, records in taken}
        if taken:
            self._checkpoint()  # before sending: a kill from here on leaves these rows "in flight", never counted lost
        for table, records in taken:
            journal = self._journal if table == "requests" else None
            first = self._requests_taken  # the journal's number of records[0]
            if journal is not None:
                self._requests_taken += len(records)
            for start in range(0, len(records), self.max_batch_rows):
                part_records = records[start:start + self.max_batch_rows]
                self._batch_seq[table] += 1  # the token is fixed here, with the batch: every resend reuses it
                seq = self._batch_seq[table]
                end = first + start + len(part_records)
                if journal is not None:  # before it is sent: a kill from here on replays it under this token
                    journal.formed(seq, first + start, end)
                part_rows = len(part_records)
                try:
                    part, part_rows = self._columns(table, part_records)
                    data = self._to_arrow(table, part)
                    self._deliver(table, data, self.batch_token(table, seq), data.num_rows)
                except Exception:  # whatever went wrong, the rows are accounted for
                    log.exception("recorder: %d %s rows lost", part_rows, table)
                    self._count(table, "dropped", part_rows)
                if journal is not None:
                    journal.done(seq, end)
            with self._lock:
                self._in_flight.pop(table, None)
        self._checkpoint()
        # replay when the store is not known down (and once more at close, whatever the backoff says)
        if self.spool.size_bytes and (final or time.monotonic() >= self._retry_at):
            self._replay()

    def _columns(self, table: str, records: list) -> tuple[dict[str, list], int]:
        """(columns, rows) of taken records; a record whose fields cannot be read is dropped, counted."""
        columns, bad = self._buffers[table].to_columns(records)
        if bad:
            self.failures += bad
            self._count(table, "dropped", bad)
            log.error("recorder: dropped %d %s records that are not records of the table (a bug in their "
                      "producer)", bad, table)
        rows = len(records) - bad
        if table == "requests" and not self.store_text:  # the redaction switch
            for name in TEXT_COLUMNS:
                columns[name] = [""] * rows
        return columns, rows

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
        if not token:  # without one, the store would deduplicate by bytes, and a re-formed batch twice
            raise ValueError(f"a {table} batch without a dedup token")
        self._get_store().insert_arrow(table, as_one_batch(data), dedup_token=token)

    def _to_spool(self, table: str, data: pa.Table, token: str, rows: int) -> None:
        try:
            stored = self.spool.put(table, data, token)
        except Exception as e:  # disk full, permissions ...: the rows are dropped, counted
            log.error("recorder: cannot write the spool (%s)", e)
            stored = False
        if not stored and not self._spool_full_logged:
            self._spool_full_logged = True
            log.warning("recorder: the spool in %s is full (%d of %d bytes): new batches are dropped (counted in "
                        "infersight_telemetry_rows_dropped_total) until the store takes the spooled ones",
                        self.spool.directory, self.spool.size_bytes, self.spool.max_bytes)
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
        self._spool_full_logged = False

    # what a kill would lose: the marker, and the runs that ended without one removed ----------------

    def _open_marker(self) -> RunMarker | None:
        try:
            return RunMarker(self.spool.directory, self._token_prefix)
        except OSError as e:
            log.error("recorder: cannot keep a run marker in %s (%s): a kill of this process will not be "
                      "reported by the next start", self.spool.directory, e)
            return None

    def _open_journal(self) -> RequestJournal | None:
        try:
            return RequestJournal(self.spool.directory, self._token_prefix, self._buffers["requests"].names,
                                  () if self.store_text else TEXT_COLUMNS, self._buffers["requests"].extend,
                                  packed=_number_lists("requests"))
        except OSError as e:
            log.error("recorder: cannot keep a request journal in %s (%s): a kill of this process loses the "
                      "requests it holds in memory", self.spool.directory, e)
            return None

    def _checkpoint(self) -> None:
        """Tell the marker what is in memory now (the flush thread, or whoever holds the flush lock)."""
        journal = self._journal
        if journal is not None:
            journal.sync()  # within a checkpoint interval even where nobody waits for it (no server)
        if self._marker is None:
            return
        with self._lock:
            buffered = {table: b.rows for table, b in self._buffers.items() if b.rows}
            in_flight = dict(self._in_flight)
        state = {"replica_id": self.replica_id, "pid": os.getpid(), "run_start_us": self.run_start_us,
                 "token_prefix": self._token_prefix, "checkpoint_interval": self.checkpoint_interval,
                 "buffered": buffered, "in_flight": in_flight,
                 "last_batch": {table: seq for table, seq in self._batch_seq.items() if seq}}
        if journal is not None and not journal.broken:
            # journaled requests are recovered by the next start: in memory and lost are only the others
            journaled = journal.journaled  # read first: a sync in between makes `appended` smaller, never larger
            pending = len(journal)
            buffered.pop("requests", None)
            in_flight.pop("requests", None)
            if pending:
                buffered["requests"] = pending
            state["journal"] = {"journaled": journaled, "appended": journaled + pending}
        try:
            self._marker.write(state)  # the file's mtime says when
        except OSError as e:
            log.error("recorder: cannot update the run marker %s (%s); no longer kept", self._marker.path, e)
            self._marker = None

    def _account_abandoned_runs(self) -> list[dict]:
        """Earlier runs in this spool directory that ended without their final flush: log each one,
        recover what its request journal holds, and count the rows its last checkpoint saw only in
        memory (not journaled) as dropped."""
        try:
            abandoned = claim_abandoned(self.spool.directory)
        except OSError as e:
            log.error("recorder: cannot look for abandoned runs in %s: %s", self.spool.directory, e)
            return []
        journaled = self._recover_journals()
        for run in abandoned:
            lost, sending = _row_counts(run.get("buffered")), _row_counts(run.get("in_flight"))
            counts = run.get("journal")
            if isinstance(counts, dict) and isinstance(counts.get("appended"), int):
                # exact for what the engine had handed over by the last checkpoint: appended, never journaled
                lost.pop("requests", None)
                sending.pop("requests", None)
                missing = counts["appended"] - journaled.get(str(run.get("token_prefix")), 0)
                if missing > 0:
                    lost["requests"] = missing
            for table, rows in lost.items():
                self._stats[table]["dropped"] += rows
            log.warning(
                "recorder: an earlier run in %s (replica %s, pid %s, started %s us) ended without its final flush "
                "(killed?). Lost, counted as dropped: %d rows it held only in memory at its last checkpoint %s. "
                "Not known: %d rows it was sending or spooling then %s (stored once, replayed from the spool, or "
                "lost). Lost and not counted: rows recorded after that checkpoint (about %s s of them).",
                self.spool.directory, run.get("replica_id", "?"), run.get("pid", "?"), run.get("run_start_us", "?"),
                sum(lost.values()), lost or "", sum(sending.values()), sending or "",
                run.get("checkpoint_interval", "?"))
        self._drops_logged = sum(counts["dropped"] for counts in self._stats.values())  # reported just now
        return abandoned

    def _recover_journals(self) -> dict[str, int]:
        """Dead runs' request journals as spool files (replayed like any): the batches a run formed
        and did not confirm under its tokens, the records it never batched under batch numbers it never
        used; then the journal goes. {run: records it journaled}. A kill in the middle of this repeats
        it at the next start, under the same tokens: stored once all the same."""
        directory = self.spool.directory
        found: dict[str, int] = {}
        try:
            runs = abandoned_runs(directory, lambda run: marker_path(directory, run).exists())
        except OSError as e:
            log.error("recorder: cannot look for request journals in %s: %s", directory, e)
            return found
        for run in runs:
            try:
                recovered = read_run(directory, run)
            except OSError as e:
                log.error("recorder: cannot read the request journal of run %s in %s: %s", run, directory, e)
                continue
            resent = sum(self._spool_recovered(batch_token(run, "requests", seq), rows)
                         for seq, rows in recovered.batches)
            fresh, seq = 0, recovered.last_batch
            for start in range(0, len(recovered.unformed), self.max_batch_rows):
                seq += 1
                fresh += self._spool_recovered(batch_token(run, "requests", seq),
                                               recovered.unformed[start:start + self.max_batch_rows])
            for path in recovered.paths:
                path.unlink(missing_ok=True)
            found[run] = recovered.journaled
            if resent or fresh:
                log.warning("recorder: run %s in %s ended without its final flush; from its request journal, %d "
                            "requests rows it had sent or spooled without confirmation go again under their "
                            "batches' tokens (stored once), %d it had not sent yet go now", run, directory,
                            resent, fresh)
        return found

    def _spool_recovered(self, token: str, rows: list[dict]) -> int:
        """Journaled records ({column: value}) as one spool file under `token`; the rows spooled."""
        records, bad = [], 0
        for row in rows:
            try:
                records.append(RequestRecord(**{k: v for k, v in row.items() if k in _REQUEST_FIELDS}))
            except TypeError:  # a journal of another version, without a column this one needs
                bad += 1
        if bad:
            log.error("recorder: %d journaled requests rows cannot be read (dropped)", bad)
            self._count("requests", "dropped", bad)
        if not records:
            return 0
        columns, n = self._columns("requests", records)
        try:
            data = self._to_arrow("requests", columns)
            if data.num_rows:
                self.spool.put("requests", data, token, force=True)  # on disk already, as the journal
            return data.num_rows
        except Exception:  # noqa: BLE001 - counted, and the journal goes all the same (no endless retry)
            log.exception("recorder: cannot spool %d journaled requests rows (dropped)", n)
            self._count("requests", "dropped", n)
            return 0

    def _report_drops(self, force: bool = False) -> None:
        """A log line when rows were dropped since the last one, at most every DROP_LOG_INTERVAL seconds."""
        with self._lock:
            by_table = {table: counts["dropped"] for table, counts in self._stats.items() if counts["dropped"]}
        total = sum(by_table.values())
        now = time.monotonic()
        if total > self._drops_logged and (force or now - self._drops_logged_at >= DROP_LOG_INTERVAL):
            log.warning("recorder: %d telemetry rows dropped since the last report (%d in all: %s); see "
                        "infersight_telemetry_rows_dropped_total", total - self._drops_logged, total, by_table)
            self._drops_logged, self._drops_logged_at = total, now

    def _count(self, table: str, counter: str, rows: int) -> None:
        with self._lock:
            self._stats.setdefault(table, dict.fromkeys(COUNTERS, 0))[counter] += rows
