"""What the proxy asks the upstream for beyond the client's request, and how it takes it out again.

Asked (only where the client did not set it itself):
- `return_token_ids` (completions and chat): vLLM and infersight answer with `prompt_token_ids`
  and `choices[].token_ids` (in a stream: the prompt's in the first chunk, each chunk's new ones);
- `return_prompt_text` (chat): vLLM answers with `prompt_text`, the prompt as its chat template
  rendered it (so a template difference shows in `rendered_prompt_hash`).
An upstream that refuses a field (a 400 / 422 naming it: infersight forbids unknown fields) is
asked again without it, and never again for it.

Taken out of every response and stream chunk, as the upstream writes a field nobody asked for:
vLLM writes it as null (its response models set these fields explicitly either way), other
servers leave it out ("null" | "omit").
"""

from __future__ import annotations

import json

# field asked for -> the response keys it adds (top level or in a choice)
EXTRAS = {"return_token_ids": ("prompt_token_ids", "token_ids"), "return_prompt_text": ("prompt_text",)}
CHAT_ONLY = frozenset({"return_prompt_text"})
UNASKED_STYLES = ("null", "omit")


class UpstreamExtras:
    """The extras one upstream takes; learns which it refuses."""

    def __init__(self) -> None:
        self.refused: set[str] = set()

    def ask(self, body: dict, kind: str) -> tuple[dict, frozenset[str]]:
        """(the body for the upstream, the extras the proxy added to it)."""
        added = frozenset(f for f in EXTRAS
                          if (kind == "chat" or f not in CHAT_ONLY) and f not in self.refused and not body.get(f))
        return ({**body, **dict.fromkeys(added, True)} if added else body), added

    def refuse(self, added: frozenset[str], error_text: str) -> frozenset[str]:
        """The added extras an error response names; remembered, so they are not asked for again."""
        named = frozenset(f for f in added if f in error_text)
        self.refused |= named
        return named


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
            if style == "omit":
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
