"""A single row times a float32 weight (decode at batch 1) as inductor's own reduction, not a BLAS call.

At one row a projection is a matrix-vector product: memory-bound, it should stream the
weight at the machine's bandwidth. MKL's sgemv (what F.linear and torch.mv call here, on
this AMD EPYC) runs on one thread whatever torch's thread count: 11 GB/s, against ~31 GB/s
that a 2-thread sum reaches. `(w * x).sum(-1)` compiled by inductor is one vectorized loop
over the weight's rows, split across threads: 20 GB/s. Measured on the 135M model's 121
projections a step (424 MB + the tied 113 MB lm_head, weights cycled so none stays in
cache): 48.9 ms -> 26.4 ms a step. Only inside a compiled graph (eager, the same expression
would materialize the [N, K] product: 222 ms) and only for one float32 row on the CPU;
anything else is F.linear. Results differ from sgemv's in the last bits (summation order:
3.8e-5 on logits of magnitude 100).

Eager, one row times a large weight (the lm_head: vocab x hidden) goes through oneDNN's
matmul instead, which does use the threads: the 135M model's 113 MB lm_head 10.7 -> 6.0 ms.
It costs ~18 us a call more than sgemv, so the weights of a layer (0.04-0.14 ms each) stay
with F.linear (960 x 576: 44.7 -> 40.1 us, not worth it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# eager one-row calls on weights at least this large take oneDNN (see above): the lm_head, not a layer
ONEDNN_MIN_NUMEL = 1 << 22


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")


_HAS_ONEDNN = hasattr(torch.ops.mkldnn, "_linear_pointwise") and torch.backends.mkldnn.is_available()


def _one_float32_cpu_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.device.type == "cpu")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if _one_float32_cpu_row(x, weight):
        if torch.compiler.is_compiling():
            out = (weight * x).sum(-1).unsqueeze(0)
            return out if bias is None else out + bias
        if _HAS_ONEDNN and weight.numel() >= ONEDNN_MIN_NUMEL and not torch.is_grad_enabled():
            return _onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def project(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` for a projection: a plain nn.Linear through `linear`, anything else (a
    quantized swap) through its own call."""
    if type(module) is torch.nn.Linear:
        return linear(x, module.weight, module.bias)
    return module(x)
