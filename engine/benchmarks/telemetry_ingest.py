"""Sidecar ingest rate: several writer processes insert request and step batches through
clickhouse-connect (as recorders do: Arrow batches with dedup tokens) into one sidecar.

    python -m engine.benchmarks.telemetry_ingest [--writers 4] [--seconds 10] [--engine | --engine-tokens-per-s X]

Prints rows/s and token IDs/s (prompt + output token ids stored). With --engine it first measures,
in the same run, the token IDs per second the engine itself produces on this machine (a tiny
random-weight Llama, offline generate: prompt + output tokens of finished requests) and prints
the headroom: how many engines' worth of telemetry one sidecar takes (goal >= 20x).
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


def engine_token_ids_per_second(prompt_tokens: int, output_tokens: int, num_prompts: int = 32) -> float:
    """Token IDs (prompt + output) per second of finished requests, engine alone, no telemetry."""
    import random

    import torch

    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams
    from engine.core.tiny_model import build_random_model

    torch.set_num_threads(1)
    model = build_random_model(tempfile.mkdtemp(prefix="ingest-bench-model-"), "llama")
    llm = LLM(model, max_num_seqs=16)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(prompt_tokens)] for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm up
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return sum(len(o.prompt_token_ids) + len(o.token_ids) for o in outputs) / elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--batch-rows", type=int, default=1000, help="rows per insert (per table)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--url", default=None, help="an existing ClickHouse HTTP endpoint (default: start a sidecar)")
    parser.add_argument("--engine", action="store_true", help="measure the engine's token IDs/s here first")
    parser.add_argument("--engine-tokens-per-s", type=float, default=None,
                        help="or give the engine's token IDs/s, to print the headroom ratio")
    args = parser.parse_args(argv)
    if args.engine:
        args.engine_tokens_per_s = engine_token_ids_per_second(args.prompt_tokens, args.output_tokens)
        print(f"engine alone: {args.engine_tokens_per_s:,.0f} token IDs/s (prompt + output, tiny Llama, CPU)",
              flush=True)

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
              f"{args.engine_tokens_per_s:,.0f} token IDs/s (goal >= 20x)")


if __name__ == "__main__":
    main()
