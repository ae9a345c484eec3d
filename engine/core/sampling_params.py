"""Sampling parameters of one request (vLLM-compatible names)."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field, fields

from engine.core.structured_output import grammar_spec

GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20  # top-n logprobs per token (OpenAI's limit)
# the sampler's integer tensors are int64 (torch.long); vLLM bounds a seed to the same width
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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
    # logits processors (engine/core/logits_processors.py), vLLM's semantics
    presence_penalty: float = 0.0  # OpenAI: minus this where an output token already appeared
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # HF/CTRL over prompt + output tokens; 1: off
    min_p: float = 0.0  # drop tokens below min_p * the top token's probability; 0: off
    logit_bias: dict[int, float] | None = None  # token ID -> added to its logit
    # the API request this sample is part of (engine/serving/server/choices.py): n choices kept of best_of samples
    n: int = 1
    best_of: int | None = None
    response_format: dict | None = None  # {"type": "json_object"} / {"type": "json_schema", ...}: constrained
    # a chat request's tools (engine/serving/server/tool_calls.py): sha256 of their canonical JSON, and the tool
    # choice ("none" | "auto" | "required" | "function:NAME"); in to_json only when set, so every other
    # request's layout stays the one the proxy writes too (engine/serving/proxy/request_row.py)
    tools_hash: str | None = None
    tool_choice: str | None = None

    def __post_init__(self):
        self.validate()

    @property
    def greedy(self) -> bool:
        # vLLM's _SAMPLING_EPS: a temperature this small is greedy (dividing by it would overflow float32)
        return self.temperature < GREEDY_BELOW

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the field (its first word) and the range, with a message a user can act on.

        Every number is checked for its type (a bool, a string or None where a number belongs is refused),
        for being finite, and for fitting the sampler: its integer tensors are int64, so an integer past
        that width (top_k 2**64, or 1e308 written as an integer) would fail inside a batched step, for
        every request in it. Runs when the parameters are made (and remade: `dataclasses.replace`); with
        `vocab_size`, `check_token_ids` too."""
        _real("temperature", self.temperature, 0.0, 100.0)
        if self.top_k != -1:
            _integer("top_k", self.top_k, 1, INT64_MAX, note="-1 (off) or an integer in [1, 2**63 - 1]")
        _real("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _integer("max_tokens", self.max_tokens, 1, INT64_MAX)
        if self.seed is not None:
            _integer("seed", self.seed, INT64_MIN, INT64_MAX)
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of token IDs, got {_shown(self.stop_token_ids)}")
        for token in self.stop_token_ids:
            _integer("stop_token_ids", token, 0, INT64_MAX)
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a list of strings, got {_shown(self.stop)}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a boolean, got {_shown(self.ignore_eos)}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 0, MAX_LOGPROBS)
        for name in ("presence_penalty", "frequency_penalty"):
            _real(name, getattr(self, name), -2.0, 2.0)
        # any finite positive penalty (vLLM's bound); the sampler keeps the float32 result finite
        _real("repetition_penalty", self.repetition_penalty, 0.0, math.inf, low_open=True)
        _real("min_p", self.min_p, 0.0, 1.0)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a mapping of token ID to bias, got {_shown(self.logit_bias)}")
            for token, bias in self.logit_bias.items():
                _integer("logit_bias", token, 0, INT64_MAX, what="keys (token IDs)")
                _real("logit_bias", bias, -100.0, 100.0, what=f"value of token {token}")
        _integer("n", self.n, 1, INT64_MAX)
        if self.best_of is not None:
            _integer("best_of", self.best_of, 1, INT64_MAX)
        grammar_spec(self.response_format)  # engine/core/structured_output.py: the type, the schema, xgrammar parses it
        if vocab_size is not None:
            self.check_token_ids(vocab_size)

    def check_token_ids(self, vocab_size: int) -> None:
        """The token IDs of stop_token_ids and logit_bias inside a vocabulary (an ID past it would index past
        the logits): all that is left to check where the engine makes a Sequence, the only place that knows
        the vocabulary (every field was checked when the parameters were made)."""
        for token in self.stop_token_ids:
            _integer("stop_token_ids", token, 0, vocab_size - 1)
        for token in self.logit_bias or ():
            _integer("logit_bias", token, 0, vocab_size - 1, what="keys (token IDs)")

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


def _shown(value) -> str:
    """A value in an error message, cut short (an integer of 300 digits is no help to read)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _integer(name: str, value, low: int, high: int, *, note: str = "", what: str = "") -> None:
    """`value` an integer (not a bool) in [low, high]; else ValueError starting with `name`."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= value <= high:
        return
    field = f"{name} {what}" if what else name
    bounds = note or f"an integer in [{_bound(low)}, {_bound(high)}]"
    raise ValueError(f"{field} must be {bounds}, got {_shown(value)}")


def _real(name: str, value, low: float, high: float, *, low_open: bool = False, what: str = "") -> None:
    """`value` a finite real number (not a bool) in [low, high] ((low, high] with `low_open`)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and _finite_float(value) \
            and (low < value if low_open else low <= value) and value <= high:
        return
    field = f"{name} {what}" if what else name
    upper = f"{high:g}]" if math.isfinite(high) else "inf)"
    raise ValueError(f"{field} must be a finite number in {'(' if low_open else '['}{low:g}, {upper}, "
                     f"got {_shown(value)}")


def _finite_float(value: numbers.Real) -> bool:
    """A finite number as a float, as the sampler's tensors take it (the integer 10**400 is none)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _bound(n: int) -> str:
    return {INT64_MAX: "2**63 - 1", INT64_MIN: "-2**63"}.get(n, str(n))
