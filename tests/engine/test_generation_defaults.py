"""The model's sampling defaults as vLLM applies them: read from generation_config.json ("auto"), off
("vllm"), or from another directory (its max_new_tokens then caps every request); filled into the fields a
request leaves unset; in the replica's identity; recorded per request as the values used."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from engine.core.generation_defaults import GenerationDefaults, generation_defaults
from engine.serving.server.admission import admit_chat, admit_completion
from engine.serving.server.model_info import ServedModel
from engine.serving.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.core.tokenization import Tokenizer


def _model(tiny_llama, tmp_path, **sampling) -> str:
    model = shutil.copytree(tiny_llama, tmp_path / "model")
    path = model / "generation_config.json"
    gen = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**gen, **sampling}))
    return str(model)


def test_the_model_file_the_switch_and_another_directory(tiny_llama, tmp_path):
    model = _model(tiny_llama, tmp_path, repetition_penalty=1.3, top_k=0, temperature=None, max_new_tokens=40,
                   do_sample=True)
    auto = generation_defaults(model)
    # null is unset, do_sample is not read, top_k 0 is off, max_new_tokens is max_tokens
    assert auto.values == {"repetition_penalty": 1.3, "top_k": -1, "max_tokens": 40} and auto.max_tokens_cap is None
    assert generation_defaults(model, "vllm").values == {}
    other = tmp_path / "gen"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"max_new_tokens": 12, "top_p": 0.5}))
    chosen = generation_defaults(model, str(other))
    assert (chosen.values, chosen.max_tokens_cap) == ({"max_tokens": 12, "top_p": 0.5}, 12)
    assert chosen.max_tokens(30, room=100) == 12 and auto.max_tokens(30, room=100) == 30
    assert auto.max_tokens(None, room=100) == 40 and auto.max_tokens(None, room=25) == 25


@pytest.mark.parametrize("bad, words", [({"repetition_penalty": 0}, ["repetition_penalty", "'vllm'"]),
                                        ({"temperature": "hot"}, ["temperature must be a number"])])
def test_a_default_that_cannot_be_used_fails_at_start_naming_the_file(tiny_llama, tmp_path, bad, words):
    with pytest.raises(ValueError) as e:
        generation_defaults(_model(tiny_llama, tmp_path, **bad))
    assert "generation_config.json" in str(e.value) and all(w in str(e.value) for w in words)
    with pytest.raises(ValueError, match="'auto', 'vllm' or a directory"):
        generation_defaults(str(tiny_llama), str(tmp_path / "nowhere"))


def test_unset_request_fields_take_the_models_defaults_and_set_ones_keep_their_own(tiny_llama):
    tok = Tokenizer(tiny_llama)
    defaults = GenerationDefaults("auto", {"repetition_penalty": 1.3, "temperature": 0.7, "max_tokens": 9})
    served = ServedModel(engine=None, name="tiny", replica_id="r0", max_model_len=64, vocab_size=tok.vocab_size,
                         tokenizer=tok, generation_defaults=defaults)
    chat = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])
    sp = admit_chat(chat, served).sampling_params
    assert (sp.repetition_penalty, sp.temperature, sp.max_tokens) == (1.3, 0.7, 9)
    # what the client set wins, its defaults' values included (temperature 1.0 said is not unset)
    own = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
                                repetition_penalty=1.0, max_tokens=5)
    sp = admit_chat(own, served).sampling_params
    assert (sp.repetition_penalty, sp.temperature, sp.max_tokens) == (1.0, 1.0, 5)
    # a completion's max_tokens is 16 unless the client says null (as vLLM's API has it)
    assert admit_completion(CompletionRequest(model="tiny", prompt="hi"), served).sampling_params.max_tokens == 16
    assert admit_completion(CompletionRequest(model="tiny", prompt="hi", max_tokens=None),
                            served).sampling_params.max_tokens == 9
    # without defaults (generation_config "vllm"), the API's own
    off = dataclasses.replace(served, generation_defaults=GenerationDefaults())
    assert admit_chat(chat, off).sampling_params.repetition_penalty == 1.0


def test_the_defaults_are_in_the_identity_and_each_record_holds_the_values_used(tiny_llama, tmp_path):
    from engine.core.config import EngineConfig
    from engine.core.llm import LLM
    from telemetry.contract.hooks import EngineObserver

    class Rows(EngineObserver):
        enabled = True

        def __init__(self):
            self.replicas, self.requests = [], []

        def on_replica_start(self, record):
            self.replicas.append(record)

        def on_request_finished(self, record):
            self.requests.append(record)

    model = _model(tiny_llama, tmp_path, repetition_penalty=1.3)
    rows = {}
    for source in ("auto", "vllm"):
        observer = Rows()
        llm = LLM(EngineConfig(model=model, num_kv_blocks=16, generation_config=source), observer)
        llm.generate([[5, 6, 7]], use_tqdm=False)
        rows[source] = observer
    auto, off = rows["auto"], rows["vllm"]
    assert json.loads(auto.requests[0].sampling_params_json)["repetition_penalty"] == 1.3
    assert json.loads(off.requests[0].sampling_params_json)["repetition_penalty"] == 1.0
    ident = json.loads(auto.replicas[0].config_json)["generation"]["sampling_defaults"]
    assert ident == {"source": "auto", "values": {"repetition_penalty": 1.3}}
    assert auto.replicas[0].config_hash != off.replicas[0].config_hash
