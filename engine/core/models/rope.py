"""Rotary position embeddings: the default and llama3-style (and linear) frequency scaling.

Cos/sin are computed once per forward for the step's positions and shared by all
layers, so no table of max_position_embeddings rows is kept. The arithmetic
follows transformers' (float32 frequencies, halves rotated), so logits agree
to float32 rounding.
"""

from __future__ import annotations

import math

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between."""
    old_len = original_max_position_embeddings
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def build_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for `scaling` (a rope_parameters / rope_scaling dict, or None)."""
    inv_freq = default_inv_freq(head_dim, theta)
    rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return llama3_inv_freq(inv_freq, float(scaling["factor"]), float(scaling["low_freq_factor"]),
                               float(scaling["high_freq_factor"]),
                               int(scaling["original_max_position_embeddings"]))
    raise ValueError(f"unsupported rope type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        # a plain attribute, not a buffer: it survives meta-device construction untouched
        self.inv_freq = build_inv_freq(head_dim, theta, scaling)
        self._per_device: dict[str, torch.Tensor] = {}

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [T, 1, head_dim] (broadcast over heads), in `dtype`.

        Both halves are laid out for `apply_rotary`: cos is (cos, cos), the signed sin is
        (-sin, sin), so a layer rotates with 4 ops instead of 8 (the once-per-step cats pay).
        """
        key = str(positions.device)
        inv_freq = self._per_device.get(key)
        if inv_freq is None:
            inv_freq = self._per_device[key] = self.inv_freq.to(positions.device)
            # a constant of the model: static for torch.compile (compile_decode), or dynamo's duck
            # sizing takes a context length of head_dim / 2 for this size and compiles per length
            mark_static_for_dynamo(inv_freq)
        freqs = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]


def mark_static_for_dynamo(t: torch.Tensor) -> None:
    """What `torch._dynamo.mark_static(t)` records on a tensor (every dim static), without importing
    torch._dynamo: the table is made on the first forward of every engine, compiled or not, and that
    import alone costs ~140 MB of RSS and ~1 s in a replica that never compiles. Dynamo reads these
    attributes when it first meets the tensor; tests/engine/test_rope_static.py checks they are still
    the ones mark_static sets."""
    t._dynamo_static_indices = set(range(t.dim()))
    t._has_dynamo_dim_marking = True


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by `RotaryEmbedding`'s (cos, signed sin) [T, 1, D]; pairs are
    (i, i + D/2) as in transformers: (x1 cos - x2 sin, x2 cos + x1 sin), where the roll
    brings x2 under x1 and the sign of sin does the minus - the same float operations, so
    the same bits as transformers' rotate_half form."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, dims=-1).mul_(sin))
