"""Model loading: `load_model(dir) -> LoadedModel`, plus KV-cache sizing helpers for the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.models.errors import ModelLoadError
from engine.core.models.llama import LlamaForCausalLM
from engine.core.models.loader import load_weights, read_json
from engine.core.models.model_config import ARCHITECTURES, ModelConfig, parse_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    hf_config: dict  # config.json as parsed
    weights_hash: str
    model_name: str  # the directory's name
    model_dir: Path
    dtype: torch.dtype
    device: torch.device

    @property
    def architecture(self) -> str:
        return self.config.architecture

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_position_embeddings

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.config.eos_token_ids)

    @property
    def bos_token_id(self) -> int | None:
        return self.config.bos_token_id


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; choose from {sorted(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose from {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_model(model_dir: str | Path, dtype: str | torch.dtype = "float32",
               device: str | torch.device = "cpu") -> LoadedModel:
    """Build our forward for the checkpoint in `model_dir` and load its weights.

    Raises `ModelLoadError` (naming the file and tensor) when the directory does
    not hold a loadable model of a supported architecture.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: not a directory")
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device)
    hf_config = read_json(model_dir / "config.json")
    generation_config = read_json(model_dir / "generation_config.json", required=False)
    cfg = parse_config(hf_config, model_dir / "config.json", generation_config)

    # build without allocating or initialising weights; the checkpoint fills every one
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch_dtype).to_empty(device=device)
    model.tie_weights()
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_word_embeddings else {}
    weights_hash = load_weights(model, model_dir, torch_dtype, tied)
    model.eval().requires_grad_(False)
    return LoadedModel(model=model, config=cfg, hf_config=hf_config, weights_hash=weights_hash,
                       model_name=model_dir.resolve().name, model_dir=model_dir,
                       dtype=torch_dtype, device=device)


def kv_bytes_per_block(loaded: LoadedModel, block_size: int) -> int:
    """Bytes one KV block takes across all layers (keys and values)."""
    elem = torch.empty((), dtype=loaded.dtype).element_size()
    return 2 * loaded.num_layers * block_size * loaded.num_kv_heads * loaded.head_dim * elem


def allocate_kv_cache(loaded: LoadedModel, num_blocks: int,
                      block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim].

    Zero-filled: masked-out slots are still read by batched attention, and garbage
    there (NaN bit patterns) would poison the sum even with a zero weight.
    """
    shape = (num_blocks, block_size, loaded.num_kv_heads, loaded.head_dim)
    return [(torch.zeros(shape, dtype=loaded.dtype, device=loaded.device),
             torch.zeros(shape, dtype=loaded.dtype, device=loaded.device))
            for _ in range(loaded.num_layers)]


__all__ = ["ARCHITECTURES", "LoadedModel", "ModelConfig", "ModelLoadError", "allocate_kv_cache",
           "kv_bytes_per_block", "load_model"]
