"""Per-choice fields vLLM's and OpenAI's clients read, computed from an engine output.

- `stop_reason` (vLLM): the stop token ID or stop string that ended the choice, None for EOS or
  length. The engine checks EOS first, then stop_token_ids, then stop strings; so does this. The
  stop string is found where the engine cut the text: its detokenizer's text is the full decode
  of the output, so the decode past `out.text` starts with the stop string that matched.
- `skip_special_tokens=False`: the output decoded again with special tokens kept (the final stop
  token left out, as the engine leaves it out), cut at the stop string as the engine cuts.
- `token_piece`: a logprobs entry's token text, special tokens shown ("</s>", not "").
- `echo`: the prompt's text and logprobs before the output's (first prompt token: None).
- `completion_top_logprobs`: a completion's `top_logprobs` entry: the token itself, then the top-n
  asked (OpenAI's "up to logprobs + 1" entries, as vLLM writes them), so a token outside the top-n
  still shows its own logprob there.
- `system_fingerprint`: the replica's identity, a hash of its weights hash and config hash.
"""

from __future__ import annotations

import hashlib

from engine.core.outputs import RequestOutput


def _eos_ids(served) -> set[int]:
    try:
        return set(served.engine.engine.eos_token_ids)
    except AttributeError:  # a served model without an in-process engine
        return set()


def _stopped_by_token(served, out: RequestOutput, stop_token_ids, ignore_eos: bool) -> tuple[bool, int | None]:
    """(the last token ended the choice, the stop token ID to report)."""
    if out.finish_reason != "stop" or not out.token_ids:
        return False, None
    last = out.token_ids[-1]
    if last in _eos_ids(served) and not ignore_eos:
        return True, None
    if last in stop_token_ids:
        return True, last
    return False, None


def stop_reason(served, out: RequestOutput, stop: list[str], stop_token_ids: list[int], ignore_eos: bool):
    by_token, token = _stopped_by_token(served, out, stop_token_ids, ignore_eos)
    if by_token or out.finish_reason != "stop" or not stop:
        return token
    rest = served.decode(list(out.token_ids))[len(out.text):]
    return next((s for s in stop if rest.startswith(s)), None)


def text_with_specials(served, out: RequestOutput, stop: list[str], stop_token_ids: list[int],
                       ignore_eos: bool) -> str:
    ids = list(out.token_ids)
    if _stopped_by_token(served, out, stop_token_ids, ignore_eos)[0]:
        ids = ids[:-1]
    text = served.tokenizer.decode(ids, skip_special_tokens=False)
    cuts = [text.find(s) for s in stop if s in text]
    return text[:min(cuts)] if cuts else text


def token_piece(served, token_id: int) -> str:
    return served.tokenizer.decode([token_id], skip_special_tokens=False)


def completion_top_logprobs(served, item) -> dict[str, float]:
    """{piece: logprob} of the token itself, then of the top-n in rank order. Two tokens with one piece (byte
    tokens of an incomplete character both read "\ufffd") keep the first: the token itself, or the higher."""
    ranked = sorted(item.top.items(), key=lambda kv: -kv[1]) if item.top else []
    out: dict[str, float] = {}
    for t, lp in [(item.token_id, item.logprob), *ranked]:
        out.setdefault(token_piece(served, t), lp)
    return out


def echo_completion_logprobs(served, out: RequestOutput) -> dict:
    """The prompt's part of an echoed choice's logprobs: None for the first token, as OpenAI."""
    tokens, lps, tops, offsets, offset = [], [], [], [], 0
    items = out.prompt_logprobs or []
    for k, token_id in enumerate(out.prompt_token_ids):
        item = items[k] if k < len(items) else None
        text = token_piece(served, token_id)
        tokens.append(text)
        lps.append(None if item is None else item.logprob)
        tops.append(None if item is None else completion_top_logprobs(served, item))
        offsets.append(offset)
        offset += len(served.decode([token_id]))
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def system_fingerprint(served) -> str | None:
    try:
        record = served.engine.engine.replica_record
    except AttributeError:
        return None
    identity = f"{record.weights_hash}:{record.config_hash}"
    return "fp_" + hashlib.sha256(identity.encode()).hexdigest()[:16]
