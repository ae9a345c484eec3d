"""Sampling parameters of one request (vLLM-compatible names)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from engine.structured_output import grammar_spec

GREEDY_BELOW = 1e-5


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 (anything below GREEDY_BELOW) means greedy
    top_k: int = -1  # -1: off
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None  # per-request seed: same seed, same output
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output text)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs of each generated token (0: only the chosen token's)
    prompt_logprobs: int | None = None  # logprobs of the prompt tokens (teacher forcing)
    # logits processors (engine/logits_processors.py), vLLM's semantics
    presence_penalty: float = 0.0  # OpenAI: minus this where an output token already appeared
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # HF/CTRL over prompt + output tokens; 1: off
    min_p: float = 0.0  # drop tokens below min_p * the top token's probability; 0: off
    logit_bias: dict[int, float] | None = None  # token ID -> added to its logit
    # the API request this sample is part of (engine/server/choices.py): n choices kept of best_of samples
    n: int = 1
    best_of: int | None = None
    response_format: dict | None = None  # {"type": "json_object"} / {"type": "json_schema", ...}: constrained
    # a chat request's tools (engine/server/tool_calls.py): sha256 of their canonical JSON, and the tool
    # choice ("none" | "auto" | "required" | "function:NAME"); in to_json only when set, so every other
    # request's layout stays the one the proxy writes too (engine/proxy/request_row.py)
    tools_hash: str | None = None
    tool_choice: str | None = None

    def __post_init__(self):
        self.validate()

    @property
    def greedy(self) -> bool:
        # vLLM's _SAMPLING_EPS: a temperature this small is greedy (dividing by it would overflow float32)
        return self.temperature < GREEDY_BELOW

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
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-2.0 <= getattr(self, name) <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token IDs (integers >= 0), got {token!r}")
            if not (-100.0 <= bias <= 100.0):
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")
        grammar_spec(self.response_format)  # engine/structured_output.py: the type, the schema, xgrammar parses it

    def to_json(self) -> str:
        # a shallow dict: asdict deep-copies every list and dict first (21 us against 2.6 us a request, paid by
        # the engine thread in each finished request's record)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("tools_hash", "tool_choice"):
            if d[name] is None:
                del d[name]
        if self.logit_bias is not None:  # string keys, as JSON (and the proxy's copy of the body) has them
            d["logit_bias"] = {str(t): float(b) for t, b in self.logit_bias.items()}
        return json.dumps(d, sort_keys=True)
