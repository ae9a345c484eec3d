"""What the server needs to know about the engine it fronts, in one place.

The HTTP layer talks to the engine only through `ServedModel`: the async
engine, the tokenizer, the served name and the limits requests are checked
against, plus a live view of the engine's queues and KV blocks for /health.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServedModel:
    engine: Any  # engine.async_engine.AsyncLLM
    name: str
    replica_id: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any  # engine.tokenization.Tokenizer: the engine's own (its tokenization cache, its observer)
    created: int = 0
    root: str = ""
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_engine(cls, engine, created: int) -> ServedModel:
        core = engine.engine  # the LLMEngine inside the AsyncLLM
        record = core.replica_record
        config = core.config
        return cls(
            engine=engine, name=record.model_name, replica_id=record.replica_id,
            max_model_len=int(core.max_model_len), vocab_size=int(core.vocab_size),
            tokenizer=core.tokenizer, created=created, root=str(config.model),
        )

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def engine_state(self) -> dict:
        """Queues and KV blocks right now (read without locking: a monitoring snapshot)."""
        core = self.engine.engine
        return {"running": core.scheduler.num_running, "waiting": core.scheduler.num_waiting,
                "kv_blocks_used": core.kv_cache.num_used_blocks, "kv_blocks_total": core.kv_cache.num_blocks}
