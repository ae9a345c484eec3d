"""Weight-only int8, symmetric, one scale per output channel (row).

w[o, i] ~= q[o, i] * scale[o] with q in [-127, 127]: rounding to the nearest
grid point means |w - dq(q(w))| <= scale / 2 for every element.

The matmul (`Int8Matmul`): on the CPU in float32, for up to FAST_MAX_ROWS tokens (decode
steps and small batches, where a step is memory-bound) and matrices of at least
FAST_MIN_NUMEL weights, it runs fbgemm's int8 GEMM
(`quantized::linear_dynamic` over the same q and scales, prepacked once).
That kernel also rounds the activations to 7-bit integers (dynamic; one scale per token:
rows are brought to max |x| = 1 around the call). So it reads 4x fewer weight bytes than
float32, at the price of an activation rounding error of the order of the weight
rounding (~1.5% relative on a layer's output for Gaussian inputs, ~1% for the weights;
the tiny model's logits: KL 1.6e-4 against 3.6e-5 for the exact path, same top-1).
7 bits, not 8: AVX2's u8 x s8 pair-sum saturates int16 at 8 bits.
Elsewhere (longer prefill chunks, CUDA, half types, a torch without the quantized ops,
or `exact=True`) it multiplies by the int8 matrix cast to the activation dtype: exact in
the weight, but it reads the int8 matrix and writes a float copy each call.

Measured at batch 1, one thread, the 135M model's shapes (576 -> 3072, 576 -> 49152):
fbgemm 0.14 / 2.5 ms, the cast 0.46 / 155 ms, float32 0.25 / 10 ms. Tried and slower
here (AVX2, no VNNI): `torch._weight_int8pack_mm` 1.7 / 28 ms, `torch._int_mm`
1.1 / 21 ms, an inductor-compiled int8 GEMV 2.8 / 39 ms.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from engine.core.opaque_matmul import OpaqueMatmul, tensor_version

QMAX = 127  # symmetric: -128 is never used, so +w and -w quantize alike
# up to this many tokens a call is memory-bound and the int8 kernel pays (4x fewer weight bytes);
# a longer prefill chunk is compute-bound, the cast is 1/rows of its work, and it stays exact
FAST_MAX_ROWS = 16
# below this many weights the int8 matrix sits in cache and bytes do not matter, the kernel's
# fixed cost does: the cast path (reference model, int8, batch 1: CPU 4.3 -> 4.0 ms/token)
FAST_MIN_NUMEL = 1 << 16


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (q int8 [out, in], scale float32 [out])."""
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1) / QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale is exact
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.to(torch.float32) * scale[:, None]).to(dtype)


def _prepack(q: torch.Tensor, scale: torch.Tensor):
    """fbgemm's packed form of (q, scale), or None where the quantized ops are missing."""
    if q.device.type != "cpu" or not hasattr(torch.ops.quantized, "linear_prepack"):
        return None
    try:
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; the kernel is still there
            warnings.simplefilter("ignore")
            qt = torch._make_per_channel_quantized_tensor(
                q.contiguous(), scale.to(torch.float64), torch.zeros_like(scale, dtype=torch.int64), 0)
            return torch.ops.quantized.linear_prepack(qt, None)  # bias added after: rows may be rescaled
    except (RuntimeError, AttributeError):
        return None


def _linear_dynamic(x: torch.Tensor, packed) -> torch.Tensor:
    # the packed weights are a ScriptObject: torch's __torch_function__ check on the arguments asks it
    # for that attribute, and it answers with a C++ exception, caught: 22 -> 7 us a call, most of a
    # small matrix's (the 135M model at batch 1 makes 121 of these calls a step). Plain tensors only here.
    with torch._C.DisableTorchFunctionSubclass():
        return torch.ops.quantized.linear_dynamic.default(x, packed, True)


class Int8Matmul(OpaqueMatmul, op="int8_matmul"):
    """y = x @ (q * scale)^T + bias for int8 q [out, in]; prepacks lazily, once.

    Keeps (q, scale, bias) for the exact path; the packed copy is built at the first
    float32 CPU call, so a module that never runs (e.g. a projection served by a fused
    matmul) costs no packed memory. Compiled, one opaque op (engine/core/opaque_matmul.py).
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, exact: bool = False):
        self.q, self.scale, self.bias, self.exact = q, scale, bias, exact
        self.fast = not exact and q.numel() >= FAST_MIN_NUMEL
        self._packed = None
        self._packed_for: tuple | None = None  # (data_ptr, _version) of q and scale the pack was built from
        super().__init__()

    @property
    def out_features(self) -> int:
        return self.q.shape[0]

    def _key(self) -> tuple:
        return tuple(None if t is None else (t.data_ptr(), tensor_version(t)) for t in (self.q, self.scale, self.bias))

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        # (tried: running these calls on one thread when torch has more - fbgemm's team spin-waits
        # on busy cores - but switching torch's thread count per call made the reference model's
        # int8 decode 10x slower at 2 threads: p10 step 3.2 -> 35.5 ms)
        if x.shape[0] == 1:  # a decode row: the kernel's per-call activation scale is per token already
            y = _linear_dynamic(x, self._packed)
        else:
            # the kernel takes one activation scale per call: over many tokens one large row would
            # coarsen every other row's rounding (tiny-model top-1 0.96 -> 0.93), so rows are
            # brought to max |x| = 1 first and scaled back: per-token rounding for 3 small ops
            a = x.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-30)
            y = _linear_dynamic(x / a, self._packed).mul_(a)
        return y + self.bias if self.bias is not None else y

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] <= FAST_MAX_ROWS:
            key = self._key()
            if self._packed_for != key:  # first call, or the weights were replaced / written in place
                self._packed, self._packed_for = _prepack(self.q, self.scale), key
            if self._packed is not None:
                return self._fast(x)
        # (x @ q^T) * s == x @ (q * s)^T: the scale factors out of the row
        y = F.linear(x, self.q.to(x.dtype)) * self.scale.to(x.dtype)
        return y + self.bias.to(x.dtype) if self.bias is not None else y


class Int8Linear(nn.Module):
    """Drop-in for nn.Linear holding int8 weights (see the module docstring for the matmul);
    no dequantized weight is kept between calls. `exact=True` forces the cast path."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)
        self.orig_dtype = dtype  # the replaced linear's dtype: what `.weight` returns
        self.exact = False
        self._mm: Int8Matmul | None = None

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

    def matmul(self) -> Int8Matmul:
        """The kernel over the current buffers (rebuilt when `.to()` or assignment replaced them)."""
        mm = self._mm
        if mm is None or mm.q is not self.qweight or mm.scale is not self.scale or mm.bias is not self.bias \
                or mm.exact != self.exact:
            mm = self._mm = Int8Matmul(self.qweight, self.scale, self.bias, self.exact)
        return mm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul()(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"
