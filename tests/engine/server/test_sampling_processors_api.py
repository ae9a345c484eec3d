"""logit_bias, penalties and min_p over real HTTP on a tiny random Llama: greedy output follows them, the
request's sampling_params_json in the store carries them, and out-of-range values are 400s naming the field."""

from __future__ import annotations

import json
import uuid
from collections import Counter

from store_polling import stored_request


def greedy(client, live, prompt="The quick brown fox", **extra) -> list[int]:
    r = client.post("/v1/completions", json={"model": live.served.name, "prompt": prompt, "max_tokens": 24,
                                             "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_a_huge_logit_bias_makes_greedy_output_that_token(client, live):
    plain = greedy(client, live)
    token = next(t for t in range(5, live.served.vocab_size) if t not in plain)  # one greedy never picks
    assert greedy(client, live, logit_bias={str(token): 100}) == [token] * 24
    chat = client.post("/v1/chat/completions", json={
        "model": live.served.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
        "temperature": 0, "ignore_eos": True, "return_token_ids": True, "logit_bias": {str(token): 100}})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["token_ids"] == [token] * 6


def test_penalties_change_a_repetitive_greedy_output(client, live):
    plain = greedy(client, live)
    most = Counter(plain).most_common(1)[0][1]
    assert most >= 3, plain  # the random model repeats itself: the precondition of this test
    for extra in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 10.0}):
        penalised = greedy(client, live, **extra)
        assert penalised != plain, extra
        assert Counter(penalised).most_common(1)[0][1] < most, (extra, penalised)
    assert greedy(client, live, min_p=0.5) == plain  # min_p never removes greedy's argmax


def test_the_store_row_carries_the_processors(client, live, store):
    rid = f"proc-{uuid.uuid4().hex[:8]}"
    r = client.post("/v1/completions", headers={"X-Request-Id": rid}, json={
        "model": live.served.name, "prompt": "hello", "max_tokens": 3, "temperature": 0.8, "seed": 1,
        "presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.1, "min_p": 0.05,
        "logit_bias": {"7": -3}})
    assert r.status_code == 200, r.text
    live.flush()
    row = stored_request(store, rid)
    params = json.loads(row.iloc[0]["sampling_params_json"])
    assert (params["presence_penalty"], params["frequency_penalty"], params["repetition_penalty"],
            params["min_p"], params["logit_bias"]) == (0.5, 0.25, 1.1, 0.05, {"7": -3.0})


def test_out_of_range_values_are_400s_naming_the_field(client, live):
    for extra, field in [({"presence_penalty": 3}, "presence_penalty"), ({"min_p": -0.1}, "min_p"),
                         ({"repetition_penalty": 0}, "repetition_penalty"), ({"logit_bias": {"5": 500}}, "logit_bias"),
                         ({"logit_bias": {str(live.served.vocab_size): 1}}, "logit_bias"),
                         ({"logit_bias": {"abc": 1}}, "logit_bias")]:
        r = client.post("/v1/completions", json={"model": live.served.name, "prompt": "x", **extra})
        assert r.status_code == 400, (extra, r.text)
        assert field in (r.json()["error"].get("param") or "") + r.json()["error"]["message"], (extra, r.text)


def test_the_schema_states_the_logit_bias_keys_of_this_vocabulary(client, live):
    import re

    schema = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]
    node = next(s for s in schema["properties"]["logit_bias"]["anyOf"] if s.get("type") == "object")
    keys = re.compile(node["propertyNames"]["pattern"])
    vocab = live.served.vocab_size
    assert all(keys.search(str(t)) for t in (0, 7, vocab // 3, vocab - 1))
    assert not any(keys.search(k) for k in (str(vocab), str(10 * vocab), "05", "-1", "abc", ""))
    assert node["additionalProperties"] == {"type": "number", "minimum": -100.0, "maximum": 100.0}
