"""Decode attention over the paged pool in place (attention/paged_decode.py, compiled) against the KV block size.

    .venv/bin/python -m engine.benchmarks.paged_decode_blocks [--batch 48] [--threads 2]

One layer of the 135M model's shape (9 query / 3 kv heads of 64), a batch of decodes with contexts drawn from
100-768 tokens, blocks scattered through the pool; per block size: ms a call, the KV bytes read per second, and
the largest difference from SDPA over the gathered keys of one sequence. What
`torch_backend.PAGED_BLOCK_SIZE` (the block size compile_decode takes on a CPU) was chosen from.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F

from engine.core.attention import paged_decode

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def measure(batch: int, block_size: int, calls: int = 30, seed: int = 0) -> tuple[float, float, float]:
    """(ms a call, GB/s of keys and values read, max |difference| from SDPA) for one block size."""
    rng = random.Random(seed)
    lens = [rng.randint(100, 768) for _ in range(batch)]
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 8
    order = list(range(num_blocks))
    rng.shuffle(order)
    tables, start = [], 0
    for n in need:
        tables.append(order[start:start + n])
        start += n
    k = torch.randn(num_blocks * block_size, KV_HEADS, HEAD_DIM)
    v = torch.randn(num_blocks * block_size, KV_HEADS, HEAD_DIM)
    blocks = paged_decode.BlockLists(num_blocks, torch.device("cpu")).decode_blocks(tables, lens, block_size)
    q = torch.randn(batch, HEADS, HEAD_DIM)
    attend = torch.compile(lambda q, k, v: paged_decode.attend(q, k, v, blocks, HEAD_DIM ** -0.5), fullgraph=True)
    out = attend(q, k, v)  # compiles
    start_t = time.perf_counter()
    for _ in range(calls):
        attend(q, k, v)
    ms = (time.perf_counter() - start_t) / calls * 1e3
    slots = torch.cat([torch.arange(b * block_size, (b + 1) * block_size) for b in tables[0]])[:lens[0]]
    ref = F.scaled_dot_product_attention(q[0].view(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM),
                                         k[slots].transpose(0, 1), v[slots].transpose(0, 1))
    err = (out[0].view_as(ref) - ref).abs().max().item()
    gb = sum(lens) * KV_HEADS * HEAD_DIM * k.element_size() * 2 / 1e9
    return ms, gb / ms * 1e3, err


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block-sizes", default="16,32,64,128")
    args = parser.parse_args(argv)
    reason = paged_decode.unavailable_reason(torch.device("cpu"))
    if reason:
        print(f"paged decode attention does not run here: {reason}")
        return 1
    torch.set_num_threads(args.threads)
    base = None
    for bs in map(int, args.block_sizes.split(",")):
        ms, gbs, err = measure(args.batch, bs)
        base = base or ms
        print(f"batch {args.batch} block {bs:3d}: {ms:6.3f} ms a layer ({base / ms:.2f}x block "
              f"{args.block_sizes.split(',')[0]}), {gbs:5.1f} GB/s of KV, max diff from SDPA {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
