"""Checks on a request's text that must come before any tokenization.

- Every string must be valid Unicode. Python's json accepts a lone surrogate
  (`"\\ud800"`, or its raw UTF-8-style bytes ED A0 80) and yields a str the Rust
  tokenizer cannot take (it raised TypeError: a 500). Such text is a 400 naming
  the field (`prompt`, `prompt[0]`, `messages[1].content`, `stop[2]`) and the
  character position. NUL, controls, combining marks, ZWJ and RTL marks are
  valid characters and pass.
- Text that cannot fit the context is refused without tokenizing it (a 28 MB
  prompt took the tokenizer 46 s and 3 GB). No token of the vocabulary covers
  more characters than its longest entry, so a text longer than
  max_model_len x that many characters has more tokens than the context holds.
  (The bound assumes the tokenizer's normalizer deletes no characters, as
  byte-level BPE and SentencePiece tokenizers do not.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pydantic import BaseModel

from engine.serving.server.errors import APIError, first_surrogate, invalid_unicode

MIN_CHARS_PER_TOKEN = 8  # floor of the bound, for tokenizers whose vocabulary we cannot list


def _strings(value, path: str) -> Iterator[tuple[str, str]]:
    """(field path, text) of every string in a request, dict keys included."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _strings(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, (list, tuple)):
        if value and not isinstance(value[0], (str, list, tuple, dict, BaseModel)):
            return  # token IDs and numbers: nothing to check (and prompts of many IDs stay cheap)
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            key_path = f"{path}[{json.dumps(key)}]"  # json.dumps escapes a surrogate in the key itself
            yield from _strings(key, key_path)
            yield from _strings(item, key_path)


def check_unicode(request: BaseModel) -> None:
    """400 for the first string of `request` that is not valid Unicode."""
    for path, text in _strings(request, ""):
        position = first_surrogate(text)
        if position is not None:
            raise invalid_unicode(path, text, position)


def longest_token_chars(tokenizer) -> int:
    """Characters of the longest entry in the tokenizer's vocabulary (added tokens included): no token
    covers more characters of a text than that."""
    try:
        vocab = tokenizer.hf.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a listable vocabulary: the floor
        return MIN_CHARS_PER_TOKEN
    return max(MIN_CHARS_PER_TOKEN, max((len(t) for t in vocab), default=0))


def check_fits(num_chars: int, param: str, max_model_len: int, chars_per_token: int) -> None:
    """400 for text too long to fit the context whatever it tokenizes to."""
    limit = max_model_len * chars_per_token
    if num_chars > limit:
        raise APIError(f"{param}: the text is {num_chars} characters; this model's maximum context length is "
                       f"{max_model_len} tokens and no token is longer than {chars_per_token} characters, so at most "
                       f"{limit} characters can fit", param=param, code="context_length_exceeded",
                       detail={"prompt_chars": num_chars, "max_model_len": max_model_len, "max_chars": limit})


TOKENIZE_HEADROOM = 16  # /tokenize measures texts that may not fit (the loadgen sizes its prompts with it)


def check_countable(num_chars: int, param: str, max_model_len: int, chars_per_token: int) -> None:
    """400 for text too long for /tokenize to count: it answers for texts longer than the context (that is
    what it is asked to measure), up to TOKENIZE_HEADROOM times what could fit, never an unbounded one."""
    limit = TOKENIZE_HEADROOM * max_model_len * chars_per_token
    if num_chars > limit:
        raise APIError(f"{param}: the text is {num_chars} characters; /tokenize counts at most {limit} "
                       f"({TOKENIZE_HEADROOM} times what fits this model's {max_model_len}-token context)",
                       param=param, code="context_length_exceeded")
