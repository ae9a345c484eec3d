"""Attention backends behind one interface (see `base.py`).

`torch` runs anywhere; `flashinfer` needs CUDA and is imported only when asked
for (or chosen by "auto" on a CUDA device), so importing this package never
touches CUDA-only code.
"""

from __future__ import annotations

from engine.attention.base import AttentionBackend, AttentionMetadata

BACKENDS = ("auto", "torch", "flashinfer")


def flashinfer_available() -> bool:
    import importlib.util

    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


def get_backend(name: str = "auto", device: str = "cpu") -> AttentionBackend:
    """The backend called `name`; "auto" picks flashinfer on CUDA when installed, else torch."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {BACKENDS}")
    on_cuda = str(device).startswith("cuda")
    if name == "auto":
        name = "flashinfer" if on_cuda and flashinfer_available() else "torch"
    if name == "flashinfer":
        if not on_cuda:
            raise ValueError(f"the flashinfer backend needs a CUDA device, not {device!r}")
        if not flashinfer_available():
            raise ValueError("the flashinfer backend needs CUDA and the flashinfer package "
                             "(pip install 'infersight[gpu]')")
        from engine.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(device=device)
    from engine.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "get_backend", "flashinfer_available"]
