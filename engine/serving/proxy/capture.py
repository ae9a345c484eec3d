"""What a response showed of its request, as it passed through: token IDs, text, and when each token came.

One `ResponseCapture` per proxied request, fed every stream chunk (`on_chunk`, with the time it
arrived) or the whole response (`on_response`). It reads both layouts in use: `prompt_token_ids`
at the top level (infersight; vLLM's chat) or in the choice (vLLM's completions), and
`choices[].token_ids` as the whole output (a response) or the chunk's new tokens (a stream).
A chunk without token IDs that carries text counts as one token, as the load generator counts it.
The sampled tokens' logprobs (`choices[].logprobs`: a completion's `token_logprobs`, a chat's
`content[].logprob`) are collected the same way, whole or per chunk. A choice's `prompt_logprobs` (asked
by the client: the cross-scorer's teacher-forced rescore requests, engine/traffic/probe/rescore.py) is
vLLM's layout, None for the first prompt token then {token id: {logprob, rank, decoded_token}} holding the
prompt token and any alternatives; it comes once (a stream's first chunk) and is kept as the prompt
token's own logprob at each position after the first, which is what the rescore diagnostics read.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ChoiceCapture:
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    upstream_output_ids: bool = False  # the upstream sent the output's token IDs
    token_times: list[float] = field(default_factory=list)  # when each output token arrived (epoch seconds)
    output_logprobs: list[float] = field(default_factory=list)  # the sampled tokens' logprobs, where given
    prompt_logprobs: list[dict | None] | None = None  # as the upstream wrote them (see prompt_token_logprobs)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    counted_tokens: int = 0  # output tokens seen (by ID, or one per text chunk without IDs)


@dataclass
class ResponseCapture:
    kind: str  # "completion" | "chat"
    arrival_time: float
    streamed: bool = False
    prompt_token_ids: list[int] | None = None  # top-level
    prompt_text: str | None = None  # a chat's rendered prompt, when the upstream returned it
    usage: dict | None = None
    choices: dict[int, ChoiceCapture] = field(default_factory=dict)
    finish_time: float = 0.0
    error: str = ""
    complete: bool = False  # the whole response (or the stream up to [DONE]) came through

    def _choice(self, index) -> ChoiceCapture:
        return self.choices.setdefault(int(index) if isinstance(index, int) else 0, ChoiceCapture())

    def _top(self, body: dict) -> None:
        if isinstance(body.get("prompt_token_ids"), list):
            self.prompt_token_ids = list(body["prompt_token_ids"])
        if isinstance(body.get("prompt_text"), str):
            self.prompt_text = body["prompt_text"]
        if isinstance(body.get("usage"), dict):
            self.usage = body["usage"]
        error = body.get("error")
        if error:
            self.error = str(error.get("message", error) if isinstance(error, dict) else error)

    def _text(self, choice: dict, delta: bool) -> str:
        if self.kind == "completion":
            text = choice.get("text")
        else:
            text = (choice.get("delta") if delta else choice.get("message")) or {}
            text = text.get("content") if isinstance(text, dict) else None
        return text if isinstance(text, str) else ""

    def _logprobs(self, choice: dict) -> list[float]:
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            return []
        if self.kind == "completion":
            values = lp.get("token_logprobs")
        else:
            values = [c.get("logprob") for c in lp.get("content") or [] if isinstance(c, dict)]
        return [float(v) for v in values or [] if isinstance(v, (int, float))]

    @staticmethod
    def _prompt_logprobs(c: ChoiceCapture, choice: dict) -> None:
        if isinstance(choice.get("prompt_logprobs"), list) and c.prompt_logprobs is None:
            c.prompt_logprobs = list(choice["prompt_logprobs"])

    def on_chunk(self, chunk: dict, now: float) -> None:
        self.streamed = True
        self._top(chunk)
        for raw in chunk.get("choices") or []:
            if not isinstance(raw, dict):
                continue
            c = self._choice(raw.get("index", 0))
            if isinstance(raw.get("prompt_token_ids"), list):
                c.prompt_token_ids = list(raw["prompt_token_ids"])
            text = self._text(raw, delta=True)
            ids = raw.get("token_ids")
            if isinstance(ids, list):
                c.upstream_output_ids = True
                c.output_token_ids += ids
                new = len(ids)
            else:
                new = 1 if text else 0
            if new:
                c.token_times += [now] * new
                c.counted_tokens += new
            c.text.append(text)
            c.output_logprobs += self._logprobs(raw)
            self._prompt_logprobs(c, raw)
            if raw.get("finish_reason"):
                c.finish_reason = str(raw["finish_reason"])

    def on_response(self, body: dict, now: float) -> None:
        """A whole (non-streamed) response: its tokens' own times are unknown, only the finish."""
        self._top(body)
        for raw in body.get("choices") or []:
            if not isinstance(raw, dict):
                continue
            c = self._choice(raw.get("index", 0))
            if isinstance(raw.get("prompt_token_ids"), list):
                c.prompt_token_ids = list(raw["prompt_token_ids"])
            if isinstance(raw.get("token_ids"), list):
                c.upstream_output_ids = True
                c.output_token_ids = list(raw["token_ids"])
            c.text.append(self._text(raw, delta=False))
            c.output_logprobs = self._logprobs(raw)
            self._prompt_logprobs(c, raw)
            c.counted_tokens = len(c.output_token_ids)
            if raw.get("finish_reason"):
                c.finish_reason = str(raw["finish_reason"])
        self.finish_time = now
        self.complete = True


def prompt_token_logprobs(entries: list[dict | None] | None, prompt_ids: list[int]) -> list[float]:
    """Each prompt token's own logprob after the first (len(prompt_ids) - 1 values), read from the
    upstream's `prompt_logprobs` by the token's ID; [] where any position lacks it (never a partial row)."""
    if not entries or len(entries) != len(prompt_ids) or len(prompt_ids) < 2:
        return []
    out = []
    for entry, token in zip(entries[1:], prompt_ids[1:]):
        item = entry.get(str(token)) if isinstance(entry, dict) else None
        value = item.get("logprob") if isinstance(item, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return []
        out.append(float(value))
    return out
