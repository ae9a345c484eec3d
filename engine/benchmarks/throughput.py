"""Offline throughput: the engine vs transformers' `generate`, same model, same prompts, one run.

    infersight bench throughput                       # 256 prompts, a random 4-layer Llama
    infersight bench throughput --num-prompts 64 --model path/to/model

The workload (vLLM's benchmark_throughput in spirit): prompts of random token
ids with lengths uniform in [16, 512], output lengths uniform in [16, 256],
greedy, ignore EOS - so both sides produce exactly the requested tokens.

transformers gets the way vLLM's benchmark drives it: requests in order, cut
into batches of up to B prompts (and at most 2048 padded tokens), each batch
left-padded and generated to its longest requested output; only the
requested tokens count. B is swept (`--hf-batch-sizes`) on the first prompts
and the full workload runs at the best B.

Each side runs in a fresh process, so that its peak RSS (getrusage) is its own,
and after a short warm-up. Throughput is output tokens per second.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "infersight" / "bench-models"
# tiny but not trivial: real matmuls, real attention lengths, still CPU friendly
DEFAULT_MODEL_SPEC = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768,
                          vocab_size=512, max_position_embeddings=2048)


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def head(self, n: int) -> "Workload":
        return Workload(self.prompts[:n], self.output_lens[:n])


def make_workload(num_prompts: int, vocab_size: int, seed: int = 0, prompt_lens=(16, 512),
                  output_lens=(16, 256), first_token_id: int = 6) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(first_token_id, vocab_size) for _ in range(rng.randint(*prompt_lens))]
               for _ in range(num_prompts)]
    return Workload(prompts, [rng.randint(*output_lens) for _ in range(num_prompts)])


def default_model(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The benchmark's random Llama, built once into the cache directory."""
    from engine.core.tiny_model import build_random_model

    name = "llama-h{hidden_size}-l{num_layers}-v{vocab_size}".format(**DEFAULT_MODEL_SPEC)
    path = cache_dir / name
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        build_random_model(path, "llama", **DEFAULT_MODEL_SPEC)
    return path


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


# --- the two sides (each runs in its own process) ---------------------------------------

def run_engine(model: str, workload: Workload, threads: int, engine_args: dict) -> dict:
    import torch

    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(model, **engine_args)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    warm = workload.head(4)
    llm.generate(warm.prompts, [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4, use_tqdm=False)
    llm.engine.kv_cache.reset_prefix_cache()  # random prompts share nothing, but be fair anyway
    start = time.perf_counter()
    outs = llm.generate(workload.prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == workload.output_tokens, (produced, workload.output_tokens)
    return dict(seconds=elapsed, output_tokens=produced, peak_rss_mib=peak_rss_mib(),
                preemptions=llm.engine.scheduler.total_preemptions,
                kv_cache_mib=llm.engine.kv_cache.num_blocks * _kv_block_bytes(llm) / 2**20,
                first_tokens=[o.token_ids[:8] for o in outs[:8]])


def _kv_block_bytes(llm) -> int:
    from engine.core.models import kv_bytes_per_block

    return kv_bytes_per_block(llm.engine.loaded, llm.engine.kv_cache.block_size)


def hf_batches(workload: Workload, batch_size: int, max_padded_tokens: int = 2048) -> list[list[int]]:
    """Request indices per transformers batch (in order, vLLM's rule)."""
    batches, current, max_p, max_o = [], [], 0, 0
    n = len(workload.prompts)
    for i in range(n):
        current.append(i)
        max_p = max(max_p, len(workload.prompts[i]))
        max_o = max(max_o, workload.output_lens[i])
        if len(current) < batch_size and i != n - 1:
            nxt_p, nxt_o = len(workload.prompts[i + 1]), workload.output_lens[i + 1]
            if max(max_p, nxt_p) + max(max_o, nxt_o) <= max_padded_tokens:
                continue
        batches.append(current)
        current, max_p, max_o = [], 0, 0
    return batches


def _hf_generate(model, workload: Workload, batch: list[int], pad_id: int) -> list[list[int]]:
    import torch

    prompts = [workload.prompts[i] for i in batch]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    max_new = max(workload.output_lens[i] for i in batch)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new,
                             do_sample=False, pad_token_id=pad_id, eos_token_id=None)
    return [row[width:width + workload.output_lens[i]] for row, i in zip(out.tolist(), batch)]


def run_hf(model_dir: str, workload: Workload, threads: int, batch_sizes: list[int], sweep_prompts: int,
           dtype: str) -> dict:
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None  # ignore EOS: exactly the requested tokens
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    _hf_generate(model, make_workload(2, 50, seed=1, prompt_lens=(4, 8), output_lens=(4, 4)), [0, 1], pad_id)

    sweep = {}
    head = workload.head(sweep_prompts)
    for b in batch_sizes:
        start = time.perf_counter()
        for batch in hf_batches(head, b):
            _hf_generate(model, head, batch, pad_id)
        sweep[b] = head.output_tokens / (time.perf_counter() - start)
    best = max(sweep, key=sweep.get)

    start = time.perf_counter()
    first = []
    for batch in hf_batches(workload, best):
        rows = _hf_generate(model, workload, batch, pad_id)
        if len(first) < 8:
            first.extend(r[:8] for r in rows)
    elapsed = time.perf_counter() - start
    return dict(seconds=elapsed, output_tokens=workload.output_tokens, peak_rss_mib=peak_rss_mib(),
                batch_size=best, sweep_tokens_per_s={str(k): v for k, v in sweep.items()},
                first_tokens=first[:8])


def _in_fresh_process(fn, *args):
    pool = mp.get_context("spawn").Pool(1)
    try:
        return pool.apply(fn, args)
    finally:
        pool.close()  # close + join (not terminate) lets the pool release its semaphores
        pool.join()


# --- the command ---------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--model", help="model directory (default: a random 4-layer Llama, built once)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--min-prompt-len", type=int, default=16)
    parser.add_argument("--max-prompt-len", type=int, default=512)
    parser.add_argument("--min-output-len", type=int, default=16)
    parser.add_argument("--max-output-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both sides (1: steadiest on a shared machine)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--hf-batch-sizes", default="8,16,32,64", help="transformers batch sizes to sweep")
    parser.add_argument("--sweep-prompts", type=int, default=64, help="prompts used for the batch-size sweep")
    parser.add_argument("--skip-hf", action="store_true", help="measure the engine only")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default: the engine's choice)")
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    parser.add_argument("--json", help="also write the results to this file")


def run(args) -> int:
    model = str(args.model or default_model())
    import json as _json

    vocab = _json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.num_prompts, vocab, args.seed, (args.min_prompt_len, args.max_prompt_len),
                             (args.min_output_len, args.max_output_len))
    engine_args = dict(dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
                       kv_cache_memory_bytes=args.kv_cache_mib * 2**20)
    print(f"model {model}\nworkload: {args.num_prompts} prompts, {workload.prompt_tokens} prompt tokens, "
          f"{workload.output_tokens} output tokens; greedy, ignore EOS; {args.threads} torch thread(s)",
          flush=True)

    eng = _in_fresh_process(run_engine, model, workload, args.threads, engine_args)
    eng_tps = eng["output_tokens"] / eng["seconds"]
    print(f"engine:       {eng_tps:9.1f} output tok/s  ({eng['seconds']:.1f} s, peak RSS {eng['peak_rss_mib']:.0f} MiB, "
          f"KV pool {eng['kv_cache_mib']:.0f} MiB, {eng['preemptions']} preemptions)", flush=True)
    result = dict(model=model, num_prompts=args.num_prompts, prompt_tokens=workload.prompt_tokens,
                  output_tokens=workload.output_tokens, threads=args.threads, engine=eng,
                  engine_tokens_per_s=eng_tps)
    if not args.skip_hf:
        sizes = [int(x) for x in args.hf_batch_sizes.split(",") if x]
        hf = _in_fresh_process(run_hf, model, workload, args.threads, sizes,
                               min(args.sweep_prompts, args.num_prompts), args.dtype)
        hf_tps = hf["output_tokens"] / hf["seconds"]
        sweep = ", ".join(f"B={k}: {v:.0f}" for k, v in hf["sweep_tokens_per_s"].items())
        print(f"transformers: {hf_tps:9.1f} output tok/s  ({hf['seconds']:.1f} s, peak RSS {hf['peak_rss_mib']:.0f} MiB, "
              f"batch size {hf['batch_size']}; sweep on {min(args.sweep_prompts, args.num_prompts)} prompts: {sweep})")
        agree = sum(a == b for a, b in zip(eng["first_tokens"], hf["first_tokens"]))
        print(f"ratio engine / transformers: {eng_tps / hf_tps:.2f}x   "
              f"(greedy prefixes agree on {agree}/{len(hf['first_tokens'])} of the first requests)")
        result.update(transformers=hf, transformers_tokens_per_s=hf_tps, ratio=eng_tps / hf_tps)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(run(p.parse_args()))
