"""Sidecar ingest rate: several writer processes insert request and step batches through
clickhouse-connect (as recorders do: Arrow batches with dedup tokens) into one sidecar.

    python -m telemetry.benchmarks.ingest [--writers 4] [--seconds 10] [--engine-tokens-per-s X]

Prints rows/s and token IDs/s (prompt + output token ids stored), and, given the engine's token
rate on this machine, how many engines' worth of telemetry one sidecar takes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time


def _writer(w: int, url: str, args, start, results) -> None:
    from telemetry import synthetic
    from telemetry.columnar import records_to_arrow
    from telemetry.store import open_store

    store = open_store(url)
    requests = records_to_arrow("requests", [
        synthetic.request(i, f"bench-{w}", prompt_len=args.prompt_tokens, output_len=args.output_tokens)
        for i in range(args.batch_rows)])
    steps = records_to_arrow("steps", synthetic.records("steps", args.batch_rows, replica_id=f"bench-{w}"))
    tokens_per_batch = args.batch_rows * (args.prompt_tokens + args.output_tokens)
    rows = token_ids = batches = 0
    start.wait()
    deadline = time.perf_counter() + args.seconds
    while time.perf_counter() < deadline:
        store.insert_arrow("requests", requests, dedup_token=f"bench-{w}-req-{batches}")
        store.insert_arrow("steps", steps, dedup_token=f"bench-{w}-step-{batches}")
        rows += requests.num_rows + steps.num_rows
        token_ids += tokens_per_batch
        batches += 1
    results.put((rows, token_ids, batches, time.perf_counter() - deadline + args.seconds))
    store.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--batch-rows", type=int, default=500, help="rows per insert (per table)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--url", default=None, help="an existing ClickHouse HTTP endpoint (default: start a sidecar)")
    parser.add_argument("--engine-tokens-per-s", type=float, default=None,
                        help="the engine's generation rate here, to print the headroom ratio")
    args = parser.parse_args(argv)

    sidecar = None
    if args.url is None:
        from telemetry.sidecar.process import start_sidecar
        sidecar = start_sidecar(tempfile.mkdtemp(prefix="ingest-bench-"))
    url = args.url or sidecar.url
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(w, url, args, start, results)) for w in range(args.writers)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    print(f"ingest benchmark: {args.writers} writer processes -> {url}, {args.seconds:.0f} s, batches of "
          f"{args.batch_rows} requests ({args.prompt_tokens}+{args.output_tokens} token ids each) + "
          f"{args.batch_rows} steps", flush=True)
    start.set()
    outcomes = [results.get(timeout=args.seconds + 300) for _ in procs]
    for p in procs:
        p.join()
    if sidecar:
        sidecar.stop()
    elapsed = max(o[3] for o in outcomes)
    rows, token_ids, batches = (sum(o[i] for o in outcomes) for i in range(3))
    print(f"inserts: {2 * batches} in {elapsed:.1f} s ({2 * batches / elapsed:.1f}/s)")
    print(f"rows/s: {rows / elapsed:,.0f}   (requests + steps)")
    print(f"token IDs/s: {token_ids / elapsed:,.0f}")
    if args.engine_tokens_per_s:
        print(f"headroom: {token_ids / elapsed / args.engine_tokens_per_s:.1f}x the engine's "
              f"{args.engine_tokens_per_s:,.0f} tokens/s (goal >= 20x)")


if __name__ == "__main__":
    main()
