"""How long each diagnostic takes over a million stored requests (and a million steps).

    .venv/bin/python diagnostics/benchmarks/diagnose_1m.py [--requests 1000000] [--store DIR] [--keep]

Generates the synthetic fleet history (diagnostics/benchmarks/synthetic_fleet.py) into an embedded
store, then runs each diagnostic over the whole window, best of --rounds, and prints seconds and
findings per diagnostic. The heavy lifting is ClickHouse's: Python sees aggregates and samples.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from diagnostics import output_drift, overhead, regression, replicas, speculative, tokenizer_divergence
from diagnostics.findings import format_table
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--store", help="data directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the generated store")
    parser.add_argument("--rounds", type=int, default=2, help="runs per diagnostic (best is reported)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from diagnostics.benchmarks.synthetic_fleet import generate
    from engine.fleet.models import tiny_random_model
    from engine.tokenization import Tokenizer
    from telemetry.schema import migrate
    from telemetry.store import open_store

    model = tiny_random_model("llama")  # the tokenizer the replicas "ran": token checks really run
    tok = Tokenizer(model)
    path = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="diagnose-1m-"))
    store = open_store(path)
    try:
        migrate(store)
        have = int(store.query_df("SELECT count() AS n FROM requests")["n"][0])
        if have < args.requests:
            t = time.perf_counter()
            generate(store, args.requests, args.steps, model_dir=str(model), tokenizer_hash=tok.tokenizer_hash,
                     chat_template_hash=tok.chat_template_hash, progress=lambda m: print("  generating", m))
            print(f"generated in {time.perf_counter() - t:.1f} s")
        counts = store.query_df("SELECT (SELECT count() FROM requests) AS requests, "
                                "(SELECT count() FROM steps) AS steps")
        print(f"store {path}: {int(counts['requests'][0]):,} requests, {int(counts['steps'][0]):,} steps")

        scope = Scope.window(since="7h")
        base, cand = scope.with_side("version=0.1.0"), scope.with_side("version=0.2.0")
        runs = {
            "regression (0.2.0 vs 0.1.0)": lambda: regression.compare(store, base, cand),
            "regression change points": lambda: regression.creep(store, scope),
            "replicas": lambda: replicas.run(store, DiagnosticRequest(scope)),
            "tokenizer": lambda: tokenizer_divergence.run(store, DiagnosticRequest(scope)),
            "drift (evals + greedy)": lambda: output_drift.run(store, DiagnosticRequest(scope)),
            "speculative": lambda: speculative.run(store, DiagnosticRequest(scope)),
            "overhead": lambda: overhead.run(store, DiagnosticRequest(scope)),
        }
        results = []
        for name, fn in runs.items():
            best, found = float("inf"), []
            for _ in range(args.rounds):
                t = time.perf_counter()
                found = fn()
                best = min(best, time.perf_counter() - t)
            above = [f for f in found if f.severity != "info"]
            results.append((name, best, len(found), above))
            print(f"  {name:<32} {best:6.2f} s  {len(found):3d} findings, {len(above)} above info")
        print(f"\nseconds per diagnostic over {int(counts['requests'][0]):,} requests (best of {args.rounds}):")
        for name, best, n, _ in results:
            print(f"  {name:<32} {best:6.2f}")
        print(f"  {'total':<32} {sum(r[1] for r in results):6.2f}")
        print("\nfindings above info:")
        print(format_table([f for r in results for f in r[3]], width=150))
    finally:
        store.close()
        if not args.store and not args.keep:
            shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
