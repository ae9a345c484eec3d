"""What the request journal costs, and whom.

    .venv/bin/python -m telemetry.benchmarks.journal_cost [--records 4000] [--prompt 136] [--output 72]

The engine thread: `on_request_finished` with and without a journal (a deque append either way;
the journal adds a length check). The thread that syncs (the server's event loop before it
answers, or the recorder's flush thread): thread CPU per record, for groups of 1 (each request
synced alone, an idle server) up to 64 (many requests finished between two syncs), records of
`--prompt` / `--output` token IDs (the telemetry-overhead benchmark's mean sizes). The store is
unreachable and the flush thread idle (an hour's interval): only the journal is measured.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from telemetry import synthetic
from telemetry.recorder import Recorder


def _recorder(directory: str, journal: bool) -> Recorder:
    return Recorder("http://127.0.0.1:9", "bench", spool_dir=directory, flush_interval=3600,
                    checkpoint_interval=3600, max_buffer_rows=10**9, max_batch_rows=10**9, journal=journal)


def engine_thread_ns(records: list, journal: bool, repeats: int = 5) -> float:
    """Median ns per on_request_finished call (thread CPU), the buffers emptied between repeats."""
    samples = []
    with tempfile.TemporaryDirectory() as d:
        rec = _recorder(d, journal)
        try:
            for _ in range(repeats):
                t = time.thread_time_ns()
                for r in records:
                    rec.on_request_finished(r)
                samples.append((time.thread_time_ns() - t) / len(records))
                if journal:
                    rec._journal._pending.clear()
                rec._buffers["requests"].take()
        finally:
            rec._closed = True  # nothing to flush: the store is unreachable on purpose
    return statistics.median(samples)


def sync_us_per_record(records: list, group: int) -> float:
    """Thread CPU per record of `sync_journal()` when `group` records wait for each sync."""
    with tempfile.TemporaryDirectory() as d:
        rec = _recorder(d, journal=True)
        try:
            spent = 0
            for start in range(0, len(records), group):
                for r in records[start:start + group]:
                    rec.on_request_finished(r)
                t = time.thread_time_ns()
                rec.sync_journal()
                spent += time.thread_time_ns() - t
                rec._buffers["requests"].take()  # what the flusher would take
        finally:
            rec._closed = True
    return spent / len(records) / 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--prompt", type=int, default=136, help="prompt token IDs per record")
    parser.add_argument("--output", type=int, default=72, help="output token IDs per record")
    args = parser.parse_args(argv)
    records = [synthetic.request(i, "bench", prompt_len=args.prompt, output_len=args.output)
               for i in range(args.records)]
    off, on = engine_thread_ns(records, False), engine_thread_ns(records, True)
    print(f"engine thread, on_request_finished: {off:.0f} ns without a journal, {on:.0f} ns with one")
    for group in (1, 8, 64):
        print(f"sync, {group:>2} records per write(): {sync_us_per_record(records, group):.1f} us of CPU per record")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
