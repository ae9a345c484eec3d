"""Attention backends behind one interface (see `base.py`).

`torch` runs anywhere; `flashinfer` needs CUDA and is imported only when asked
for (or chosen by "auto" on a CUDA device), so importing this package never
touches CUDA-only code.
"""

from __future__ import annotations

from dataclasses import replace

from engine.core.attention.base import AttentionBackend, AttentionMetadata

BACKENDS = ("auto", "torch", "flashinfer")


def flashinfer_available() -> bool:
    import importlib.util

    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


def backend_class(name: str = "auto", device: str = "cpu") -> type[AttentionBackend]:
    """The backend class called `name`; "auto" picks flashinfer on CUDA when installed, else torch."""
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
        from engine.core.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend
    from engine.core.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend


def get_backend(name: str = "auto", device: str = "cpu") -> AttentionBackend:
    cls = backend_class(name, device)
    return cls(device=device) if cls.name == "flashinfer" else cls()


def compile_decode_for(config) -> bool:
    """`config.compile_decode`, or where the config leaves it open (None) on for the torch backend on a CPU: what
    was measured there (README, "Defaults and why"). Elsewhere (flashinfer's attention stays eager between compiled
    parts; CUDA has cuda_graphs) compile is asked for explicitly."""
    if config.compile_decode is not None:
        return config.compile_decode
    cls = backend_class(config.attention_backend, config.device)
    return cls.traceable and str(config.device) == "cpu"


def block_size_for(config, kv_row_bytes: int) -> int:
    """Tokens per KV block: `config.block_size`, or where the config leaves it open its attention backend's
    choice for a model whose token takes `kv_row_bytes` of keys and values per layer. The engine sizes its
    pool with it; the server's preflight plans the same pool."""
    if config.block_size is not None:
        return config.block_size
    import torch

    from engine.core import model_runner

    compiled = compile_decode_for(config) and model_runner.COMPILE_BACKEND == "inductor"
    cls = backend_class(config.attention_backend, config.device)
    return cls.default_block_size(kv_row_bytes, torch.device(config.device), compiled)


def with_block_size(config, kv_row_bytes: int):
    """`config` with what it leaves open decided, once: compile_decode (`compile_decode_for`), then the block size
    (`block_size_for`): the engine runs this config and the replica's identity records it. Here, not on the
    config, so the config imports no backend."""
    if config.compile_decode is None:
        config = replace(config, compile_decode=compile_decode_for(config))
    return config if config.block_size is not None else replace(config, block_size=block_size_for(config, kv_row_bytes))


__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "backend_class", "block_size_for", "compile_decode_for",
           "get_backend",
           "flashinfer_available", "with_block_size"]
