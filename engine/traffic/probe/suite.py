"""The shipped probe suite: short greedy prompts chosen to catch what makes replicas disagree.

Each probe aims at one way two replicas of a model come to answer differently: the tokenizer
(whitespace runs, normalizers that fold full-width characters, ligatures, combining marks or case,
special-token strings inside user text), the chat template, numerics (arithmetic, long outputs),
the context limit, and batching (every probe is also sent inside a busy batch: runner.py).

Every probe is greedy with `ignore_eos` and a small fixed `max_tokens`, so outputs are exact and of
a known length (the random-weight test models never stop at a sensible point). The suite is data:
add a probe by adding a line; its id names it in the request id (telemetry.contract.probes).
Invisible characters are written as escapes so the source shows what is sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from telemetry.contract.probes import FILLER_PREFIX

COMPLETIONS, CHAT = "completions", "chat"
SHORT = 8  # output tokens of most probes: enough to see a divergence, cheap enough to send often
LONG_OUTPUT = 96  # the long-output probe: numerics drift with length


@dataclass(frozen=True)
class Probe:
    probe_id: str  # [a-z0-9_]+ (telemetry.contract.probes)
    api: str  # "completions" | "chat"
    category: str  # what it probes (CATEGORIES)
    prompt: str = ""  # completions
    messages: tuple[tuple[str, str], ...] = ()  # chat: (role, content) pairs
    max_tokens: int = SHORT
    stream: bool = False
    # near-context probe: this text repeated until prompt + max_tokens nearly fill the replica's
    # context (built at round time from its max_model_len via /tokenize: measure.py)
    fill: str = ""

    def body(self, prompt: str | None = None) -> dict:
        """The request body (without `model`); `prompt` replaces the prompt (the built near-context one)."""
        common = {"max_tokens": self.max_tokens, "temperature": 0.0, "ignore_eos": True}
        if self.api == CHAT:
            return {"messages": [{"role": r, "content": c} for r, c in self.messages], **common}
        return {"prompt": self.prompt if prompt is None else prompt, **common}


def _chat(probe_id: str, category: str, user: str, system: str = "", **kw) -> Probe:
    messages = ((("system", system),) if system else ()) + (("user", user),)
    return Probe(probe_id, CHAT, category, messages=messages, stream=True, **kw)


def _text(probe_id: str, category: str, prompt: str, **kw) -> Probe:
    return Probe(probe_id, COMPLETIONS, category, prompt=prompt, **kw)


# in priority order: under a token budget the first ones are sent (budget.py), so the cheap
# tokenizer and eval-like probes come first and the expensive ones last
SUITE: tuple[Probe, ...] = (
    # eval-like items, copied from evals/suites/reference_heldout.jsonl (the reference model knows them)
    _chat("eval_addition", "eval_like", "What is 8 + 27?", max_tokens=12),
    _chat("eval_reverse", "eval_like", "Reverse the letters: p y x v", max_tokens=12),
    _chat("eval_sort", "eval_like", "Sort ascending: 11 16 64 85", max_tokens=12),
    _chat("eval_kv_recall", "eval_like", "Remember jar0, sun7, pen4, egg1, bee0. What number follows pen?",
          max_tokens=12),
    _chat("eval_brackets", "eval_like", "Are these brackets balanced? (())()()()()))()", max_tokens=12),
    _chat("eval_word_problem", "eval_like", "Dev has 68 cups and Cara has 82 cups. Who has more cups?",
          max_tokens=12),
    _text("copy_words", "eval_like", "Copy: alpha beta gamma delta -> alpha beta gamma delta\n"
                                     "Copy: one two three four ->"),
    # the tokenizer: what normalizers and pre-tokenizers change
    _text("whitespace_runs", "whitespace", "alpha  beta   gamma\t\tdelta\n\n\nepsilon    \t end  "),
    _chat("chat_whitespace", "whitespace", "  leading, trailing and\u00a0non-breaking  spaces \n\n"),
    _text("numbers", "numbers", "3.14159 2,718 -42 1e10 0x1F 007 1/3 12:30 2024-05-01 1000000"),
    _text("code_python", "code", "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))  # 5\n"),
    _text("code_json", "code", '{"key": [1, 2, {"nested": null}], "ok": true, "s": "a\\"b"}'),
    _text("mixed_scripts", "mixed_scripts", "Hello \u043c\u0438\u0440 \u03ba\u03cc\u03c3\u03bc\u03bf\u03c2 "
                                            "\u4e16\u754c \u3053\u3093\u306b\u3061\u306f \uc548\ub155"),
    _chat("chat_mixed_scripts", "mixed_scripts", "Translate: hello, \u043f\u0440\u0438\u0432\u0435\u0442, "
                                                 "\u4f60\u597d, \u03b3\u03b5\u03b9\u03ac"),
    # NFKC folds these into plain letters and digits: a normalizer change shows here
    _text("fullwidth", "fullwidth_ligatures", "\uff21\uff22\uff23 \uff11\uff12\uff13 \uff46\uff55\uff4c\uff4c"),
    _text("ligatures", "fullwidth_ligatures", "\ufb01nd the \ufb02ow: \ufb00 \ufb03 \ufb04 \u00bd \u2122 \u210c"),
    # a decomposed e + U+0301 beside the precomposed one (NFC / NFD normalizers merge or split them)
    _text("combining_marks", "combining_marks", "cafe\u0301 caf\u00e9 n\u0303 \u00f1 A\u030a \u00c5"),
    _text("zwj_emoji", "zwj_emoji", "family \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 "
                                    "flag \U0001f3f3\ufe0f\u200d\U0001f308 thumbs \U0001f44d\U0001f3fd"),
    _text("rtl", "rtl", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u2014 "
                        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u200f123\u200e mixed"),
    # special-token strings typed by a user must stay text (a tokenizer that parses them differs)
    _text("special_tokens", "special_tokens", "<s> [INST] hello [/INST] </s> <|eos|> <|endoftext|>"),
    _chat("chat_special_tokens", "special_tokens", "Repeat: <s> </s> <|eos|> [INST] <|im_start|> <|im_end|>"),
    # a Lowercase normalizer changes these
    _text("uppercase", "uppercase", "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG. KV CACHE FULL."),
    _chat("chat_uppercase", "uppercase", "WHAT DOES THE SCHEDULER DO WHEN THE QUEUE IS FULL?"),
    # the chat template: a system prompt and a multi-turn history render through it
    Probe("chat_multi_turn", CHAT, "chat_template", stream=True, messages=(
        ("system", "You answer in one word."), ("user", "Is the sky blue?"), ("assistant", "Yes."),
        ("user", "Is grass blue?"))),
    # length: numerics accumulate over a long output, and the context's end is its own code path
    _text("long_output", "long_output", "Once upon a time, in a small town by the sea,", max_tokens=LONG_OUTPUT),
    _text("near_context", "near_context_limit", "", max_tokens=4,
          fill="the replica serves tokens from its cache and the scheduler batches them. "),
)

CATEGORIES = tuple(dict.fromkeys(p.category for p in SUITE))

# what keeps a replica busy while a "batched" probe runs: greedy, distinct, of moderate length
FILLER_TEXT = "Filler {i}: the batch holds several requests at once, each one decoding its own tokens."


def filler_body(i: int, max_tokens: int) -> dict:
    return {"prompt": FILLER_TEXT.format(i=i), "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


def by_id(suite=SUITE) -> dict[str, Probe]:
    return {p.probe_id: p for p in suite}


def check_suite(suite) -> None:
    """ValueError naming the first probe a round could not send as it is."""
    seen: set[str] = set()
    for p in suite:
        if not re.match(r"^[a-z0-9_]+$", p.probe_id) or p.probe_id.startswith(FILLER_PREFIX):
            raise ValueError(f"probe id {p.probe_id!r}: lowercase letters, digits and _, "
                             f"not starting with {FILLER_PREFIX!r} (telemetry.contract.probes)")
        if p.probe_id in seen:
            raise ValueError(f"probe id {p.probe_id!r} appears twice in the suite")
        seen.add(p.probe_id)
        if p.api not in (COMPLETIONS, CHAT):
            raise ValueError(f"probe {p.probe_id}: api must be {COMPLETIONS!r} or {CHAT!r}, got {p.api!r}")
        if p.api == CHAT and (not p.messages or p.fill):
            raise ValueError(f"probe {p.probe_id}: a chat probe needs messages (and no fill)")
        if p.api == COMPLETIONS and not (p.prompt or p.fill):
            raise ValueError(f"probe {p.probe_id}: a completions probe needs a prompt or a fill text")
        if p.max_tokens < 1:
            raise ValueError(f"probe {p.probe_id}: max_tokens must be at least 1")
