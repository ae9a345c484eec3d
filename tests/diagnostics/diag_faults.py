"""Faults introduced the ordinary way: a copy of a model directory with one tokenizer file changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def with_normalizer(src: Path, dst: Path, normalizer: dict) -> Path:
    """The model with a tokenizer.json normalizer, e.g. {"type": "Lowercase"} or {"type": "NFKC"}."""
    copy_model(src, dst)
    path = dst / "tokenizer.json"
    data = json.loads(path.read_text())
    data["normalizer"] = normalizer
    path.write_text(json.dumps(data))
    return dst


def with_chat_template(src: Path, dst: Path, template: str) -> Path:
    """The model with a different chat template (chat_template.jinja, where transformers reads it)."""
    copy_model(src, dst)
    (dst / "chat_template.jinja").write_text(template)
    return dst


# the tiny models' template with one change a person could make by mistake: a newline after each role marker
ALTERED_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


# -- real tokenizer incidents (tests/real_tokenizers): each one file of a model directory changed ------

def edit_json(src: Path, dst: Path, name: str, edit) -> Path:
    """The model with its JSON file `name` changed in place by `edit(data)` (dst may be src: a second edit)."""
    if Path(src).resolve() != Path(dst).resolve():
        copy_model(src, dst)
    path = dst / name
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, ensure_ascii=False))
    return dst


def with_tokenizer_config(src: Path, dst: Path, **changes) -> Path:
    """tokenizer_config.json with keys changed, e.g. legacy=False, add_bos_token=False."""
    return edit_json(src, dst, "tokenizer_config.json", lambda c: c.update(changes))


def _split_pre_tokenizers(data: dict) -> list[dict]:
    pre = data.get("pre_tokenizer") or {}
    found = [p for p in pre.get("pretokenizers", [pre]) if p.get("type") == "Split"]
    if not found:
        raise ValueError(f"no Split pre-tokenizer in {pre}")
    return found


def with_split_pattern(src: Path, dst: Path, pattern: str) -> Path:
    """tokenizer.json's Split pre-tokenizer (a byte-level BPE's regex) with another regex."""
    def edit(data):
        for split in _split_pre_tokenizers(data):
            split["pattern"] = {"Regex": pattern}
    return edit_json(src, dst, "tokenizer.json", edit)


def with_bpe_options(src: Path, dst: Path, **options) -> Path:
    """tokenizer.json's BPE model with options changed, e.g. ignore_merges=False."""
    def edit(data):
        if data["model"].get("type") != "BPE":
            raise ValueError(f"not a BPE model: {data['model'].get('type')}")
        data["model"].update(options)
    return edit_json(src, dst, "tokenizer.json", edit)


def without_bos(src: Path, dst: Path) -> Path:
    """The tokenizer adds no BOS before a text (post-processor and add_bos_token agree): the setup for
    clients that send prompts already rendered by the chat template, BOS included. transformers 5 takes
    BOS/EOS from tokenizer.json's post-processor when there is one (add_bos_token is then ignored)."""
    def edit(data):
        data["post_processor"] = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                                  "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                           {"Sequence": {"id": "B", "type_id": 1}}],
                                  "special_tokens": {}}
    edit_json(src, dst, "tokenizer.json", edit)
    return with_tokenizer_config(dst, dst, add_bos_token=False)
