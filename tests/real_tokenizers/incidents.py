"""Real tokenizer incidents, each a pair of model directories (base, cand) that differ in configuration only.

Every incident names the prompts the engine is fed (text prompts are encoded with special tokens, as
the engine encodes any text; chats are rendered by the directory's template) and, for each prompt the
change reaches, where the two sides' token IDs first differ: position, both IDs, both vocabulary
entries (SentencePiece's '▁' kept). Every other prompt must come out the same on both sides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from diag_faults import (
    with_bpe_options,
    with_chat_template,
    with_normalizer,
    with_split_pattern,
    with_tokenizer_config,
    without_bos,
)
from real_models import INST_TEMPLATE

from telemetry.contract.records import chat_messages_hash, text_sha256


@dataclass(frozen=True)
class Divergence:
    position: int
    base_id: int
    cand_id: int
    base_piece: str
    cand_piece: str


def user(content: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": content},)


def key(prompt) -> str:
    """A prompt's prompt_text_hash, as the engine records it (a chat's: of its messages)."""
    return text_sha256(prompt) if isinstance(prompt, str) else chat_messages_hash(list(prompt), True)


@dataclass(frozen=True)
class Incident:
    name: str
    family: str  # "sentencepiece" | "tekken": which real model it is made from
    make: Callable[[Path, Path], tuple[Path, Path]]  # (model dir, empty dir) -> (base dir, cand dir)
    diverging: tuple[tuple[object, Divergence], ...]  # (prompt, where it diverges)
    same: tuple = ()  # prompts the change must leave alone
    why: str = ""

    @property
    def prompts(self) -> list:
        """Every prompt: texts (str) and chats (tuples of messages)."""
        return [p for p, _ in self.diverging] + list(self.same)

    @property
    def expected(self) -> dict[str, Divergence]:
        """prompt_text_hash -> where that prompt diverges."""
        return {key(p): d for p, d in self.diverging}


CHAT = user("Why is replica 3 slower?")
MULTI_TURN = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
              {"role": "user", "content": "What does the KV cache hold?"})

# the Mistral v0.1 template with a newline after the BOS: what reformatting a template over several lines
# leaks, because transformers renders with trim_blocks (a newline after {% %} goes, after {{ }} it stays)
NEWLINE_TEMPLATE = INST_TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}\n", 1)

# Tekken's regex without its `\s+(?!\S)` lookahead, as a regex engine without lookaheads (RE2, Go) forces:
# a run of spaces no longer leaves its last space to the word after it
TEKKEN_LOOKAHEAD = r"|\s+(?!\S)"


def _drop_lookahead(model: Path, dst: Path) -> Path:
    data = json.loads((model / "tokenizer.json").read_text())
    pattern = data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    if TEKKEN_LOOKAHEAD not in pattern:
        raise ValueError(f"no lookahead in {pattern}")
    return with_split_pattern(model, dst, pattern.replace(TEKKEN_LOOKAHEAD, ""))


def _cand(fault: Callable[[Path, Path], Path]):
    """base: the model as built; cand: a copy with `fault`."""
    return lambda model, root: (model, fault(model, root / "cand"))


# a SentencePiece chat divergence right after <s>: '▁[' (733) on base
AFTER_BOS = 1, 733

INCIDENTS = [
    Incident(
        # base: a deploy whose clients send prompts the template already rendered, so its tokenizer adds no
        # BOS; cand: the tokenizer as published, adding one before the template's: <s><s>[INST] ...
        "double_bos", "sentencepiece", lambda model, root: (without_bos(model, root / "base"), model),
        diverging=(("<s>[INST] Why is replica 3 slower? [/INST]", Divergence(*AFTER_BOS, 1, "▁[", "<s>")),
                   ("<s>[INST] What does the KV cache hold? [/INST]", Divergence(*AFTER_BOS, 1, "▁[", "<s>"))),
        same=(CHAT,),  # the engine's chat path adds no BOS of its own: the template's only
        why="the template writes <s> and the tokenizer's post-processor adds another"),
    Incident(
        # transformers' LlamaTokenizer rebuilds the Metaspace pre-tokenizer from the flag: legacy=False
        # prepends '▁' to the first chunk only, so the text after a special token loses its space
        "legacy_false", "sentencepiece", _cand(lambda m, d: with_tokenizer_config(m, d, legacy=False)),
        diverging=((CHAT, Divergence(*AFTER_BOS, 28792, "▁[", "[")),
                   (MULTI_TURN, Divergence(*AFTER_BOS, 28792, "▁[", "["))),
        same=("Why is replica 3 slower?",),  # no special token in the text, no difference
        why="legacy=False: no space after <s> before [INST]"),
    Incident(
        "template_newline", "sentencepiece", _cand(lambda m, d: with_chat_template(m, d, NEWLINE_TEMPLATE)),
        diverging=((CHAT, Divergence(*AFTER_BOS, 28705, "▁[", "▁")),
                   (MULTI_TURN, Divergence(*AFTER_BOS, 28705, "▁[", "▁"))),
        same=("Why is replica 3 slower?",),
        why="the template leaks a newline after <s>: '▁', '<0x0A>', '[' where '▁[' was"),
    Incident(
        "nfkc_normalizer", "tekken", _cand(lambda m, d: with_normalizer(m, d, {"type": "NFKC"})),
        diverging=(("Latency doubled… again", Divergence(5, 1510, 2880, "âĢ¦", "...")),
                   ("Wait… what?", Divergence(2, 1510, 2880, "âĢ¦", "...")),
                   ("x² + y² ≤ 10", Divergence(2, 16077, 1050, "Â²", "2"))),
        same=("Why is replica 3 slower?", CHAT),
        why="NFKC folds the ellipsis into three dots and the superscript into a digit"),
    Incident(
        "split_regex", "tekken", _cand(_drop_lookahead),
        diverging=(("def add(a, b):\n    return a + b", Divergence(7, 1293, 1260, "ĠĠĠ", "ĠĠĠĠ")),
                   ("x  =  1", Divergence(2, 1032, 1256, "Ġ", "ĠĠ")),
                   ("The KV cache  is full.", Divergence(5, 1032, 1256, "Ġ", "ĠĠ"))),
        same=("Why is replica 3 slower?", CHAT),
        why="without the lookahead a run of spaces is one token and the next word loses its space"),
    Incident(
        "ignore_merges_false", "tekken", _cand(lambda m, d: with_bpe_options(m, d, ignore_merges=False)),
        diverging=(),
        same=("Why is replica 3 slower?", "Latency doubled… again", "def add(a, b):\n    return a + b", CHAT),
        why="every Tekken token is reachable through its merges: whole-word lookup changes no token, "
            "only the tokenizer's hash"),
]

BY_NAME = {i.name: i for i in INCIDENTS}
