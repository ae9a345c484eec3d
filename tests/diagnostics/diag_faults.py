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
