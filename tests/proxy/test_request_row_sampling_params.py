"""The proxy's sampling_params_json of a request equals the one infersight's admission makes of the same body
(SamplingParams.to_json), penalties, min_p and logit_bias included: rows from a proxied replica and from an
infersight one pair on it."""

from __future__ import annotations

import json
import re

import pytest

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
