"""`serve --chat-template` as vLLM takes it: a file's path or the template itself; the template every chat
is rendered with, its hash the replica's; one that can be neither refused before the model loads."""

from __future__ import annotations

import argparse
import hashlib

import pytest

from engine.core.config import EngineConfig
from engine.serving.server import cli as serve_cli
from engine.serving.server.engine_args import engine_config_from_args
from engine.core.tokenization import load_chat_template

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
MESSAGES = [{"role": "user", "content": "hi"}]


def _serve_args(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_file_or_the_template_itself(tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE
    with pytest.raises(ValueError, match="'no-such-template.jinja': cannot read it as a file"):
        load_chat_template("no-such-template.jinja")


def test_the_engine_renders_chats_with_it_and_its_hash_is_the_replicas(tiny_llama, tmp_path):
    from engine.core.engine import LLMEngine

    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    config = engine_config_from_args(str(tiny_llama), _serve_args("--model", str(tiny_llama), "--chat-template",
                                                                  str(path), "--num-kv-blocks", "16"))
    engine = LLMEngine(config)
    text = engine.tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert text == "[user] hi\n[assistant] "
    assert engine.replica_record.chat_template_hash == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    plain = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=16))
    assert plain.replica_record.chat_template_hash not in ("", engine.replica_record.chat_template_hash)


def test_serve_refuses_a_template_it_cannot_read_before_loading_the_model(tiny_llama, capsys):
    args = _serve_args("--model", str(tiny_llama), "--chat-template", "missing.jinja")
    assert serve_cli.run(args) == 2
    assert "chat_template 'missing.jinja': cannot read it as a file" in capsys.readouterr().err
