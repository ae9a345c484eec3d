"""Our paged forward vs transformers' forward on the same work, side by side in one run.

    python -m engine.benchmarks.model_forward [--model DIR] [--batch 32] [--threads N]

Prefill: `--batch` prompts of mixed lengths, ours flattened into steps of at most
2048 tokens, transformers' as one left-padded batch. Decode: one token for each
of those sequences, several steps, ours through the paged cache, transformers'
with its own KV cache. Prints tokens/s of both and the ratio (ours / theirs).
Without `--model` a small random Llama is built in a temp directory.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model directory (default: a random Llama)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from engine.core.attention import get_backend
    from engine.core.attention.simple_batch import SimplePagedBatcher
    from engine.core.models import allocate_kv_cache, load_model
    from engine.core.tiny_model import build_random_model

    path = args.model or build_random_model(tempfile.mkdtemp(prefix="bench_fwd_"), "llama", hidden_size=256,
                                            num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=768)
    loaded = load_model(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(args.min_len, args.max_len + 1, (args.batch,), generator=gen).tolist()
    prompts = [torch.randint(0, loaded.vocab_size, (n,), generator=gen).tolist() for n in lens]
    decode_tokens = torch.randint(0, loaded.vocab_size, (args.decode_steps, args.batch), generator=gen)
    print(f"model {path} threads {torch.get_num_threads()} batch {args.batch} "
          f"prompt tokens {sum(lens)} (lengths {min(lens)}..{max(lens)})")

    # ours
    block_size = 16
    blocks = sum((n + args.decode_steps + block_size - 1) // block_size for n in lens) + 1
    kv = allocate_kv_cache(loaded, blocks, block_size)
    backend, batcher = get_backend("torch"), SimplePagedBatcher(blocks, block_size)
    with torch.inference_mode():
        t0 = time.perf_counter()
        pending = list(enumerate(prompts))
        while pending:
            step, total = [], 0
            while pending and (not step or total + len(pending[0][1]) <= 2048):
                total += len(pending[0][1])
                step.append(pending.pop(0))
            ids, pos, md = batcher.step(step)
            hidden = loaded.model(ids, pos, md, kv, backend)
            loaded.model.compute_logits(hidden[-1:])
        ours_prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        for row in decode_tokens.tolist():
            ids, pos, md = batcher.step([(i, [t]) for i, t in enumerate(row)])
            loaded.model.compute_logits(loaded.model(ids, pos, md, kv, backend))
        ours_decode = time.perf_counter() - t0

    # transformers: one left-padded batch
    width = max(lens)
    input_ids = torch.zeros(args.batch, width, dtype=torch.long)
    mask = torch.zeros(args.batch, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = ref(input_ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        ref_prefill = time.perf_counter() - t0
        cache = out.past_key_values
        t0 = time.perf_counter()
        for row in decode_tokens:
            mask = torch.cat([mask, torch.ones(args.batch, 1, dtype=torch.long)], dim=1)
            out = ref(row[:, None], attention_mask=mask, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
        ref_decode = time.perf_counter() - t0

    n_prefill, n_decode = sum(lens), args.batch * args.decode_steps
    for phase, ours, theirs, n in (("prefill", ours_prefill, ref_prefill, n_prefill),
                                   ("decode", ours_decode, ref_decode, n_decode)):
        print(f"{phase:8} ours {n / ours:9.0f} tok/s   transformers {n / theirs:9.0f} tok/s   "
              f"ratio {theirs / ours:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
