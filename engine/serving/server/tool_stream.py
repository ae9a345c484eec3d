"""Streamed tool calls: a chat stream's content deltas rewritten into `delta.tool_calls` chunks.

`ToolStream` wraps the server's stream formatter (formatting.py): each chat chunk's `delta.content`
is fed to the choice's `ChoiceToolState`, which answers the deltas to send instead:
- content before the tool-call section passes through, less a tail that could begin the format's
  marker (held back until the next text tells);
- once the section begins, each call is sent when the parser has it whole: one delta with its
  index, id, type and name (arguments ""), then one with its arguments (the openai client joins the
  fragments); a named function (constrained output = its arguments) streams its argument fragments
  token by token after a first delta with the name;
- a section that turns out malformed is sent on as content from the end of the calls already sent
  (a whole output gives all-content then, as vLLM: the same unless a later call of several is the
  malformed one); at the end, a section that yielded no call at all is sent as content.
The parser scans the same text the whole-response path parses (tool_parsers.py), so any chunking
gives the calls the whole text gives. The last chunk's finish_reason becomes "tool_calls" where a
call was sent and the model stopped by itself.
"""

from __future__ import annotations

import json

from engine.serving.server.tool_calls import ToolPlan, call_json, new_call_id

_DATA = "data: "
_PLAIN_KEYS = {"id", "object", "created", "model", "choices"}  # a chunk holding more (ids, metrics) is kept


class ChoiceToolState:
    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of text accounted for (sent as content, or part of the section)
        self.section: int | None = None  # where the tool-call section begins
        self.raw = False  # the section was malformed: the rest is content
        self.calls = 0  # calls sent
        self.header_sent = False  # named: the first delta (id, name) is out

    def _content(self, upto: int) -> list[dict]:
        piece, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return [{"content": piece}] if piece else []

    def feed(self, new_text: str, finished: bool) -> list[dict]:
        """The deltas to send for `new_text` (finished: it is the choice's last)."""
        self.text += new_text
        plan = self.plan
        if plan.mode == "named":
            if not self.header_sent:
                self.header_sent, self.calls = True, 1
                return [{"tool_calls": [{"index": 0, **call_json(new_call_id(), plan.function, new_text)}]}]
            return [{"tool_calls": [{"index": 0, "function": {"arguments": new_text}}]}] if new_text else []
        if plan.parser is None or self.raw:
            return self._content(len(self.text))
        deltas = []
        if self.section is None:
            start = plan.parser.start(self.text)
            if start is None:
                hold = 0 if finished else plan.parser.hold(self.text)
                return self._content(len(self.text) - hold)
            deltas += self._content(start)
            self.section = start
        scan = plan.parser.scan(self.text[self.section:], final=finished)
        for k, call in enumerate(scan.calls[self.calls:], start=self.calls):
            deltas.append({"tool_calls": [{"index": k, **call_json(new_call_id(), call.name, "")}]})
            deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]})
        self.calls = len(scan.calls)
        if scan.malformed or (finished and not self.calls):
            self.raw, self.sent = True, self.section + scan.end
            deltas += self._content(len(self.text))
        return deltas


class ToolStream:
    """A formatter (`events(out) -> SSE strings`) whose chat chunks carry tool calls."""

    def __init__(self, formatter, plan: ToolPlan):
        self.formatter, self.plan = formatter, plan
        self.states: dict[int, ChoiceToolState] = {}

    def events(self, out) -> list[str]:
        return [e for event in self.formatter.events(out) for e in self._rewrite(event)]

    def _rewrite(self, event: str) -> list[str]:
        if not event.startswith(_DATA):
            return [event]
        body = json.loads(event[len(_DATA):])
        choices = body.get("choices") or []
        if len(choices) != 1 or "role" in choices[0].get("delta", {}):  # usage, or the role's first chunk
            return [event]
        choice = choices[0]
        state = self.states.setdefault(choice["index"], ChoiceToolState(self.plan))
        finished = choice.get("finish_reason") is not None
        deltas = state.feed(choice.get("delta", {}).get("content", ""), finished)
        if finished and state.calls and self.plan.mode != "named" and choice["finish_reason"] == "stop":
            choice["finish_reason"] = "tool_calls"
        if not deltas:
            if not (finished or choice.get("logprobs") or choice.get("token_ids") or set(body) - _PLAIN_KEYS):
                return []  # nothing to say yet (held back); a chunk with logprobs, ids or metrics still goes
            deltas = [{}]
        chunks = []
        for k, delta in enumerate(deltas):
            last = k == len(deltas) - 1
            part = dict(choice, delta=delta) if last else {
                "index": choice["index"], "delta": delta, "logprobs": choice.get("logprobs") if k == 0 else None,
                "finish_reason": None}
            if last and k > 0:
                part["logprobs"] = None  # sent with the first delta of this increment
            chunks.append(_DATA + json.dumps({**body, "choices": [part]}, separators=(",", ":")) + "\n\n")
        return chunks
