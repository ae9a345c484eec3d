"""A single row times a float32 weight (decode at batch 1): inductor's own reduction where the BLAS's
matrix-vector product does not stream the weight, else the BLAS call.

At one row a projection is a matrix-vector product: memory-bound, it should stream the
weight at the machine's bandwidth. On an AMD EPYC, MKL's sgemv (what F.linear and torch.mv
call) runs on one thread whatever torch's thread count: 11 GB/s, against ~31 GB/s that a
2-thread sum reaches. `(w * x).sum(-1)` compiled by inductor is one vectorized loop over the
weight's rows, split across threads: 20 GB/s. Measured there on the 135M model's 121
projections a step (424 MB + the tied 113 MB lm_head, weights cycled so none stays in
cache): 48.9 ms -> 26.4 ms a step. On an Intel Xeon with AVX-512, sgemv streams as fast as
the sum, and the reduction is the slower one: the 135M model at batch 1 compiled read 24.9
tok/s against 30.6 eager (bench peers, 2 rounds each). So the choice is measured, once per
process, before the first compile (`choose_compiled_rows`): sgemv against a plain
multi-threaded read of the model's own large weights (the working set a batch-1 step streams);
past `SLOW_GEMV` times the read, the reduction. A weight that stays in cache
(`CACHED_WEIGHT_NUMEL`) takes the reduction either way, so a model with none is not measured.

Where it is measured matters. The runner measures in the thread that builds it, before the
background build starts and before any step (model_runner.py), not in the build thread beside the
engine's eager steps: a second thread's torch reads run slower on a small machine (a second
OpenMP team: on the 2-core EPYC, w.sum() over the 135M model's 488 MiB took 19-21 ms in the first
thread, 28-32 ms in another), so a build-thread measurement read sgemv as 0.97-1.18x the read
where it is 1.9-2.1x, and took the BLAS call (13.8 GB/s) over the reduction (20.3 GB/s). The
choice is baked into the batch-1 graphs and so into their compile-cache keys: a choice that
flips between starts also compiles them again.
Only inside a compiled graph (eager, the same expression would materialize the [N, K] product:
222 ms) and only for one float32 row on the CPU; anything else is F.linear.
Results differ from sgemv's in the last bits (summation order: 3.8e-5 on logits of magnitude 100).

Eager, one row times a large weight (the lm_head: vocab x hidden) goes through oneDNN's
matmul instead, which does use the threads: the 135M model's 113 MB lm_head 10.7 -> 6.0 ms.
It costs ~18 us a call more than sgemv, so the weights of a layer (0.04-0.14 ms each) stay
with F.linear (960 x 576: 44.7 -> 40.1 us, not worth it).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# eager one-row calls on weights at least this large take oneDNN (see above): the lm_head, not a layer
ONEDNN_MIN_NUMEL = 1 << 22
# the BLAS's one-row product this many times slower than a plain read of the weights: it does not stream
# them (one thread: 2.8x on the EPYC above; 1.0x on the Xeon), and a compiled graph takes the reduction
SLOW_GEMV = 1.5
# a weight smaller than this (1 MiB of float32) stays in cache: its one-row product is the cost of a call,
# not of a stream, and inside a graph the reduction fuses with its neighbours where the BLAS call is one
# more extern kernel: the reference model (weights of 64-196 KB) at batch 1, compiled, K = 8, on the Xeon
# above, 2020 -> 2170 and 2231 -> 2354 tok/s (ABAB, the BLAS call for every one-row projection -> this)
CACHED_WEIGHT_NUMEL = 1 << 18
# inside a compiled graph, one float32 row: the reduction (True) or F.linear. Set by `choose_compiled_rows`
# before the first compile; a graph bakes in what it was traced with
rows_as_reduction = True
_chosen = False


def large_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's float32 CPU matrices that a one-row projection streams from memory (`CACHED_WEIGHT_NUMEL`
    and up): the weights the choice is about."""
    return [p for p in model.parameters() if p.dim() == 2 and p.dtype == torch.float32 and p.device.type == "cpu"
            and p.numel() >= CACHED_WEIGHT_NUMEL]


def blas_gemv_slowdown(weights: list[torch.Tensor] | None = None, mib: int = 64, repeats: int = 3) -> float:
    """sgemv's time over a multi-threaded sum's, both over `weights` (else `mib` of fresh 1024 x 1024 ones),
    best of `repeats` each, interleaved so that a busy moment of the machine hits both."""
    if weights is None:
        weights = [torch.ones(1024, 1024) for _ in range(mib // 4)]
    rows = {w.shape[1]: torch.ones(1, w.shape[1]) for w in weights}
    best_gemv = best_read = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass of each warms the allocator and the BLAS up
            start = time.perf_counter()
            for w in weights:
                F.linear(rows[w.shape[1]], w)
            best_gemv = min(best_gemv, time.perf_counter() - start)
            start = time.perf_counter()
            for w in weights:
                w.sum()
            best_read = min(best_read, time.perf_counter() - start)
    return best_gemv / best_read


def choose_compiled_rows(model: torch.nn.Module | None = None) -> bool:
    """Measure once per process whether compiled graphs take the reduction for one-row projections, over
    `model`'s large weights (a model with none leaves the choice open: each of its weights takes the
    reduction whatever is chosen)."""
    global rows_as_reduction, _chosen
    if not _chosen:
        weights = None if model is None else large_weights(model)
        if model is not None and not weights:
            return rows_as_reduction
        slowdown = blas_gemv_slowdown(weights)
        rows_as_reduction, _chosen = slowdown > SLOW_GEMV, True
        log.info("one-row float32 projections in compiled graphs: %s (sgemv %.2fx a plain read)",
                 "inductor's reduction" if rows_as_reduction else "the BLAS call", slowdown)
    return rows_as_reduction


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T + bias through oneDNN's matmul: `weight` plain, or reordered once (models/packed_linear.py)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")


_HAS_ONEDNN = hasattr(torch.ops.mkldnn, "_linear_pointwise") and torch.backends.mkldnn.is_available()


def _one_float32_cpu_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.device.type == "cpu")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if _one_float32_cpu_row(x, weight):
        if torch.compiler.is_compiling():  # the reduction, or F.linear (inductor cannot lower oneDNN's op)
            if rows_as_reduction or weight.numel() < CACHED_WEIGHT_NUMEL:
                out = (weight * x).sum(-1).unsqueeze(0)
                return out if bias is None else out + bias
        elif _HAS_ONEDNN and weight.numel() >= ONEDNN_MIN_NUMEL and not torch.is_grad_enabled():
            return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def project(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` for a projection: a plain nn.Linear through `linear`, anything else (a
    quantized swap) through its own call."""
    if type(module) is torch.nn.Linear:
        return linear(x, module.weight, module.bias)
    return module(x)
