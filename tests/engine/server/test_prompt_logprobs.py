"""`prompt_logprobs` on /v1/completions (vLLM's extension): the teacher-forced logprob of each prompt
token, in vLLM's format, and in the request's row (`requests.prompt_logprobs`)."""

from __future__ import annotations

import math

from tests.engine.server.store_polling import stored_request


def _model(live) -> str:
    return live.served.name


def test_prompt_logprobs_format_and_row(client, live, store):
    gen = client.post("/v1/completions", json={"model": _model(live), "prompt": "abc def", "max_tokens": 5,
                                               "temperature": 0, "logprobs": 0, "ignore_eos": True,
                                               "return_token_ids": True},
                      headers={"X-Request-Id": "plp-gen"}).json()
    prompt, output = gen["prompt_token_ids"], gen["choices"][0]["token_ids"]
    sampled = gen["choices"][0]["logprobs"]["token_logprobs"]
    r = client.post("/v1/completions", json={"model": _model(live), "prompt": prompt + output, "max_tokens": 1,
                                             "temperature": 0, "prompt_logprobs": 0},
                    headers={"X-Request-Id": "plp-score", "X-Workload": "rescore"}).json()
    plp = r["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(prompt) + len(output) and plp[0] is None
    for tok, entry in zip((prompt + output)[1:], plp[1:]):
        assert list(entry) == [str(tok)]  # prompt_logprobs 0: the prompt token alone
        assert entry[str(tok)]["logprob"] <= 0 and "decoded_token" in entry[str(tok)]
    # teacher-forcing the generated tokens scores them as the sampler did (same weights, same replica)
    scored = [plp[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(output)]
    assert max(abs(a - b) for a, b in zip(scored, sampled)) < 1e-3
    live.flush()
    row = stored_request(store, "plp-score")
    stored = list(row["prompt_logprobs"][0])
    assert len(stored) == len(prompt) + len(output) - 1
    assert all(math.isclose(a, e[next(iter(e))]["logprob"], abs_tol=1e-5) for a, e in zip(stored, plp[1:]))
    assert list(stored_request(store, "plp-gen")["prompt_logprobs"][0]) == []  # not asked: []


def test_prompt_logprobs_top_n_and_range(client, live):
    r = client.post("/v1/completions", json={"model": _model(live), "prompt": [5, 6, 7, 8], "max_tokens": 1,
                                             "prompt_logprobs": 2}).json()
    plp = r["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and all(2 <= len(e) <= 3 for e in plp[1:])
    ranks = sorted(v["rank"] for e in plp[1:] for v in e.values() if v["rank"] is not None)
    assert ranks and ranks[0] == 1
    bad = client.post("/v1/completions", json={"model": _model(live), "prompt": "x", "prompt_logprobs": 99})
    assert bad.status_code in (400, 422) and "prompt_logprobs" in bad.text
    absent = client.post("/v1/completions", json={"model": _model(live), "prompt": "x", "max_tokens": 1}).json()
    assert "prompt_logprobs" not in absent["choices"][0]
