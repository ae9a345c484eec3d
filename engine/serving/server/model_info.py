"""What the server needs to know about the engine it fronts, in one place.

The HTTP layer talks to the engine only through `ServedModel`: the async
engine, the tokenizer, the served name and the limits requests are checked
against, plus a live view of the engine's queues and KV blocks for /health and /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.generation_defaults import GenerationDefaults
from engine.serving.server.text_check import longest_token_chars


@dataclass
class ServedModel:
    engine: Any  # engine.core.async_engine.AsyncLLM
    name: str
    replica_id: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any  # engine.core.tokenization.Tokenizer: the engine's own (its tokenization cache, its observer)
    created: int = 0
    root: str = ""
    max_num_seqs: int = 64  # the engine's batch: the server's queue bound is counted beyond it
    chars_per_token: int = 0  # the longest token in characters (0: measured from the tokenizer)
    extra: dict = field(default_factory=dict)
    # the model's sampling defaults for fields a request leaves unset (engine/core/generation_defaults.py)
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)

    def __post_init__(self):
        if not self.chars_per_token and self.tokenizer is not None:
            self.chars_per_token = longest_token_chars(self.tokenizer)

    @classmethod
    def from_engine(cls, engine, created: int) -> ServedModel:
        core = engine.engine  # the LLMEngine inside the AsyncLLM
        record = core.replica_record
        config = core.config
        return cls(
            engine=engine, name=record.model_name, replica_id=record.replica_id,
            max_model_len=int(core.max_model_len), vocab_size=int(core.vocab_size),
            tokenizer=core.tokenizer, created=created, root=str(config.model),
            max_num_seqs=int(config.max_num_seqs), generation_defaults=core.generation_defaults,
        )

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def engine_state(self) -> dict:
        """Queues and KV blocks right now (read without locking: a monitoring snapshot)."""
        core = self.engine.engine
        return {"running": core.scheduler.num_running, "waiting": core.scheduler.num_waiting,
                "kv_blocks_used": core.kv_cache.num_used_blocks, "kv_blocks_total": core.kv_cache.num_blocks,
                "compiled_decode": core.runner.compile_state}

    def kv_state(self) -> dict:
        """The KV pool right now, as the metrics report it (used, free, cached, total blocks)."""
        kv = self.engine.engine.kv_cache
        return {"used": kv.num_used_blocks, "free": kv.num_free_blocks, "cached": kv.num_cached_blocks,
                "total": kv.num_blocks}
