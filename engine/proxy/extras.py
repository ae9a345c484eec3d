"""What the proxy asks the upstream for beyond the client's request, and how it takes it out again.

Asked (only where the client did not set it itself):
- `return_token_ids` (completions and chat): vLLM and infersight answer with `prompt_token_ids`
  and `choices[].token_ids` (in a stream: the prompt's in the first chunk, each chunk's new ones);
- `return_prompt_text` (chat): vLLM answers with `prompt_text`, the prompt as its chat template
  rendered it (so a template difference shows in `rendered_prompt_hash`);
- `logprobs` (the sampled tokens' own logprobs, stored as `output_logprobs`): completions
  `logprobs: 0` (the chosen token's logprob, no alternatives), chat `logprobs: true, top_logprobs: 0`;
  only where the client asked for none itself. Both vLLM and infersight report the model's raw
  logprobs (before temperature / top-k / top-p).
`--no-logprobs` (a proxy setting) never asks for logprobs. An upstream that refuses a field (a 400 / 422 naming it: infersight forbids unknown fields) is
asked again without it, and never again for it.

Taken out of every response and stream chunk, as the upstream writes a field nobody asked for:
vLLM writes it as null (its response models set these fields explicitly either way), other
servers leave it out ("null" | "omit"). `logprobs` is a standard field of every choice, written
as null when not asked by both servers: it is always put back to null, never removed.
"""

from __future__ import annotations

import json

# field asked for -> the response keys it adds (top level or in a choice)
EXTRAS = {"return_token_ids": ("prompt_token_ids", "token_ids"), "return_prompt_text": ("prompt_text",),
          "logprobs": ("logprobs",)}
CHAT_ONLY = frozenset({"return_prompt_text"})
ALWAYS_NULL = frozenset({"logprobs"})  # response keys every choice carries (null when not asked)
UNASKED_STYLES = ("null", "omit")


class UpstreamExtras:
    """The extras one upstream takes; learns which it refuses."""

    def __init__(self, logprobs: bool = True) -> None:
        # not asking for logprobs is a proxy setting (`--no-logprobs`): the upstream then spends nothing
        # on them, and the sampled-traffic quality rule has nothing to read for this replica
        self.refused: set[str] = set() if logprobs else {"logprobs"}

    def ask(self, body: dict, kind: str) -> tuple[dict, frozenset[str]]:
        """(the body for the upstream, the extras the proxy added to it)."""
        added = frozenset(f for f in EXTRAS
                          if (kind == "chat" or f not in CHAT_ONLY) and f not in self.refused and _unset(body, f, kind))
        if not added:
            return body, added
        sent = {**body, **dict.fromkeys(added - {"logprobs"}, True)}
        if "logprobs" in added:  # the chosen token's logprob only: no alternatives to pay for
            sent.update({"logprobs": True, "top_logprobs": 0} if kind == "chat" else {"logprobs": 0})
        return sent, added

    def refuse(self, added: frozenset[str], error_text: str) -> frozenset[str]:
        """The added extras an error response names; remembered, so they are not asked for again."""
        named = frozenset(f for f in added if f in error_text)
        self.refused |= named
        return named


def _unset(body: dict, field: str, kind: str) -> bool:
    """Whether the client left `field` to the proxy (a completion's `logprobs: 0` is set: it asked)."""
    if field == "logprobs":
        if kind == "chat":
            return not body.get("logprobs") and body.get("top_logprobs") is None
        return body.get("logprobs") is None
    return not body.get(field)


def strip_keys(added: frozenset[str]) -> tuple[str, ...]:
    return tuple(key for f in sorted(added) for key in EXTRAS[f])


def strip(obj: dict, keys: tuple[str, ...], style: str) -> bool:
    """Take `keys` out of a response object and its choices, the upstream's way; True if anything changed."""
    changed = False
    choices = obj.get("choices")
    for container in [obj, *(c for c in choices if isinstance(c, dict))] if isinstance(choices, list) else [obj]:
        for key in keys:
            if key not in container:
                continue
            if style == "omit" and key not in ALWAYS_NULL:
                del container[key]
                changed = True
            elif container[key] is not None:
                container[key] = None
                changed = True
    return changed


def dumps_like(obj, original: bytes) -> bytes:
    """`obj` as compact JSON, escaping non-ASCII text only where the upstream's own bytes did
    (infersight's stream chunks escape it, vLLM's and infersight's whole responses do not)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=original.isascii()).encode()
