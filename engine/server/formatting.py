"""Engine outputs -> OpenAI response bodies (whole responses and SSE chunks)."""

from __future__ import annotations

import dataclasses
import json

from engine.outputs import RequestOutput, TokenLogprob
from engine.server.model_info import ServedModel


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
        text = served.decode([item.token_id])
        tokens.append(text)
        lps.append(item.logprob)
        tops.append({served.decode([t]): lp for t, lp in item.top.items()} if item.top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(served: ServedModel, items: list[TokenLogprob]) -> dict:
    content = []
    for item in items:
        text = served.decode([item.token_id])
        top = [{"token": served.decode([t]), "logprob": lp, "bytes": list(served.decode([t]).encode())}
               for t, lp in sorted(item.top.items(), key=lambda kv: -kv[1])]
        content.append({"token": text, "logprob": item.logprob, "bytes": list(text.encode()), "top_logprobs": top})
    return {"content": content}


def _logprobs(served, opts: ResponseOptions, items: list[TokenLogprob] | None, text_offset: int):
    if opts.logprobs is None or items is None:
        return None
    if opts.kind == "completion":
        return _completion_logprobs(served, items, text_offset)
    return _chat_logprobs(served, items)


def full_response(served: ServedModel, opts: ResponseOptions, out: RequestOutput) -> dict:
    choice: dict = {"index": 0, "finish_reason": out.finish_reason,
                    "logprobs": _logprobs(served, opts, out.logprobs, 0)}
    if opts.kind == "completion":
        choice["text"] = out.text
    else:
        choice["message"] = {"role": "assistant", "content": out.text}
    body: dict = {
        "id": opts.response_id,
        "object": "text_completion" if opts.kind == "completion" else "chat.completion",
        "created": opts.created, "model": opts.model, "choices": [choice], "usage": usage(out),
    }
    if opts.return_token_ids:
        choice["token_ids"] = list(out.token_ids)
        body["prompt_token_ids"] = list(out.prompt_token_ids)
    if opts.return_metrics:
        body["metrics"] = timings(out)
    return body


class StreamFormatter:
    """Builds the SSE events of one streamed response, increment by increment."""

    def __init__(self, served: ServedModel, opts: ResponseOptions):
        self.served, self.opts = served, opts
        self.sent_tokens = 0  # output tokens already sent (to slice the cumulative logprobs)
        self.text_offset = 0
        self.first = True

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
                events.append(self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}, **extra))
                extra = {}
        if new_ids or out.new_text or out.finished:
            choice: dict = {"index": 0, "finish_reason": out.finish_reason if out.finished else None,
                            "logprobs": _logprobs(self.served, opts, items, self.text_offset)}
            if opts.kind == "completion":
                choice["text"] = out.new_text
            else:
                choice["delta"] = {"content": out.new_text} if (out.new_text or not out.finished) else {}
            if opts.return_token_ids:
                choice["token_ids"] = new_ids
            if out.finished and opts.return_metrics:
                extra["metrics"] = timings(out)
            self.text_offset += len(out.new_text)
            events.append(self._chunk(choice, **extra))
        if out.finished and opts.include_usage:
            events.append(self._chunk(None, usage=usage(out)))
        return events
