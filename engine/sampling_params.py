"""Sampling parameters of one request (vLLM-compatible names)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = -1  # -1: off
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None  # per-request seed: same seed, same output
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output text)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs of each generated token (0: only the chosen token's)
    prompt_logprobs: int | None = None  # logprobs of the prompt tokens (teacher forcing)

    def __post_init__(self):
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise ValueError with a message a user can act on."""
        if not (0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.prompt_logprobs is not None and not (0 <= self.prompt_logprobs <= 20):
            raise ValueError(f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)
