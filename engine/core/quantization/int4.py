"""Weight-only int4, group-wise along the input dimension, two values per byte.

Each row is cut into groups of `group_size` input columns (the last group may
be shorter) and each group has its own scale (and, asymmetric, a zero point):
- symmetric:  w ~= (u - 8) * s, u in [1, 15] (stored as unsigned nibbles; q = u - 8 in [-7, 7]);
- asymmetric: w ~= (u - z) * s, u in [0, 15], z an integer zero point in [0, 15].
Both round to the nearest grid point, so |w - dq(q(w))| <= s / 2 per element.
The asymmetric range is widened to include 0, so that 0 is exact and a
constant group never needs a zero step.

Packing: column 2j goes to the low nibble, column 2j+1 to the high nibble of
byte j (an odd width is padded by one zero nibble).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

SYM_QMAX = 7  # symmetric levels -7..7 (the -8 level stays unused, as for int8)
SYM_OFFSET = 8  # stored nibble = q + 8
ASYM_LEVELS = 15


@dataclass
class Int4Weight:
    packed: torch.Tensor  # uint8 [out, ceil(in / 2)]
    scale: torch.Tensor  # float32 [out, num_groups]
    zero: torch.Tensor | None  # uint8 [out, num_groups] (asymmetric) or None (symmetric)
    in_features: int
    group_size: int


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """[out, in] -> [out, num_groups, group_size], zero-padded at the end of each row."""
    out_f, in_f = w.shape
    num_groups = -(-in_f // group_size)
    padded = F.pad(w, (0, num_groups * group_size - in_f))
    return padded.view(out_f, num_groups, group_size)


def pack_int4(u: torch.Tensor) -> torch.Tensor:
    """uint8 nibbles [out, in] (values 0..15) -> uint8 [out, ceil(in / 2)]."""
    if u.shape[1] % 2:
        u = F.pad(u, (0, 1))
    return (u[:, 0::2] | (u[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """uint8 [out, ceil(in / 2)] -> uint8 nibbles [out, in]."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=2).view(packed.shape[0], -1)[:, :in_features]


def quantize_int4(weight: torch.Tensor, group_size: int = 128, symmetric: bool = True) -> Int4Weight:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    w = weight.detach().to(torch.float32)
    out_f, in_f = w.shape
    g = _grouped(w, group_size)
    if symmetric:
        scale = g.abs().amax(dim=2) / SYM_QMAX
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        u = torch.round(g / scale[..., None]).clamp_(-SYM_QMAX, SYM_QMAX) + SYM_OFFSET
        zero = None
    else:
        lo = g.amin(dim=2).clamp(max=0.0)
        hi = g.amax(dim=2).clamp(min=0.0)
        scale = (hi - lo) / ASYM_LEVELS
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero_f = torch.round(-lo / scale).clamp_(0, ASYM_LEVELS)
        u = (torch.round(g / scale[..., None]) + zero_f[..., None]).clamp_(0, ASYM_LEVELS)
        zero = zero_f.to(torch.uint8)
    u = u.to(torch.uint8).view(out_f, -1)[:, :in_f]
    return Int4Weight(pack_int4(u), scale, zero, in_f, group_size)


def dequantize_int4(qw: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _dequantize(qw.packed, qw.scale, qw.zero, qw.in_features, qw.group_size).to(dtype)


def _dequantize(packed, scale, zero, in_features: int, group_size: int) -> torch.Tensor:
    u = unpack_int4(packed, in_features).to(torch.float32)
    offset = zero.to(torch.float32) if zero is not None else torch.full_like(scale, SYM_OFFSET)
    # per-group parameters repeated over the group's columns, cut to the real width
    s = scale.repeat_interleave(group_size, dim=1)[:, :in_features]
    z = offset.repeat_interleave(group_size, dim=1)[:, :in_features]
    return (u - z) * s


class Int4Linear(nn.Module):
    """Drop-in for nn.Linear holding packed int4 weights.

    The forward dequantizes the whole weight (unpack, subtract the zero point,
    scale per group) and runs a float matmul: correct everywhere, not fast on
    the CPU. The dequantized weight is not kept, so the memory saving is real.
    """

    def __init__(self, in_features: int, out_features: int, group_size: int, symmetric: bool,
                 bias: bool = True, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.symmetric = group_size, symmetric
        num_groups = -(-in_features // group_size)
        self.register_buffer("qweight", torch.zeros(out_features, -(-in_features // 2), dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(out_features, num_groups, dtype=torch.float32))
        self.register_buffer("zero", None if symmetric else torch.zeros(out_features, num_groups, dtype=torch.uint8))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)
        self.orig_dtype = dtype  # the replaced linear's dtype: what `.weight` returns

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, symmetric: bool = True) -> "Int4Linear":
        bias = linear.bias is not None
        mod = cls(linear.in_features, linear.out_features, group_size, symmetric, bias,
                  dtype=linear.weight.dtype)
        qw = quantize_int4(linear.weight, group_size, symmetric)
        device = linear.weight.device
        mod.qweight, mod.scale = qw.packed.to(device), qw.scale.to(device)
        if not symmetric:
            mod.zero = qw.zero.to(device)
        if bias:
            mod.bias = linear.bias.detach().clone()
        return mod

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return _dequantize(self.qweight, self.scale, self.zero, self.in_features, self.group_size).to(dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, for code that reads `.weight` of a linear (e.g. tied heads)."""
        return self.dequantized_weight(self.orig_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 group_size={self.group_size} {kind}")
