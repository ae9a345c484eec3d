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
`--logprobs-fraction F` (a proxy setting, 0 <= F <= 1; `--no-logprobs` is F = 0) asks for logprobs on
that share of requests only, chosen by a hash of the request id (`asks_logprobs`): the same id always
gets the same choice (a retry too), and the choice depends on nothing else (not the prompt, the
workload or the replica), so the asked requests are a uniform sample of the traffic. Those not
asked store no output_logprobs. An upstream that refuses a field (a 400 / 422 naming it: infersight
forbids unknown fields) is asked again without it, and never again for it.

Taken out of every response and stream chunk, as the upstream writes a field nobody asked for:
vLLM writes it as null (its response models set these fields explicitly either way), other
servers leave it out ("null" | "omit"). `logprobs` is a standard field of every choice, written
as null when not asked by both servers: it is always put back to null, never removed.
"""

from __future__ import annotations

import hashlib
import json

# field asked for -> the response keys it adds (top level or in a choice)
EXTRAS = {"return_token_ids": ("prompt_token_ids", "token_ids"), "return_prompt_text": ("prompt_text",),
          "logprobs": ("logprobs",)}
CHAT_ONLY = frozenset({"return_prompt_text"})
ALWAYS_NULL = frozenset({"logprobs"})  # response keys every choice carries (null when not asked)
UNASKED_STYLES = ("null", "omit")


def asks_logprobs(request_id: str, fraction: float) -> bool:
    """Whether a request is one of the `fraction` the proxy asks logprobs for: the first 8 bytes of
    blake2b(request id) as a uniform number in [0, 1) below `fraction` (0: never, 1: always)."""
    if fraction >= 1.0:
        return True
    u = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big") / 2.0 ** 64
    return u < fraction


def check_fraction(fraction: float) -> float:
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:  # also NaN
        raise ValueError(f"the logprobs fraction is a share of requests in [0, 1], got {fraction!r}")
    return fraction


class UpstreamExtras:
    """The extras one upstream takes; learns which it refuses."""

    def __init__(self, logprobs_fraction: float = 1.0) -> None:
        # asking for logprobs on a share of requests only is a proxy setting (`--logprobs-fraction`): what vLLM
        # spends producing them falls with the share (engine/benchmarks/proxy_asks.py); the sampled-traffic
        # quality rule reads a per-request statistic, so a uniform sample of requests serves it (0: nothing)
        self.logprobs_fraction = check_fraction(logprobs_fraction)
        self.refused: set[str] = set()

    def ask(self, body: dict, kind: str, request_id: str = "") -> tuple[dict, frozenset[str]]:
        """(the body for the upstream, the extras the proxy added to it); logprobs only for the share of
        request ids `asks_logprobs` picks."""
        skip = set(self.refused)
        if not asks_logprobs(request_id, self.logprobs_fraction):
            skip.add("logprobs")
        added = frozenset(f for f in EXTRAS
                          if (kind == "chat" or f not in CHAT_ONLY) and f not in skip and _unset(body, f, kind))
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
