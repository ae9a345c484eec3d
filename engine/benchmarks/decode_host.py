"""Decode-step host overhead: tokens/s and the engine's own per-step time split, small batches.

    python -m engine.benchmarks.decode_host                  # all workloads, 3 runs each, medians
    python -m engine.benchmarks.decode_host --only batch1 --runs 1 --json out.json
    python -m engine.benchmarks.decode_host --only 135m --quant int8 [--quant-skip ''] [--int8-exact]
    python -m engine.benchmarks.decode_host --only batch1 --no-compile   # eager decode steps (A/B)
    python -m engine.benchmarks.decode_host --only batch1,decode16 --sweep-steps 1,4,8,16,32 --rounds 5
    python -m engine.benchmarks.decode_host --only batch1,decode16 --sweep-steps 1,auto --rounds 5  # the default

`--sweep-steps`: one engine per workload and run, built once, then each num_scheduler_steps in turn, round
after round (interleaved, so the machine's load falls on every K alike); per K, medians over rounds of the
schedule's wall time per token at its 10th percentile and the CPU per token.

The engine's default path is measured: compile_decode on, its graphs built in the background at start; a run
is measured once that build is done (its seconds count in the warm-up).

Workloads (greedy, ignore EOS, so every run produces exactly the requested tokens):
- batch1:    1 prompt, 128 tokens in -> 128 out, on the shipped reference model
             (evals/reference/models/target, 0.9M parameters: all host, almost no math);
- decode16:  16 prompts, 32 in -> 224 out each (its 256 positions allow no more), reference model;
- mixed:     64 prompts, 16-512 in / 16-256 out, on the throughput benchmark's random 4-layer Llama;
- 135m:      1 prompt, 32 in -> 32 out, on a random Llama of SmolLM2-135M's shape (hidden 576,
             30 layers, 9 / 3 heads, vocab 49152, tied embeddings), built once into the cache.

Each workload runs `--runs` times (fresh engine each, after a warm-up) and the median is
printed: the machine is shared and noisy. The host split comes from the StepRecords the
engine itself emits (wall time; schedule / prepare / forward / sample / postprocess, per step):
"host" is everything but the forward, as a share of the step and in ms per decode step.
CPU ms per token (process time, all threads) and the 10th percentile of the decode steps'
time (and of their host part) are printed too: wall time on a loaded machine swings by
2-5x; the fastest steps show what a step costs when it is not preempted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from engine.core.model_refs import REFERENCE_MODEL as REFERENCE
from telemetry.contract.hooks import EngineObserver

SMOL_SPEC = dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536,
                 vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True)

PARTS = ("schedule", "prepare", "forward", "sample", "postprocess")


def smol_model() -> Path:
    from engine.benchmarks.throughput import DEFAULT_CACHE
    from engine.core.tiny_model import build_random_model

    path = DEFAULT_CACHE / "llama-smol135m-shape"
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        build_random_model(path, "llama", tokenizer_dir=REFERENCE, **SMOL_SPEC)
    return path


def workloads() -> dict:
    from engine.benchmarks.throughput import default_model, make_workload

    ref = str(REFERENCE)
    return {
        "batch1": (ref, make_workload(1, 463, 0, (128, 128), (128, 128))),
        "decode16": (ref, make_workload(16, 463, 0, (32, 32), (224, 224))),
        "mixed": (str(default_model()), make_workload(64, 512, 0, (16, 512), (16, 256))),
        "135m": (str(smol_model()), make_workload(1, 49152, 0, (32, 32), (32, 32))),
    }


class StepCollector(EngineObserver):
    """Keeps the host split of every step (the engine's StepRecord fields)."""

    enabled = True

    def __init__(self):
        self.steps = []

    def on_step(self, record) -> None:
        self.steps.append((record.num_decode_tokens, record.num_prefill_tokens, *(getattr(record, f"{p}_seconds") for p in PARTS)))


def run_once(model: str, workload, threads: int, engine_args: dict, int8_exact: bool = False,
             gather_decode: bool = False) -> dict:
    import torch

    import engine.core.attention.torch_backend as torch_backend
    from engine.core.llm import LLM
    from engine.core.quantization import Int8Linear
    from engine.core.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    torch_backend.PAGED_DECODE = not gather_decode  # before the engine: its runner reads it
    obs = StepCollector()
    llm = LLM(model, obs, **engine_args)
    if int8_exact:  # the cast path, unfused (what int8 ran before the int8 kernel): for A/B runs
        for mod in llm.engine.loaded.model.modules():
            if isinstance(mod, Int8Linear):
                mod.exact = True
        llm.engine.loaded.model.fuse_projections()
    warm = workload.head(2)
    warm_start = time.perf_counter()  # compiled: the decode steps' build ends here
    warm_tokens = 8 + 2 * engine_args.get("num_scheduler_steps", 1)  # multi-step: its K steps compile here too
    warm_params = SamplingParams(temperature=0.0, max_tokens=warm_tokens, ignore_eos=True)
    llm.generate(warm.prompts, [warm_params] * len(warm.prompts), use_tqdm=False)
    # compile_decode builds its graphs in a thread at start: measured once they are built, as a replica serves
    # from then on (the seconds to that point are warm-up)
    llm.engine.runner.wait_compiled()
    warmup_s = time.perf_counter() - warm_start
    llm.engine.kv_cache.reset_prefix_cache()
    obs.steps.clear()
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    start, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(workload.prompts, params, use_tqdm=False)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == workload.output_tokens, (produced, workload.output_tokens)
    # decode-only steps: no prefill token in them
    decode = [s for s in obs.steps if s[1] == 0] or obs.steps
    sums = {p: sum(s[2 + i] for s in decode) for i, p in enumerate(PARTS)}
    total = sum(sums.values())
    host = total - sums["forward"]
    # the 10th percentile of per-step times: what a step costs when nothing else runs (on a
    # loaded machine most steps are stretched by preemption; the fastest ones are not)
    steps_ms = sorted(1e3 * sum(s[2:]) for s in decode)
    host_ms = sorted(1e3 * (sum(s[2:]) - s[2 + PARTS.index("forward")]) for s in decode)
    p10 = len(decode) // 10
    return dict(tokens_per_s=produced / elapsed, warmup_s=warmup_s, step_p10_ms=steps_ms[p10], host_p10_ms=host_ms[p10], cpu_ms_per_token=1e3 * cpu / produced, steps=len(obs.steps), decode_steps=len(decode),
                step_ms=1e3 * total / len(decode), host_ms=1e3 * host / len(decode),
                host_share=host / total if total else 0.0,
                split_ms={p: 1e3 * v / len(decode) for p, v in sums.items()},
                first_tokens=outs[0].token_ids[:8])


def sweep_steps(model: str, workload, threads: int, engine_args: dict, ks: list[int], rounds: int) -> dict:
    """Each K of `ks` as the engine's fixed num_scheduler_steps, interleaved over `rounds`, on one engine whose
    compiled steps (multi-step's included) are built first. Per K and round: the 10th percentile of an engine
    step's wall seconds per token it produced (a schedule of K sub-steps is one step), CPU ms per token."""
    import torch

    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(model, **{**engine_args, "num_scheduler_steps": max(k or 2 for k in ks)})
    engine = llm.engine
    warm = workload.head(2)
    llm.generate(warm.prompts, [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * len(warm.prompts),
                 use_tqdm=False)
    engine.runner.wait_compiled()
    step, schedule, timed, batches = engine.step, engine.scheduler.schedule, [], []

    def scheduled():
        batches.append(schedule())
        return batches[-1]

    def timed_step():  # a decode step's seconds and the tokens it produced (prefill steps: none counted)
        t0 = time.perf_counter()
        outs = step()
        batch = batches.pop()
        timed.append((time.perf_counter() - t0, 0 if batch.num_prefill_tokens else len(batch.seqs) * batch.num_steps))
        return outs

    engine.scheduler.schedule, engine.step = scheduled, timed_step
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    per_k = {k: {"p10_ms_per_token": [], "cpu_ms_per_token": [], "tokens_per_s": []} for k in ks}
    for _ in range(rounds):
        for k in ks:
            engine.scheduler.num_scheduler_steps = k  # None: auto, its measured step times kept between rounds
            engine.kv_cache.reset_prefix_cache()
            timed.clear()
            start, cpu = time.perf_counter(), time.process_time()
            outs = llm.generate(workload.prompts, params, use_tqdm=False)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            produced = sum(len(o.token_ids) for o in outs)
            per_token = sorted(1e3 * s / n for s, n in timed if n)
            per_k[k]["p10_ms_per_token"].append(per_token[len(per_token) // 10])
            per_k[k]["cpu_ms_per_token"].append(1e3 * cpu / produced)
            per_k[k]["tokens_per_s"].append(produced / elapsed)
    return per_k


def _median_run(fn_args, runs: int) -> dict:
    import multiprocessing as mp

    results = []
    for _ in range(runs):
        pool = mp.get_context("spawn").Pool(1)  # fresh process: no state carried between runs
        try:
            results.append(pool.apply(run_once, fn_args))
        finally:
            pool.close()
            pool.join()
    med = {k: statistics.median(r[k] for r in results)
           for k in ("tokens_per_s", "warmup_s", "cpu_ms_per_token", "step_p10_ms", "host_p10_ms", "step_ms", "host_ms", "host_share")}
    med["split_ms"] = {p: statistics.median(r["split_ms"][p] for r in results) for p in PARTS}
    med["runs_tokens_per_s"] = [r["tokens_per_s"] for r in results]
    med["decode_steps"] = results[0]["decode_steps"]
    med["first_tokens"] = results[0]["first_tokens"]
    return med


def _sweep_run(fn_args, runs: int) -> dict:
    """`sweep_steps` in `runs` fresh processes; per K, the median over every run's rounds."""
    import multiprocessing as mp

    merged: dict = {}
    for _ in range(runs):
        pool = mp.get_context("spawn").Pool(1)
        try:
            for k, m in pool.apply(sweep_steps, fn_args).items():
                for key, values in m.items():
                    merged.setdefault(k, {}).setdefault(key, []).extend(values)
        finally:
            pool.close()
            pool.join()
    return {k: {key: statistics.median(v) for key, v in m.items()} for k, m in merged.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated workloads (batch1,decode16,mixed,135m)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="engine option compile_decode (default: the engine's, on; --no-compile: eager)")
    p.add_argument("--steps", type=int, default=1, help="engine option num_scheduler_steps (multi-step decode)")
    p.add_argument("--sweep-steps",
                   help="comma-separated num_scheduler_steps values (N or auto) measured on one engine, interleaved")
    p.add_argument("--rounds", type=int, default=5, help="with --sweep-steps: rounds over the values")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--quant", default="none", help="engine option quantization (none | int8 | int4)")
    p.add_argument("--quant-skip", default="lm_head", help="comma-separated layers left in float ('' for none)")
    p.add_argument("--int8-exact", action="store_true", help="int8 through the exact cast path (A/B)")
    p.add_argument("--pack-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="engine option pack_weights (default: the engine's, on for the CPU; --no-pack-weights: A/B)")
    p.add_argument("--gather-decode", action="store_true",
                   help="with --compile: decode attention as the gather + SDPA, not in place (A/B)")
    args = p.parse_args(argv)
    engine_args = dict(max_num_seqs=128, max_num_batched_tokens=2048, kv_cache_memory_bytes=512 * 2**20)
    if args.compile is not None:
        engine_args["compile_decode"] = args.compile
    if args.steps > 1:
        engine_args["num_scheduler_steps"] = args.steps
    if args.pack_weights is not None:
        engine_args["pack_weights"] = args.pack_weights
    if args.quant != "none":
        engine_args.update(quantization=args.quant, quant_skip_layers=[s for s in args.quant_skip.split(",") if s])
    chosen = args.only.split(",") if args.only else ["batch1", "decode16", "mixed", "135m"]
    results = {}
    print(f"{args.threads} torch threads, {args.runs} runs per workload (medians)", flush=True)
    for name, (model, workload) in workloads().items():
        if name not in chosen:
            continue
        if args.sweep_steps:
            ks = [None if k == "auto" else int(k) for k in args.sweep_steps.split(",")]
            results[name] = r = _sweep_run((model, workload, args.threads, engine_args, ks, args.rounds), args.runs)
            for k, m in r.items():
                print(f"{name:9s} K={k or 'auto':<4} p10 {m['p10_ms_per_token']:.3f} ms/token  "
                      f"cpu {m['cpu_ms_per_token']:.3f} ms/token  {m['tokens_per_s']:8.1f} tok/s", flush=True)
            continue
        r = _median_run((model, workload, args.threads, engine_args, args.int8_exact, args.gather_decode), args.runs)
        results[name] = r
        split = " ".join(f"{k} {v:.3f}" for k, v in r["split_ms"].items())
        print(f"{name:9s} {r['tokens_per_s']:9.1f} tok/s  cpu {r['cpu_ms_per_token']:.3f} ms/tok  p10 step {r['step_p10_ms']:.3f} ms host {r['host_p10_ms']:.3f} ms  mean step {r['step_ms']:.3f} ms, host {r['host_ms']:.3f} ms "
              f"({100 * r['host_share']:.0f}%)  [ms/step: {split}]  warm-up {r['warmup_s']:.1f} s  "
              f"runs {[round(x) for x in r['runs_tokens_per_s']]}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
