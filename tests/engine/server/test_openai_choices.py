"""n / best_of, lists of prompts, echo, skip_special_tokens, stop_reason, system_fingerprint: over real HTTP."""

from __future__ import annotations

import json

from engine.core.outputs import RequestOutput, TokenLogprob
from engine.serving.server.choices import kept_choices


def _model(live) -> str:
    return live.served.name


def _chunks(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def test_n_samples_are_seeded_children(client, live):
    req = {"model": _model(live), "prompt": "abc", "max_tokens": 6, "temperature": 1.0, "ignore_eos": True,
           "seed": 11, "return_token_ids": True}
    body = client.post("/v1/completions", json={**req, "n": 3}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    # sample j is the request with seed + j (vLLM's child seeds)
    for j, choice in enumerate(body["choices"]):
        alone = client.post("/v1/completions", json={**req, "seed": 11 + j}).json()["choices"][0]
        assert choice["token_ids"] == alone["token_ids"]
    assert len({tuple(c["token_ids"]) for c in body["choices"]}) > 1
    assert body["usage"]["completion_tokens"] == 18
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    assert live.wait_idle()["in_flight"] == 0


def test_best_of_keeps_highest_cumulative_logprob(client, live):
    req = {"model": _model(live), "prompt": "abc", "max_tokens": 5, "temperature": 1.0, "ignore_eos": True,
           "seed": 3, "logprobs": 0}
    body = client.post("/v1/completions", json={**req, "n": 2, "best_of": 4}).json()
    scores = []
    for j in range(4):
        alone = client.post("/v1/completions", json={**req, "seed": 3 + j}).json()["choices"][0]
        scores.append((sum(alone["logprobs"]["token_logprobs"]), alone["text"]))
    best = [t for _, t in sorted(scores, reverse=True)[:2]]
    assert [c["text"] for c in body["choices"]] == best
    assert body["usage"]["completion_tokens"] == 20  # every sample generated counts
    no_lp = client.post("/v1/completions", json={**req, "logprobs": None, "n": 1, "best_of": 2}).json()
    assert no_lp["choices"][0]["logprobs"] is None  # ranked by logprobs the client did not ask for
    for bad in [{"n": 3, "best_of": 2}, {"n": 1, "best_of": 2, "stream": True}]:
        assert client.post("/v1/completions", json={**req, **bad}).status_code == 400


def test_kept_choices_unit():
    def out(lps):
        return RequestOutput("r", [1], [2] * len(lps), "", logprobs=[TokenLogprob(2, v) for v in lps])
    a, b, c, d = out([-1.0]), out([-0.1]), out([-3.0]), out([-0.2, -0.2])
    assert kept_choices([a, b, c, d], 2, 1) == [b, d]  # per prompt, the best
    assert kept_choices([a, b], 2, 2) == [a, b]  # best_of == n: in order


def test_prompt_list_indexes_and_stream(client, live):
    req = {"model": _model(live), "prompt": [[5, 6, 7], [8, 9]], "n": 2, "max_tokens": 4, "temperature": 0,
           "ignore_eos": True}
    body = client.post("/v1/completions", json=req).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    first = client.post("/v1/completions", json={**req, "prompt": [5, 6, 7], "n": 1}).json()["choices"][0]["text"]
    second = client.post("/v1/completions", json={**req, "prompt": [8, 9], "n": 1}).json()["choices"][0]["text"]
    assert [c["text"] for c in body["choices"]] == [first, first, second, second]
    assert body["usage"]["prompt_tokens"] == 5
    texts = client.post("/v1/completions", json={**req, "prompt": ["one", "two"], "n": 1}).json()
    assert [c["index"] for c in texts["choices"]] == [0, 1]
    r = client.post("/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}})
    texts = {}
    for chunk in _chunks(r.text):
        for c in chunk["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {c["index"]: c["text"] for c in body["choices"]}
    assert _chunks(r.text)[-1]["usage"] == body["usage"]
    chat = client.post("/v1/chat/completions", json={"model": _model(live), "n": 2, "max_tokens": 3, "seed": 1,
                                                     "messages": [{"role": "user", "content": "hi"}]}).json()
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert live.wait_idle()["in_flight"] == 0


def test_echo(client, live):
    req = {"model": _model(live), "prompt": "The fox", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    plain = client.post("/v1/completions", json=req).json()["choices"][0]
    echo = client.post("/v1/completions", json={**req, "echo": True, "logprobs": 1}).json()["choices"][0]
    assert echo["text"] == "The fox" + plain["text"]
    lp = echo["logprobs"]
    n_prompt = len(live.served.tokenizer.encode("The fox"))
    assert len(lp["tokens"]) == n_prompt + 3
    assert lp["token_logprobs"][0] is None and all(v is not None for v in lp["token_logprobs"][1:])
    assert "prompt_logprobs" not in echo  # computed for echo, not asked
    s = client.post("/v1/completions", json={**req, "echo": True, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in _chunks(s.text) if c["choices"]) == echo["text"]


def test_stop_reason_and_fingerprint(client, live):
    req = {"model": _model(live), "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
           "return_token_ids": True}
    base = client.post("/v1/completions", json=req).json()
    assert base["choices"][0]["stop_reason"] is None and base["choices"][0]["finish_reason"] == "length"
    assert base["system_fingerprint"].startswith("fp_")
    third = base["choices"][0]["token_ids"][2]
    by_id = client.post("/v1/completions", json={**req, "stop_token_ids": [third]}).json()["choices"][0]
    assert (by_id["finish_reason"], by_id["stop_reason"]) == ("stop", third)
    text = base["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 1] if text.strip() else None
    if stop:
        by_str = client.post("/v1/completions", json={**req, "stop": ["\u2603", stop]}).json()["choices"][0]
        assert (by_str["finish_reason"], by_str["stop_reason"]) == ("stop", stop)


def test_skip_special_tokens_and_eos_logprob_token(client, live):
    tok = live.served.tokenizer
    eos = sorted(live.served.engine.engine.eos_token_ids)[0]
    eos_text = tok.decode([eos], skip_special_tokens=False)
    assert eos_text
    # a prompt of the EOS token: with skip_special_tokens false, echo keeps it
    req = {"model": _model(live), "prompt": [5, eos, 6], "max_tokens": 2, "temperature": 0, "ignore_eos": True,
           "echo": True, "logprobs": 0}
    kept = client.post("/v1/completions", json={**req, "skip_special_tokens": False}).json()["choices"][0]
    skipped = client.post("/v1/completions", json=req).json()["choices"][0]
    assert eos_text in kept["logprobs"]["tokens"] and eos_text in skipped["logprobs"]["tokens"]
    # output side: a stop at EOS leaves it out of the text either way; an EOS forced by ignore_eos shows
    out_ids = client.post("/v1/completions", json={**req, "echo": False, "return_token_ids": True,
                                                    "stop_token_ids": [], "skip_special_tokens": False,
                                                    "max_tokens": 2}).json()["choices"][0]
    assert out_ids["text"] == tok.decode(out_ids["token_ids"], skip_special_tokens=False)


def test_a_stream_with_special_tokens_kept_and_stop_strings_sends_the_whole_text_only(client, live):
    """Streamed, skip_special_tokens=false with a stop string: the events add up to the whole response's
    text, cut before the stop string, and no event sent text past it (a tail that could begin a stop
    string waits)."""
    req = {"model": _model(live), "prompt": "abc abc abc", "max_tokens": 24, "temperature": 0, "ignore_eos": True,
           "skip_special_tokens": False}
    full = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    assert len(full) >= 4
    stop = full[len(full) // 2:len(full) // 2 + 2]  # a string the greedy answer is known to contain
    whole = client.post("/v1/completions", json={**req, "stop": [stop]}).json()["choices"][0]
    streamed = client.post("/v1/completions", json={**req, "stop": [stop], "stream": True})
    assert streamed.status_code == 200
    text = "".join(c["choices"][0]["text"] for c in _chunks(streamed.text) if c["choices"])
    assert text == whole["text"] == full[:full.index(stop)]
