"""The vLLM adapter's parts that need no vLLM: identity hashes the engine's way, the switch, config JSON."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.core.models import load_model
from engine.core.tokenization import Tokenizer
from engine.serving.vllm_adapter import launch, plugin
from engine.serving.vllm_adapter.config_json import config_document, config_hash, jsonable
from engine.serving.vllm_adapter.identity import chat_template_argument, local_dir, model_name, weights_hash
from engine.serving.vllm_adapter.request_ids import proxy_request_id, vllm_request_id
from engine.serving.vllm_adapter.settings import SettingsError, read_settings
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE


@pytest.mark.parametrize("shards", [None, "20KB"])
def test_weights_hash_is_the_loaders(tiny_model_factory, shards):
    model_dir = tiny_model_factory("llama", max_shard_size=shards) if shards else tiny_model_factory("qwen3")
    assert weights_hash(model_dir) == load_model(model_dir).weights_hash
    if shards:
        assert len(list(Path(model_dir).glob("*.safetensors"))) > 1


def test_reference_model_identity_matches_the_engine():
    tokenizer = Tokenizer(REFERENCE)
    assert weights_hash(REFERENCE) == load_model(REFERENCE).weights_hash
    assert tokenizer.tokenizer_hash and tokenizer.chat_template_hash


def test_chat_template_argument_forms():
    assert chat_template_argument(["api_server", "--model", "m"]) is None
    assert chat_template_argument(["x", "--chat-template", "/t.jinja", "--port", "1"]) == "/t.jinja"
    assert chat_template_argument(["x", "--chat-template={{ messages }}"]) == "{{ messages }}"


def test_model_name_follows_the_engine():
    # vLLM's default served name is the path: the directory's name, as infersight's engine names it
    assert model_name(str(REFERENCE), str(REFERENCE), local_dir(str(REFERENCE))) == "target"
    assert model_name("prod-llama", str(REFERENCE), local_dir(str(REFERENCE))) == "prod-llama"
    assert local_dir("no-such-org/no-such-model") == ""  # offline: a hub id not cached here


def test_settings_from_environment_and_vllm_args():
    env = {"INFERSIGHT_STORE": "http://w:pw@127.0.0.1:1/infersight", "INFERSIGHT_REPLICA_ID": "v0",
           "INFERSIGHT_LABELS": '{"fleet": "a"}'}
    s = read_settings(None, env)
    assert s.enabled and s.store == env["INFERSIGHT_STORE"] and s.replica_id == "v0" and s.labels == {"fleet": "a"}
    assert s.replica_for_engine(0) == "v0" and s.replica_for_engine(2) == "v0-engine2"
    s = read_settings({"infersight": {"replica_id": "from-args", "spool_dir": "/tmp/s"}}, env)
    assert (s.replica_id, s.spool_dir, s.store) == ("from-args", "/tmp/s", env["INFERSIGHT_STORE"])
    off = read_settings({}, {})
    assert not off.enabled and off.replica_id.startswith("vllm-")


@pytest.mark.parametrize("config, env, message", [
    ({"infersight": {"stor": "http://x"}}, {}, "unknown keys ['stor']"),
    ({"infersight": "http://x"}, {}, "must be an object"),
    ({}, {"INFERSIGHT_STORE": "/var/lib/store"}, "expected a ClickHouse HTTP URL"),
    ({}, {"INFERSIGHT_STORE": "http://x", "INFERSIGHT_LABELS": "[1]"}, "labels must be a JSON object"),
])
def test_settings_errors_are_clear(config, env, message):
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_settings(config, env)


def test_request_ids_as_vllm_names_them():
    assert vllm_request_id("/v1/completions", "abc") == "cmpl-abc-0"
    assert vllm_request_id("/v1/completions", "abc", 2) == "cmpl-abc-2"
    assert vllm_request_id("/v1/chat/completions", "abc") == "chatcmpl-abc"
    with pytest.raises(ValueError, match="unknown endpoint"):
        vllm_request_id("/v1/embeddings", "abc")


@pytest.mark.parametrize("base", ["abc", "a-b-7", "0f3e9c", "x-0"])
def test_the_proxys_row_id_is_recovered_from_every_engine_id(base):
    assert proxy_request_id(vllm_request_id("/v1/completions", base)) == base
    assert proxy_request_id(vllm_request_id("/v1/completions", base, 3)) == f"{base}-3"  # a list's 4th prompt
    assert proxy_request_id(vllm_request_id("/v1/chat/completions", base)) == base
    assert proxy_request_id("7") == "7"  # the offline LLM's ids: no proxy, kept as they are
    assert proxy_request_id("cmpl-") == "cmpl-"


class Mode(enum.Enum):
    EAGER = 1


class Opaque:
    pass


@dataclass
class Inner:
    mode: Mode = Mode.EAGER
    path: Path = Path("/m")
    tags: frozenset = frozenset({"b", "a"})
    _private: int = 7
    handle: object = field(default_factory=Opaque)


@dataclass
class Outer:
    model_config: Inner = field(default_factory=Inner)
    instance_id: str = "random-1"
    additional_config: dict = field(default_factory=lambda: {"infersight": {"store": "http://u:secret@h/db"},
                                                             "other": 1})


def test_config_json_is_plain_and_hash_is_stable():
    as_json = jsonable(Inner())
    assert as_json["mode"] == "EAGER" and as_json["path"] == "/m" and as_json["tags"] == ["a", "b"]
    assert "_private" not in as_json and as_json["handle"].startswith("<") and "0x" not in as_json["handle"]
    doc = config_document(Outer(), model_dir="/m", tokenizer_dir="/m", chat_template=None)
    text = json.dumps(doc)
    assert doc["model"] == "/m" and doc["engine"] == "vllm"
    assert "secret" not in text and doc["vllm_config"]["additional_config"] == {"other": 1}
    # a per-start field does not change the hash; a behaviour field does
    again = config_document(Outer(instance_id="random-2"), model_dir="/m", tokenizer_dir="/m", chat_template=None)
    assert config_hash(doc) == config_hash(again)
    other = config_document(Outer(), model_dir="/m", tokenizer_dir="/m", chat_template="/t.jinja")
    assert config_hash(doc) != config_hash(other) and len(config_hash(doc)) == 16
    assert config_hash(doc) != hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def test_plugin_module_imports_without_vllm_and_says_so_when_asked_for_the_class():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            plugin.InfersightStatLogger  # noqa: B018 - the entry point's target needs vLLM
    else:
        pytest.skip("vLLM is importable here")


def test_launch_without_a_vllm_environment_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERSIGHT_VLLM_PYTHON", str(tmp_path / "no-python"))
    assert launch.vllm_python() is None
    with pytest.raises(RuntimeError, match=r"\.ci/setup"):
        launch.start_vllm_server(REFERENCE)
