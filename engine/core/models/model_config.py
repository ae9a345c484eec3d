"""What our forward needs from a Hugging Face `config.json`, read and checked in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.core.models.errors import ModelLoadError
from engine.core.models.rope import SUPPORTED_ROPE_TYPES

# architecture -> what distinguishes it within the Llama family
ARCHITECTURES = {
    "LlamaForCausalLM": dict(qkv_bias=None, o_bias=None, qk_norm=False),  # None: config's attention_bias
    "Qwen2ForCausalLM": dict(qkv_bias=True, o_bias=False, qk_norm=False),
    "Qwen3ForCausalLM": dict(qkv_bias=None, o_bias=None, qk_norm=True),
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]


def _rope_settings(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's `rope_parameters` or older `rope_theta` + `rope_scaling`."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        if "rope_type" not in params and all(isinstance(v, dict) for v in params.values()):
            raise ValueError("per-layer-type rope_parameters are not supported")
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        return theta, dict(params)
    theta = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    return theta, dict(scaling) if scaling else None


def _eos_list(value) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    return tuple(dict.fromkeys(int(v) for v in values))


def parse_config(cfg: dict, path: Path, generation_config: dict | None = None) -> ModelConfig:
    """Check `cfg` (the parsed config.json at `path`) and pull out our settings."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(f"{path}: unsupported architecture {archs or cfg.get('model_type')!r}; "
                             f"supported: {sorted(ARCHITECTURES)}")
    flags = ARCHITECTURES[arch]

    def need(key):
        if key not in cfg:
            raise ModelLoadError(f"{path}: missing required key {key!r} for {arch}")
        return cfg[key]

    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')")
    if cfg.get("use_sliding_window"):
        raise ModelLoadError(f"{path}: sliding-window attention is not supported")
    try:
        theta, scaling = _rope_settings(cfg)
        rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    num_heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    head_dim = int(cfg.get("head_dim") or hidden // num_heads)
    num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
    if num_heads % num_kv_heads:
        raise ModelLoadError(f"{path}: num_attention_heads {num_heads} is not a multiple of "
                             f"num_key_value_heads {num_kv_heads}")
    if head_dim % 2:
        raise ModelLoadError(f"{path}: head_dim {head_dim} must be even for rotary embeddings")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(f"{path}: partial_rotary_factor is not supported")
    attention_bias = bool(cfg.get("attention_bias", False))
    gen = generation_config or {}
    eos = _eos_list(gen.get("eos_token_id")) or _eos_list(cfg.get("eos_token_id"))
    bos = gen.get("bos_token_id", cfg.get("bos_token_id"))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias if flags["qkv_bias"] is None else flags["qkv_bias"],
        o_bias=attention_bias if flags["o_bias"] is None else flags["o_bias"],
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=flags["qk_norm"],
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos,
    )
