"""Replace a model's nn.Linear layers in place by weight-only quantized ones."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.core.quantization.int4 import Int4Linear
from engine.core.quantization.int8 import Int8Linear

SCHEMES = ("int8", "int4")


@dataclass
class LayerQuantStats:
    name: str
    shape: tuple[int, int]  # (out_features, in_features)
    bytes_before: int  # the float weight
    bytes_after: int  # packed weight + scales (+ zero points); biases stay float and are not counted
    max_abs_error: float  # max |w - dequantized(w)|
    max_error_over_scale: float  # max |w - dq| / (its scale); <= 0.5 when rounding is exact


@dataclass
class QuantReport:
    scheme: str  # "int8" | "int4"
    group_size: int | None  # int4 only
    symmetric: bool
    layers: list[LayerQuantStats] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # nn.Linear layers left in float (skip list)
    model_bytes_before: int = 0  # all parameters and buffers
    model_bytes_after: int = 0
    weights_hash: str = ""  # sha256 over the quantized tensors: same checkpoint, same hash

    @property
    def label(self) -> str:
        """The replica-identity string: "int8", "int4-g128", "int4-g128-asym"."""
        if self.scheme == "int8":
            return "int8"
        return f"int4-g{self.group_size}" + ("" if self.symmetric else "-asym")

    @property
    def linear_bytes_before(self) -> int:
        return sum(s.bytes_before for s in self.layers)

    @property
    def linear_bytes_after(self) -> int:
        return sum(s.bytes_after for s in self.layers)

    @property
    def max_abs_error(self) -> float:
        return max((s.max_abs_error for s in self.layers), default=0.0)

    def summary(self) -> str:
        ratio = self.model_bytes_before / max(self.model_bytes_after, 1)
        return (f"{self.label}: {len(self.layers)} linear layers quantized, {len(self.skipped)} skipped; "
                f"linear weights {self.linear_bytes_before / 2**20:.2f} -> {self.linear_bytes_after / 2**20:.2f} MiB; "
                f"model {self.model_bytes_before / 2**20:.2f} -> {self.model_bytes_after / 2**20:.2f} MiB "
                f"({ratio:.2f}x); max |w - dq(w)| = {self.max_abs_error:.3g}")


def quantization_label(scheme: str, group_size: int = 128, symmetric: bool = True) -> str:
    """The identity string for a scheme without quantizing anything ("none" passes through)."""
    if scheme in ("none", "", None):
        return "none"
    return QuantReport(scheme, group_size if scheme == "int4" else None, symmetric).label


def _tensor_bytes(module: nn.Module) -> int:
    tensors = list(module.parameters()) + [b for b in module.buffers() if b is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def _layer_stats(name: str, linear: nn.Linear, qmod: nn.Module) -> LayerQuantStats:
    w = linear.weight.detach().to(torch.float32)
    err = (w - qmod.weight.to(torch.float32)).abs()
    if isinstance(qmod, Int8Linear):
        per_elem_scale = qmod.scale[:, None].expand_as(w)
        after = qmod.qweight.numel() + qmod.scale.numel() * 4
    else:
        per_elem_scale = qmod.scale.repeat_interleave(qmod.group_size, dim=1)[:, : qmod.in_features]
        after = qmod.qweight.numel() + qmod.scale.numel() * 4 + (qmod.zero.numel() if qmod.zero is not None else 0)
    return LayerQuantStats(
        name=name, shape=tuple(w.shape), bytes_before=w.numel() * linear.weight.element_size(), bytes_after=after,
        max_abs_error=float(err.max()) if err.numel() else 0.0,
        max_error_over_scale=float((err / per_elem_scale).max()) if err.numel() else 0.0,
    )


def _hash_quantized(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, buf in sorted(model.named_buffers()):
        if buf is None or not any(name.endswith(s) for s in (".qweight", ".scale", ".zero")):
            continue
        h.update(name.encode())
        h.update(buf.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def quantize_model(model: nn.Module, scheme: str = "int8", group_size: int = 128,
                   skip: list[str] | tuple[str, ...] = ("lm_head",), symmetric: bool = True) -> QuantReport:
    """Replace every nn.Linear of `model` whose name contains none of `skip` by an
    Int8Linear (per output channel) or Int4Linear (per `group_size` input columns).

    Deterministic: the same weights give bit-identical quantized tensors.
    Returns a QuantReport (bytes before / after, per-layer max error).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; choose from {SCHEMES} (or 'none')")
    if scheme == "int4" and group_size < 1:
        raise ValueError(f"quant group size must be >= 1, got {group_size}")
    report = QuantReport(scheme, group_size if scheme == "int4" else None, symmetric if scheme == "int4" else True)
    report.model_bytes_before = _tensor_bytes(model)
    # collect first, replace afterwards: never mutate the module tree while walking it
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name, linear in targets:
        if any(s in name for s in skip):
            report.skipped.append(name)
            continue
        with torch.no_grad():
            if scheme == "int8":
                qmod = Int8Linear.from_linear(linear)
            else:
                qmod = Int4Linear.from_linear(linear, group_size, symmetric)
        report.layers.append(_layer_stats(name, linear, qmod))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, qmod)
    fuse = getattr(model, "fuse_projections", None)
    if fuse is not None:  # int8 q/k/v and gate/up become one int8 matmul each again (llama.FusedLinear)
        fuse()
    report.model_bytes_after = _tensor_bytes(model)
    report.weights_hash = _hash_quantized(model)
    return report
