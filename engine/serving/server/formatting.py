"""Engine outputs -> OpenAI response bodies (whole responses and SSE chunks)."""

from __future__ import annotations

import dataclasses
import json

from engine.core.outputs import RequestOutput, TokenLogprob
from engine.serving.server import choice_fields
from engine.serving.server.choices import GroupOutput, kept_choices
from engine.serving.server.model_info import ServedModel


@dataclasses.dataclass
class ResponseOptions:
    kind: str  # "completion" | "chat"
    response_id: str
    created: int
    model: str
    return_token_ids: bool
    return_metrics: bool
    logprobs: int | None  # top-n asked, None: no logprobs
    include_usage: bool = False
    n: int = 1  # choices per prompt
    best_of: int = 1  # samples per prompt
    echo_texts: list[str] | None = None  # completions' echo: each prompt's text
    echo_only: bool = False  # echo with max_tokens 0: the prompt alone, the engine's one token not shown
    skip_special_tokens: bool = True
    show_prompt_logprobs: bool = True  # False: the engine computed them for echo only
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    system_fingerprint: str | None = None


def with_choices(opts: ResponseOptions, served: ServedModel, admitted, req) -> ResponseOptions:
    """The options that depend on the admitted request: n / best_of, echo, stop reasons, fingerprint."""
    sp = admitted.sampling_params
    prompts = [admitted.engine_prompt, *(p for p, _ in admitted.more_prompts)]
    echo = ([p.text if p.kind == "text" else served.decode(p.token_ids) for p in prompts]
            if admitted.echo else None)
    return dataclasses.replace(
        opts, n=admitted.n, best_of=admitted.best_of, echo_texts=echo,
        echo_only=admitted.echo_only,
        skip_special_tokens=admitted.skip_special_tokens,
        show_prompt_logprobs=getattr(req, "prompt_logprobs", None) is not None,
        stop=list(sp.stop), stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos,
        system_fingerprint=choice_fields.system_fingerprint(served))


def usage(out: RequestOutput) -> dict:
    cached = out.metrics.cached_tokens if out.metrics else 0
    return {
        "prompt_tokens": len(out.prompt_token_ids),
        "completion_tokens": len(out.token_ids),
        "total_tokens": len(out.prompt_token_ids) + len(out.token_ids),
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def timings(out: RequestOutput) -> dict | None:
    return dataclasses.asdict(out.metrics) if out.metrics is not None else None


def _completion_logprobs(served: ServedModel, items: list[TokenLogprob], offset: int) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    for item in items:
        tokens.append(choice_fields.token_piece(served, item.token_id))  # "</s>", not ""
        lps.append(item.logprob)
        tops.append(choice_fields.completion_top_logprobs(served, item))
        offsets.append(offset)
        offset += len(served.decode([item.token_id]))
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(served: ServedModel, items: list[TokenLogprob]) -> dict:
    content = []
    for item in items:
        text = choice_fields.token_piece(served, item.token_id)
        top = [{"token": choice_fields.token_piece(served, t), "logprob": lp,
                "bytes": list(choice_fields.token_piece(served, t).encode())}
               for t, lp in sorted(item.top.items(), key=lambda kv: -kv[1])]
        content.append({"token": text, "logprob": item.logprob, "bytes": list(text.encode()), "top_logprobs": top})
    return {"content": content}


def _rank(lp: float, top: dict[int, float]) -> int | None:
    """The 1-based rank of a logprob among the top-n computed; None when it is below them all (unknown)."""
    if top and lp >= min(top.values()):
        return 1 + sum(v > lp for v in top.values())
    return None


def prompt_logprobs(served: ServedModel, items: list[TokenLogprob | None]) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then {token id: {logprob, rank, decoded_token}}
    holding the prompt token and the top-n alternatives asked."""
    out: list[dict | None] = []
    for item in items:
        if item is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": v, "rank": r, "decoded_token": served.decode([t])}
                 for r, (t, v) in enumerate(sorted(item.top.items(), key=lambda kv: -kv[1]), 1)}
        entry[str(item.token_id)] = {"logprob": item.logprob, "rank": _rank(item.logprob, item.top),
                                     "decoded_token": served.decode([item.token_id])}
        out.append(entry)
    return out


def _logprobs(served, opts: ResponseOptions, items: list[TokenLogprob] | None, text_offset: int):
    if opts.logprobs is None or items is None:
        return None
    if opts.echo_only:
        items = []
    if opts.kind == "completion":
        return _completion_logprobs(served, items, text_offset)
    return _chat_logprobs(served, items)


def _text(served, opts: ResponseOptions, out: RequestOutput) -> str:
    if opts.echo_only:
        return ""
    if opts.skip_special_tokens:
        return out.text
    return choice_fields.text_with_specials(served, out, opts.stop, opts.stop_token_ids, opts.ignore_eos)


def _stop_reason(served, opts: ResponseOptions, out: RequestOutput):
    return choice_fields.stop_reason(served, out, opts.stop, opts.stop_token_ids, opts.ignore_eos)


def _echo(opts: ResponseOptions, prompt: int) -> str | None:
    return opts.echo_texts[prompt] if opts.echo_texts is not None else None


def _echo_logprobs(served, out: RequestOutput, echo: str, logprobs: dict | None) -> dict | None:
    """The prompt's logprobs, then the output's (their offsets moved past the echoed prompt)."""
    if logprobs is None:
        return None
    head = choice_fields.echo_completion_logprobs(served, out)
    return {"tokens": head["tokens"] + logprobs["tokens"],
            "token_logprobs": head["token_logprobs"] + logprobs["token_logprobs"],
            "top_logprobs": head["top_logprobs"] + logprobs["top_logprobs"],
            "text_offset": head["text_offset"] + [len(echo) + o for o in logprobs["text_offset"]]}


def _choice(served, opts: ResponseOptions, out: RequestOutput, index: int) -> dict:
    choice: dict = {"index": index, "finish_reason": out.finish_reason,
                    "stop_reason": _stop_reason(served, opts, out),
                    "logprobs": _logprobs(served, opts, out.logprobs, 0)}
    if opts.kind == "completion":
        choice["text"] = _text(served, opts, out)
        echo = _echo(opts, index // opts.n)
        if echo is not None:
            choice["text"] = echo + choice["text"]
            choice["logprobs"] = _echo_logprobs(served, out, echo, choice["logprobs"])
        if out.prompt_logprobs is not None and opts.show_prompt_logprobs:
            choice["prompt_logprobs"] = prompt_logprobs(served, out.prompt_logprobs)
    else:
        choice["message"] = {"role": "assistant", "content": _text(served, opts, out)}
    if opts.return_token_ids:
        choice["token_ids"] = list(out.token_ids)
    return choice


def group_usage(finals: list[RequestOutput], best_of: int) -> dict:
    """Every sample's output tokens; each prompt's tokens once (its first sample's)."""
    prompt = sum(len(f.prompt_token_ids) for f in finals[::best_of])
    completion = sum(len(f.token_ids) for f in finals)
    cached = sum(f.metrics.cached_tokens for f in finals[::best_of] if f.metrics)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def full_response(served: ServedModel, opts: ResponseOptions, out: RequestOutput | GroupOutput) -> dict:
    finals = out.finals if isinstance(out, GroupOutput) else [out]
    kept = kept_choices(finals, opts.best_of, opts.n)
    body: dict = {
        "id": opts.response_id,
        "object": "text_completion" if opts.kind == "completion" else "chat.completion",
        "created": opts.created, "model": opts.model,
        "choices": [_choice(served, opts, o, i) for i, o in enumerate(kept)],
        "usage": group_usage(finals, opts.best_of), "system_fingerprint": opts.system_fingerprint,
    }
    if opts.return_token_ids and len(finals) == opts.best_of:  # one prompt: its token IDs
        body["prompt_token_ids"] = list(finals[0].prompt_token_ids)
    if opts.return_metrics:
        body["metrics"] = timings(finals[0])
    return body


def _fingerprint(opts: ResponseOptions) -> dict:
    """A stream's last chunk carries the replica's system_fingerprint, as vLLM's does (and the whole
    response's body)."""
    return {"system_fingerprint": opts.system_fingerprint} if opts.system_fingerprint is not None else {}


class StreamFormatter:
    """Builds the SSE events of one streamed response, increment by increment."""

    def __init__(self, served: ServedModel, opts: ResponseOptions, index: int = 0, usage: bool = True):
        self.served, self.opts = served, opts
        self.index = index  # the choice's index (a group's sample k: best_of == n when streamed)
        self.usage = usage  # False: a group sends the summed usage itself
        self.sent_chars = 0  # skip_special_tokens=False: the text sent of the decode kept here
        self.sent_tokens = 0  # output tokens already sent (to slice the cumulative logprobs)
        self.text_offset = 0
        self.first = True
        self.sent_prompt_logprobs = False

    def _chunk(self, choice: dict | None, **extra) -> str:
        body = {
            "id": self.opts.response_id,
            "object": "text_completion" if self.opts.kind == "completion" else "chat.completion.chunk",
            "created": self.opts.created, "model": self.opts.model,
            "choices": [choice] if choice is not None else [],
        }
        body.update(extra)
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    def events(self, out: RequestOutput) -> list[str]:
        opts, events = self.opts, []
        new_ids = list(out.new_token_ids)
        start = self.sent_tokens
        self.sent_tokens = len(out.token_ids)
        items = out.logprobs[start:self.sent_tokens] if out.logprobs is not None else None
        extra = {}
        if self.first:
            self.first = False
            if opts.return_token_ids:
                extra["prompt_token_ids"] = list(out.prompt_token_ids)
            if opts.kind == "chat":  # the role goes first, on its own, as OpenAI does it
                events.append(self._chunk({"index": self.index, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}, **extra))
                extra = {}
        new_text = self._new_text(out)
        echo = _echo(opts, self.index // opts.n) if self.text_offset == 0 and not self.sent_chars else None
        if new_ids or new_text or out.finished:
            choice: dict = {"index": self.index, "finish_reason": out.finish_reason if out.finished else None,
                            "logprobs": _logprobs(self.served, opts, items, self.text_offset)}
            if out.finished:
                choice["stop_reason"] = _stop_reason(self.served, opts, out)
            elif opts.kind == "completion":  # vLLM's completion chunks all carry it (its chat chunks do not)
                choice["stop_reason"] = None
            if opts.kind == "completion":
                choice["text"] = new_text
                if echo is not None:  # the prompt first, once
                    choice["text"] = echo + new_text
                    choice["logprobs"] = _echo_logprobs(self.served, out, echo, choice["logprobs"])
                if (out.prompt_logprobs is not None and opts.show_prompt_logprobs
                        and not self.sent_prompt_logprobs):  # once, as vLLM does
                    choice["prompt_logprobs"] = prompt_logprobs(self.served, out.prompt_logprobs)
                    self.sent_prompt_logprobs = True
            else:
                choice["delta"] = {"content": new_text} if (new_text or not out.finished) else {}
            if opts.return_token_ids:
                choice["token_ids"] = new_ids
            if out.finished and opts.return_metrics:
                extra["metrics"] = timings(out)
            if out.finished and not opts.include_usage:  # else the usage chunk is the last: it carries it
                extra.update(_fingerprint(opts))
            self.text_offset += len(new_text) + len(echo or "")
            events.append(self._chunk(choice, **extra))
        if out.finished and opts.include_usage and self.usage:
            events.append(self._chunk(None, usage=usage(out), **_fingerprint(opts)))
        return events

    def _new_text(self, out: RequestOutput) -> str:
        if self.opts.echo_only:
            return ""
        if self.opts.skip_special_tokens:
            return out.new_text
        # special tokens kept: the output decoded again; an incomplete character at the end waits for the
        # next token, and so does a tail that could still begin a stop string: the final text is cut
        # before the first stop string (choice_fields.text_with_specials), and nothing sent runs past it
        if out.finished:
            text = _text(self.served, self.opts, out)
        else:
            text = self.served.tokenizer.decode(list(out.token_ids), skip_special_tokens=False)
            if text.endswith("\ufffd"):
                return ""
            if self.opts.stop:
                cuts = [text.find(s) for s in self.opts.stop if s in text]
                text = text[:min(cuts)] if cuts else text[:max(0, len(text) - max(map(len, self.opts.stop)) + 1)]
        new = text[self.sent_chars:]
        self.sent_chars = max(self.sent_chars, len(text))
        return new


class GroupStreamFormatter:
    """The SSE events of a streamed group (n > 1 or several prompts): one StreamFormatter per choice,
    the usage summed over all when the last one finishes."""

    def __init__(self, served: ServedModel, opts: ResponseOptions, num_samples: int):
        self.opts = opts
        self.parts = [StreamFormatter(served, opts, k, usage=False) for k in range(num_samples)]

    def events(self, group: GroupOutput) -> list[str]:
        events = self.parts[group.index].events(group.out)
        if group.finished and self.opts.include_usage:
            events.append(self.parts[0]._chunk(None, usage=group_usage(group.finals, self.opts.best_of),
                                               **_fingerprint(self.opts)))
        return events
