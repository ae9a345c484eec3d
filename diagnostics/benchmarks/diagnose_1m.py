"""How long each diagnostic takes over a million stored requests (and a million steps).

    .venv/bin/python diagnostics/benchmarks/diagnose_1m.py [--requests 1000000] [--store DIR] [--keep]
        [--only NAME ...]  (NAME: a prefix of a diagnostic's name below, e.g. --only tokenizer)
        [--blas-threads N]

Generates the synthetic fleet history (diagnostics/benchmarks/synthetic_fleet.py) into an embedded
store, then runs each diagnostic over the whole window, best of --rounds, and prints seconds and
findings per diagnostic. The heavy lifting is ClickHouse's: Python sees aggregates and samples.
--blas-threads 1 runs numpy's BLAS on one thread: the diagnostics multiply small matrices (~100 x 128),
where on a busy 2-core host threaded OpenBLAS spends more time waking and waiting than computing
(the tokenizer's frequency test: 2.5-3.8 s with the default threads, 0.05-0.13 s with one, load ~4).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from diagnostics import (
    drift,
    overhead,
    quality,
    regression,
    replicas,
    rescore,
    speculative,
    steps as steps_rule,
    tokenizer,
)
from diagnostics.findings import format_table
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

# the synthetic fleet writes no output_logprobs: give every request 16, from a per-request level
# (r5, the int4 replica, less sure of its tokens), once per store
_LOGPROBS = """
ALTER TABLE requests UPDATE output_logprobs = arrayMap(k -> toFloat32(least(0.0,
    -0.4 * if(replica_id = 'r5', 1.3, 1.0) * (0.5 + (cityHash64(request_id) % 1000) / 1000.0)
    - 0.3 * ((cityHash64(request_id, k) % 1000) / 1000.0))), range(least(output_tokens, 16)))
WHERE empty(output_logprobs)
SETTINGS mutations_sync = 1
"""


def add_sampled_logprobs(store) -> None:
    if int(store.query_df("SELECT countIf(notEmpty(output_logprobs)) AS n FROM requests")["n"][0]) == 0:
        t = time.perf_counter()
        store.command(_LOGPROBS)
        print(f"output_logprobs added in {time.perf_counter() - t:.1f} s")


# rescore rounds (cross-scoring): 0.4% of the requests, each scored by all 8 replicas; scores move
# by ~1e-5 nats on equal weights, by ~0.01 where r5 (int4) served or scored
_RESCORES = """
INSERT INTO requests (replica_id, request_id, model_name, workload, arrival_time, finish_reason, prompt_tokens,
                      output_tokens, prompt_token_ids, output_token_ids, prompt_logprobs)
SELECT s.scorer, concat('rescore.p1.', s.scorer, '.', o.request_id), o.model_name, 'rescore', o.arrival_time + 30,
       'length', length(o.prompt_token_ids) + length(o.output_token_ids), 1,
       arrayConcat(o.prompt_token_ids, o.output_token_ids), [toUInt32(1)],
       arrayConcat(arrayWithConstant(length(o.prompt_token_ids) - 1, toFloat32(-2)),
           arrayMap((x, k) -> toFloat32(x + if(o.replica_id != s.scorer AND 'r5' IN (o.replica_id, s.scorer), 0.02, 1e-5)
               * ((cityHash64(o.request_id, s.scorer, k) % 1000) / 500.0 - 1)),
               o.output_logprobs, arrayEnumerate(o.output_logprobs)))
FROM requests AS o CROSS JOIN (SELECT concat('r', toString(number)) AS scorer FROM numbers(8)) AS s
WHERE o.workload != 'rescore' AND cityHash64(o.request_id) % 1000 < 4
  AND length(o.output_logprobs) = length(o.output_token_ids) AND length(o.output_token_ids) >= 2
"""


def add_rescores(store) -> None:
    if int(store.query_df("SELECT countIf(workload = 'rescore') AS n FROM requests")["n"][0]) == 0:
        t = time.perf_counter()
        store.command(_RESCORES)
        print(f"rescore rows added in {time.perf_counter() - t:.1f} s")


# a store generated before migration 0010 computes mean_itl_seconds from token_times when read (the
# old cost) until its parts merge: store it once, so that a reused store measures what a new one does
def materialize_mean_itl(store) -> None:
    have = store.query_df("SELECT (SELECT count() FROM system.parts WHERE database = currentDatabase() "
                          "AND table = 'requests' AND active) AS parts, (SELECT count() FROM system.parts_columns "
                          "WHERE database = currentDatabase() AND table = 'requests' AND active "
                          "AND column = 'mean_itl_seconds') AS stored")
    if int(have["stored"][0]) < int(have["parts"][0]):
        t = time.perf_counter()
        store.command("ALTER TABLE requests MATERIALIZE COLUMN mean_itl_seconds SETTINGS mutations_sync = 1")
        print(f"mean_itl_seconds stored in {time.perf_counter() - t:.1f} s")


_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--store", help="data directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the generated store")
    parser.add_argument("--rounds", type=int, default=2, help="runs per diagnostic (best is reported)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run only the diagnostics whose name starts with one of these (e.g. tokenizer)")
    parser.add_argument("--blas-threads", type=int,
                        help="OpenBLAS/OpenMP/MKL threads for numpy (default: as the environment says)")
    args = parser.parse_args()
    if args.blas_threads is not None and os.environ.get(_BLAS_VARS[0]) != str(args.blas_threads):
        # numpy reads these once, when loaded (by the diagnostics package, before main): run afresh
        env = {**os.environ, **dict.fromkeys(_BLAS_VARS, str(args.blas_threads))}
        os.execve(sys.executable, [sys.executable, "-m", "diagnostics.benchmarks.diagnose_1m", *sys.argv[1:]], env)
    print("BLAS threads:", ", ".join(f"{v}={os.environ.get(v, '(unset)')}" for v in _BLAS_VARS))

    import torch

    torch.set_num_threads(1)
    from diagnostics.benchmarks.synthetic_fleet import generate
    from engine.core.model_refs import tiny_random_model
    from engine.core.tokenization import Tokenizer
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
        add_sampled_logprobs(store)
        add_rescores(store)
        materialize_mean_itl(store)
        counts = store.query_df("SELECT (SELECT count() FROM requests) AS requests, "
                                "(SELECT count() FROM steps) AS steps")
        print(f"store {path}: {int(counts['requests'][0]):,} requests, {int(counts['steps'][0]):,} steps")

        scope = Scope.window(since="7h")
        base, cand = scope.with_side("version=0.1.0"), scope.with_side("version=0.2.0")
        runs = {
            "regression (0.2.0 vs 0.1.0)": lambda: regression.compare(store, base, cand),
            "regression change points": lambda: regression.creep(store, scope),
            "replicas": lambda: replicas.run(store, DiagnosticRequest(scope)),
            "tokenizer": lambda: tokenizer.run(store, DiagnosticRequest(scope)),
            "drift (evals + greedy)": lambda: drift.run(store, DiagnosticRequest(scope)),
            "speculative": lambda: speculative.run(store, DiagnosticRequest(scope)),
            "overhead": lambda: overhead.run(store, DiagnosticRequest(scope)),
            "quality (sampled logprobs)": lambda: quality.run(store, DiagnosticRequest(scope)),
            "rescore (cross-scoring)": lambda: rescore.run(store, DiagnosticRequest(scope)),
            "steps (step-time model)": lambda: steps_rule.run(store, DiagnosticRequest(scope)),
        }
        if args.only:
            runs = {name: fn for name, fn in runs.items() if any(name.startswith(o) for o in args.only)}
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
