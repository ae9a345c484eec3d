"""What one recorder flush costs its thread, part by part, writing to a real sidecar.

    .venv/bin/python -m telemetry.benchmarks.flush_cost [--cycles 40] [--interval 2]

The recorder's flusher is a Python thread in the engine's process: the CPU it spends holds the
GIL the engine thread also needs, so it is the part of telemetry's cost the engine does not see
in its own hooks. Each cycle buffers what an engine makes in one flush interval (by default at the
telemetry-overhead benchmark's rate: 50 steps and 6 requests per second, prompts of ~136 and
outputs of ~72 token IDs), then flushes, and the flush's thread CPU time is split into: rows ->
columns, columns -> Arrow, and the inserts over HTTP.

Two stores are measured side by side, cycles alternating: the RemoteStore the recorder uses, and
clickhouse-connect's own `insert_arrow` with its default lz4 (what RemoteStore did before: it names
every column in the INSERT, and urllib3 re-encodes that long URL character by character).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from telemetry import synthetic
from telemetry.recorder import DEFAULT_FLUSH_INTERVAL, Recorder
from telemetry.sidecar.process import start_sidecar
from telemetry.store.remote import RemoteStore

PARTS = ("columns", "arrow", "insert")


class NamedColumnsStore(RemoteStore):
    """The baseline: clickhouse-connect's insert_arrow (column list in the URL, lz4 compression)."""

    def insert_arrow(self, table: str, data: pa.Table, dedup_token: str | None = None) -> int:
        self.client.insert_arrow(table, data, settings={"insert_deduplication_token": dedup_token})
        return data.num_rows


class TimedRecorder(Recorder):
    """The recorder, with the thread CPU time of each part of a cycle added up."""

    def __init__(self, *args, **kwargs):
        self.part_seconds = dict.fromkeys(PARTS, 0.0)
        super().__init__(*args, **kwargs)

    def _timed(self, part: str, fn, *args):
        t = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.part_seconds[part] += time.thread_time() - t

    def _columns(self, table, row_tuples):
        return self._timed("columns", super()._columns, table, row_tuples)

    def _to_arrow(self, table, columns):
        return self._timed("arrow", super()._to_arrow, table, columns)

    def _insert(self, table, data, token):
        return self._timed("insert", super()._insert, table, data, token)


def measure(cycles: int, steps: int, requests: int, prompt_len: int = 136, output_len: int = 72) -> dict:
    """{store name: {part: median ms per flush}}, the two stores' flushes alternating."""
    with tempfile.TemporaryDirectory() as tmp, start_sidecar(Path(tmp) / "store") as sidecar:
        stores = {"RemoteStore": RemoteStore(sidecar.url),
                  "clickhouse-connect insert_arrow, lz4": NamedColumnsStore(sidecar.url + "?compress=lz4")}
        # flush_interval: the threads never flush on their own, only when this loop says so
        recorders = {name: TimedRecorder(store, name.split()[0], flush_interval=3600) for name, store in stores.items()}
        per_cycle = {name: {p: [] for p in (*PARTS, "total")} for name in stores}
        appended = dict.fromkeys(stores, 0)
        try:
            for cycle in range(cycles + 3):  # 3 warm-up cycles: connections, schemas, first inserts
                for name, recorder in recorders.items():
                    for i in range(steps):
                        recorder.on_step(synthetic.step(cycle * steps + i, recorder.replica_id))
                    for i in range(requests):
                        recorder.on_request_finished(synthetic.request(
                            cycle * requests + i, recorder.replica_id, prompt_len=prompt_len, output_len=output_len))
                    appended[name] += steps + requests
                    before = dict(recorder.part_seconds)
                    t = time.thread_time()
                    recorder.flush()
                    total = time.thread_time() - t
                    if cycle >= 3:
                        per_cycle[name]["total"].append(total)
                        for p in PARTS:
                            per_cycle[name][p].append(recorder.part_seconds[p] - before[p])
        finally:
            for recorder in recorders.values():
                recorder.close()
            for store in stores.values():
                store.close()
    for name, recorder in recorders.items():  # a fast flush that loses rows would be no result
        written = sum(recorder.stats()[t]["written"] for t in ("steps", "requests"))
        if written != appended[name]:
            raise RuntimeError(f"{name}: {written} rows written of {appended[name]} appended")
    return {name: {p: statistics.median(v) * 1e3 for p, v in parts.items()} for name, parts in per_cycle.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--interval", type=float, default=DEFAULT_FLUSH_INTERVAL, help="flush interval, seconds")
    p.add_argument("--steps-per-second", type=float, default=50)
    p.add_argument("--requests-per-second", type=float, default=6)
    a = p.parse_args(argv)
    steps, requests = round(a.steps_per_second * a.interval), round(a.requests_per_second * a.interval)
    result = measure(a.cycles, steps, requests)
    print(f"{a.cycles} flushes each of {steps} step rows + {requests} request rows (one every {a.interval:g} s) "
          f"to a sidecar; thread CPU, median per flush, and per second of running:")
    for name, parts in result.items():
        print(f"  {name}:")
        for part, ms in parts.items():
            print(f"    {part:8s} {ms:6.2f} ms  = {ms / a.interval:5.2f} ms/s")
    base, ours = result["clickhouse-connect insert_arrow, lz4"], result["RemoteStore"]
    print(f"  RemoteStore vs clickhouse-connect insert_arrow: inserts {base['insert'] / ours['insert']:.2f}x "
          f"cheaper, whole flush {base['total'] / ours['total']:.2f}x")


if __name__ == "__main__":
    main()
