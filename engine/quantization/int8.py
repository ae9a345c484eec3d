"""Weight-only int8, symmetric, one scale per output channel (row).

w[o, i] ~= q[o, i] * scale[o] with q in [-127, 127]: rounding to the nearest
grid point means |w - dq(q(w))| <= scale / 2 for every element.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

QMAX = 127  # symmetric: -128 is never used, so +w and -w quantize alike


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (q int8 [out, in], scale float32 [out])."""
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1) / QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale is exact
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.to(torch.float32) * scale[:, None]).to(dtype)


class Int8Linear(nn.Module):
    """Drop-in for nn.Linear holding int8 weights; the forward multiplies by the
    int8 matrix (cast to the activation dtype) and scales each output channel
    afterwards, so no dequantized weight is kept between calls."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)
        self.orig_dtype = dtype  # the replaced linear's dtype: what `.weight` returns

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        bias = linear.bias is not None
        mod = cls(linear.in_features, linear.out_features, bias,
                  dtype=linear.weight.dtype)
        q, scale = quantize_int8(linear.weight)
        device = linear.weight.device
        mod.qweight, mod.scale = q.to(device), scale.to(device)
        if bias:
            mod.bias = linear.bias.detach().clone()
        return mod

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, for code that reads `.weight` of a linear (e.g. tied heads)."""
        return dequantize_int8(self.qweight, self.scale, self.orig_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (x @ q^T) * s == x @ (q * s)^T: the scale factors out of the row
        y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return y + self.bias.to(x.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"
