"""Constrained decoding: OpenAI's `response_format` (json_object / json_schema) with xgrammar.

A request's `SamplingParams.response_format` becomes a grammar; every step, before
sampling, each constrained row's raw logits are set to -inf outside the tokens the
grammar allows next. So greedy and sampled output, penalties and bias included, can
only spell text the grammar accepts, and EOS is allowed exactly when the JSON is
complete (the engine then finishes the request, ignore_eos or not: vLLM's behaviour).

- `grammar_spec(response_format)`: checks the format (the type, a json_schema's schema,
  that xgrammar can parse the schema) and returns its canonical JSON (compact, keys kept in
  the client's order, since properties are generated in that order), so a bad format is a
  ValueError at admission (a 400), never a failure mid-step (length-bounded strings become
  patterns: `_bounded_strings`). The parse is the one the engine compiles: `parsed_grammar`
  (tokenizer-independent, memoised by canonical JSON) keeps xgrammar's Grammar, so a schema
  is turned into a grammar once, not once to check and again to compile.
  json_object is the schema {"type": "object"} (as vLLM compiles it);
  json_schema's schema compiles in xgrammar's strict mode (no properties or items beyond
  those listed), whatever `strict` says, as vLLM does. Whitespace is JSON's standard
  separators only (vLLM's `disable_any_whitespace`): with any whitespace allowed the
  reference model spent all 120 of 120 tokens on spaces after "{", greedy and sampled.
- `StructuredOutput` (one per engine): xgrammar's TokenizerInfo of the engine's tokenizer,
  built on first use, its vocabulary the model's logits width (which may exceed the
  tokenizer's: the extra IDs are never allowed), stop tokens the engine's EOS ids; and
  xgrammar's GrammarCompiler, whose own cache (keyed by the grammar, least recently used
  evicted past `cache_limit_bytes`) keeps the compiled grammars: a hit costs ~0.05 ms, about
  what creating the sequence's matcher does.
  `grammar_for(response_format)` gives a new `GrammarState` per sequence.
- `GrammarState` advances lazily: before a row's mask is made it accepts the sequence's
  output tokens it has not seen yet (so the engine's postprocess needs no hook, and a
  recompute after preemption keeps it right). A token the grammar rejects means the mask
  was not applied: a bug, raised.
- `apply_grammar_masks(logits, states, rows)`: one bitmask [N, ceil(V / 32)] on the CPU,
  filled for the constrained rows only, applied in place to those rows
  (xgrammar.apply_token_bitmask_inplace; its CPU kernel, triton on CUDA).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BACKEND = "xgrammar"
JSON_OBJECT_SCHEMA = '{"type":"object"}'
_TYPES = ("text", "json_object", "json_schema")
CACHE_LIMIT_BYTES = 256 << 20  # compiled grammars kept per engine (a large vocabulary's take ~MBs each)
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[20:59:48] /project/cpp/x.cc:5082: " before xgrammar's message


def backend_identity() -> str:
    """"xgrammar 0.2.9" (for the replica's identity), "" when xgrammar is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{BACKEND} {version(BACKEND)}"
    except PackageNotFoundError:
        return ""


def is_constrained(response_format: dict | None) -> bool:
    """Cheap (per step): whether a format constrains the output (validity is grammar_spec's business)."""
    return response_format is not None and response_format.get("type") != "text"


def grammar_spec(response_format: dict | None) -> str | None:
    """The canonical JSON of the schema a format constrains to; None for plain text. ValueError when invalid."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError(f"response_format must be an object, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind not in _TYPES:
        raise ValueError(f"response_format: type must be one of {', '.join(map(repr, _TYPES))}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA  # always parses (parsed_grammar when compiled)
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ValueError("response_format: type 'json_schema' needs json_schema.schema, a JSON Schema object")
    try:
        # compact, keys in the client's order: the order of `properties` is the order the output is generated in
        canonical = json.dumps(_bounded_strings(spec["schema"]), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"response_format: json_schema.schema is not JSON: {e}") from None
    parsed_grammar(canonical)  # what xgrammar refuses is refused here
    return canonical


# JSON string characters that need no escape: what a length-bounded string may hold
_PLAIN_CHARS = r'[^"\\\u0000-\u001f]'  # regex: not a quote, a backslash or U+0000..U+001F


_LITERALS = ("const", "enum", "default", "examples")  # values, not schemas: left as they are
_NAMED = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema maps


def _bounded_strings(node, names: bool = False):
    """A copy of the schema whose length-bounded strings (minLength / maxLength, no pattern or format) are
    patterns of plain characters: xgrammar 0.2.9 compiles the lengths to a character class that excludes
    only the quote, the backslash, CR and LF, which lets raw control characters (invalid JSON; a random
    model wrote a vertical tab) into the string. Such strings then hold no escapes."""
    if isinstance(node, list):
        return [_bounded_strings(v) for v in node]
    if not isinstance(node, dict):
        return node
    if names:  # keys are property / definition names (a property may be called "default")
        return {k: _bounded_strings(v) for k, v in node.items()}
    out = {k: v if k in _LITERALS else _bounded_strings(v, names=k in _NAMED) for k, v in node.items()}
    lengths = ("minLength" in out or "maxLength" in out) and "pattern" not in out and "format" not in out
    if out.get("type") == "string" and lengths:
        low, high = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^{_PLAIN_CHARS}{{{low},{high}}}$"
    return out


@functools.lru_cache(maxsize=256)
def parsed_grammar(canonical: str):
    """The schema (canonical JSON, grammar_spec's) parsed into xgrammar's Grammar; no tokenizer needed.
    json_object's {"type": "object"} is not strict (strict would allow only {}); whitespace is JSON's
    standard separators only. Only successes are memoised (lru_cache does not cache a raise)."""
    import xgrammar as xgr

    try:
        return xgr.Grammar.from_json_schema(canonical, strict_mode=canonical != JSON_OBJECT_SCHEMA,
                                            any_whitespace=False)
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / its own errors
        raise ValueError(f"response_format: xgrammar cannot compile json_schema.schema: {_message(e)}") from None


def _message(e: Exception) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()] or [type(e).__name__]
    return _CPP_PREFIX.sub("", lines[0])[:500]


class GrammarState:
    """One sequence's grammar matcher and how many of its output tokens it has accepted."""

    def __init__(self, matcher):
        self.matcher = matcher
        self.num_accepted = 0

    def advance(self, token_ids: list[int], num_prompt_tokens: int) -> None:
        """Accept the output tokens (`token_ids[num_prompt_tokens:]`) not accepted yet."""
        for token in token_ids[num_prompt_tokens + self.num_accepted:]:
            if not self.matcher.accept_token(token):
                raise RuntimeError(f"constrained decoding: token {token} (output position {self.num_accepted}) "
                                   "is not allowed by the request's grammar")
            self.num_accepted += 1

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()


class StructuredOutput:
    """Per engine: the tokenizer as xgrammar sees it and xgrammar's compiler, which caches what it compiles."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_token_ids, cache_limit_bytes: int = CACHE_LIMIT_BYTES):
        self.hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size  # the logits' width
        self.stop_token_ids = sorted(stop_token_ids)
        self.cache_limit_bytes = cache_limit_bytes
        self._compiler = None
        self._lock = threading.Lock()  # the compiler is built once (admission runs on worker threads)

    def _get_compiler(self):
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(self.hf_tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.stop_token_ids or None)
                # xgrammar's cache is thread-safe and bounded in bytes (least recently used evicted)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True,
                                                     cache_limit_bytes=self.cache_limit_bytes)
            return self._compiler

    def cache_bytes(self) -> int:
        """What the compiled grammars kept take (0 before the first constrained request)."""
        return self._compiler.get_cache_size_bytes() if self._compiler is not None else 0

    def compiled(self, canonical: str):
        """The compiled grammar of a schema (canonical JSON): xgrammar's cache hit, or compiled now."""
        try:
            return self._get_compiler().compile_grammar(parsed_grammar(canonical))
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"response_format: xgrammar cannot compile the schema: {_message(e)}") from None

    def grammar_for(self, response_format: dict | None) -> GrammarState | None:
        """A fresh matcher for one sequence; None when the request is not constrained."""
        canonical = grammar_spec(response_format)
        if canonical is None:
            return None
        import xgrammar as xgr

        return GrammarState(xgr.GrammarMatcher(self.compiled(canonical)))


def apply_grammar_masks(x: torch.Tensor, states: list[GrammarState], rows: list[int]) -> None:
    """In place: -inf in `x[rows[i]]` wherever `states[i]` does not allow the token next."""
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(x.shape[0], x.shape[-1])  # all allowed; only `rows` get filled
    for state, row in zip(states, rows):
        if state.is_terminated:
            raise RuntimeError("constrained decoding: the grammar already ended (a stop token) but the "
                               "sequence goes on")
        state.matcher.fill_next_token_bitmask(bitmask, row)
    xgr.apply_token_bitmask_inplace(x, bitmask.to(x.device, non_blocking=True), indices=rows)
