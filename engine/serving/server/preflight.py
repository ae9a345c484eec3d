"""Refuse at start what cannot work (before the weights load), with messages that say what to change.

Two checks, from the model directory's config.json and tokenizer alone:

- The context vs the KV pool. One sequence of `max_model_len` tokens needs that many KV slots; the
  pool holds `num_blocks * block_size` (num_blocks as engine/core/kv_cache.py kv_pool_blocks sizes it: from
  --num-kv-blocks, --kv-cache-memory-bytes / bytes per block, or what max_num_seqs full sequences fill). When the user did NOT set --max-model-len, the default (the model's
  max_position_embeddings) is not a choice anyone made: it is capped to the pool with a warning, so
  `/v1/models` states a context the replica can serve. When the user DID set it, silently serving
  less would break what they asked for: refused, naming both ways out (a smaller --max-model-len or a
  larger --kv-cache-memory-bytes, with the size needed).
- The tokenizer vs the embedding rows. A tokenizer ID at or past the model's vocab_size has no
  embedding row: refused. Model rows past the tokenizer decode to '' when sampled: padding of the
  embedding to a round size (Qwen, Phi-3: well under 1% of the rows) is normal and only warned about;
  a tokenizer that leaves more than MAX_UNCOVERED_FRACTION of the rows without text is a different
  model's tokenizer (the output would be mostly empty strings): refused.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from engine.core.config import EngineConfig

log = logging.getLogger("infersight.serve")

MAX_UNCOVERED_FRACTION = 0.10  # padding is a few hundred rows of 10^5; a wrong tokenizer leaves most rows bare
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PreflightError(ValueError):
    """A configuration that cannot work; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class KVPlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size


def _model_config(model_dir: str):
    from engine.core.models.loader import read_json
    from engine.core.models.model_config import parse_config

    path = Path(model_dir) / "config.json"
    return parse_config(read_json(path), path, None)


def kv_plan(config: EngineConfig, model_cfg) -> KVPlan:
    """The KV pool the engine will allocate (as engine.core.models.kv_bytes_per_block sizes it)."""
    from engine.core.attention import block_size_for
    from engine.core.kv_cache import kv_pool_blocks

    row_bytes = 2 * model_cfg.num_kv_heads * model_cfg.head_dim * _ELEMENT_BYTES.get(config.dtype, 4)  # a token, a layer
    block_size = block_size_for(config, row_bytes)
    per_block = model_cfg.num_layers * block_size * row_bytes
    blocks = kv_pool_blocks(per_block, block_size, config.max_num_seqs,
                            config.max_model_len or model_cfg.max_position_embeddings,
                            config.kv_cache_memory_bytes, config.num_kv_blocks)
    return KVPlan(int(blocks), block_size, per_block)


def fit_context(config: EngineConfig, model_cfg) -> EngineConfig:
    """`config` with a max_model_len the KV pool can hold (capped if defaulted; PreflightError if explicit)."""
    plan = kv_plan(config, model_cfg)
    if plan.num_blocks < 1:
        return config  # the engine's own check says so, with the block size in bytes
    asked = config.max_model_len
    if asked is not None and asked > plan.tokens:
        need_blocks = -(-asked // plan.block_size)
        raise PreflightError(
            f"--max-model-len {asked} does not fit the KV cache: it holds {plan.tokens} tokens "
            f"({plan.num_blocks} blocks of {plan.block_size}). Lower --max-model-len to at most {plan.tokens}, "
            f"or raise --kv-cache-memory-bytes to at least {need_blocks * plan.bytes_per_block} "
            f"({need_blocks} blocks)")
    default = model_cfg.max_position_embeddings
    if asked is None and default > plan.tokens:
        log.warning("max_model_len capped at %d (the KV cache holds %d blocks of %d tokens; the model allows %d): "
                    "raise --kv-cache-memory-bytes for a longer context", plan.tokens, plan.num_blocks,
                    plan.block_size, default)
        return dataclasses.replace(config, max_model_len=plan.tokens)
    return config


def check_vocabulary(tokenizer_size: int, model_vocab: int, model_dir: str = "") -> None:
    """PreflightError when tokenizer and embedding do not fit each other; a warning for mere padding."""
    where = f" ({model_dir})" if model_dir else ""
    if tokenizer_size > model_vocab:
        raise PreflightError(
            f"the tokenizer{where} has {tokenizer_size} tokens but the model's embedding only {model_vocab} rows: "
            f"IDs {model_vocab}..{tokenizer_size - 1} cannot be embedded. Use the tokenizer that came with "
            f"the model")
    uncovered = model_vocab - tokenizer_size
    if uncovered == 0:
        return
    if uncovered > MAX_UNCOVERED_FRACTION * model_vocab:
        raise PreflightError(
            f"the tokenizer{where} covers {tokenizer_size} of the model's {model_vocab} embedding rows: "
            f"{uncovered} sampled IDs ({uncovered / model_vocab:.0%}) would decode to ''. The tokenizer "
            f"probably belongs to another model: use the one that came with the model")
    log.warning("the model's embedding has %d rows past the tokenizer's %d tokens (padding); "
                "if sampled, they decode to ''", uncovered, tokenizer_size)


def preflight(config: EngineConfig) -> EngineConfig:
    """Both checks (and that a --chat-template can be read), before the model loads; returns the config to
    build the engine with."""
    from engine.core.tokenization import load_chat_template, load_hf_tokenizer

    if config.chat_template is not None:
        load_chat_template(config.chat_template)
    model_cfg = _model_config(config.model)
    check_vocabulary(len(load_hf_tokenizer(config.model)), model_cfg.vocab_size, config.model)
    return fit_context(config, model_cfg)
