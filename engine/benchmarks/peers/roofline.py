"""This machine's roofline, measured in the same run as the benchmark (the machine is shared: it moves).

    memory bandwidth  sum of a 512 MiB fp32 tensor (bytes read / s) and a copy of it (read + write)
    matmul rate       fp32 GEMM, 1024 x 1024 x 1024, 2*n^3 flops / s

Both at the benchmark's thread count, the median of 5 timed runs after one warm-up. From them: the
batch-1 decode ceiling of a model (each token reads every weight once: bandwidth / weight bytes) and
the prefill ceiling (2 * parameters flops per token: GEMM rate / that).
"""

from __future__ import annotations

import json
import statistics
import time


def _median_seconds(fn, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(threads: int, mib: int = 512, n: int = 1024) -> dict:
    import torch

    torch.set_num_threads(threads)
    a = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    b = torch.empty_like(a)
    nbytes = a.numel() * 4
    sum_s = _median_seconds(lambda: a.sum())
    copy_s = _median_seconds(lambda: b.copy_(a))
    x, y = torch.randn(n, n), torch.randn(n, n)
    gemm_s = _median_seconds(lambda: x @ y)
    return dict(threads=threads, read_gb_s=nbytes / sum_s / 1e9, copy_gb_s=2 * nbytes / copy_s / 1e9,
                gemm_gflop_s=2 * n**3 / gemm_s / 1e9)


def ceilings(roof: dict, weight_bytes: int, params: int) -> dict:
    """Upper bounds in tokens/s: batch-1 decode (bandwidth-bound) and prefill (compute-bound)."""
    return dict(decode_b1_tok_s=roof["read_gb_s"] * 1e9 / weight_bytes,
                prefill_tok_s=roof["gemm_gflop_s"] * 1e9 / (2 * params))


def measure_in_subprocess(threads: int) -> dict:
    """The same, in a child: its 1 GiB of tensors must not raise this process's peak RSS, which every
    side's child would inherit (Linux keeps ru_maxrss across fork and exec)."""
    import subprocess
    import sys

    code = f"import json; from engine.benchmarks.peers.roofline import measure; print(json.dumps(measure({threads})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
