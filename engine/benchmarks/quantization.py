"""Weight-only quantization benchmark: fidelity, weight bytes and throughput, in one run.

    infersight bench quantization                    # a random 4-layer Llama (or --model DIR)
    python -m engine.benchmarks.quantization --model evals/reference/models/target

For float32 (the baseline), int8 per channel, int4 group-wise (symmetric and
asymmetric) on the same model and prompts:
- linear-layer weight bytes before / after, and the whole model's;
- logit fidelity against float32 on teacher-forced prompts: mean and max KL
  divergence, top-1 agreement, and the relative L2 error of the logits;
- greedy agreement: share of output tokens equal to float32's up to the first
  divergence (a single flip changes everything after it);
- output tokens/s of offline greedy generation (median of interleaved runs).

On the CPU the forward dequantizes weights on the fly (int8: an int8 -> float
cast per matmul, int4: unpack + scale per group), so quantized models are
expected to be slower here: the point on the CPU is fidelity and memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

SCHEMES = [("none", {}), ("int8", dict(quantization="int8")),
           ("int4-g128", dict(quantization="int4", quant_group_size=128)),
           ("int4-g32", dict(quantization="int4", quant_group_size=32))]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", help="model directory (default: a random 4-layer Llama)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the results here")


def teacher_forced_logits(loaded, prompts) -> torch.Tensor:
    """Logits at every position of every prompt through the engine's own forward."""
    from engine.core.attention import AttentionMetadata, get_backend
    from engine.core.models import allocate_kv_cache

    backend, block_size, out = get_backend("torch"), 16, []
    for p in prompts:
        t = len(p)
        nb = -(-t // block_size)
        kv = allocate_kv_cache(loaded, nb, block_size)
        meta = AttentionMetadata([t], [t], [list(range(nb))], torch.arange(t), block_size)
        with torch.inference_mode():
            out.append(loaded.model.compute_logits(
                loaded.model(torch.tensor(p), torch.arange(t), meta, kv, backend)))
    return torch.cat(out)


def fidelity(model_dir, prompts, ref_logits, spec: dict) -> dict:
    from engine.core.models import load_model
    from engine.core.quantization import quantize_model

    loaded = load_model(model_dir)
    if not spec:
        return {}
    report = quantize_model(loaded.model, spec["quantization"], spec.get("quant_group_size", 128))
    logits = teacher_forced_logits(loaded, prompts)
    kl = torch.nn.functional.kl_div(logits.log_softmax(-1), ref_logits.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    return {"linear_bytes_before": report.linear_bytes_before, "linear_bytes_after": report.linear_bytes_after,
            "model_bytes_before": report.model_bytes_before, "model_bytes_after": report.model_bytes_after,
            "max_weight_error": report.max_abs_error, "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
            "top1_agreement": (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item(),
            "logit_rel_error": ((logits - ref_logits).norm(dim=-1) / ref_logits.norm(dim=-1)).mean().item()}


def greedy_agreement(outputs, reference) -> float:
    same = total = 0
    for a, b in zip(outputs, reference):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += n
        total += len(b)
    return same / total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="quant_bench_") as root:
        return _run(args, Path(root))


def _run(args, root: Path) -> int:
    import random

    from engine.core.llm import LLM
    from engine.core.models import load_model
    from engine.core.sampling_params import SamplingParams

    model = args.model
    if model is None:
        from engine.core.tiny_model import build_random_model

        model = str(build_random_model(root / "model", "llama", hidden_size=256, num_layers=4, num_heads=8,
                                       num_kv_heads=4, intermediate_size=768))
    base = load_model(model)
    rng = random.Random(0)
    prompts = [[rng.randrange(6, base.vocab_size) for _ in range(args.prompt_len)] for _ in range(args.num_prompts)]
    ref_logits = teacher_forced_logits(base, prompts)
    del base
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"model {model}; {len(prompts)} prompts x {args.prompt_len} tokens, {args.max_tokens} output tokens, "
          f"greedy; torch threads {torch.get_num_threads()}; median of {args.repeats} interleaved runs")

    results = {name: fidelity(model, prompts, ref_logits, spec) for name, spec in SCHEMES}
    engines = {}
    for name, spec in SCHEMES:
        engines[name] = LLM(model, max_num_seqs=args.max_num_seqs, **spec)
        engines[name].generate(prompts[:2], params, use_tqdm=False)  # warm up
        results[name]["replica_quantization"] = engines[name].engine.replica_record.quantization
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    outputs = {}
    for _ in range(args.repeats):
        for name, llm in engines.items():
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            seconds[name].append(time.perf_counter() - t)
            outputs[name] = [o.token_ids for o in outs]
    tokens = len(prompts) * args.max_tokens
    for name in engines:
        r = results[name]
        r["seconds"] = sorted(seconds[name])[len(seconds[name]) // 2]
        r["tokens_per_s"] = tokens / r["seconds"]
        r["throughput_ratio"] = r["tokens_per_s"] / results["none"].get("tokens_per_s", r["tokens_per_s"])
        r["greedy_agreement"] = greedy_agreement(outputs[name], outputs["none"])

    print(f"{'scheme':<11}{'linear MiB':>16}{'model MiB':>16}{'KL mean':>10}{'KL max':>9}{'top-1':>7}"
          f"{'rel err':>9}{'greedy':>8}{'tok/s':>8}{'vs fp32':>9}")
    for name, r in results.items():
        if "kl_mean" in r:
            mib = (f"{r['linear_bytes_before'] / 2**20:>7.2f}->{r['linear_bytes_after'] / 2**20:<7.2f}"
                   f"{r['model_bytes_before'] / 2**20:>7.2f}->{r['model_bytes_after'] / 2**20:<7.2f}")
            fid = (f"{r['kl_mean']:>10.4f}{r['kl_max']:>9.4f}{r['top1_agreement']:>7.3f}"
                   f"{r['logit_rel_error']:>9.3f}")
        else:
            mib, fid = f"{'-':>16}{'-':>16}", f"{'-':>10}{'-':>9}{'-':>7}{'-':>9}"
        print(f"{r['replica_quantization']:<11}{mib}{fid}{r['greedy_agreement']:>8.3f}{r['tokens_per_s']:>8.1f}"
              f"{r['throughput_ratio']:>8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
