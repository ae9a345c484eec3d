"""The proxy's sampling_params_json of a request equals the one infersight's admission makes of the same body
(SamplingParams.to_json), penalties, min_p and logit_bias included: rows from a proxied replica and from an
infersight one pair on it."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.generation_defaults import AUTO, GenerationDefaults
from engine.serving.proxy.request_row import sampling_params_json
from engine.serving.server.admission import admit_chat, admit_completion
from engine.serving.server.model_info import ServedModel
from engine.serving.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.core.tokenization import Tokenizer

PROCESSORS = {"presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.2, "min_p": 0.05,
              "logit_bias": {"10": 2, "9": -1.5, "100": 100}}  # "10" < "9" as strings: key order must not matter


@pytest.fixture(scope="module")
def served(tiny_llama):
    tok = Tokenizer(tiny_llama)
    return ServedModel(engine=None, name="tiny", replica_id="r0", max_model_len=64, vocab_size=tok.vocab_size,
                       tokenizer=tok)


@pytest.mark.parametrize("extra", [{}, PROCESSORS, {"logit_bias": {}}])
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_the_proxy_row_has_the_engines_sampling_params(served, kind, extra):
    if kind == "chat":
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}
        admitted = admit_chat(ChatCompletionRequest(**body), served)
    else:
        body = {"model": "tiny", "prompt": "hello", "temperature": 0.7, **extra}
        admitted = admit_completion(CompletionRequest(**body), served)
    proxied_text = sampling_params_json(body, kind, admitted.prompt_len, served.max_model_len)
    engine_text = admitted.sampling_params.to_json()
    # the rows compare as text: logit_bias written byte for byte alike (string keys sorted as strings)
    bias = re.compile(r'"logit_bias": (null|\{[^}]*\})')
    assert bias.search(proxied_text).group(1) == bias.search(engine_text).group(1)
    proxied, engine = json.loads(proxied_text), json.loads(engine_text)
    assert set(PROCESSORS) <= set(proxied)
    # every key the proxy writes, as the engine writes it (keys the engine has beyond them are other features')
    assert proxied == {k: engine[k] for k in proxied}
    if extra is PROCESSORS:
        assert proxied["logit_bias"] == {"10": 2.0, "9": -1.5, "100": 100.0}


MODEL_DEFAULTS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 0.6, 1.3]), "top_p": st.sampled_from([0.5, 0.9]),
    "top_k": st.sampled_from([-1, 5, 40]), "min_p": st.sampled_from([0.0, 0.1]),
    "repetition_penalty": st.sampled_from([1.0, 1.3]), "presence_penalty": st.sampled_from([0.0, 0.4]),
    "frequency_penalty": st.sampled_from([-0.2, 0.0]), "max_tokens": st.sampled_from([3, 7, 500])})
REQUEST_FIELDS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 0.8]), "top_p": st.sampled_from([0.7]), "top_k": st.sampled_from([3]),
    "repetition_penalty": st.sampled_from([1.1]), "max_tokens": st.sampled_from([None, 4])})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=MODEL_DEFAULTS, fields=REQUEST_FIELDS, kind=st.sampled_from(["completion", "chat"]))
def test_the_proxy_row_records_the_model_defaults_the_upstream_served_with(served, model, fields, kind):
    # a field the client leaves unset is served with the model's generation default, as
    # vLLM's --generation-config auto does and infersight's admission does: the proxy's row must say so
    defaults = GenerationDefaults(AUTO, model)
    with_defaults = dataclasses.replace(served, generation_defaults=defaults)
    if kind == "chat":
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
        admitted = admit_chat(ChatCompletionRequest(**body), with_defaults)
    else:
        body = {"model": "tiny", "prompt": "hello", **fields}
        admitted = admit_completion(CompletionRequest(**body), with_defaults)
    proxied = json.loads(sampling_params_json(body, kind, admitted.prompt_len, served.max_model_len,
                                              defaults=defaults))
    engine = json.loads(admitted.sampling_params.to_json())
    assert proxied == {k: engine[k] for k in proxied}
    for name, value in model.items():  # and the default is what was recorded wherever the request left it unset
        if name != "max_tokens" and fields.get(name) is None:
            assert proxied[name] == value


def test_without_the_model_defaults_the_api_defaults_are_recorded():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    plain = json.loads(sampling_params_json(body, "chat", 5, 64))
    assert plain["repetition_penalty"] == 1.0 and plain["temperature"] == 1.0 and plain["max_tokens"] == 59
    ruled = json.loads(sampling_params_json(body, "chat", 5, 64, defaults=GenerationDefaults(
        AUTO, {"repetition_penalty": 1.3, "temperature": 0.2, "max_tokens": 8})))
    assert ruled["repetition_penalty"] == 1.3 and ruled["temperature"] == 0.2 and ruled["max_tokens"] == 8
