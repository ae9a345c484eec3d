"""Check the CUDA paths against the torch reference; run on a GPU machine.

    python -m engine.benchmarks.gpu_check            # flashinfer vs torch, model on CUDA vs CPU
    python -m engine.benchmarks.gpu_check --device cpu   # dry run of the same code on the CPU

1. Attention: random q/k/v through a paged cache (pure decode, fresh prefill,
   chunked prefill mixed with decodes), the flashinfer backend vs the torch
   backend on the same device; prints the max abs difference per case.
2. Model: a small random Llama run through prefill + decode on the CPU (float32,
   the reference) and on `--device` (float32 with the torch backend, bfloat16
   with the "auto" backend); prints the max abs logit difference and top-1
   agreement.
3. CUDA graphs (EngineConfig.cuda_graphs, engine/core/cuda_graph.py): the same requests through an engine
   with and without graphs (float32 on the torch backend, bfloat16 on "auto"); prints how many graphs
   were captured, how many requests got the same tokens (and the share of tokens before a first
   difference), and each side's output tokens/s in a second round (the first captures). On the CPU
   the graphs' buffers and padding run eagerly (nothing to capture).
Exits 1 when a difference passes its tolerance.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from engine.core.attention import get_backend
from engine.core.attention.simple_batch import SimplePagedBatcher

# (name, steps): each step a list of (sequence, new tokens)
ATTENTION_CASES = [
    ("fresh_prefill", [[("a", 37)]]),
    ("batched_prefill", [[("a", 5), ("b", 1), ("c", 70), ("d", 16)]]),
    ("decode", [[("a", 40), ("b", 3), ("c", 17)], [("a", 1), ("b", 1), ("c", 1)]]),
    ("chunked_mixed", [[("a", 20), ("b", 9)], [("a", 1), ("b", 33), ("c", 4)], [("a", 1), ("b", 1), ("c", 12)]]),
]


def attention_diff(device: str, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int,
                   steps, backend_name: str = "flashinfer", block_size: int = 16, seed: int = 0) -> float:
    """Max abs difference between `backend_name` and the torch backend over all steps' outputs."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 64
    candidate, reference = get_backend(backend_name, device), get_backend("torch", device)
    caches = [tuple(torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
                    for _ in range(2)) for _ in range(2)]
    batcher = SimplePagedBatcher(num_blocks, block_size, seed=seed)
    worst = 0.0
    for chunks in steps:
        _, _, md_a = batcher.step([(s, [0] * n) for s, n in chunks], device=device)
        t = md_a.num_tokens
        q, k, v = (torch.randn(t, h, head_dim, generator=gen).to(device, dtype) for h in (heads, kv_heads, kv_heads))
        md_b = type(md_a)(md_a.query_lens, md_a.context_lens, md_a.block_tables, md_a.slot_mapping, block_size)
        out_a = candidate.forward(q, k, v, *caches[0], md_a, head_dim ** -0.5)
        out_b = reference.forward(q, k, v, *caches[1], md_b, head_dim ** -0.5)
        worst = max(worst, (out_a.float() - out_b.float()).abs().max().item())
    return worst


def model_diff(device: str, dtype: str, backend_name: str, steps: int = 4) -> tuple[float, float]:
    """(max abs logit difference, top-1 agreement) of a small random Llama on `device` vs the CPU."""
    from engine.core.models import allocate_kv_cache, load_model
    from engine.core.tiny_model import build_random_model

    path = build_random_model(tempfile.mkdtemp(prefix="gpu_check_"), "llama", hidden_size=256, num_heads=4,
                              num_kv_heads=2, intermediate_size=512, num_layers=2)

    def run(dev, dt, name):
        loaded = load_model(path, dtype=dt, device=dev)
        backend = get_backend(name, dev)
        kv = allocate_kv_cache(loaded, 64, 16)
        batcher = SimplePagedBatcher(64, 16, seed=1)
        gen = torch.Generator().manual_seed(2)
        prompts = [torch.randint(0, loaded.vocab_size, (n,), generator=gen).tolist() for n in (7, 30, 65)]
        chunks, outs = list(enumerate(prompts)), []
        with torch.inference_mode():
            for _ in range(steps):
                ids, pos, md = batcher.step(chunks, device=dev)
                logits = loaded.model.compute_logits(loaded.model(ids, pos, md, kv, backend)).cpu()
                outs.append(logits)
                # feed fixed tokens (not each run's own argmax) so both runs see the same inputs
                chunks = [(i, [int(torch.randint(0, loaded.vocab_size, (1,), generator=gen))])
                          for i in range(len(prompts))]
        return torch.cat(outs)

    ref = run("cpu", "float32", "torch")
    got = run(device, dtype, backend_name)
    return (got - ref).abs().max().item(), (got.argmax(-1) == ref.argmax(-1)).float().mean().item()


def eager_graphs_engine(path, num_kv_blocks: int, **engine_kw):
    """An engine whose pure decode steps go through engine/core/cuda_graph.py with the capture left out (a CPU has
    nothing to capture): what `cuda_graphs` sets up on CUDA, a pad block past the block manager's included."""
    from engine.core.engine import LLMEngine
    from engine.core.models import allocate_kv_cache

    engine = LLMEngine(path, num_kv_blocks=num_kv_blocks, **engine_kw)
    runner = engine.runner
    runner.kv_caches[:] = allocate_kv_cache(engine.loaded, num_kv_blocks + 1, runner.block_size)
    runner.use_cuda_graphs(engine.config.max_num_seqs, engine.max_model_len, pad_block=num_kv_blocks, capture=False)
    return engine


def graphs_check(device: str, dtype: str, backend_name: str) -> dict:
    """Greedy requests of a small random Llama through an engine without CUDA graphs and one with them, twice
    each on the same engine (the first round captures the graphs; the second, timed, replays them). `match`:
    the mean share of each request's tokens before its first difference (a wrong graph differs from the
    first tokens; near-ties in the logits of a random model, late)."""
    import time

    from engine.core.engine import LLMEngine
    from engine.core.sampling_params import SamplingParams
    from engine.core.tiny_model import build_random_model

    path = build_random_model(tempfile.mkdtemp(prefix="gpu_check_graphs_"), "llama", hidden_size=256, num_heads=4,
                              num_kv_heads=2, intermediate_size=512, num_layers=2)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (3, 40, 17, 90, 8, 25, 61)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (70, 12, 45, 33, 64, 5, 50)]
    kw = dict(device=device, dtype=dtype, attention_backend=backend_name)

    def run(graphs: bool):
        if graphs and not device.startswith("cuda"):  # the dry run: buffers and padding, eagerly
            engine = eager_graphs_engine(path, 256, **kw)
        else:
            engine = LLMEngine(path, num_kv_blocks=256, cuda_graphs=graphs, **kw)
        for round_ in range(2):
            engine.kv_cache.reset_prefix_cache()
            for i, (p, sp) in enumerate(zip(prompts, params)):
                engine.add_request(f"{round_}-{i}", p, sp, stream=False)
            done, t0 = {}, time.perf_counter()
            while engine.has_unfinished():
                done.update((o.request_id[2:], o.token_ids) for o in engine.step() if o.finished)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            tokens_per_s = sum(map(len, done.values())) / (time.perf_counter() - t0)
        graphs_made = len(engine.runner.graphs.shapes) if engine.runner.graphs else 0
        return done, graphs_made, tokens_per_s

    def matched(a: list[int], b: list[int]) -> float:
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n / max(len(a), 1)

    plain, _, plain_tps = run(False)
    graphed, made, graphed_tps = run(True)
    return dict(graphs=made, same=sum(graphed[r] == plain[r] for r in plain), requests=len(plain),
                match=sum(matched(graphed[r], plain[r]) for r in plain) / len(plain),
                plain_tps=plain_tps, graphed_tps=graphed_tps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = args.device
    on_cuda = device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (use --device cpu for a dry run)")
        return 2
    failures = []
    print(f"torch {torch.__version__} device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if on_cuda else ""))

    attention_backend = "flashinfer" if on_cuda else "torch"
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        if on_cuda:
            print("flashinfer is not installed: attention check skipped (pip install 'infersight[gpu]')")
            attention_backend = None
    if attention_backend:
        for dtype in (torch.bfloat16, torch.float16):
            for head_dim, heads, kv_heads in ((128, 8, 2), (64, 4, 4)):
                for name, steps in ATTENTION_CASES:
                    diff = attention_diff(device, dtype, head_dim, heads, kv_heads, steps, attention_backend)
                    ok = diff < 2e-2
                    failures += [] if ok else [f"attention {name}"]
                    print(f"attention {attention_backend} vs torch {str(dtype)[6:]:8} d={head_dim:3} "
                          f"h={heads}/{kv_heads} {name:16} max_abs_diff={diff:.2e} {'ok' if ok else 'FAIL'}")

    for dtype, backend_name, tol, min_agree in (("float32", "torch", 1e-3, 0.99), ("bfloat16", "auto", 0.5, 0.9)):
        if dtype == "bfloat16" and not on_cuda:
            backend_name = "torch"
        diff, agree = model_diff(device, dtype, backend_name)
        ok = diff < tol and agree >= min_agree
        failures += [] if ok else [f"model {dtype}"]
        print(f"model {device} {dtype:8} {backend_name:10} vs cpu float32: max_abs_logit_diff={diff:.2e} "
              f"top1_agreement={agree:.3f} {'ok' if ok else 'FAIL'}")
    for dtype, backend_name, min_match in (("float32", "torch", 0.95), ("bfloat16", "auto", 0.8)):
        if dtype == "bfloat16" and not on_cuda:
            continue
        r = graphs_check(device, dtype, backend_name)
        ok = r["graphs"] > 0 and r["match"] >= min_match
        failures += [] if ok else [f"cuda graphs {dtype}"]
        print(f"cuda graphs {device} {dtype:8} {backend_name:6}: {r['graphs']} graphs, {r['same']}/{r['requests']} "
              f"requests the same tokens, {r['match']:.3f} matched before a difference, {r['plain_tps']:.0f} -> {r['graphed_tps']:.0f} tok/s "
              f"{'ok' if ok else 'FAIL'}")
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
